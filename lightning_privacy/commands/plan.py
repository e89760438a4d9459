"""``lightning-privacy plan``: the noise multiplier σ for a target β*_MIA or a target ε.

σ is calibrated by the privacy ledger's one routine (:meth:`lightning_privacy.ledger.PrivacyLedger.calibrate`, the
one ``DPSGD(target_…)`` uses): for ``--target`` the smallest σ whose *safe* β*_MIA (pessimistic PLD, composed per
epoch as a run composes it) meets the target; for ``--target-epsilon`` the smallest σ whose accountant ε at
``--delta`` stays within it. The closed form's σ (Cherubin et al. 2024, Eq. 4) is printed beside it. The command
prints what the plan implies: safe β* and the closed form, attacker success at a uniform prior, tight TPR bounds at
FPR 0.1% / 1% / 10% (the mechanism's trade-off curve) and the accountant's ε.

The sampling rate is given directly (``--sample-rate``) or from ``--dataset-size`` and ``--batch-size`` as Opacus'
``DPDataLoader`` (and our ``DPSGD`` callback) set it: p = 1/⌈N/L⌉, with ⌈N/L⌉ steps per epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

NAME = "plan"
HELP = "Noise multiplier for a target Bayes security against membership inference, or for a target ε."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--target", type=float, help="target Bayes security β*_MIA in (0, 1), e.g. 0.9")
    target.add_argument("--target-epsilon", type=float, help="target ε (> 0) at --delta, by the accountant")
    rate = parser.add_argument_group("sampling rate (give --sample-rate, or --dataset-size with --batch-size)")
    rate.add_argument("--sample-rate", type=float, default=None, help="Poisson sampling rate p in (0, 1]")
    rate.add_argument("--dataset-size", type=int, default=None, help="training set size N")
    rate.add_argument("--batch-size", type=int, default=None, help="expected batch size L (p = 1/ceil(N/L))")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--epochs", type=float, help="training epochs (steps = ceil(epochs / p))")
    length.add_argument("--steps", type=int, help="optimizer steps T")
    parser.add_argument(
        "--relation",
        choices=("replace", "add_remove"),
        default="replace",
        help="neighbouring relation (default: %(default)s, the paper's MIA game)",
    )
    parser.add_argument(
        "--exact", action="store_true", help="(kept for old scripts: σ is always planned on the safe exact value)"
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the accountant's ε (default: %(default)s)")
    parser.add_argument(
        "--accountant",
        choices=("pld", "rdp", "prv", "gdp"),
        default="pld",
        help="accountant of ε: the package's pessimistic PLD (certified, the default), or Opacus' rdp, prv or gdp",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _sampling(args: argparse.Namespace) -> tuple[float, int, int | None]:
    """(sample_rate, steps, steps per epoch or None) from the arguments; ValueError naming the flag on bad input."""
    if args.sample_rate is not None:
        if args.dataset_size is not None or args.batch_size is not None:
            raise ValueError("give either `--sample-rate` or `--dataset-size` with `--batch-size`, not both")
        if not 0.0 < args.sample_rate <= 1.0:
            raise ValueError(f"`--sample-rate` must be in (0, 1], got {args.sample_rate!r}")
        p = float(args.sample_rate)
        steps_per_epoch = None
    else:
        if args.dataset_size is None or args.batch_size is None:
            raise ValueError("give `--sample-rate`, or both `--dataset-size` and `--batch-size`")
        if args.dataset_size < 1:
            raise ValueError(f"`--dataset-size` must be >= 1, got {args.dataset_size!r}")
        if not 1 <= args.batch_size <= args.dataset_size:
            raise ValueError(
                f"`--batch-size` must be in [1, dataset size {args.dataset_size}], got {args.batch_size!r}"
            )
        steps_per_epoch = math.ceil(args.dataset_size / args.batch_size)
        p = 1.0 / steps_per_epoch
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"`--steps` must be >= 1, got {args.steps!r}")
        return p, int(args.steps), steps_per_epoch
    if not args.epochs > 0 or not math.isfinite(args.epochs):
        raise ValueError(f"`--epochs` must be a positive number, got {args.epochs!r}")
    if steps_per_epoch is not None:
        return p, math.ceil(args.epochs * steps_per_epoch - 1e-9), steps_per_epoch
    return p, math.ceil(args.epochs / p - 1e-9), None


def make_plan(args: argparse.Namespace) -> dict:
    """The plan of ``args`` as a dict of plain values (raises ValueError on bad input)."""
    from lightning_privacy.analysis import bayes_security as bs
    from lightning_privacy.ledger import PrivacyLedger

    if args.target is not None and not 0.0 < args.target < 1.0:
        raise ValueError(f"`--target` must be in (0, 1), got {args.target!r}")
    if args.target_epsilon is not None and not args.target_epsilon > 0.0:
        raise ValueError(f"`--target-epsilon` must be > 0, got {args.target_epsilon!r}")
    if not 0.0 < args.delta < 1.0:
        raise ValueError(f"`--delta` must be in (0, 1), got {args.delta!r}")
    p, steps, steps_per_epoch = _sampling(args)
    per_read = steps_per_epoch or max(1, round(1 / p))  # a run reads (composes) once per epoch
    if args.target is not None:
        target = {"target_bayes_security": args.target}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the σ < 1 caveat: the safe plan below resolves it
            closed_sigma = bs.noise_multiplier_for(
                target=args.target, sample_rate=p, steps=steps, relation=args.relation
            )
    else:
        target = {"target_epsilon": args.target_epsilon}
        closed_sigma = None
    sigma = PrivacyLedger.calibrate(
        sample_rate=p,
        steps=steps,
        delta=args.delta,
        accountant=args.accountant,
        relation=args.relation,
        steps_per_read=per_read,
        **target,
    )
    ledger = PrivacyLedger(accountant=args.accountant, delta=args.delta, relation=args.relation)
    done = 0
    while done < steps:  # compose as a run would: one read per epoch
        take = min(per_read, steps - done)
        ledger.step(noise_multiplier=sigma, sample_rate=p, steps=take)
        ledger.bayes_security()
        ledger.epsilon()
        done += take
    safe = ledger.bayes_security()
    tight = ledger.tpr_bounds([0.001, 0.01, 0.1])
    out = {
        "target": args.target,
        "target_epsilon": args.target_epsilon,
        "relation": args.relation,
        "sample_rate": p,
        "steps": steps,
        "epochs": steps * p,
        "noise_multiplier": sigma,
        "noise_multiplier_closed_form": closed_sigma,
        "mia_bayes_security": safe,
        "mia_bayes_security_closed_form": ledger.bayes_security_closed_form(),
        "mia_advantage": 1.0 - safe,
        "attacker_success_uniform_prior": (2.0 - safe) / 2.0,
        "mia_tpr_bound_fpr_0.001": float(tight[0]),
        "mia_tpr_bound_fpr_0.01": float(tight[1]),
        "mia_tpr_bound_fpr_0.1": float(tight[2]),
        "mia_tpr_bound_fpr_0.01_prop9": bs.tpr_upper_bound(bayes_security=safe, fpr=0.01),
        "delta": args.delta,
        "accountant": args.accountant,
        "epsilon": ledger.epsilon(),
        "epsilon_label": ledger.epsilon_label,
        "notes": [],
    }
    if closed_sigma is not None and out["mia_bayes_security_closed_form"] > safe + 1e-4:
        out["notes"].append(
            f"the closed form says β* = {out['mia_bayes_security_closed_form']:.4f} at this σ but the safe value is "
            f"{safe:.4f}: the closed form overstates security here."
        )
    return out


def _table(out: dict) -> str:
    accountant, kind = out["epsilon_label"].split(", ", 1)  # e.g. "PLD (add/remove)", "certified upper bound"
    sigma = f"{out['noise_multiplier']:.4f}"
    if out["noise_multiplier_closed_form"] is not None:
        sigma += f"  (closed form, Eq. 4: {out['noise_multiplier_closed_form']:.4f})"
    rows = [
        ("noise_multiplier σ", sigma),
        ("sample_rate p", f"{out['sample_rate']:.6g}"),
        ("steps T", f"{out['steps']}  ({out['epochs']:.4g} epochs)"),
        ("β*_MIA (exact, safe)", f"{out['mia_bayes_security']:.4f}"),
        ("β*_MIA closed form (Cor. 7, approx.)", f"{out['mia_bayes_security_closed_form']:.4f}"),
        ("attacker success, uniform prior", f"{100 * out['attacker_success_uniform_prior']:.2f}%"),
        ("TPR bound @ FPR 0.1%", f"{100 * out['mia_tpr_bound_fpr_0.001']:.2f}%"),
        (
            "TPR bound @ FPR 1%",
            f"{100 * out['mia_tpr_bound_fpr_0.01']:.2f}%  (Prop. 9: {100 * out['mia_tpr_bound_fpr_0.01_prop9']:.2f}%)",
        ),
        ("TPR bound @ FPR 10%", f"{100 * out['mia_tpr_bound_fpr_0.1']:.2f}%"),
        (f"ε at δ={out['delta']:g}, {accountant}", f"{out['epsilon']:.4g}  ({kind})"),
    ]
    width = max(len(k) for k, _ in rows)
    if out["target"] is not None:
        head = f"Plan for β*_MIA >= {out['target']} ({out['relation']})"
    else:
        head = f"Plan for ε <= {out['target_epsilon']} at δ = {out['delta']:g}, {out['epsilon_label']}"
    lines = [head, "-" * len(head)] + [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"note: {n}" for n in out["notes"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        out = make_plan(args)
    except (ValueError, TypeError) as err:
        print(f"lightning-privacy plan: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if args.json else _table(out))
    return 0

"""``lightning-privacy plan``: the noise multiplier σ for a target Bayes security against MIA.

Equation 4 of Cherubin et al. (2024) gives σ in closed form; the command then checks that σ against
the pessimistic PLD ground truth (1 − δ(ε=0)) and, with ``--exact``, raises σ until the PLD value also
meets the target. It prints what the plan implies: attacker success at a uniform prior and TPR bounds
at FPR 1% / 10% (Proposition 9), computed from the smaller (safer) of the two β* values.

The sampling rate is given directly (``--sample-rate``) or from ``--dataset-size`` and
``--batch-size`` as Opacus' ``DPDataLoader`` (and our ``DPSGD`` callback) set it: p = 1/⌈N/L⌉, with
⌈N/L⌉ steps per epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

NAME = "plan"
HELP = "Noise multiplier for a target Bayes security against membership inference (Cherubin et al. 2024, Eq. 4)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=float, required=True, help="target Bayes security β*_MIA in (0, 1), e.g. 0.9")
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
        "--exact",
        action="store_true",
        help="plan σ against the exact PLD value instead of the closed form (slower: seconds)",
    )
    parser.add_argument(
        "--delta", type=float, default=None, help="also print the loose ε estimate of Section 4.2.1 at this δ in [0, 1)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _sampling(args: argparse.Namespace) -> tuple[float, int]:
    """(sample_rate, steps) from the arguments; ValueError naming the flag on bad input."""
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
        return p, int(args.steps)
    if not args.epochs > 0 or not math.isfinite(args.epochs):
        raise ValueError(f"`--epochs` must be a positive number, got {args.epochs!r}")
    if steps_per_epoch is not None:
        return p, math.ceil(args.epochs * steps_per_epoch - 1e-9)
    return p, math.ceil(args.epochs / p - 1e-9)


def make_plan(args: argparse.Namespace) -> dict:
    """The plan of ``args`` as a dict of plain values (raises ValueError on bad input)."""
    from lightning_privacy.analysis import bayes_security as bs

    if not 0.0 < args.target < 1.0:
        raise ValueError(f"`--target` must be in (0, 1), got {args.target!r}")
    if args.delta is not None and not 0.0 <= args.delta < 1.0:
        raise ValueError(f"`--delta` must be in [0, 1), got {args.delta!r}")
    p, steps = _sampling(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        closed_sigma = bs.noise_multiplier_for(target=args.target, sample_rate=p, steps=steps, relation=args.relation)
    notes = [str(w.message) for w in caught]
    if args.exact:
        sigma = bs.noise_multiplier_for_exact(target=args.target, sample_rate=p, steps=steps, relation=args.relation)
        notes = []  # the exact plan resolves the closed form's σ < 1 caveat
    else:
        sigma = closed_sigma
    kw = dict(sample_rate=p, noise_multiplier=sigma, steps=steps, relation=args.relation)
    closed = bs.mia_bayes_security(**kw)
    exact = bs.mia_bayes_security_exact(**kw)
    safe = min(closed, exact)
    if exact < args.target:
        notes.append(
            f"the exact (PLD) Bayes security at this σ is {exact:.4f} < target {args.target}: the closed form "
            "overstates security here; rerun with --exact for a σ that meets the target exactly."
        )
    out = {
        "target": args.target,
        "relation": args.relation,
        "sample_rate": p,
        "steps": steps,
        "epochs": steps * p,
        "noise_multiplier": sigma,
        "noise_multiplier_closed_form": closed_sigma,
        "planned_with": "exact" if args.exact else "closed_form",
        "mia_bayes_security": closed,
        "mia_bayes_security_exact": exact,
        "mia_advantage": 1.0 - safe,
        "attacker_success_uniform_prior": (2.0 - safe) / 2.0,
        "mia_tpr_bound_fpr_0.01": bs.tpr_upper_bound(bayes_security=safe, fpr=0.01),
        "mia_tpr_bound_fpr_0.1": bs.tpr_upper_bound(bayes_security=safe, fpr=0.1),
        "approximation_error": bs.approximation_error(sample_rate=p, noise_multiplier=sigma, steps=steps),
        "notes": notes,
    }
    if args.delta is not None:
        out["delta"] = args.delta
        out["epsilon_estimate_loose"] = bs.epsilon_estimate(bayes_security=safe, delta=args.delta)
    return out


def _table(out: dict) -> str:
    rows = [
        (
            "noise_multiplier σ",
            f"{out['noise_multiplier']:.4f}"
            + (
                ""
                if out["planned_with"] == "closed_form"
                else f"  (exact plan; closed form: {out['noise_multiplier_closed_form']:.4f})"
            ),
        ),
        ("sample_rate p", f"{out['sample_rate']:.6g}"),
        ("steps T", f"{out['steps']}  ({out['epochs']:.4g} epochs)"),
        ("β*_MIA closed form (Cor. 7)", f"{out['mia_bayes_security']:.4f}"),
        ("β*_MIA exact (PLD, pessimistic)", f"{out['mia_bayes_security_exact']:.4f}"),
        ("attacker success, uniform prior", f"{100 * out['attacker_success_uniform_prior']:.2f}%"),
        ("TPR bound @ FPR 1%", f"{100 * out['mia_tpr_bound_fpr_0.01']:.2f}%"),
        ("TPR bound @ FPR 10%", f"{100 * out['mia_tpr_bound_fpr_0.1']:.2f}%"),
        (
            "approximation error bound (Prop. 4)",
            f"{out['approximation_error']:.3g}" + ("  (vacuous, >= 1)" if out["approximation_error"] >= 1 else ""),
        ),
    ]
    if "epsilon_estimate_loose" in out:
        rows.append((f"ε estimate at δ={out['delta']:g} (loose)", f"{out['epsilon_estimate_loose']:.4g}"))
    width = max(len(k) for k, _ in rows)
    head = f"Plan for β*_MIA >= {out['target']} ({out['relation']})"
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

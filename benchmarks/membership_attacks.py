"""LOSS, LiRA (offline / online) and RMIA (offline) with 1, 2, 4 reference models, on Adult and digits.

Targets per data set: an over-fitted MLP (no DP, many epochs) and DP-SGD MLPs at three noise multipliers. Members,
non-members and the population are disjoint random rows; reference models train with the target's recipe (DP-SGD
at the same σ for the DP targets) on balanced halves of the population (offline) or of the audited rows (online). Every DP row is checked against the ledger's
trade-off curve for the in/out game (add/remove: the TPR bound of any attack at the point's FPR upper limit) and its
ledger is the claim of a verdict (``audit_membership(..., claim=ledger)``). Writes
``benchmarks/results/membership_attacks.md`` (tables + the ordering the RMIA paper reports, checked row by row)
and ``benchmarks/results/membership_attacks_dp.png`` (a DP row's ROC inside the accountant's region).

The DP-SGD targets train with ``DPSGD(sampling_seed=0, noise_seed=0)``, so every run trains the same targets (and the
over-fitted rows re-run to the digit, the timing columns aside). The DP-SGD references are seeded by
``train_references`` from the audit seed and the reference's index (masks and noise independent across references),
so the DP rows re-run to the digit too.

    python benchmarks/membership_attacks.py            # ~2 min on one CPU thread
    python benchmarks/membership_attacks.py --quick    # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.audits import audit_membership
from lightning_privacy.models import TabularMLP
from lightning_privacy.references import train_references

RESULTS = Path(__file__).resolve().parent / "results"
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
SIGMAS = (0.7, 1.0, 2.0)
# Written under the tables: why the rows differ from the previous release's (rewrite when a change moves them again).
WHY_MOVED = """\
**Why the DP-SGD rows moved since the previous release.** Two changes to DP-SGD's randomness. Commit `898a633` made
`DPSGD` draw its Gaussian noise from a private generator (seeded from OS entropy at every fit unless
`DPSGD(noise_seed=...)` fixes it) instead of torch's global generator, which this script seeds with
`torch.manual_seed(0)` before each target; whoever knows a published seed could replay that noise. Commit `96bf2ed`
made the Poisson sampler draw each step's rows as geometric gaps between selected rows (O(batch) per step instead of
one coin per row): the same law (every row in every step independently with probability q), but a given
`sampling_seed` now selects other rows than before. The DP-SGD targets pass `DPSGD(sampling_seed=0, noise_seed=0)` and
their references are seeded from the audit seed and the reference's index (`train_references`), so each DP row is
another draw of the same mechanism and re-runs to the digit. The over-fitted targets and their references use neither
the DP-SGD noise nor the Poisson sampler, so nothing should move their rows."""

# The previous release's over-fitted rows (AUC | TPR@0.1% | TPR@1% | TPR@10% | ε lower; the timing columns vary from
# run to run), as its results file printed them, to say whether they equal it to the digit.
PREVIOUS_OVERFITTED = {
    "Adult, LOSS": "0.555 | 0.003 | 0.012 | 0.087 | 2.62",
    "Adult, LiRA offline, 1 ref": "0.577 | 0.005 | 0.020 | 0.145 | 0.27",
    "Adult, LiRA offline, 2 ref": "0.585 | 0.016 | 0.038 | 0.152 | 0.04",
    "Adult, LiRA offline, 4 ref": "0.591 | 0.016 | 0.028 | 0.162 | 0.00",
    "Adult, LiRA online, 2 ref": "0.585 | 0.001 | 0.008 | 0.124 | 0.35",
    "Adult, LiRA online, 4 ref": "0.636 | 0.009 | 0.036 | 0.208 | 0.00",
    "Adult, RMIA offline, 1 ref": "0.621 | 0.000 | 0.055 | 0.204 | 2.47",
    "Adult, RMIA offline, 2 ref": "0.649 | 0.014 | 0.053 | 0.230 | 2.46",
    "Adult, RMIA offline, 4 ref": "0.656 | 0.024 | 0.052 | 0.233 | 2.39",
    "digits, LOSS": "0.558 | 0.000 | 0.013 | 0.105 | 2.46",
    "digits, LiRA offline, 1 ref": "0.617 | 0.018 | 0.048 | 0.210 | 0.00",
    "digits, LiRA offline, 2 ref": "0.618 | 0.018 | 0.030 | 0.188 | 0.04",
    "digits, LiRA offline, 4 ref": "0.613 | 0.025 | 0.040 | 0.177 | 0.36",
    "digits, LiRA online, 2 ref": "0.631 | 0.007 | 0.037 | 0.152 | 1.30",
    "digits, LiRA online, 4 ref": "0.637 | 0.045 | 0.062 | 0.205 | 0.93",
    "digits, RMIA offline, 1 ref": "0.643 | 0.037 | 0.043 | 0.225 | 2.27",
    "digits, RMIA offline, 2 ref": "0.631 | 0.025 | 0.077 | 0.205 | 2.35",
    "digits, RMIA offline, 4 ref": "0.648 | 0.035 | 0.075 | 0.205 | 2.31",
}


def compare_previous(rows) -> str:
    """Whether the over-fitted rows equal the previous release's to the digit (the timing columns aside)."""
    cells = {
        f"{d}, {a}": f"{auc:.3f} | {t1:.3f} | {t2:.3f} | {t3:.3f} | {e:.2f}"
        for d, t, a, auc, t1, t2, t3, e, *_ in rows
        if t == "over-fitted"
    }
    same = [k for k, c in cells.items() if PREVIOUS_OVERFITTED.get(k) == c]
    moved = [k for k, c in cells.items() if k in PREVIOUS_OVERFITTED and PREVIOUS_OVERFITTED[k] != c]
    if not moved and len(same) == len(PREVIOUS_OVERFITTED):
        return (
            f" All {len(same)} over-fitted rows equal the previous release's to the digit (the timing columns aside)."
        )
    return (
        f" Over-fitted rows equal to the previous release's to the digit (timing aside): {len(same)} of "
        f"{len(PREVIOUS_OVERFITTED)}; moved: {'; '.join(moved) or 'none'}."
    )


def adult(n_total: int):
    from lightning_privacy.data.adult import AdultEncoder, load_adult

    table = load_adult("train")
    x = torch.from_numpy(AdultEncoder().fit(table).transform(table)).float()
    y = torch.from_numpy(table.labels)
    idx = torch.from_numpy(np.random.default_rng(0).permutation(len(y))[:n_total])
    return x[idx], y[idx], 10


def digits(n_total: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy(d.data / 16.0).float()
    y = torch.from_numpy(d.target).long()
    idx = torch.from_numpy(np.random.default_rng(0).permutation(len(y))[:n_total])
    return x[idx], y[idx], 10


def loader(x, y, rows, shuffle=False, batch=64):
    return DataLoader(TensorDataset(x[rows], y[rows]), batch_size=batch, shuffle=shuffle)


def run(name, data, n, epochs_overfit, epochs_dp, refs_max, out_rows, figure_done):
    x, y, _ = data
    classes = int(y.max()) + 1
    mem, non, pop = slice(0, n), slice(n, 2 * n), slice(2 * n, 4 * n)
    members, nonmembers, population = loader(x, y, mem), loader(x, y, non), loader(x, y, pop)

    def factory():
        return TabularMLP(x.shape[1], hidden=(256, 256), num_classes=classes, lr=1e-3, optimizer="adam")

    targets = {}
    torch.manual_seed(0)
    model = factory()
    pl.Trainer(max_epochs=epochs_overfit, **QUIET).fit(model, loader(x, y, mem, True))
    targets["over-fitted"] = (model, None, "over-fitted")
    for sigma in SIGMAS:
        dp = DPSGD(noise_multiplier=sigma, max_grad_norm=1.0, delta=1e-5, sampling_seed=0, noise_seed=0)
        torch.manual_seed(0)
        model = factory()
        pl.Trainer(max_epochs=epochs_dp, callbacks=[dp], **QUIET).fit(model, loader(x, y, mem, True))
        targets[f"DP-SGD σ = {sigma:g} (ε = {dp.ledger.epsilon():.2f})"] = (model, dp.ledger, f"σ = {sigma:g}")

    refs = {}
    recipes = {"over-fitted": (epochs_overfit, None)}
    recipes.update({f"σ = {sigma:g}": (epochs_dp, sigma) for sigma in SIGMAS})
    for recipe, (epochs, sigma) in recipes.items():
        for k in (1, 2, 4):
            if k > refs_max:
                continue
            kw = dict(max_epochs=epochs)
            if sigma is not None:  # the target's recipe: DP-SGD with the same σ, C, δ and expected batch; no fixed
                # seeds: copied into every reference, one seed would give them all the same masks and noise
                kw["callbacks"] = [DPSGD(noise_multiplier=sigma, max_grad_norm=1.0, delta=1e-5)]
            refs[("offline", recipe, k)] = train_references(factory, population, num_references=k, trainer_kwargs=kw)
            if k >= 2:
                # Carlini et al.'s setting: references on random halves of the audited rows alone (as many rows
                # as the target), so each audited row is IN half of them
                refs[("online", recipe, k)] = train_references(
                    factory,
                    loader(x, y, slice(0, 0)),
                    num_references=k,
                    trainer_kwargs=kw,
                    targets=(members, nonmembers),
                )
            print(f"{name}: references for {recipe}, k = {k} trained", file=sys.stderr, flush=True)
    for label, (model, ledger, recipe) in targets.items():
        attacks = [("LOSS", "loss", None)]
        attacks += [
            (f"LiRA offline, {k} ref", "lira", refs[("offline", recipe, k)]) for k in (1, 2, 4) if k <= refs_max
        ]
        attacks += [(f"LiRA online, {k} ref", "lira", refs[("online", recipe, k)]) for k in (2, 4) if k <= refs_max]
        attacks += [
            (f"RMIA offline, {k} ref", "rmia", refs[("offline", recipe, k)]) for k in (1, 2, 4) if k <= refs_max
        ]
        for attack_label, attack, ref in attacks:
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = audit_membership(
                    model,
                    members,
                    nonmembers,
                    attack=attack,
                    references=ref,
                    population_loader=population,
                    ledger=ledger,
                    claim=ledger,
                )
            seconds = time.perf_counter() - start
            per_ref = np.mean(ref.seconds) if ref is not None and ref.seconds else float("nan")
            inside = "—" if ledger is None else ("**OUTSIDE**" if r.outside else "inside")
            bounds = "" if ledger is None else " / ".join(f"{b:.3f}" for b in r.ledger_tpr_bounds)
            verdict = "—" if r.verdict is None else r.verdict
            out_rows.append(
                (
                    name,
                    label,
                    attack_label,
                    r.auc,
                    *(p.tpr for p in r.tpr),
                    r.epsilon["epsilon_lower"],
                    per_ref,
                    seconds,
                    inside,
                    bounds,
                    verdict,
                )
            )
            if (
                ledger is not None
                and attack == "rmia"
                and not figure_done
                and "σ = 2 " in label
                and ref is not None
                and len(ref) == refs_max
            ):
                r.figure().savefig(RESULTS / "membership_attacks_dp.png", dpi=110)
                figure_done = True
            print(f"{name} | {label} | {attack_label}: AUC {r.auc:.3f}", file=sys.stderr, flush=True)
    return figure_done


def ordering(rows):
    """Per data set and target: does RMIA offline beat LiRA offline at TPR@0.1% and 1% FPR with 1 and 2 refs?"""
    lines = []
    by = {}
    for row in rows:
        by.setdefault((row[0], row[1]), {})[row[2]] = row
    for (data, target), attacks in by.items():
        verdicts = []
        for k in (1, 2):
            rm, li = attacks.get(f"RMIA offline, {k} ref"), attacks.get(f"LiRA offline, {k} ref")
            if rm is None or li is None:
                continue
            for j, fpr in ((4, "0.1%"), (5, "1%")):
                verdicts.append(f"{k} ref @ {fpr}: {'yes' if rm[j] >= li[j] else 'no'} ({rm[j]:.3f} vs {li[j]:.3f})")
        lines.append(f"- {data}, {target}: RMIA ≥ LiRA (offline) — " + "; ".join(verdicts))
    return lines


def tally(rows):
    """Counts over all rows: RMIA offline vs LiRA offline (AUC, TPR@0.1%/1%) and vs LOSS (AUC), per target kind."""
    by = {}
    for row in rows:
        by.setdefault((row[0], row[1]), {})[row[2]] = row
    out = []
    for kind, pick in (("over-fitted", lambda t: t == "over-fitted"), ("DP-SGD", lambda t: t != "over-fitted")):
        auc_lira = auc_loss = low = n_auc = n_low = 0
        for (_, target), attacks in by.items():
            if not pick(target):
                continue
            for k in (1, 2, 4):
                rm, li = attacks.get(f"RMIA offline, {k} ref"), attacks.get(f"LiRA offline, {k} ref")
                if rm is None or li is None:
                    continue
                n_auc += 1
                auc_lira += rm[3] > li[3]
                auc_loss += rm[3] > attacks["LOSS"][3]
                if k <= 2:
                    n_low += 2
                    low += (rm[4] >= li[4]) + (rm[5] >= li[5])
        out.append(
            f"- {kind} targets: RMIA's AUC above LiRA offline's in {auc_lira} of {n_auc} (data set × references), "
            f"above LOSS's in {auc_loss} of {n_auc}; RMIA's TPR ≥ LiRA offline's at FPR 0.1% and 1% with 1–2 "
            f"references in {low} of {n_low}."
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sets and few epochs (smoke run)")
    parser.add_argument("--output", default=str(RESULTS / "membership_attacks.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, figure_done = [], False
    t0 = time.perf_counter()
    if args.quick:
        figure_done = run("Adult", adult(800), 200, 20, 5, 2, rows, True)
    else:
        figure_done = run("Adult", adult(4000), 1000, 100, 30, 4, rows, figure_done)
        figure_done = run("digits", digits(1600), 400, 100, 30, 4, rows, figure_done)
    total = time.perf_counter() - t0
    header = (
        "| data | target | attack | AUC | TPR@0.1% | TPR@1% | TPR@10% | ε lower | s / reference | s / audit | "
        "ledger region (add/remove) | ledger TPR bound @ FPR⁺ (0.1% / 1% / 10%) | verdict (own ledger as claim) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    body = "\n".join(
        f"| {d} | {t} | {a} | {auc:.3f} | {t1:.3f} | {t2:.3f} | {t3:.3f} | {e:.2f} | "
        + ("—" if np.isnan(pr) else f"{pr:.1f}")
        + f" | {s:.1f} | {ins} | {b or '—'} | {v} |"
        for d, t, a, auc, t1, t2, t3, e, pr, s, ins, b, v in rows
    )
    setup = (
        "Adult: 1,000 members, 1,000 non-members, 2,000 population rows (random, disjoint); digits (scikit-learn 8×8): "
        "400 / 400 / 800. Targets: MLP(256, 256), Adam 1e-3, batch 64; over-fitted = 100 epochs without DP; DP-SGD "
        "= 30 epochs, expected batch 64, C = 1, δ = 1e-5. References: the target's recipe (the same MLP and epochs; DP-SGD with the same σ for the DP "
        "targets), on balanced halves of the population (offline) or of the audited rows (online, Carlini et al.'s setting). TPR at FPR ≤ x on the audited rows (threshold read off the same scores); ε lower = Bayesian 95% "
        "interval with a holdout threshold (valid). 'ledger region': every reported point's Clopper–Pearson TPR "
        "lower limit is at most the accountant's bound at its FPR upper limit, for the in/out game these attacks play "
        "(add/remove relation). 'verdict': the target's own ledger as the claim (ROC points and a Clopper–Pearson ε "
        "bound against its add/remove curve and ε, 95% with the multiple comparisons corrected). DP-SGD targets: "
        "`DPSGD(sampling_seed=0, noise_seed=0)`; DP-SGD references: masks and noise seeded from the audit seed and "
        "the reference's index (`train_references`), so every row re-runs to the digit (timing columns aside)."
    )
    if args.quick:
        setup = "QUICK SMOKE RUN (not the published setting)."
    text = "\n".join(
        [
            f"<!-- written by benchmarks/membership_attacks.py{' --quick' if args.quick else ''} in {total / 60:.1f} "
            f"min, {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread -->",
            "",
            setup,
            "",
            header,
            body,
            "",
            "RMIA paper's ordering (RMIA ≥ LiRA at low FPR with few references), counted:",
            "",
            *tally(rows),
            "",
            "Row by row:",
            "",
            *ordering(rows),
            "",
            *([] if args.quick else [WHY_MOVED + compare_previous(rows), ""]),
        ]
    )
    Path(args.output).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

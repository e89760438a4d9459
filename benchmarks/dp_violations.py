"""Do the audits catch a broken DP-SGD? Detection rates of "contradicted" per audit and violation, over seeds.

The claim audited is always the same: DP-SGD with σ = 2, Poisson rate p = 0.1, 300 steps, C = 1 (ε = 4.18 at
δ = 1e-5 from the pessimistic add/remove PLD; Opacus' RDP says 4.56), except in case (e), which claims ε = 1 at
δ = 1e-5. The run that is audited breaks it in one way:

- (a) correct: σ = 2 as claimed (contradicted at most at the rate α = 0.05, by construction);
- (b) the noise is σ/2 = 1 or σ/4 = 0.5 while σ = 2 is claimed;
- (c) clipping is skipped for the canaries' rows: each canary enters the sum with norm 4C instead of C;
- (d) the same Poisson masks every epoch (10 steps) while fresh masks are claimed: a canary (or row) sampled at
  step t of the first epoch is sampled at that step of every epoch;
- (e) no noise at all (the trained runs use σ = 0.001: DPSGD refuses 0), ε = 1 claimed.

Audits: the one-run white-box gradient-canary audit (``CanaryAudit("gradient")``, m = 1000 Dirac canaries each
included with probability 1/2, its default score Σ_t (released noisy sum − the batch's own clipped sum)), with the
claim's verdict of :func:`lightning_privacy.analysis.claims.check_canaries` (Steinke et al.'s binomial ε bound at
the claim's δ against the claim's ε, and Mahloujifar et al.'s f-DP test with the claim's own trade-off curve; α
split between them, Bonferroni over the guess grid) — and, on the trained models, the black-box LOSS attack
(``audit_membership(attack="loss", claim=...)``: ROC points and an ε bound against the claim's add/remove curve).

Two ways to run the gradient-canary audit, both reported:

- **simulated** (``--seeds``, default 200): with the default score the model and data cancel out — what is left of
  canary j is value·(times it was sampled) + N(0, σ²C²) per step — so the scores are drawn directly:
  value·count_j·[included] + σC√T·N(0, 1), count_j ~ Binomial(T, p) (case (d): 30 × Binomial(10, p)). This is the
  distribution the real pipeline produces (its "ideal" column in ``benchmarks/canary_audit.py`` tracks the trained
  runs), at a fraction of the cost, so many seeds fit;
- **trained** (``--trained-seeds``, default 20): real fits through ``DPSGD`` + ``CanaryAudit`` of a small MLP
  (8-128-2, 1,410 trainable coordinates) on 2,000 synthetic rows (batch 200: p = 0.1, 30 epochs = 300 steps), the
  violation made as an auditor would meet it: (b), (e) a DPSGD run at the lower σ; (c) the canaries added at 4C;
  (d) the canaries' Poisson masks repeated every epoch (the data rows' sampling is DPSGD's own, fresh; with the
  default score it does not enter the canaries' scores). LOSS attacks the same models (members: the 2,000
  training rows; non-members: 2,000 more rows never trained on); for (c) and (d) only the canaries' rows break
  the claim, which the LOSS attack does not see, so those cells are marked n/a.

    python benchmarks/dp_violations.py [--seeds 200] [--trained-seeds 20] [--output benchmarks/results/dp_violations.md]

About 10 minutes on one core.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from lightning_privacy.audits import audit_canaries
from lightning_privacy.claims import Claim

RESULTS = Path(__file__).resolve().parent / "results"
SIGMA, RATE, STEPS, M, DELTA, ALPHA = 2.0, 0.1, 300, 1000, 1e-5, 0.05
EPOCH = round(1 / RATE)  # steps per epoch
UNCLIPPED = 4.0  # (c): the canaries' norm when clipping is skipped, in units of C
NO_NOISE = 1e-3  # (e), trained runs: DPSGD needs σ > 0
ROWS, FEATURES, WIDTH = 2000, 8, 128

CASES = [  # (key, label, actual σ, canary value in units of C, repeated masks, claim)
    ("a", "(a) correct: σ = 2 as claimed", SIGMA, 1.0, False, "dp_sgd"),
    ("b2", "(b) noise σ/2 = 1, σ = 2 claimed", SIGMA / 2, 1.0, False, "dp_sgd"),
    ("b4", "(b) noise σ/4 = 0.5, σ = 2 claimed", SIGMA / 4, 1.0, False, "dp_sgd"),
    ("c", "(c) canaries' clipping skipped (norm 4C)", SIGMA, UNCLIPPED, False, "dp_sgd"),
    ("d", "(d) the same Poisson masks every epoch", SIGMA, 1.0, True, "dp_sgd"),
    ("e", "(e) no noise, ε = 1 claimed", 0.0, 1.0, False, "epsilon"),
]


def claims() -> Dict[str, Claim]:
    return {
        "dp_sgd": Claim.dp_sgd(noise_multiplier=SIGMA, sample_rate=RATE, steps=STEPS, delta=DELTA),
        "epsilon": Claim.epsilon_delta(1.0, DELTA),
    }


def _record(result) -> Dict[str, Any]:
    return {
        "contradicted": result.verdict == "contradicted",
        "by": None if result.evidence is None else result.evidence["kind"],
        "binomial": result.epsilon_lower,
        "gdp": result.values["audit/canary_epsilon_lower_gdp"],
    }


# ------------------------------------------------------------------------------------------------ simulated
def simulated(case, seed: int, claim: Claim) -> Dict[str, Any]:
    """The gradient canaries' scores under the case's mechanism, drawn directly (see the module docstring)."""
    key, _, sigma, value, repeat, _ = case
    rng = np.random.default_rng([seed, ord(key[0]), len(key)])
    included = rng.random(M) < 0.5
    if repeat:
        counts = (STEPS // EPOCH) * rng.binomial(EPOCH, RATE, size=M)
    else:
        counts = rng.binomial(STEPS, RATE, size=M)
    scores = value * counts * included + sigma * math.sqrt(STEPS) * rng.standard_normal(M)
    return _record(audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, claim=claim, seed=seed))


def simulated_lr(case, seed: int, claim: Claim, m: int) -> Dict[str, Any]:
    """The same mechanism step by step, scored by the per-step likelihood ratio (``CanaryAudit(score=
    "likelihood_ratio")``): Σ_t log[(1 − p) + p·exp((y_t − 1/2)/σ²)] in units of C, with the claimed σ."""
    key, _, sigma, value, repeat, _ = case
    rng = np.random.default_rng([seed, ord(key[0]), len(key), m])
    included = rng.random(m) < 0.5
    if repeat:
        sampled = np.tile(rng.random((m, EPOCH)) < RATE, STEPS // EPOCH)
    else:
        sampled = rng.random((m, STEPS)) < RATE
    y = value * (sampled & included[:, None]) + sigma * rng.standard_normal((m, STEPS))
    scores = np.logaddexp(np.log1p(-RATE), np.log(RATE) + (y - 0.5) / SIGMA**2).sum(axis=1)
    return _record(audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, claim=claim, seed=seed))


# -------------------------------------------------------------------------------------------------- trained
def trained(case, seed: int, claim: Claim) -> Dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_privacy import DPSGD, CanaryAudit
    from lightning_privacy.audits import audit_membership
    from lightning_privacy.models import TabularMLP

    key, _, sigma, value, repeat, _ = case

    class Violating(CanaryAudit):
        """The canaries of a broken run: added at ``value``·C (clipping skipped) or with masks repeated per epoch."""

        def on_train_start(self, trainer, pl_module):
            super().on_train_start(trainer, pl_module)
            if value != 1.0:
                self._dpsgd = _Scaled(self._dpsgd, value)

        def sampled(self, step: int) -> np.ndarray:
            return super().sampled(step % EPOCH if repeat else step)

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * ROWS, FEATURES, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] + 0.5 * torch.randn(2 * ROWS, generator=g) > 0).long()
    train = DataLoader(TensorDataset(x[:ROWS], y[:ROWS]), batch_size=int(ROWS * RATE), shuffle=True)
    members = DataLoader(TensorDataset(x[:ROWS], y[:ROWS]), batch_size=1000)
    nonmembers = DataLoader(TensorDataset(x[ROWS:], y[ROWS:]), batch_size=1000)
    dpsgd = DPSGD(
        noise_multiplier=sigma or NO_NOISE, max_grad_norm=1.0, delta=DELTA, sampling_seed=seed, noise_seed=seed
    )
    canaries = Violating("gradient", num_canaries=M, seed=seed, alpha=ALPHA, delta=DELTA, claim=claim)
    torch.manual_seed(seed)
    model = TabularMLP(FEATURES, hidden=(WIDTH,), lr=0.5)
    trainer = pl.Trainer(
        max_epochs=STEPS // EPOCH,
        callbacks=[dpsgd, canaries],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train)
        assert dpsgd.ledger.steps == STEPS and abs(dpsgd.sample_rate - RATE) < 1e-12, (dpsgd.ledger.history,)
        loss = audit_membership(model, members, nonmembers, attack="loss", claim=claim, alpha=ALPHA, warn=False)
    out = _record(canaries.result)
    out["loss"] = None if key in ("c", "d") else loss.verdict == "contradicted"
    return out


class _Scaled:
    """DPSGD as the canary hook sees it, with max_grad_norm scaled (the canaries' clipping skipped)."""

    def __init__(self, dpsgd: Any, factor: float) -> None:
        self._inner, self.max_grad_norm = dpsgd, dpsgd.max_grad_norm * factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# ------------------------------------------------------------------------------------------- previous release
# Printed under the tables: why their numbers differ from the previous release's (keep with the script that measures
# them, and rewrite when a change moves them again).
WHY_MOVED = """\
**Why the trained rows moved since the previous release.** Two changes to DP-SGD's randomness. Commit `898a633` made
`DPSGD` draw its Gaussian noise from a private generator (seeded from OS entropy at every fit unless
`DPSGD(noise_seed=...)` fixes it), not from torch's global generator that `torch.manual_seed(seed)` fixes; the trained
runs pass `DPSGD(noise_seed=seed)` beside `sampling_seed=seed`, so a re-run trains the same models. Commit `96bf2ed`
made the Poisson sampler draw each step's rows as geometric gaps between selected rows (O(batch) per step instead of
one coin per row): the same law (every row in every step independently with probability p), but a given
`sampling_seed` now selects other rows than before. So each trained run is another draw of the same mechanism. The
simulated audits draw their scores with numpy from (seed, case) and use neither, so nothing should move their rows;
the likelihood-ratio rows are new in this release."""

# The previous release's rows (simulated: 200 audits per case; trained: 20 seeds per case, DP-SGD with
# `sampling_seed=seed`, the noise from torch's global generator and the per-row-coin sampler before `96bf2ed`), as its
# results file printed them, to say which rows equal it to the digit.
PREVIOUS_ROWS = {
    "simulated": [
        "| (a) correct: σ = 2 as claimed | 4.18 | 0.00 (0/200) | — | 1.12 | 1.49 |",
        "| (b) noise σ/2 = 1, σ = 2 claimed | 4.18 | 0.02 (4/200) | fdp 4 | 2.44 | 3.44 |",
        "| (b) noise σ/4 = 0.5, σ = 2 claimed | 4.18 | 1.00 (200/200) | fdp 200 | 3.88 | 6.01 |",
        "| (c) canaries' clipping skipped (norm 4C) | 4.18 | 1.00 (200/200) | fdp 200 | 3.88 | 6.01 |",
        "| (d) the same Poisson masks every epoch | 4.18 | 0.00 (0/200) | — | 1.30 | 1.78 |",
        "| (e) no noise, ε = 1 claimed | 1.00 | 1.00 (200/200) | fdp 200 | 4.09 | 6.66 |",
    ],
    "trained": [
        "| (a) correct: σ = 2 as claimed | 0.00 (0/20) | — | 1.09 | 1.48 | 0.00 (0/20) |",
        "| (b) noise σ/2 = 1, σ = 2 claimed | 0.00 (0/20) | — | 2.40 | 3.32 | 0.00 (0/20) |",
        "| (b) noise σ/4 = 0.5, σ = 2 claimed | 1.00 (20/20) | fdp 20 | 3.88 | 6.01 | 0.00 (0/20) |",
        "| (c) canaries' clipping skipped (norm 4C) | 1.00 (20/20) | fdp 20 | 3.88 | 6.01 | n/a |",
        "| (d) the same Poisson masks every epoch | 0.00 (0/20) | — | 1.29 | 1.80 | n/a |",
        "| (e) no noise, ε = 1 claimed | 1.00 (20/20) | fdp 20 | 4.09 | 6.66 | 0.00 (0/20) |",
    ],
}


def _compare_previous(table: str, rows: List[str], seeds: int, previous_seeds: int) -> str:
    """Which of a table's rows equal the previous release's to the digit (only with its number of seeds)."""
    if seeds != previous_seeds:
        return ""
    previous = PREVIOUS_ROWS[table]
    same = [r.split(" | ")[0].lstrip("| ") for r in rows if r in previous]
    moved = [r.split(" | ")[0].lstrip("| ") for r in rows if r not in previous]
    text = f" {table.capitalize()}: equal to the previous release's to the digit: {'; '.join(same) or 'no row'}."
    if moved:
        text += f" Moved: {'; '.join(moved)}."
    return text


# ------------------------------------------------------------------------------------------------------ table
def _rate(runs: List[Dict[str, Any]], key: str = "contradicted") -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "n/a"
    return f"{sum(values) / len(values):.2f} ({sum(values)}/{len(values)})"


def _by(runs: List[Dict[str, Any]]) -> str:
    kinds = [r["by"] for r in runs if r["contradicted"]]
    return ", ".join(f"{k} {kinds.count(k)}" for k in ("fdp", "binomial") if kinds.count(k)) or "—"


def _median(runs, key) -> str:
    return f"{statistics.median(r[key] for r in runs):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="simulated audits per case")
    parser.add_argument("--trained-seeds", type=int, default=20, help="trained runs per case (0: none)")
    parser.add_argument("--lr-seeds", type=int, default=100, help="simulated likelihood-ratio audits per case and m")
    parser.add_argument("--output", default=str(RESULTS / "dp_violations.md"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    claim = claims()
    rows_sim, rows_trained = [], []
    for case in CASES:
        c = claim[case[5]]
        runs = [simulated(case, seed, c) for seed in range(args.seeds)]
        rows_sim.append((case, c, runs))
        print(f"simulated {case[1]}: {_rate(runs)}", flush=True)
    rows_lr = []
    for m in (1000, 5000):
        for case in CASES:
            c = claim[case[5]]
            runs = [simulated_lr(case, seed, c, m) for seed in range(args.lr_seeds)]
            rows_lr.append((m, case, c, runs))
            print(f"simulated, likelihood ratio, m = {m}, {case[1]}: {_rate(runs)}", flush=True)
    for case in CASES if args.trained_seeds else ():
        c = claim[case[5]]
        runs = []
        for seed in range(args.trained_seeds):
            t0 = time.perf_counter()
            runs.append(trained(case, seed, c))
            print(f"trained {case[1]}, seed {seed}: {runs[-1]} ({time.perf_counter() - t0:.0f} s)", flush=True)
        rows_trained.append((case, c, runs))
    minutes = (time.perf_counter() - start) / 60

    head = (
        "| case | claim (ε at δ = 1e-5) | contradicted (rate) | decided by | median ε lower, binomial | "
        "median ε lower, Gaussian |\n|---|---|---|---|---|---|"
    )
    lines = [
        f"<!-- written by benchmarks/dp_violations.py in {minutes:.1f} min, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread -->",
        "",
        f"Claim: DP-SGD σ = {SIGMA:g}, p = {RATE:g}, {STEPS} steps (ε = {claim['dp_sgd'].epsilon:.2f} at δ = 1e-5, "
        "pessimistic add/remove PLD); (e) claims (ε = 1, δ = 1e-5). Gradient canaries: m = 1000, α = 0.05 (half to "
        "the binomial ε test, half to the f-DP test of the claim's curve; Bonferroni over 27 guess pairs each). ε "
        "lower bounds at the claim's δ, Bonferroni-corrected (their ceiling for m = 1000: 4.79 binomial, 8.09 "
        "Gaussian).",
        "",
        f"**Simulated** gradient-canary scores ({args.seeds} audits per case):",
        "",
        head,
    ]
    sim_lines = [
        f"| {case[1]} | {c.epsilon:.2f} | {_rate(runs)} | {_by(runs)} | {_median(runs, 'binomial')} | "
        f"{_median(runs, 'gdp')} |"
        for case, c, runs in rows_sim
    ]
    lines += sim_lines
    lines += [
        "",
        f'**Simulated**, the per-step **likelihood-ratio** score (`CanaryAudit(score="likelihood_ratio")`, with the '
        f"claimed σ) instead of the sum, for m = 1000 and m = 5000 canaries ({args.lr_seeds} audits per case and m):",
        "",
        "| case | m | contradicted (rate) | decided by | median ε lower, binomial | median ε lower, Gaussian |",
        "|---|---|---|---|---|---|",
    ]
    for m, case, _, runs in rows_lr:
        lines.append(
            f"| {case[1]} | {m} | {_rate(runs)} | {_by(runs)} | {_median(runs, 'binomial')} | {_median(runs, 'gdp')} |"
        )
    if rows_trained:
        lines += [
            "",
            f"**Trained** runs, DPSGD + CanaryAudit on the synthetic MLP ({args.trained_seeds} seeds per case), and the "
            "LOSS attack on the same models:",
            "",
            "| case | gradient canaries: contradicted | decided by | median ε lower, binomial | median ε lower, "
            "Gaussian | LOSS attack: contradicted |\n|---|---|---|---|---|---|",
        ]
    trained_lines = [
        f"| {case[1]} | {_rate(runs)} | {_by(runs)} | {_median(runs, 'binomial')} | {_median(runs, 'gdp')} | "
        f"{_rate(runs, 'loss')} |"
        for case, _, runs in rows_trained
    ]
    lines += trained_lines
    comparison = _compare_previous("simulated", sim_lines, args.seeds, 200)
    if trained_lines:
        comparison += _compare_previous("trained", trained_lines, args.trained_seeds, 20)
    lines += ["", WHY_MOVED + comparison]
    text = "\n".join(lines) + "\n"
    Path(args.output).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

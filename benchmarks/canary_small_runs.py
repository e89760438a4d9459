"""The canary audit on short DP-SGD runs of a small MLP: every estimator, and claims of more noise than was used.

The canary-audit guide's "Measured on DP-SGD runs": a TabularMLP (8-128-2, SGD lr 0.5) on 256 rows of a synthetic
task (x ~ N(0, I₈), label x₀ + 0.3·x₁ > 0), Poisson rate p = 0.1 (batch 26), 100 steps, DPSGD at σ (C = 1) with
``CanaryAudit("gradient")``'s 1,000 canaries; both independent scores from each run (the default summed score and the
likelihood ratio, ``canary_estimators.TwoScores``), δ = 1e-5, α = 0.05.

1. σ ∈ {1.5, 1.0, 0.7}, seeds 0–2: every estimator's median — valid for every (ε, δ)-DP mechanism: binomial, the
   f-DP test of the (ε, δ) curve, the order statistics read through that curve, and the audit's headline (the
   largest of the last two at its fixed shares); Gaussian readings (only if the mechanism is μ-GDP): the Gaussian f-DP
   test, the order statistics' μ, the Gaussian model's estimate, and the headline before issue 56 (binomial, gdp and
   orderstat readings at 0.05 / 0.05 / 0.9 of α) — the headline over the accountant's ε, and the run's own ledger
   tested as a claim (on its own PLD curve).
2. A claim of σ = 1 (p = 0.1, 100 steps) against runs at σ ∈ {0.5, 0.7, 1.0}, seeds 0–3: how many runs contradict
   it, with the audit's default tests for independent canaries (binomial, f-DP and order statistics, α split three
   ways) and with the f-DP test alone at all of α.

    OMP_NUM_THREADS=1 python benchmarks/canary_small_runs.py > benchmarks/results/canary_small_runs.md

About three minutes on one core. Progress to stderr, the Markdown to stdout.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from canary_estimators import GAUSSIAN_TIGHTEST, KEYS, SCORES, TwoScores  # noqa: E402  (the estimators; both scores)

from lightning_privacy import DPSGD  # noqa: E402
from lightning_privacy.analysis.canary_fdp import tightest_canary_bound  # noqa: E402
from lightning_privacy.audits.canary import audit_canaries  # noqa: E402
from lightning_privacy.claims import Claim  # noqa: E402
from lightning_privacy.models import TabularMLP  # noqa: E402

DELTA, ALPHA, M, RATE, STEPS = 1e-5, 0.05, 1000, 0.1, 100
SIGMAS, SEEDS = (1.5, 1.0, 0.7), (0, 1, 2)
CLAIMED, NOISES, CLAIM_SEEDS = 1.0, (0.5, 0.7, 1.0), (0, 1, 2, 3)


def data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] + 0.3 * x[:, 1] > 0).long()), batch_size=26, shuffle=True)


def fit(sigma: float, seed: int):
    """One run: (its DPSGD, the canaries' bits, {score: scores})."""
    pl.seed_everything(seed, verbose=False)
    dp = DPSGD(noise_multiplier=sigma, max_grad_norm=1.0, delta=DELTA, sampling_seed=seed, noise_seed=seed)
    audit = TwoScores("gradient", num_canaries=M, seed=seed, alpha=ALPHA, delta=DELTA)
    trainer = pl.Trainer(
        max_epochs=round(STEPS * RATE), callbacks=[dp, audit], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TabularMLP(8, hidden=(128,), lr=0.5), data())
    assert dp.steps == STEPS and abs(dp.sample_rate - RATE) < 1e-12, (dp.steps, dp.sample_rate)
    return dp, audit.included, {"summed": audit.scores, "likelihood ratio": audit.ratio}


def median(values) -> float:
    return statistics.median(values)


def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = []
    for sigma in SIGMAS:
        runs = [fit(sigma, seed) for seed in SEEDS]
        epsilon = runs[0][0].epsilon()
        for score in SCORES:
            found = {name: [] for name in (*KEYS, "before")}
            verdicts = []
            for dp, included, scores in runs:
                result = audit_canaries(
                    scores[score], included, delta=DELTA, alpha=ALPHA, independent=True, claim=dp.ledger
                )
                for name, key in KEYS.items():
                    found[name].append(result.values[key])
                before = tightest_canary_bound(
                    scores=scores[score], included=included, delta=DELTA, alpha=ALPHA, methods=tuple(GAUSSIAN_TIGHTEST),
                    weights=GAUSSIAN_TIGHTEST,
                )  # fmt: skip
                found["before"].append(before.epsilon_lower)
                verdicts.append(result.verdict)
            sound = " / ".join(f"{median(found[n]):.2f}" for n in ("binomial", "fdp", "orderstat"))
            readings = " / ".join(f"{median(found[n]):.2f}" for n in ("gdp reading", "orderstat reading", "gauss"))
            rows.append(
                f"| {sigma:g} ({epsilon:.2f}) | {score} | {sound} | {median(found['headline']):.2f} | "
                f"{median(found['headline']) / epsilon:.2f} | {readings} | {median(found['before']):.2f} | "
                f"{', '.join(sorted(set(verdicts)))} |"
            )
        print(f"σ = {sigma:g}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    claim = Claim.dp_sgd(noise_multiplier=CLAIMED, sample_rate=RATE, steps=STEPS, delta=DELTA)
    claims = []
    for noise in NOISES:
        runs = [fit(noise, seed) for seed in CLAIM_SEEDS]
        for score in SCORES:
            both = sum(
                audit_canaries(s[score], inc, delta=DELTA, alpha=ALPHA, independent=True, claim=claim).verdict
                == "contradicted"
                for _, inc, s in runs
            )
            fdp = sum(claim.check_canaries(s[score], inc, alpha=ALPHA, tests="fdp").contradicted for _, inc, s in runs)
            claims.append(f"| {noise:g} | {score} | {both} of {len(runs)} | {fdp} of {len(runs)} |")
        print(f"claim test, σ = {noise:g}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    print(
        f"Short DP-SGD runs of a small MLP (8-128-2, 256 rows, p = {RATE}, {STEPS} steps, C = 1) with {M} gradient "
        f"canaries, δ = {DELTA:g}, α = {ALPHA}; both independent scores from each run.\n\n"
        f"**Every estimator** (medians of {len(SEEDS)} seeds). Valid for every (ε, δ)-DP mechanism: binomial / f-DP "
        "test of the (ε, δ) curve / order statistics read through it, and the headline (the audit's: the largest of "
        "the last two at 0.9 / 0.1 of α). Gaussian readings, lower bounds only if the mechanism is μ-GDP: Gaussian f-DP "
        "/ order statistics' μ / the Gaussian model's estimate, and the headline before issue 56 (binomial, gdp and "
        "orderstat readings at 0.05 / 0.05 / 0.9 of α). 'ledger': the run's own ledger tested as a claim, on its PLD "
        "curve)\n"
    )
    print(
        "| σ (accountant ε) | score | sound bounds | headline | headline ÷ ε | Gaussian readings | headline before "
        "issue 56 | ledger |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\n**A claim of σ = {CLAIMED:g}** (p = {RATE}, {STEPS} steps) against runs at less noise: runs of "
        f"{len(CLAIM_SEEDS)} seeds that contradict it\n"
    )
    print("| run's σ | score | contradicted (audit's tests, α/3 each) | contradicted (f-DP test alone, all of α) |")
    print("|---|---|---|---|")
    print("\n".join(claims))
    print(
        f"\n<!-- written by benchmarks/canary_small_runs.py in {(time.perf_counter() - started) / 60:.1f} min, "
        f"{datetime.date.today()}, torch {torch.__version__}, 1 thread -->"
    )


if __name__ == "__main__":
    main()

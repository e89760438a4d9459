"""What a canary seen only in the final model can show, at the language-model benchmark's DP fine-tune (issue 50).

A black-box canary (the LM canaries of ``audits/lm_canaries.py``, Panda et al.'s new-token secrets included) is
scored on the last model only. Its best case is a canary whose whole clipped gradient lands on parameters nothing
else moves (a new token's own row) and whose score reads them exactly: with SGD-like accumulation the final model then
holds the sum over the T steps, S = C·(times sampled) + N(0, T·σ²C²) if included and N(0, T·σ²C²) if not — the
summed score of the white-box gradient canaries, the per-step values lost. The pair (S | included, S | excluded) is a
mixture of Gaussians against a Gaussian; dp_accounting's ``from_mixture_gaussian_mechanism`` gives its ε at δ
("last-iterate ε": the most any final-model canary of this kind can show, with unlimited canaries), and m = 1000
simulated ideal canaries give what the audit's estimators show: valid for every (ε, δ)-DP mechanism and for canaries
that share a model, the binomial test and the f-DP test of the (ε, δ) curve (the audit's headline for such canaries);
the Gaussian f-DP reading (only if the mechanism is μ-GDP); and, as references that would apply only to independent
canaries, the order statistics read through the (ε, δ) curve and their Gaussian reading.

Rows: the language-model benchmark's DP full fine-tune (1,000 members + 507 canaries, expected batch 64: p = 1/24,
5 epochs = 120 steps; σ planned for ε) and the same data for 50 epochs (1,200 steps), at ε = 4 and 8, δ = 1e-5,
α = 0.05; each bound ÷ the accountant's ε, median [min, max] over ``--seeds`` seeds.

    python benchmarks/lm_canary_ceiling.py [--seeds 50] > benchmarks/results/lm_canary_ceiling.md

About five minutes on one core.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import time
from functools import cache
from typing import Dict

import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from scipy import stats

from lightning_privacy import names
from lightning_privacy.audits.canary import audit_canaries
from lightning_privacy.ledger import PrivacyLedger

DELTA, ALPHA, M = 1e-5, 0.05, 1000
RATE = 1 / 24  # ⌈(1000 members + 507 canaries) / 64⌉ = 24 batches per epoch
CONFIGS = (("the benchmark's DP fine-tune, 5 epochs", 120), ("the same data, 50 epochs", 1200))
TARGETS = (4.0, 8.0)
COLUMNS = ("binomial", "fdp", "headline", "gdp reading", "orderstat", "orderstat reading")


@cache
def sigma_for(epsilon: float, steps: int) -> float:
    """σ whose accountant ε at δ is at most ``epsilon`` (p = RATE): the ledger's own calibration, as DPSGD plans it."""
    return PrivacyLedger.calibrate(sample_rate=RATE, steps=steps, target_epsilon=epsilon, delta=DELTA)


def _times_sampled(steps: int):
    counts = np.arange(0, int(stats.binom.ppf(1 - 1e-16, steps, RATE)) + 1)
    return counts, stats.binom.pmf(counts, steps, RATE)


def last_iterate_epsilon(sigma: float, steps: int) -> float:
    """ε at δ of S = C·Binomial(T, p) + N(0, Tσ²C²) against N(0, Tσ²C²) (C = 1), both directions (dp_accounting,
    pessimistic estimate)."""
    counts, probs = _times_sampled(steps)
    pld = privacy_loss_distribution.from_mixture_gaussian_mechanism(
        standard_deviation=sigma * math.sqrt(steps),
        sensitivities=counts.astype(float).tolist(),
        sampling_probs=(probs / probs.sum()).tolist(),
        value_discretization_interval=1e-3,
    )
    return float(pld.get_epsilon_for_delta(DELTA))


def ideal_canaries(sigma: float, steps: int, seed: int) -> Dict[str, float]:
    """m ideal final-model canaries' bounds (summed score), shared-model estimators and the order statistics."""
    rng = np.random.default_rng([seed, steps, int(sigma * 1e4)])
    included = rng.random(M) < 0.5
    scores = rng.binomial(steps, RATE, size=M) * included + sigma * math.sqrt(steps) * rng.standard_normal(M)
    shared = audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, seed=seed).values
    alone = audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, seed=seed, independent=True).values
    return {
        "binomial": shared[names.CANARY_EPSILON_LOWER],
        "fdp": shared[names.CANARY_EPSILON_LOWER_FDP],
        "headline": shared[names.CANARY_EPSILON_LOWER_TIGHTEST],
        "gdp reading": shared[names.CANARY_EPSILON_GDP_GAUSSIAN_READING],
        "orderstat": alone[names.CANARY_EPSILON_LOWER_ORDERSTAT],
        "orderstat reading": alone[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING],
    }


def _cell(values) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    args = parser.parse_args()
    started = time.perf_counter()
    print(
        f"The ideal final-model canary: p = 1/24, C = 1, δ = {DELTA:g}, α = {ALPHA}, m = {M}; every value ÷ the "
        f"accountant's ε; bounds: median [min, max] over {args.seeds} seeds. 'headline' is the audit's for canaries "
        "that share a model (the f-DP test of the (ε, δ) curve at all of α: valid for every (ε, δ)-DP mechanism); "
        "'gdp reading' is the Gaussian f-DP test's ε, a lower bound only if the mechanism is μ-GDP (the headline before "
        "issue 56 was the larger of it and the binomial bound at α/2 each); 'orderstat' ((ε, δ) curve) and its Gaussian "
        "reading would apply only to independent canaries.\n"
    )
    print("| run | steps | accountant ε | σ | last-iterate ε ÷ ε | " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * (5 + len(COLUMNS)))
    for label, steps in CONFIGS:
        for epsilon in TARGETS:
            sigma = sigma_for(epsilon, steps)
            ceiling = last_iterate_epsilon(sigma, steps)
            runs = [ideal_canaries(sigma, steps, seed) for seed in range(args.seeds)]
            cells = [_cell([r[c] / epsilon for r in runs]) for c in COLUMNS]
            print(
                f"| {label} | {steps} | {epsilon:g} | {sigma:.3f} | {ceiling / epsilon:.3f} | "
                + " | ".join(cells)
                + " |"
            )
    print(
        f"\n<!-- written by benchmarks/lm_canary_ceiling.py in {(time.perf_counter() - started) / 60:.1f} min, "
        f"{datetime.date.today()} -->"
    )


if __name__ == "__main__":
    main()

"""How often each one-run estimator exceeds the mechanism's true ε (issue 56): the headline against the readings.

Canaries from mechanisms that are (ε₀, 0)-DP but not Gaussian — randomized response (a canary's score is its bit,
kept with probability e^ε₀/(1 + e^ε₀)) and Laplace (its bit plus Laplace noise of scale 1/ε₀) — and from Gaussian ones
(its bit times μ plus N(0, 1); true ε at δ from the Gaussian curve) and summed DP-SGD gradient canaries (its bit times
Binomial(T, q) plus N(0, σ²T); true ε the PLD accountant's of the same q, σ, T); m = 1,000 independent canaries,
α = 0.05, δ = 1e-5, ``--audits`` audits per mechanism. Each cell: the share of audits whose value exceeds the true ε,
with its 95 % Clopper–Pearson interval; the last columns the medians ÷ the true ε.

- valid for every (ε, δ)-DP mechanism: ``binomial`` (Steinke et al.), ``fdp`` (the f-DP test of the (ε, δ) curve),
  ``orderstat`` (order statistics read through the (ε, δ) curve), and the ``headline`` (``audit_canaries``'
  ``audit/canary_epsilon_lower_tightest``, ``independent=True``: fdp and orderstat at 0.9 / 0.1 of α);
- Gaussian readings (lower bounds only if the mechanism is μ-GDP): ``gdp reading``, ``orderstat reading`` and the
  headline before issue 56 (binomial, gdp and orderstat readings at 0.05 / 0.05 / 0.9 of α).

    OMP_NUM_THREADS=1 python benchmarks/canary_soundness.py [--audits 500] > benchmarks/results/canary_soundness.md

About ten minutes on one core at 500 audits.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from canary_estimators import GAUSSIAN_TIGHTEST, KEYS  # noqa: E402  (the same estimators under the same names)

from lightning_privacy.analysis.canary import epsilon_from_mu  # noqa: E402
from lightning_privacy.analysis.canary_fdp import tightest_canary_bound  # noqa: E402
from lightning_privacy.audits.canary import audit_canaries  # noqa: E402
from lightning_privacy.claims import Claim  # noqa: E402

M, ALPHA, DELTA = 1000, 0.05, 1e-5
BEFORE = GAUSSIAN_TIGHTEST  # the headline before issue 56
COLUMNS = ("binomial", "fdp", "orderstat", "headline", "gdp reading", "orderstat reading", "headline before")


def randomized_response(rng: np.random.Generator, epsilon: float) -> Tuple[np.ndarray, np.ndarray]:
    included = rng.random(M) < 0.5
    keep = rng.random(M) < math.exp(epsilon) / (1.0 + math.exp(epsilon))
    return np.where(keep, included, ~included).astype(float), included


def laplace(rng: np.random.Generator, epsilon: float) -> Tuple[np.ndarray, np.ndarray]:
    included = rng.random(M) < 0.5
    return included + rng.laplace(scale=1.0 / epsilon, size=M), included


def gaussian(rng: np.random.Generator, mu: float) -> Tuple[np.ndarray, np.ndarray]:
    included = rng.random(M) < 0.5
    return mu * included + rng.normal(size=M), included


def dp_sgd(rng: np.random.Generator, sigma: float, rate: float = 0.1, steps: int = 300) -> Tuple[np.ndarray, ...]:
    included = rng.random(M) < 0.5
    return rng.binomial(steps, rate, size=M) * included + rng.normal(scale=sigma * math.sqrt(steps), size=M), included


def cases() -> List[Tuple[str, Callable, float, float]]:
    """(label, draw, parameter, true ε at δ)."""
    sgd = Claim.dp_sgd(noise_multiplier=2.07, sample_rate=0.1, steps=300, delta=DELTA).epsilon
    return [
        ("randomized response ε₀ = 1", randomized_response, 1.0, 1.0),
        ("randomized response ε₀ = 2", randomized_response, 2.0, 2.0),
        ("Laplace ε₀ = 1", laplace, 1.0, 1.0),
        ("Laplace ε₀ = 4", laplace, 4.0, 4.0),
        ("Gaussian μ = 1", gaussian, 1.0, epsilon_from_mu(mu=1.0, delta=DELTA)),
        ("Gaussian μ = 2", gaussian, 2.0, epsilon_from_mu(mu=2.0, delta=DELTA)),
        ("DP-SGD q = 0.1, σ = 2.07, T = 300 (summed score)", dp_sgd, 2.07, sgd),
    ]


def one(draw: Callable, parameter: float, rng: np.random.Generator) -> Dict[str, float]:
    scores, included = draw(rng, parameter)
    result = audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, independent=True)
    out = {name: result.values[key] for name, key in KEYS.items()}
    out["headline before"] = tightest_canary_bound(
        scores=scores, included=included, delta=DELTA, alpha=ALPHA, methods=tuple(BEFORE), weights=BEFORE
    ).epsilon_lower
    return out


def rate_cell(over: int, n: int) -> str:
    low = 0.0 if over == 0 else stats.beta.ppf(0.025, over, n - over + 1)
    high = 1.0 if over == n else stats.beta.ppf(0.975, over + 1, n - over)
    return f"{100 * over / n:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=500)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for index, (label, draw, parameter, truth) in enumerate(cases()):
        rng = np.random.default_rng([56, index])
        runs = [one(draw, parameter, rng) for _ in range(args.audits)]
        rates = [rate_cell(sum(r[c] > truth for r in runs), len(runs)) for c in COLUMNS]
        medians = [f"{statistics.median(r[c] for r in runs) / truth:.2f}" for c in ("headline", "orderstat reading")]
        rows.append(f"| {label} | {truth:.2f} | " + " | ".join(rates) + " | " + " / ".join(medians) + " |")
        print(f"{label}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(
        f"Share of one-run audits whose value exceeds the mechanism's true ε (m = {M} independent canaries, α = "
        f"{ALPHA}, δ = {DELTA:g}, {args.audits} audits per row; 95 % Clopper–Pearson intervals). Valid for every (ε, "
        "δ)-DP mechanism: binomial, fdp (f-DP test of the (ε, δ) curve), orderstat ((ε, δ) reading) and the headline "
        "(the audit's `audit/canary_epsilon_lower_tightest`: fdp and orderstat at 0.9 / 0.1 of α). Gaussian readings: "
        "gdp reading, orderstat reading and the headline before issue 56 (binomial, gdp and orderstat readings at "
        "0.05 / 0.05 / 0.9 of α). Last column: median headline ÷ ε and median orderstat reading ÷ ε.\n"
    )
    print("| mechanism | true ε | " + " | ".join(COLUMNS) + " | median ÷ ε (headline / reading) |")
    print("|" + "---|" * (len(COLUMNS) + 3))
    print("\n".join(rows))
    print(
        f"\n<!-- written by benchmarks/canary_soundness.py in {(time.perf_counter() - started) / 60:.1f} min, "
        f"{datetime.date.today()} -->"
    )


if __name__ == "__main__":
    main()

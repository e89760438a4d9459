"""What a canary seen only in the final model can show at the language-model benchmark's DP fine-tune
(``benchmarks/lm_canary_ceiling.py`` → ``benchmarks/results/lm_canary_ceiling.md``; issue 50): the configuration is
the language-model benchmark's own, the last-iterate ε (dp_accounting) agrees with an independent quadrature, a row's
bounds come back to the digit, and the guide quotes the table."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from tests._results import assert_all_printed, load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm_canary_ceiling.md"
GUIDE = ROOT / "docs" / "guides" / "language_models.md"


def _bench():
    return load_benchmark("lm_canary_ceiling")


def _rows() -> dict:
    return {(int(r["steps"]), float(r["accountant ε"])): r for r in markdown_table(RESULTS, "| run |")}


def test_the_configuration_is_the_language_model_benchmarks():
    bench = _bench()
    text = (ROOT / "benchmarks" / "results" / "language_model.md").read_text(encoding="utf-8")
    found = re.findall(
        r"DP-SGD ε = (\d+) with the canaries \(either kind\): σ = ([\d.]+), q = ([\d.]+), (\d+) steps", text
    )
    assert len(found) == 2
    for epsilon, sigma, rate, steps in found:
        assert float(rate) == pytest.approx(bench.RATE, abs=5e-5) and int(steps) == bench.CONFIGS[0][1]
        assert bench.sigma_for(float(epsilon), int(steps)) == pytest.approx(float(sigma), abs=1e-3)


def _quadrature_epsilon(sigma: float, steps: int, rate: float, delta: float) -> float:
    """ε at δ of C·Binomial(T, p) + N(0, s²) vs N(0, s²), both directions, by summing the hockey stick on a grid."""
    s = sigma * math.sqrt(steps)
    counts = np.arange(0, int(stats.binom.ppf(1 - 1e-16, steps, rate)) + 1)
    weights = stats.binom.pmf(counts, steps, rate)
    x = np.linspace(-14 * s, counts[-1] + 14 * s, 200_001)
    log_q = stats.norm.logpdf(x, 0, s)
    log_p = np.logaddexp.reduce(np.log(weights)[:, None] + stats.norm.logpdf(x[None, :], counts[:, None], s), axis=0)
    dx = x[1] - x[0]

    def epsilon(a, b):
        excess = lambda e: np.sum(np.maximum(0.0, np.exp(a) - np.exp(e + b))) * dx - delta  # noqa: E731
        return optimize.brentq(excess, 0.0, 50.0) if excess(0.0) > 0 else 0.0

    return max(epsilon(log_p, log_q), epsilon(log_q, log_p))


def test_the_last_iterate_epsilon_agrees_with_an_independent_quadrature():
    bench = _bench()
    for (steps, epsilon), cells in _rows().items():
        exact = _quadrature_epsilon(float(cells["σ"]), steps, bench.RATE, bench.DELTA) / epsilon
        # the file's value comes from dp_accounting's pessimistic PLD: at or a little above the quadrature
        assert float(cells["last-iterate ε ÷ ε"]) == pytest.approx(exact, abs=2e-3), (steps, epsilon)
        assert float(cells["last-iterate ε ÷ ε"]) < 1  # the final model shows less than the whole mechanism


def test_a_row_comes_back_to_the_digit_and_the_guide_quotes_the_table():
    bench = _bench()
    rows = _rows()
    seeds = int(re.search(r"over (\d+) seeds", RESULTS.read_text(encoding="utf-8")).group(1))
    cells = rows[(120, 8.0)]
    sigma = bench.sigma_for(8.0, 120)
    runs = [bench.ideal_canaries(sigma, 120, seed) for seed in range(seeds)]
    for column in bench.COLUMNS:
        values = [r[column] / 8.0 for r in runs]  # the cell: median [min, max] (bench._cell)
        summary = [statistics.median(values), min(values), max(values)]
        assert_all_printed(summary, cells[column], f"120 steps, ε = 8, {column}")
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())

    def median(steps, epsilon, column):
        return rows[(steps, epsilon)][column].split()[0]

    assert (
        f"even the ideal canary shows {median(120, 4.0, 'headline')} of ε at ε = 4 and {median(120, 8.0, 'headline')} "
        "at ε = 8" in guide
    )
    assert (
        f"its own ε is {rows[(120, 4.0)]['last-iterate ε ÷ ε']} and {rows[(120, 8.0)]['last-iterate ε ÷ ε']} of the "
        "accountant's" in guide
    )
    assert (
        f"With 1,200 steps at the same ε the ideal canary reaches {median(1200, 4.0, 'headline')} and "
        f"{median(1200, 8.0, 'headline')} of ε under the audit's headline ({median(1200, 4.0, 'gdp reading')} and "
        f"{median(1200, 8.0, 'gdp reading')} as the Gaussian f-DP reading" in guide
    )
    assert all(float(median(120, e, "headline")) < 0.25 for e in (4.0, 8.0))  # "below the goal of 0.25"
    assert all(float(median(1200, e, "gdp reading")) >= 0.25 for e in (4.0, 8.0))
    # the headline for canaries that share a model is the f-DP test of the (ε, δ) curve at all of α
    assert all(rows[k]["headline"] == rows[k]["fdp"] for k in rows)

"""``benchmarks/results/neighbour_check_cost.md`` (``benchmarks/neighbour_check_cost.py``, issue 57): the neighbour
check costs at most 3 % of a run's time at the default rate, the shares follow from the measured times, and the file
states the rate the package uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_privacy.dpsgd.neighbours import DEFAULT_RATE, FIRST_STEPS
from tests._results import markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "neighbour_check_cost.md"


def test_the_check_costs_at_most_three_percent_at_the_default_rate():
    assert f"the default rate {DEFAULT_RATE}" in RESULTS.read_text(encoding="utf-8") and FIRST_STEPS == 2
    rows = markdown_table(RESULTS, "| model |")
    assert [r["model"] for r in rows] == ["Adult MLP, batch 256", "token classifier, batch 64"]
    for row in rows:
        step, check = float(row["ms per step"]), float(row["ms per check"])
        assert float(row["check ÷ step"].rstrip("×")) == pytest.approx(check / step, abs=0.06)
        for runs in (1_000, 10_000):
            share = float(row[f"share, T = {runs:,}"].rstrip(" %"))
            expected = 100 * (FIRST_STEPS + DEFAULT_RATE * (runs - FIRST_STEPS)) * check / (runs * step)
            assert share == pytest.approx(expected, abs=0.02) and share <= 3.0

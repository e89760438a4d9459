"""Optimised input canaries against the rows they start from (``benchmarks/input_canary_design.py`` →
``benchmarks/results/input_canary_design.md``): the configuration is the benchmark's, every bound under DP-SGD stays
below the accountant's ε, and the guide's sentences say what the table shows."""

from __future__ import annotations

import re
from pathlib import Path

from tests._results import load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "input_canary_design.md"
GUIDE = ROOT / "docs" / "guides" / "canary_audit.md"


def _rows() -> dict:
    return {(r["recipe"].split(":")[0], r["DP-SGD σ"]): r for r in markdown_table(RESULTS, "| recipe |")}


def _median(cell: str) -> float:
    return float(cell.split(" ")[0])


def _range(cell: str) -> tuple:
    low, high = re.search(r"\[([\d.]+), ([\d.]+)\]", cell).groups()
    return float(low), float(high)


def test_the_table_is_the_benchmarks_configuration():
    bench = load_benchmark("input_canary_design")
    rows = _rows()
    assert set(rows) == {(name, s) for name in bench.RECIPES for s in ("none", "0.5", "2")}
    for name, recipe in bench.RECIPES.items():
        label = rows[(name, "none")]["recipe"]
        assert label == f"{name}: lr {recipe['lr']:g}, batch {recipe['batch']}, {recipe['epochs']} epochs"
    text = RESULTS.read_text(encoding="utf-8")
    assert "m = 1000" in text and "after 60 metagradient steps" in text and "seeds 0, 1" in text


def test_every_bound_under_dp_sgd_is_below_the_accountant():
    for (_, sigma), row in _rows().items():
        if sigma == "none":
            assert row["accountant ε"] == "—"
            continue
        _, epsilon = _range(row["accountant ε"])
        for column in ("default binomial", "default gdp", "optimised binomial", "optimised gdp"):
            assert _range(row[column])[1] <= epsilon
        for column in ("default AUC", "optimised AUC"):
            assert 0.48 <= _range(row[column])[0] and _range(row[column])[1] <= 0.53  # chance: nothing memorised


def test_the_guide_says_what_the_table_shows():
    rows = _rows()
    adam = rows[("adam", "none")]
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())
    sentence = (
        f"raise the binomial bound from {_median(adam['default binomial']):.2f} to "
        f"{_median(adam['optimised binomial']):.2f} and the Gaussian f-DP bound from {_median(adam['default gdp']):.2f} "
        f"to {_median(adam['optimised gdp']):.2f} (medians of two seeds)"
    )
    assert sentence in guide
    assert _range(adam["optimised binomial"])[0] > 2 * _range(adam["default binomial"])[1]  # "2× and more"
    # "Under DP-SGD they show nothing, and neither do the default canaries, at any σ of either recipe"
    for (_, sigma), row in rows.items():
        if sigma != "none":
            assert all(_range(row[c]) == (0.0, 0.0) for c in row if "binomial" in c or "gdp" in c)
    # "In the plain-SGD recipe they show nothing even without DP"
    sgd = rows[("sgd", "none")]
    assert _range(sgd["optimised binomial"]) == (0.0, 0.0) and _range(sgd["optimised gdp"]) == (0.0, 0.0)
    aucs = [
        v for (_, s), r in rows.items() if s != "none" for c in ("default AUC", "optimised AUC") for v in _range(r[c])
    ]
    assert f"(AUC {min(aucs):.2f}–{max(aucs):.2f})" in guide
    assert (
        "not even at ε = 55" in guide.replace("— not", "not") and _range(rows[("sgd", "0.5")]["accountant ε"])[0] > 55
    )

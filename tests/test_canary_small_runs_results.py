"""The canary audit on short DP-SGD runs of a small MLP (``benchmarks/canary_small_runs.py`` →
``benchmarks/results/canary_small_runs.md``): every bound below the accountant's ε and every ledger consistent, the
headline the largest of its tests, a claim row reproduced from its runs, and the guide's sentences true to the
tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._results import load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "canary_small_runs.md"
GUIDE = ROOT / "docs" / "guides" / "canary_audit.md"


def _estimators() -> list:
    return markdown_table(RESULTS, "| σ (accountant ε) |")


def _claims() -> dict:
    rows = markdown_table(RESULTS, "| run's σ |")
    return {(float(r["run's σ"]), r["score"]): r for r in rows}


def _count(cell: str) -> int:
    return int(cell.split(" of ")[0])


def test_every_bound_is_below_the_accountant_and_the_headline_is_its_largest_test():
    rows = _estimators()
    assert len(rows) == 6
    for row in rows:
        epsilon = float(re.search(r"\(([\d.]+)\)", row["σ (accountant ε)"])[1])
        binomial, fdp, orderstat = (float(v) for v in row["sound bounds"].split(" / "))
        readings = [float(v) for v in row["Gaussian readings"].split(" / ")]
        headline, before = float(row["headline"]), float(row["headline before issue 56"])
        assert (
            max(binomial, fdp, orderstat, headline, *readings[:2], before) < epsilon and row["ledger"] == "consistent"
        )
        assert headline <= max(fdp, orderstat) + 0.005 and headline >= binomial - 0.005
        assert float(row["headline ÷ ε"]) == pytest.approx(headline / epsilon, abs=0.006)
        assert before > headline  # the Gaussian reading: tighter here, valid only if the mechanism is μ-GDP


def test_a_claim_row_comes_back_from_its_runs():
    bench = load_benchmark("canary_small_runs")
    from lightning_privacy.audits.canary import audit_canaries
    from lightning_privacy.claims import Claim

    claim = Claim.dp_sgd(noise_multiplier=bench.CLAIMED, sample_rate=bench.RATE, steps=bench.STEPS, delta=bench.DELTA)
    runs = [bench.fit(0.5, seed) for seed in bench.CLAIM_SEEDS]
    for score in bench.SCORES:
        both = sum(
            audit_canaries(s[score], inc, delta=bench.DELTA, independent=True, claim=claim).verdict == "contradicted"
            for _, inc, s in runs
        )
        fdp = sum(claim.check_canaries(s[score], inc, tests="fdp").contradicted for _, inc, s in runs)
        row = _claims()[(0.5, score)]
        assert (both, fdp) == (
            _count(row["contradicted (audit's tests, α/3 each)"]),
            _count(row["contradicted (f-DP test alone, all of α)"]),
        )


def test_the_guide_says_what_the_tables_show():
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())
    rows = _estimators()
    ratios = [float(r["Gaussian readings"].split(" / ")[1]) / float(r["sound bounds"].split(" / ")[0]) for r in rows]
    assert f"the order statistics' Gaussian reading is {min(ratios):.1f}–{max(ratios):.1f}× the binomial bound" in guide
    shares = [float(r["headline ÷ ε"]) for r in rows]
    assert f"shows {min(shares):.2f}–{max(shares):.2f} of ε" in guide
    claims = _claims()
    both, fdp = "contradicted (audit's tests, α/3 each)", "contradicted (f-DP test alone, all of α)"
    # "catches half the claimed noise (σ = 0.5) in every run, with either score, where the f-DP test alone ... none"
    assert all(
        _count(claims[(0.5, s)][both]) == 4 and _count(claims[(0.5, s)][fdp]) == 0
        for s in ("summed", "likelihood ratio")
    )
    # "at σ = 0.7 only the likelihood-ratio score catches it"
    assert _count(claims[(0.7, "likelihood ratio")][both]) == 4 and _count(claims[(0.7, "summed")][both]) == 0
    # "the true σ = 1 is contradicted in no run"
    assert all(_count(claims[(1.0, s)][c]) == 0 for s in ("summed", "likelihood ratio") for c in (both, fdp))
    assert "The order-statistic test catches half the claimed noise (σ = 0.5) in every run" in guide

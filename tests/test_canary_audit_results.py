"""The canary reproduction's published numbers hold in its results file (benchmarks/results/canary_audit.txt): the
accountant column is the package's certified PLD ε for the run (σ, p = 1/11, 330 steps, δ = 1e-5), every canary
bound is a lower bound below it and below the ceiling m canaries allow, and the white-box bound follows the simulated
ideal game while the input canaries say nothing under DP-SGD."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_privacy.ledger import PrivacyLedger
from tests._results import markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "canary_audit.txt"


def _rows() -> dict:
    return {row["σ"]: row for row in markdown_table(RESULTS, "| σ | accountant ε |")}


def _cell(text: str):
    """``mean [min, max]`` → three floats (``None`` for "—")."""
    if text == "—":
        return None
    found = re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", text)
    return tuple(float(v) for v in found.groups())


def test_the_accountant_column_is_the_certified_pld_epsilon_of_the_run():
    rows = _rows()
    assert {"0.3", "0.5", "1", "2", "4"} <= set(rows)
    for sigma in ("0.3", "0.5", "1", "2", "4"):
        ledger = PrivacyLedger(delta=1e-5)
        ledger.step(noise_multiplier=float(sigma), sample_rate=1 / 11, steps=330)
        mean, low, high = _cell(rows[sigma]["accountant ε"])
        assert low == high == mean == pytest.approx(ledger.epsilon(), abs=0.006), sigma
    text = RESULTS.read_text(encoding="utf-8")
    assert "30 epochs, m = 1000 canaries of each kind, δ = 1e-05" in text


def test_every_bound_is_below_the_accountant_and_the_ceiling_and_follows_the_ideal_game():
    text = RESULTS.read_text(encoding="utf-8")
    found = re.search(r"Largest bound m canaries can give: ([\d.]+) \(binomial\), ([\d.]+) \(Gaussian f-DP\)", text)
    ceiling, ceiling_gdp = float(found[1]), float(found[2])
    for sigma, row in _rows().items():
        accountant = _cell(row["accountant ε"])
        for column, cap in (("gradient", ceiling), ("gradient gdp", ceiling_gdp), ("input", ceiling)):
            value = _cell(row[column])
            if value is None:
                continue
            assert value[2] <= cap + 1e-9, (sigma, column)
            if accountant is not None:
                assert value[2] <= accountant[0], (sigma, column)  # a valid lower bound never exceeds the upper one
        if accountant is not None:
            assert _cell(row["input"])[2] == 0.0  # the last model's loss says nothing under DP-SGD here
            grad, ideal = _cell(row["gradient"]), _cell(row["ideal"])
            assert abs(grad[0] - ideal[0]) <= 0.5, sigma  # the implementation adds the noise the accountant assumes
    memorising = _cell(_rows()["none (Adam, batch 256)"]["input"])
    assert memorising[1] > 0.5  # without DP an optimiser that memorises is caught by the same input canaries

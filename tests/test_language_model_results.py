"""The language-model benchmark's published claims hold in its results file (benchmarks/results/language_model.md):
on the over-fitted model without DP the sequence-level LOSS and RMIA audits reach AUC ≥ 0.95 with one score per member
sequence, and every DP-SGD row is inside the accountant's add/remove region."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "language_model.md"


def _audit_rows() -> list:
    text = RESULTS.read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| target | accountant ε | attack |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = [
        dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
        for line in text.splitlines()
        if line.startswith("| over-fitted") or line.startswith("| DP-SGD")
    ]
    return rows


def test_the_over_fitted_model_is_found_by_loss_and_rmia_per_sequence():
    text = RESULTS.read_text(encoding="utf-8")
    members = int(re.search(r"\(([\d,]+) members → ([\d,]+) scores\)", text)[1].replace(",", ""))
    assert members >= 1000  # the acceptance setting: 1,000 member sequences, one score each
    over = {row["attack"].split()[0]: row for row in _audit_rows() if row["target"].startswith("over-fitted")}
    assert float(over["LOSS"]["AUC"]) >= 0.95 and float(over["RMIA"]["AUC"]) >= 0.95
    assert "Min-K%" in over
    assert "acceptance (over-fitted LOSS and RMIA AUC ≥ 0.95): yes" in text


def test_every_dp_row_is_inside_the_accountants_region():
    dp = [row for row in _audit_rows() if row["target"].startswith("DP-SGD")]
    assert len({row["target"] for row in dp}) == 2 and len(dp) == 6  # two ε × (LOSS, Min-K%, RMIA)
    for row in dp:
        assert row["ledger region (add/remove)"] == "inside", row
        bounds = [float(b) for b in row["ledger TPR bound @ FPR⁺ (0.1% / 1% / 10%)"].split(" / ")]
        assert 0.0 < bounds[0] <= bounds[1] <= bounds[2] <= 1.0, row  # the trade-off curve rises with the FPR
    assert "every DP-SGD row inside the accountant's region: yes" in RESULTS.read_text(encoding="utf-8")

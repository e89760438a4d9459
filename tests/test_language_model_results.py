"""The language-model benchmark's published claims hold in its results file (benchmarks/results/language_model.md):
on fine-tunes of a pretrained base without DP, the attacks that take the base as their reference (EZ-MIA, Ref) find
more members than the reference-free ones (LOSS, Min-K%) and than RMIA with references trained from scratch, EZ-MIA
twice LOSS's at 1 % FPR on full fine-tuning, and RMIA with references fine-tuned from the base more than EZ-MIA;
every DP-SGD row is inside the accountant's add/remove region with its ledger consistent; the one-run canary audit,
with random-token and with new-token canaries, contradicts a no-noise full fine-tune claimed at ε = 1 and keeps the
DP-SGD ledgers."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "language_model.md"


def _table(header_start: str) -> list:
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _audits() -> list:
    return _table("| target | accountant ε | attack |")


SCRATCH, TUNED = "RMIA offline, 2 ref trained from scratch", "RMIA offline, 2 ref fine-tuned from the base"


def _cell(target: str, attack: str, column: str) -> float:
    """The ``column`` of the row of ``target`` whose attack name starts with ``attack``."""
    return next(float(r[column]) for r in _audits() if r["target"] == target and r["attack"].startswith(attack))


def test_one_score_per_member_sequence_and_every_attack_on_every_fine_tune():
    text = RESULTS.read_text(encoding="utf-8")
    members = int(re.search(r"\(([\d,]+) members → ([\d,]+) scores\)", text)[1].replace(",", ""))
    assert members >= 1000  # the acceptance setting: 1,000 member sequences, one score each
    targets = {row["target"] for row in _audits()}
    assert targets == {"LoRA, no DP", "full, no DP", "full, DP-SGD ε = 8", "full, DP-SGD ε = 1"}
    for target in targets:
        attacks = [r["attack"].split()[0] for r in _audits() if r["target"] == target]
        rmia = ["RMIA", "RMIA"] if "no DP" in target else ["RMIA"]  # without DP also with references from scratch
        assert attacks == ["LOSS", "Min-K%", "Ref", *rmia, "EZ-MIA"], target
        assert any(r["attack"] == TUNED for r in _audits() if r["target"] == target)
        assert any(r["attack"] == SCRATCH for r in _audits() if r["target"] == target) == ("no DP" in target)
    assert "base: pretrained without DP on" in text


def test_the_base_as_reference_beats_loss_and_rmia_with_references_from_scratch_without_dp():
    for target in ("LoRA, no DP", "full, no DP"):
        for column in ("AUC", "TPR@1%"):
            for attack in ("EZ-MIA", "Ref"):  # the base's two scores: no reference training
                mine = _cell(target, attack, column)
                for other in ("LOSS", "Min-K%", SCRATCH):
                    assert mine >= _cell(target, other, column), (target, column, attack, other)
    assert _cell("full, no DP", "EZ-MIA", "TPR@1%") >= 2 * _cell("full, no DP", "LOSS", "TPR@1%")
    text = RESULTS.read_text(encoding="utf-8")
    assert "RMIA with references trained from scratch on the fine-tunes without DP: yes" in text
    assert "EZ-MIA's TPR@1% at least twice LOSS's on full fine-tuning: yes" in text


def test_what_the_guide_says_about_ezmia_against_the_trained_references_holds():
    # two reference fine-tunes buy RMIA more than EZ-MIA's free reference gives; the base's loss difference is close
    for target in ("LoRA, no DP", "full, no DP"):
        assert _cell(target, "RMIA", "AUC") > _cell(target, "EZ-MIA", "AUC")
        assert _cell(target, "RMIA", "AUC") - _cell(target, "Ref", "AUC") < 0.01
    assert "at least LOSS's and RMIA's: NO" in RESULTS.read_text(encoding="utf-8")


def test_every_dp_row_is_inside_the_accountants_region_and_its_ledger_consistent():
    dp = [row for row in _audits() if "DP-SGD" in row["target"]]
    assert len({row["target"] for row in dp}) == 2 and len(dp) == 10  # two ε × (LOSS, Min-K%, Ref, RMIA, EZ-MIA)
    for row in dp:
        assert row["ledger region (add/remove)"] == "inside", row
        assert row["verdict (true claim)"] == "consistent", row
        bounds = [float(b) for b in row["ledger TPR bound @ FPR⁺ (0.1% / 1% / 10%)"].split(" / ")]
        assert 0.0 < bounds[0] <= bounds[1] <= bounds[2] <= 1.0, row  # the trade-off curve rises with the FPR
    assert "every DP-SGD row inside the accountant's region and its ledger consistent: yes" in RESULTS.read_text(
        encoding="utf-8"
    )


def test_the_canary_audit_contradicts_the_false_claim_and_keeps_the_true_ones():
    rows = {row["target"]: row for row in _table("| target | accountant ε | claim tested |")}
    assert set(rows) == {"LoRA, no DP", "full, no DP", "full, DP-SGD ε = 8", "full, DP-SGD ε = 1"}
    full = rows["full, no DP"]
    assert full["claim tested"].startswith("ε = 1.00") and full["verdict"] == "contradicted"
    assert 1.0 < float(full["ε lower bound"]) <= float(full["ceiling for m"])
    for target in ("full, DP-SGD ε = 8", "full, DP-SGD ε = 1"):
        row = rows[target]
        assert row["verdict"] == "consistent", row
        lower, accountant = float(row["ε lower bound"]), float(row["accountant ε"])
        assert 0.0 <= lower <= accountant  # a valid lower bound never exceeds a true upper bound
        assert abs(float(row["lower bound ÷ claimed ε"]) - lower / accountant) < 2e-3

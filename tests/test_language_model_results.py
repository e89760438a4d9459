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

from tests._results import markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "language_model.md"


def _table(header_start: str) -> list:
    return markdown_table(RESULTS, header_start)


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


def test_what_the_guide_says_about_ezmia_against_the_references_fine_tuned_from_the_base_holds():
    # two reference fine-tunes of the base buy RMIA more than EZ-MIA's free reference gives; Ref is close to RMIA
    for target in ("LoRA, no DP", "full, no DP"):
        assert _cell(target, TUNED, "AUC") > _cell(target, "EZ-MIA", "AUC")
        assert _cell(target, TUNED, "TPR@1%") > _cell(target, "EZ-MIA", "TPR@1%")
        assert _cell(target, TUNED, "AUC") - _cell(target, "Ref", "AUC") < 0.01
    text = RESULTS.read_text(encoding="utf-8")
    assert "- measured, not accepted: EZ-MIA at least Ref (the base's plain loss difference): no;" in text
    assert "minus EZ-MIA: LoRA, no DP: AUC +0.012, TPR@1% +0.093; full, no DP: AUC +0.015, TPR@1% +0.186" in text


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
    table = _table("| canaries | target | accountant ε | claim tested |")
    rows = {(row["canaries"], row["target"]): row for row in table}
    kinds = {kind for kind, _ in rows}
    assert kinds == {"random tokens", "new-token secret (1 of 32)"} and len(rows) == 8
    for kind in kinds:
        full = rows[(kind, "full, no DP")]
        assert full["claim tested"].startswith("ε = 1.00") and full["verdict"] == "contradicted", kind
        assert 1.0 < float(full["ε lower bound"]) <= float(full["ceiling for m"])
        for target in ("full, DP-SGD ε = 8", "full, DP-SGD ε = 1"):
            row = rows[(kind, target)]
            assert row["verdict"] == "consistent", row
            lower, accountant = float(row["ε lower bound"]), float(row["accountant ε"])
            assert 0.0 <= lower <= accountant  # a valid lower bound never exceeds a true upper bound
            assert abs(float(row["lower bound ÷ claimed ε"]) - lower / accountant) < 2e-3


BASES = RESULTS.with_name("language_model_bases.md")


def _bases() -> list:
    return [
        {k: tuple(map(float, v.split(" / "))) if " / " in v else v for k, v in row.items()}
        for row in markdown_table(BASES, "| base | target |")
    ]


def test_base_zero_of_the_bases_table_is_the_benchmarks_own_base():
    pairs = (
        ("LOSS", "LOSS"),
        ("Ref (base)", "Ref"),
        ("RMIA, 2 ref fine-tuned from the base", TUNED),
        ("RMIA, 2 ref from scratch", SCRATCH),
        ("EZ-MIA", "EZ-MIA"),
    )
    for row in (r for r in _bases() if r["base"] == "0"):
        for column, attack in pairs:
            assert row[column] == (_cell(row["target"], attack, "AUC"), _cell(row["target"], attack, "TPR@1%")), column


def test_over_four_bases_the_base_attacks_beat_loss_and_references_from_scratch_and_ezmia_doubles_loss():
    rows = _bases()
    assert {r["base"] for r in rows} == {"0", "1", "2", "3"} and len(rows) == 8
    for row in rows:
        for mine in ("EZ-MIA", "Ref (base)"):
            for other in ("LOSS", "RMIA, 2 ref from scratch"):
                assert row[mine][0] >= row[other][0] and row[mine][1] >= row[other][1], (row["base"], mine, other)
        assert row["RMIA, 2 ref fine-tuned from the base"][0] > row["EZ-MIA"][0]  # by AUC, on every base
        if row["target"] == "full, no DP":
            assert row["EZ-MIA"][1] >= 2 * row["LOSS"][1], row["base"]


def test_the_guide_quotes_the_bases_tables_ranges():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "language_models.md").read_text(encoding="utf-8")
    text = " ".join(guide.split())
    for target, words in (("full, no DP", "on full fine-tuning"), ("LoRA, no DP", "under LoRA")):
        ratios = [float(r["EZ-MIA ÷ LOSS @1%"]) for r in _bases() if r["target"] == target]
        assert f"{min(ratios):.1f}–{max(ratios):.1f}×" in text and words in text

"""The tied-head GPT-2's memory beside ghost clipping's on the untied one (``benchmarks/results/dpsgd_memory_gpt2.txt``,
written by ``benchmarks/dpsgd_memory.py --models gpt2 gpt2_untied``; issue 48): ghost refuses the tied head, auto
trains it in functional mode, and the DP-SGD guide quotes the file's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "dpsgd_memory_gpt2.txt"
GUIDE = ROOT / "docs" / "guides" / "dpsgd.md"


def _rows() -> dict:
    rows = {}
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| gpt2") and len(cells) == 8:
            rows[(cells[0], cells[2])] = cells
    return rows


def test_every_mode_has_a_row_and_ghost_refuses_only_the_tied_head():
    rows = _rows()
    for model in ("gpt2", "gpt2_untied"):
        for mode in ("none", "hooks", "ghost", "functional"):
            assert (model, mode) in rows, (model, mode)
    assert rows[("gpt2", "ghost")][3].startswith("refused: DPSGD(grad_sample_mode='ghost') cannot clip tied parameters")
    assert not rows[("gpt2_untied", "ghost")][3].startswith("refused")
    # the tied GPT-2 has fewer parameters than the untied one by exactly the head (8,000 × 512)
    tied, untied = (float(rows[(m, "none")][1].rstrip(" M")) for m in ("gpt2", "gpt2_untied"))
    assert untied - tied == pytest.approx(8000 * 512 / 1e6, abs=0.1)


def test_the_guide_quotes_the_files_memory():
    rows = _rows()
    text = " ".join(GUIDE.read_text(encoding="utf-8").split())
    functional, ghost, hooks = rows[("gpt2", "functional")], rows[("gpt2_untied", "ghost")], rows[("gpt2", "hooks")]
    assert (
        f"functional mode trains the tied one in {functional[6]} MB added by training (peak {functional[5]} MB), where "
        f"ghost clipping on the untied one adds {ghost[6]} MB (peak {ghost[5]} MB) and per-sample hooks on the tied one "
        f"add {hooks[6]} MB (peak {hooks[5]} MB); functional's step is {functional[4]}× hooks' there"
    ) in text
    assert int(functional[6]) < int(hooks[6])  # what functional mode buys on the tied head


def test_auto_trains_the_benchmarks_tied_gpt2_in_functional_mode():
    transformers = pytest.importorskip("transformers")
    from lightning_privacy.dpsgd.functional import hooks_obstacles

    def gpt2(tied: bool):
        config = transformers.GPT2Config(
            vocab_size=50, n_positions=8, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=tied
        )
        return transformers.GPT2LMHeadModel(config)

    # the tied head is an obstacle to hooks, so auto trains in functional mode (resolve_grad_sample_mode); a fit of a
    # tied GPT-2 in auto mode is one of clipping_exactness.md's rows (tests/test_clipping_exactness.py)
    assert any("is `lm_head.weight` (tied" in reason for reason in hooks_obstacles(gpt2(True)))
    assert not any("tied" in reason for reason in hooks_obstacles(gpt2(False)))

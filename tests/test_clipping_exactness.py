"""The published architectures × modes table of ``benchmarks/clipping_exactness.py`` (issue 48, item 6): no pattern
trains wrong or crashes with a raw framework error in any mode; every pattern trains exactly in functional and auto
mode or is refused (before its first step, or — a use that starts after warm-up — at the sampled later step that
sees it); the sampled later-step check costs at most 3 % at the default rate; and a short re-run agrees with the
file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "clipping_exactness.md"
REFUSED = {  # (what, mode) that DPSGD must refuse in hooks or ghost mode: the rest of those must be exact
    ("`lin.weight` also used by `F.linear`", "hooks"),
    ("`lin.weight` also used by `F.linear`", "ghost"),
    ("output head `h @ embed.weight.T`", "hooks"),
    ("output head `h @ embed.weight.T`", "ghost"),
    ("one Linear applied twice", "ghost"),
    ("GPT-2 (1 layer), full (tied head module)", "ghost"),
    ("`lin.weight` reused by `F.linear` from step 4 on", "hooks"),
    ("`lin.weight` reused by `F.linear` from step 4 on", "ghost"),
    ("stock HF `BertForSequenceClassification`, `.loss`", "hooks"),  # (position ids of shape [1, T])
    ("stock HF `GPT2LMHeadModel` (tied head), `.loss`", "ghost"),
}
STOCK = "stock HF", "ResNet with BatchNorm", "`nn.LSTM` classifier", "torchtext", "torchmetrics"
#: what no mode may train: the model mixes examples (each example's loss alone differs from its loss in the batch), or
#: leaks outside the mechanism (max_norm), or does not compute one function per step (spectral_norm)
NEVER = (
    "`h - h.mean(0)`, reduced loss",
    "`h - h.mean(0)`, per-example losses",
    "`nn.Embedding(max_norm=1.0)`",
    "`nn.utils.spectral_norm(nn.Linear)`",
)


def _rows(text: str):
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip(" |") for cell in row] for row in rows[1:]]


def test_no_pattern_trains_wrong_or_crashes_in_any_mode():
    rows = _rows(RESULTS.read_text())
    assert len(rows) == 136 and {r[1].split(" ")[0] for r in rows} == {"hooks", "ghost", "functional", "auto"}
    for what, mode, outcome, error, *_ in rows:
        assert not outcome.startswith(("WRONG", "CRASH")), (what, mode, outcome)
        assert outcome == "exact" or outcome.startswith("refused"), (what, mode, outcome)
        if outcome == "exact":
            assert float(error) < 1e-5, (what, mode, error)
        if what in NEVER:
            assert outcome.startswith("refused"), (what, mode)


def test_hooks_and_ghost_refuse_what_they_must_and_clip_the_rest_exactly():
    for what, mode, outcome, _error, check, mismatch, *_ in _rows(RESULTS.read_text()):
        if mode not in ("hooks", "ghost") or what in NEVER:
            continue
        if (what, mode) in REFUSED:
            assert outcome.startswith("refused"), (what, mode)
        elif outcome == "exact":  # (per-example losses: each example's gradient; a reduced loss: the sum, and a few
            # examples alone on the same steps)
            assert check.startswith(("autograd per example (vmap)", "sum invariant")), (what, mode, check)
            assert float(mismatch) < 1e-4, (what, mode)


#: what only the forward code shows — a use of a weight outside its layer, `torch.utils.checkpoint` called in
#: `forward`, Hugging Face's position ids of shape [1, T]: auto starts in hooks (nothing in the module's structure says
#: otherwise), its verification disagrees on the first steps or (after warm-up) on a sampled later step, and that step
#: is redone in functional mode before its noise (issue 57 item 1)
FORWARD_CODE_ONLY = {
    "`lin.weight` also used by `F.linear`": 0,
    "output head `h @ embed.weight.T`": 0,
    "`lin.weight` reused by `F.linear` from step 4 on": 4,
    "non-reentrant `torch.utils.checkpoint`": 0,
    "reentrant `torch.utils.checkpoint`": 0,
    "stock HF `BertForSequenceClassification`, `.loss`": 0,
}


def test_functional_and_auto_train_every_pattern_that_does_not_mix_examples():
    """Functional mode and auto (the default) train all but NEVER exactly; auto switches from hooks to functional
    mode where only the forward code shows that hooks cannot clip, at the step that shows it."""
    rows = _rows(RESULTS.read_text())
    for what, mode, outcome, *_ in rows:
        if what in NEVER or not mode.startswith(("functional", "auto")):
            continue
        assert outcome == "exact", (what, mode, outcome)
        if mode.startswith("auto") and what in FORWARD_CODE_ONLY:
            assert mode == f"auto → functional (switched at step {FORWARD_CODE_ONLY[what]})", (what, mode)
    auto = {what: mode for what, mode, *_ in rows if mode.startswith("auto")}
    assert auto["GPT-2 (1 layer), full (tied head module)"] == "auto → functional"
    assert auto["tied LM head (`lm_head.weight is wte.weight`)"] == "auto → functional"
    assert auto["Llama (1 layer), LoRA on q/v"] == "auto → hooks"
    assert auto["torchtext `EmbeddingBag(text, offsets)` classifier"] == "auto → hooks"
    assert sum(what.startswith(STOCK) for what in auto) == 9


def test_the_sampled_later_step_check_costs_at_most_three_percent_at_the_default_rate():
    costs = [row[7] for row in _rows(RESULTS.read_text()) if row[7] not in ("—", "")]
    assert len(costs) >= 40
    values = [float(c.rstrip("%")) for c in costs]
    assert max(values) <= 3.0, sorted(values)[-5:]


@pytest.mark.slow
def test_a_short_rerun_agrees_with_the_published_table():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import clipping_exactness as bench

    rows = bench.main(
        ["--only", "functional_reuse", "padding_idx", "late_reuse", "bilinear", "--steps", "8", "--modes", "hooks",
         "functional", "auto"]
    )  # fmt: skip
    published = {(r[0], r[1].split(" ")[0]): r[2] for r in _rows(RESULTS.read_text())}
    for row in rows:
        what = bench.WHAT[row["architecture"]]
        assert published[(what, row["mode"])].split(" ")[0] == row["outcome"], (what, row["mode"])
        if row["outcome"] == "refused":
            assert re.search(r"exactness check|cannot train|grad_sample_mode", row["message"])

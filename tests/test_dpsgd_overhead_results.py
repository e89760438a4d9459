"""The published cost of each DP-SGD mode (``benchmarks/results/dpsgd_modes.txt``, written by ``benchmarks/dpsgd_overhead.py``; issue 48 item 6): every model has
a row per mode (or the refusal), the functional summary is the breakdown's own ratios, and the DP-SGD guide's claim
about the transformer's goal (functional ≤ 2× hooks, ≤ 3× plain) says what the file shows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "dpsgd_modes.txt"
GUIDE = ROOT / "docs" / "guides" / "dpsgd.md"
MODELS = ("mlp", "cnn", "transformer", "gpt2", "gpt2_lora")
MODES = ("none", "hooks", "ghost", "functional")


def _breakdown():
    steps, refused = {}, {}
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in MODELS and parts[1] in MODES:
            if parts[2] == "refused:":
                refused[(parts[0], parts[1])] = line
            else:
                steps[(parts[0], parts[1])] = float(parts[2])
    return steps, refused


def _summary():
    text = RESULTS.read_text(encoding="utf-8")
    block = text.split("functional mode's step ÷ hooks' step and ÷ the plain step:")[1]
    rows = re.findall(r"^(\w+)\s+([0-9.]+) × hooks\s+([0-9.]+) × none$", block, flags=re.M)
    return {model: (float(h), float(n)) for model, h, n in rows}


def test_every_model_has_a_row_per_mode_or_the_refusal():
    steps, refused = _breakdown()
    for model in MODELS:
        for mode in MODES:
            assert (model, mode) in steps or (model, mode) in refused, (model, mode)
    assert set(refused) == {("gpt2", "ghost")}  # GPT-2's tied head: ghost clipping refuses it, functional trains it
    assert "cannot clip tied parameters" in refused[("gpt2", "ghost")]


def test_the_functional_summary_is_the_breakdown_s_ratio():
    steps, _ = _breakdown()
    summary = _summary()
    assert set(summary) == set(MODELS)
    for model, (hooks, plain) in summary.items():  # (the steps are printed to 0.1 ms, the ratios from the unrounded)
        for ratio, of in ((hooks, "hooks"), (plain, "none")):
            printed = steps[(model, "functional")] / steps[(model, of)]
            assert abs(ratio - printed) <= 0.005 + 0.002 * printed, (model, of, ratio, printed)


def test_the_guide_states_the_transformer_goal_as_measured():
    hooks, plain = _summary()["transformer"]
    met = hooks <= 2.0 and plain <= 3.0
    text = " ".join(GUIDE.read_text(encoding="utf-8").split())
    assert f"{hooks:.2f}× hooks' step and {plain:.2f}× the plain step" in text
    assert ("goal met" in text) == met and ("goal not met" in text) == (not met)

"""``benchmarks/results/clipping_rules.md`` (``benchmarks/clipping_rules.py``, issue 59 item 5): both tasks at ε = 1, 3
and 8, the best fixed C of the grid at least C = 1's accuracy, the count's extra ε recomputed from the ledger's
calibration, and what the guide says about quantile clipping against the best fixed C, as measured."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from lightning_privacy.dpsgd.clipping import split_noise_multiplier
from lightning_privacy.ledger import PrivacyLedger
from tests._results import load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "clipping_rules.md"
# (rows, batch size): the Adult training set and the digits' first 1,400 images
TASKS = ((30162, 256), (1400, 64))


def _mean(cell: str) -> float:
    return float(cell.split("±")[0])


def test_both_tasks_every_epsilon_and_the_best_fixed_c_at_least_c_1():
    bench = load_benchmark("clipping_rules")
    for occurrence in range(2):
        rows = markdown_table(RESULTS, "| ε |", occurrence)
        assert [float(r["ε"]) for r in rows] == list(bench.EPSILONS)
        for row in rows:
            best = row["best fixed C (of the grid; choosing it is not private)"]
            assert _mean(best) >= _mean(row["fixed C = 1"]) - 1e-4
            assert float(re.search(r"C = ([0-9.]+)", best).group(1)) in bench.GRID


def test_the_count_s_extra_epsilon_is_the_ledger_s():
    text = RESULTS.read_text(encoding="utf-8")
    epochs = int(re.search(r"--epochs (\d+)", text).group(1))
    for occurrence, (rows_in_set, batch) in enumerate(TASKS):
        steps_per_epoch = math.ceil(rows_in_set / batch)
        rate, steps = 1 / steps_per_epoch, epochs * steps_per_epoch
        for row in markdown_table(RESULTS, "| ε |", occurrence):
            epsilon = float(row["ε"])
            z = PrivacyLedger.calibrate(sample_rate=rate, steps=steps, target_epsilon=epsilon)
            alone = PrivacyLedger()
            alone.step(noise_multiplier=split_noise_multiplier(z, batch / 20), sample_rate=rate, steps=steps)
            assert float(row["extra ε of the count"]) == pytest.approx(epsilon - alone.epsilon(), abs=6e-4)


def test_the_guide_says_how_far_quantile_clipping_is_from_the_best_fixed_c_on_adult():
    rows = markdown_table(RESULTS, "| ε |", 0)
    best = "best fixed C (of the grid; choosing it is not private)"
    median = [100 * (_mean(r[best]) - _mean(r["quantile (γ = 0.5)"])) for r in rows]
    high = [100 * (_mean(r[best]) - _mean(r["quantile (γ = 0.9)"])) for r in rows]
    guide = " ".join((ROOT / "docs" / "guides" / "dpsgd.md").read_text(encoding="utf-8").split())
    for stated in (
        f"{min(median):.1f}–{max(median):.1f} points below the best fixed C on Adult",
        f"within {max(high):.1f} points of the best fixed C on Adult",
    ):
        assert stated in guide, stated
    assert max(high) <= 1.0  # the goal, at γ = 0.9
    assert all(_mean(r[best]) - _mean(r["fixed C = 1"]) < 0.01 for r in rows)  # "ahead by less than a point"
    assert all(abs(_mean(r["automatic (γ = 0.01)"]) - _mean(r["fixed C = 1"])) < 0.005 for r in rows)  # "matches"


LM = ROOT / "benchmarks" / "results" / "clipping_rules_lm.md"


def test_the_gpt2_lora_rows_and_what_the_guide_says_of_them():
    """``benchmarks/results/clipping_rules_lm.md`` (the issue's third task): every ε, the best fixed C of the grid
    at most C = 1's loss, and the guide's sentences recomputed from the file."""
    bench = load_benchmark("clipping_rules")
    rows = markdown_table(LM, "| ε |", 0)
    assert [float(r["ε"]) for r in rows] == list(bench.EPSILONS)
    best = "best fixed C (of the grid; choosing it is not private)"
    rules = ("fixed C = 1", best, "quantile (γ = 0.5)", "quantile (γ = 0.9)", "automatic (γ = 0.01)")
    spread = 0.0
    for row in rows:
        assert _mean(row[best]) <= _mean(row["fixed C = 1"]) + 1e-4
        assert float(re.search(r"C = ([0-9.]+)", row[best]).group(1)) in bench.GRID
        means = [_mean(row[rule]) for rule in rules]
        stds = [float(row[rule].split("±")[1].split()[0]) for rule in rules]
        spread = max(spread, max(means) - min(means))
        assert max(means) - min(means) <= 2 * max(stds) + 1e-4  # "about two seeds' standard deviations"
    text = LM.read_text(encoding="utf-8")
    base = float(re.search(r"The base \(pretrained without DP\): ([0-9]+\.[0-9]+)", text).group(1))
    plain = float(re.search(r"LoRA without DP, the same epochs: ([0-9]+\.[0-9]+)", text).group(1))
    at_8 = next(r for r in rows if float(r["ε"]) == 8.0)
    guide = " ".join((ROOT / "docs" / "guides" / "dpsgd.md").read_text(encoding="utf-8").split())
    for stated in (
        f"the five columns lie within {spread:.4f} of each other",
        f"at ε = 8 the fine-tune moves the held-out loss {base - _mean(at_8['fixed C = 1']):.4f} below the base's",
        f"where LoRA without DP moves it {base - plain:.4f}",
    ):
        assert stated in guide, stated

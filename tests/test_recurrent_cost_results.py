"""``benchmarks/results/recurrent_cost.md`` (``benchmarks/recurrent_cost.py``, issue 57 item 6): each recurrent model's
functional mode runs as the file says (recomputed: one step of each, which way its per-example passes ran), the
ratios follow from the times printed beside them, vmap is cheaper than the loop it replaced, and the one remaining
loop (packed sequences) is named with its cost."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tests._results import load_benchmark, markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "recurrent_cost.md"


def _rows():
    return {row["model"]: row for row in markdown_table(RESULTS, "| model |")}


def test_the_file_covers_every_model_of_the_benchmark_and_its_ratios_follow_from_its_times():
    bench = load_benchmark("recurrent_cost")
    rows = _rows()
    assert list(rows) == list(bench.MODELS)
    for name, row in rows.items():
        plain, functional, loop = (float(row[k]) for k in ("plain ms", "functional ms", "loop ms"))
        assert float(row["functional ÷ plain"].rstrip("×")) == pytest.approx(functional / plain, rel=0.015, abs=0.06)
        assert float(row["loop ÷ plain"].rstrip("×")) == pytest.approx(loop / plain, rel=0.015, abs=0.06)
        packed = bench.MODELS[name][2]
        assert row["functional runs"] == ("loop" if packed else "vmap")
        if not packed:  # the unrolled layers beat the loop they replaced by far
            assert functional < loop / 1.5, name
    assert rows["LSTM, packed sequences"]["hooks (fix_modules) ms"] == "refused"
    assert "exactness check" in RESULTS.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["GRU", "LSTM, float64", "LSTM, packed sequences"])
def test_functional_mode_runs_each_model_the_way_the_file_says(name):
    bench = load_benchmark("recurrent_cost")
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms, runs = bench.step_ms(name, "functional", bench.WARMUP + 1)
    assert ms is not None and runs == _rows()[name]["functional runs"]


def test_the_guide_states_the_loop_s_cost_as_measured():
    rows = _rows().values()
    loop = [float(r["loop ÷ plain"].rstrip("×")) for r in rows]
    vmap = [float(r["functional ÷ plain"].rstrip("×")) for r in rows if r["functional runs"] == "vmap"]
    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "dpsgd.md"
    text = " ".join(guide.read_text(encoding="utf-8").split())
    stated = f"{round(min(loop))}–{round(max(loop))}× the plain step here, against {round(min(vmap))}–{round(max(vmap))}× for vmap"
    assert stated in text, stated

"""benchmarks/gpu_check.py cannot rot: its CPU smoke runs the same code on a tiny GPT-2 (under 2 minutes), and the
report's GPU-only parts (peak memory, a run out of memory, missed goals) are rendered from made-up GPU numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_privacy.dpsgd.bookkeeping import PROFILER_RANGE

pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = (
    "## CUDA-marked tests",
    "## One optimizer step: plain vs DPSGD ghost (book-keeping) vs hooks",
    "## Ratios against the issue's goals",
    "## Noise generation",
    "## Profiles",
)


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_smoke_runs_every_part_and_writes_the_report(tmp_path):
    out, numbers = tmp_path / "gpu.md", tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--json", str(numbers)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text, info = out.read_text(), json.loads(numbers.read_text())
    assert text.startswith("# GPU check") and "CPU smoke" in text and "it measures nothing about a GPU" in text
    assert all(section in text for section in SECTIONS)
    assert info["smoke"] and info["device"] == "cpu" and info["seconds"] > 0  # (about 40 s on an idle 2-core CPU)
    tests = info["tests"]  # the CUDA tests skip on the CPU, and nothing broke on the way
    assert tests["skipped"] > 10 and tests["passed"] == tests["failed"] == tests["errors"] == 0 and not tests["notes"]
    assert [(r["setting"], r["mode"]) for r in info["runs"]] == [
        ("lora", "plain"), ("lora", "ghost"), ("lora", "hooks"),
        ("full", "plain"), ("full", "ghost"), ("full", "ghost-split"), ("full", "functional"), ("full", "hooks"),
        ("tied", "plain"), ("tied", "functional"), ("tied-checkpointed", "plain"), ("tied-checkpointed", "functional"),
    ]  # fmt: skip
    for run in info["runs"]:
        assert run["batch"] == 4 and len(run["steps_ms"]) == info["scale"]["steps"] and min(run["steps_ms"]) > 0
        assert all(len(v) == len(run["steps_ms"]) and min(v) > 0 for v in run["phases_ms"].values())
        assert run["trainable"] > 0  # functional mode's note: vmap ran the stock GPT-2 (SDPA, checkpointing too)
        note = {"functional": "vmap", "ghost-split": "products: split (emulated in float32)"}.get(run["mode"], "")
        assert run["note"] == note, run["note"]  # (ghost-split: bf16 autocast's captures, CUDA's product elsewhere)
        # (ghost: no "second 16-bit pass" note: book-keeping formed every step's sum, so the times are its)
        assert (run["mode"] == "plain") != bool(run["profile"])  # one profiled step per DP run
    # book-keeping's clipped sums (one weight product per layer) have their own range in the ghost runs' profiles
    for setting, mode in (("full", "ghost"), ("full", "ghost-split"), ("lora", "ghost")):
        ghost = next(r for r in info["runs"] if (r["setting"], r["mode"]) == (setting, mode))
        (kept,) = [p for p in ghost["profile"] if p.get("range")]
        assert kept["op"] == PROFILER_RANGE and kept["ms"] > 0 and kept["calls"] == 1 and 0 < kept["share"] < 1
    assert text.count(f"| *`{PROFILER_RANGE}`* |") == 3
    assert [(q["setting"], q["mode"]) for q in info["ratios"]] == [
        ("lora", "ghost"), ("lora", "hooks"), ("full", "ghost"), ("full", "ghost-split"), ("full", "functional"),
        ("full", "hooks"),
        ("tied", "functional"), ("tied-checkpointed", "functional"),
    ]  # fmt: skip
    for q in info["ratios"]:
        assert math.isfinite(q["time"]) and q["time"] > 0 and not q["per_row"] and q["memory"] is None
        assert (q["time_goal"] is None) == ((q["setting"], q["mode"]) in (("full", "hooks"), ("full", "functional")))
        assert f"| {q['mode']} ÷ plain, {q['setting']} | {q['time']:.2f}× |" in text
    assert [n["ms"] > 0 for n in info["noise"]] == [True] * 4
    assert "takes" in text and "of the plain step" in text  # the noise of one full step against the step
    assert not info["failures"] and not info["skipped"]


def test_a_cpu_run_never_writes_the_committed_results():
    results = ROOT / "benchmarks" / "results" / "gpu.md"
    before = results.read_bytes() if results.exists() else None
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(results)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "never writes benchmarks/results/gpu.md" in done.stderr
    assert (results.read_bytes() if results.exists() else None) == before


def _run(setting, mode, batch, step, peak, note=""):
    return {
        "setting": setting, "mode": mode, "batch": batch, "steps_ms": [step, step * 1.1, step * 0.9] if step else [],
        "phases_ms": {"forward": [step / 3] * 3, "backward": [step / 2] * 3, "optimizer": [step / 6] * 3} if step else {},
        "peak_memory": peak, "trainable": 1000, "note": note,
        "profile": [{"op": "aten::mm", "ms": 1.0, "share": 0.5, "calls": 3}] if mode != "plain" and step else [],
    }  # fmt: skip


def test_the_report_of_a_gpu_run_compares_memory_and_names_what_missed_its_goal():
    gpu_check = _script()
    runs = [
        _run("lora", "plain", 64, 100.0, 1000 * 2**20),
        _run("lora", "ghost", 64, 105.0, 1080 * 2**20),  # 1.05×, +8 %: both goals met
        _run("lora", "hooks", 64, 140.0, 1500 * 2**20),  # 1.4×: missed
        _run("full", "plain", 64, 200.0, 4000 * 2**20),
        _run("full", "ghost", 32, 118.0, 3000 * 2**20, note="out of memory at batch 64"),  # per row: 1.18×
        _run("full", "ghost-split", 64, 230.0, 4500 * 2**20, note="products: split"),  # 1.15×, but +12 % memory
        _run("full", "hooks", 8, 0.0, None, note="out of memory at batch 64; …; out of memory at batch 16"),
    ]
    ratios = gpu_check.ratios([gpu_check.Run(**r) for r in runs])
    by = {(q["setting"], q["mode"]): q for q in ratios}
    assert set(by) == {("lora", "ghost"), ("lora", "hooks"), ("full", "ghost"), ("full", "ghost-split")}  # not failed
    assert by["lora", "ghost"]["time"] == pytest.approx(1.05) and by["lora", "ghost"]["memory"] == pytest.approx(1.08)
    assert by["lora", "ghost"]["time_met"] and by["lora", "ghost"]["memory_met"]
    assert by["lora", "hooks"]["time_met"] is False and by["lora", "hooks"]["memory_met"] is None  # no memory goal
    full = by["full", "ghost"]
    assert full["per_row"] and full["time"] == pytest.approx(1.18) and full["memory"] is None
    split = by["full", "ghost-split"]  # ghost's goals, memory's too
    assert split["time_met"] and split["memory"] == pytest.approx(1.125) and split["memory_met"] is False
    info = {
        "smoke": False, "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3 (79 GiB, 132 SMs)",
        "date": "2026-11-27", "seconds": 300.0, "runs": runs, "ratios": ratios, "batches": {"lora": 64, "full": 64},
        "skipped": [], "failures": ["noise rates failed: RuntimeError: x"],
        "versions": {"torch": "2.11.0+cu130", "CUDA": "13.0", "python": "3.12.3", "lightning": "2.6.6",
                     "opacus": "1.6.0", "transformers": "5.17.0", "peft": "0.18.0", "lightning_privacy": "0.2.0",
                     "commit": "abc1234"},
        "scale": vars(gpu_check.GPU) | {"model": {}},
        "noise": [{"what": "draw", "numbers": 2**27, "ms": 1.0}],
        "tests": {"commands": ["pytest -m cuda tests"], "passed": 19, "failed": 1, "errors": 0, "skipped": 0,
                  "failures": ["tests.test_cuda::test_x"], "collection_errors": [], "notes": [], "tail": "E boom",
                  "seconds": 60.0},
    }  # fmt: skip
    text = gpu_check.report(info)
    assert "CPU smoke" not in text and "NVIDIA H100 80GB HBM3" in text and "torch 2.11.0+cu130, CUDA 13.0" in text
    assert "19 passed, 1 failed" in text and "- failed: `tests.test_cuda::test_x`" in text and "E boom" in text
    assert "| peak memory ghost ÷ plain, lora | 1.08× (+8 %) | ≤ 1.10× (+10%) | yes |" in text
    assert "| hooks ÷ plain, lora | 1.40× | ≤ 1.3× | **no** |" in text
    assert "| ghost ÷ plain, full (per row: another batch) | 1.18× | ≤ 1.25× | yes |" in text
    assert "| peak memory ghost ÷ plain, full | n/a |" in text
    assert "| peak memory ghost-split ÷ plain, full | 1.12× (+12 %) | ≤ 1.10× (+10%) | **no** |" in text
    assert "Missed: hooks lora, ghost-split full." in text
    assert "| full | hooks | 1,000 | 8 | — |" in text and "out of memory at batch 16" in text
    assert "| 1,000 | 64 | 100.000 | 1.5625 |" in text and "| 1,080 |" in text  # MiB
    assert "## Failures" in text and "noise rates failed" in text
    assert "one step's noise for full fine-tuning (1,000 coordinates)" in text


def test_the_committed_gpu_results_are_consistent():
    """The first GPU run's file (an H200): each ratio is the step table's times divided, as printed."""
    text = (ROOT / "benchmarks" / "results" / "gpu.md").read_text()
    assert "device: NVIDIA" in text and "18 passed, 2 failed" in text and "3 passed" in text  # (the fix, rerun)
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 11 and cells[0] in ("lora", "full") and cells[1] in ("plain", "ghost", "hooks"):
            rows[cells[0], cells[1]] = (float(cells[4].replace(",", "")), float(cells[9].replace(",", "")))
    assert len(rows) == 6
    for setting in ("lora", "full"):
        ghost = rows[setting, "ghost"][0] / rows[setting, "plain"][0]
        assert f"| ghost ÷ plain, {setting} | {ghost:.2f}× |" in text
    memory = rows["lora", "ghost"][1] / rows["lora", "plain"][1]
    assert f"| peak memory ghost ÷ plain, lora | {memory:.2f}× (+{(memory - 1) * 100:.0f} %) |" in text

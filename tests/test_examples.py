"""The example scripts run end to end with their smallest settings (subprocess, one thread, tmp dirs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_adult_dpsgd(tmp_path):
    logdir = tmp_path / "logs"
    out = _run("adult_dpsgd.py", "--epochs", "1", "--target", "0.95", "--logdir", str(logdir), cwd=tmp_path)
    assert "epoch  val acc   β*_MIA" in out
    assert "stopped by the budget after step" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert rows and 0.5 < float(rows[0][1]) <= 1 and float(rows[0][2]) >= 0.95
    assert list(logdir.rglob("last.ckpt")) and list(logdir.rglob("best-*.ckpt"))


@pytest.mark.slow
def test_audit_checkpoint(tmp_path):
    logdir = tmp_path / "logs"
    out = _run("audit_checkpoint.py", "--epochs", "1", "--helper-epochs", "2", "--logdir", str(logdir), cwd=tmp_path)
    assert "audit/epsilon_star " in out and "PANORAMIA audit: eps_tilde" in out
    assert "Summary (same checkpoint, no retraining)" in out
    checkpoint = logdir / "audit_checkpoint" / "model.ckpt"
    assert checkpoint.is_file() and (logdir / "audit_checkpoint" / "panoramia.json").is_file()
    # the same checkpoint audited again, without training
    again = _run(
        "audit_checkpoint.py",
        "--checkpoint",
        str(checkpoint),
        "--helper-epochs",
        "2",
        "--logdir",
        str(tmp_path / "again"),
        cwd=tmp_path,
    )
    assert "trained" not in again and "audit/epsilon_star " in again


@pytest.mark.slow
def test_adult_canary_audit(tmp_path):
    logdir = tmp_path / "logs"
    args = ("--epsilon", "8", "--epochs", "2", "--canaries", "200", "--logdir", str(logdir))
    out = _run("adult_canary_audit.py", *args, cwd=tmp_path)
    values = {}
    for line in out.splitlines():
        for key in (
            "accountant ε (upper bound",
            "canary ε lower bound (any mechanism)",
            "canary ε lower bound, binomial",
            "Epsilon* (estimate",
        ):
            if line.startswith(key):
                values[key] = float(line.split()[-1] if "budget" not in line else line.split("(budget")[0].split()[-1])
    assert 0 < values["accountant ε (upper bound"] <= 8.0  # the ε budget held
    assert 0 <= values["canary ε lower bound, binomial"] <= values["accountant ε (upper bound"]
    assert 0 <= values["canary ε lower bound (any mechanism)"] <= values["accountant ε (upper bound"]
    assert list(logdir.rglob("privacy_report.md"))


@pytest.mark.slow
def test_fsdp2_example_under_torchrun(tmp_path):
    """``torchrun --nproc_per_node=2 examples/fsdp2.py``: FSDP2 with validation and checkpoints counts each step once."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    from tests._launch import _free_port

    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    command += [str(EXAMPLES / "fsdp2.py"), "--epochs", "1", "--batch-size", "2048", "--logdir", str(tmp_path / "ck")]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("FSDP2 on 2 ranks:")]
    steps = int(line.split(": ")[1].split(" optimizer steps")[0])
    assert f"ledger {steps} steps" in line and 10 <= steps <= 18  # 27,146 rows / 2048: ~13 Poisson steps
    assert "view tensor" not in proc.stdout + proc.stderr
    assert (tmp_path / "ck" / "last.ckpt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_dp_lora_language_model(tmp_path, mode):
    """LoRA fine-tuning of the tiny GPT-2 under DP-SGD trains in both gradient modes, logs ε and audits per sequence."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    args = ("--grad-sample-mode", mode, "--members", "96", "--epochs", "2", "--references", "1", "--logdir", "logs")
    out = _run("dp_lora_language_model.py", *args, cwd=tmp_path)
    before, after = (float(v) for v in re.search(r"member loss: ([\d.]+) before -> ([\d.]+) after", out).groups())
    assert after < before - 0.005  # it trained
    epsilon = float(re.search(r"accountant ε at δ = 1e-05: ([\d.]+) \(budget 8\)", out)[1])
    assert 7.0 < epsilon <= 8.0  # planned for the budget, never over it
    assert f"DP-SGD ({mode}): σ = " in out and "LoRA r = 8 on c_attn/c_proj" in out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] in (["rmia"], ["loss"], ["min-k%"])
    }
    assert set(rows) == {"rmia", "loss", "min-k%"}
    for row in rows.values():
        assert 0.0 <= float(row[1]) <= 1.0 and row[-1] == "yes"  # AUC; every point inside the accountant's region
    report = next((tmp_path / "logs").rglob("privacy_report.md")).read_text()
    assert "Membership attack (RMIA/LiRA/LOSS)" in report and "Sequence-level MIN-K% attack" in report


@pytest.mark.slow
def test_dp_lora_language_model_full_fine_tuning_in_ghost_mode_is_refused_naming_the_tied_embedding(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    script = str(EXAMPLES / "dp_lora_language_model.py")
    args = ["--full", "--grad-sample-mode", "ghost", "--members", "16", "--epochs", "1", "--logdir", "logs"]
    proc = subprocess.run([sys.executable, script, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "cannot clip tied parameters (`model.transformer.wte.weight` is `model.lm_head.weight`" in proc.stderr

"""The example scripts run end to end with their smallest settings (subprocess, one thread, tmp dirs)."""

from __future__ import annotations

import os
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
        for key in ("accountant ε (upper bound", "canary ε lower bound, binomial", "Epsilon* (estimate"):
            if line.startswith(key):
                values[key] = float(line.split()[-1] if "budget" not in line else line.split("(budget")[0].split()[-1])
    assert 0 < values["accountant ε (upper bound"] <= 8.0  # the ε budget held
    assert 0 <= values["canary ε lower bound, binomial"] <= values["accountant ε (upper bound"]
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

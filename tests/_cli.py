"""The installed ``lightning-privacy`` console script, run as a user runs it (a subprocess), for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).parent / "lightning-privacy")


def run_cli(*args, cwd, extra_path=None, timeout=600) -> subprocess.CompletedProcess:
    """``lightning-privacy *args`` in ``cwd`` (``extra_path`` prepended to PYTHONPATH), output captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def cli_warnings(stderr: str, command: str) -> list:
    """The ``lightning-privacy COMMAND: warning: …`` lines of ``stderr``, without their prefix."""
    prefix = f"lightning-privacy {command}: warning: "
    return [line[len(prefix) :] for line in stderr.splitlines() if line.startswith(prefix)]

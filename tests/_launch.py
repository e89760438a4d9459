"""Run a test's worker function under ``torchrun`` on CPU/gloo: DDP as users launch it (a script per rank).

``run_ddp("tests.callbacks.test_x:_worker", tmp_path, nprocs=2, kwargs)`` starts ``python -m torch.distributed.run``
with ``nprocs`` processes per node (``nnodes=2`` starts two torchrun "nodes" on localhost, one process each); every
rank calls ``_worker(**kwargs)``, which builds its own ``Trainer(strategy="ddp", ...)`` (Lightning sees torchrun's
environment and does not launch processes itself), and returns something ``torch.save`` can store. The results come
back ordered by global rank; a rank's failure fails the test with that rank's output.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import torch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds for one launch; a desynchronised run hangs in a collective and is killed here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(target: str, tmp_path: Path, *, nprocs: int = 2, nnodes: int = 1, **kwargs: Any) -> List[Any]:
    """Results of ``target(**kwargs)`` on every rank (see the module docstring)."""
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "launch.json"
    spec.write_text(json.dumps({"target": target, "kwargs": kwargs, "out": str(tmp_path)}))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    port = _free_port()
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--node_rank={node}",
            f"--nproc_per_node={nprocs}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "-m",
            "tests._launch",
            str(spec),
        ]
        for node in range(nnodes)
    ]
    procs = [
        subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in commands
    ]
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"torchrun did not finish within {TIMEOUT} s (ranks out of step?)") from None
        outputs.append(out)
    for node, (proc, out) in enumerate(zip(procs, outputs)):
        (tmp_path / f"torchrun-node{node}.log").write_text(out)
        if proc.returncode != 0:
            raise AssertionError(failure_report(proc.returncode, out, tmp_path / f"torchrun-node{node}.log"))
    world = nprocs * nnodes
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


KEPT_LINES = 400  # of a failed launch's output in the test's message (the whole output is in the log file)


def failure_report(returncode: int, output: str, log: Path) -> str:
    """A failed launch, as the test's message: torchrun's root-cause section (each failed rank's exit code or signal
    and, through ``record``, its traceback) first, then the output's last lines, every rank's included."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "Root Cause" in line or "Failures:" in line), None)
    cause = lines[max(0, start - 2) :] if start is not None else []
    return (
        f"torchrun exited with {returncode} (whole output in {log}).\n"
        + ("torchrun's failure summary:\n" + "\n".join(cause[:120]) + "\n" if cause else "")
        + f"last {KEPT_LINES} lines of the output:\n"
        + "\n".join(lines[-KEPT_LINES:])
    )


def _main(spec_path: str) -> None:
    import importlib

    spec = json.loads(Path(spec_path).read_text())
    module, name = spec["target"].split(":")
    result = getattr(importlib.import_module(module), name)(**spec["kwargs"])
    torch.save(result, Path(spec["out"]) / f"rank{os.environ['RANK']}.pt")
    # Leave the process group in step and skip the interpreter's teardown: on a loaded 2-core machine a gloo/FSDP2
    # background thread was seen to abort the process at exit ("terminate called without an active exception")
    # after its result was saved, failing a run that had finished.
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    torch.set_num_threads(1)
    record(_main)(sys.argv[1])  # a rank's exception reaches torchrun's root-cause section with its traceback

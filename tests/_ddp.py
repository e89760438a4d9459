"""Run a function in two CPU processes joined by a gloo process group (for metric/DDP tests)."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, queue) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    queue.put((rank, fn(rank, world_size, *args)))  # SimpleQueue writes to its pipe at once (no feeder thread)
    dist.barrier()
    dist.destroy_process_group()
    # Skip the interpreter's teardown, as tests/_launch.py does: a gloo background thread was seen to abort a
    # finished process at exit ("terminate called without an active exception") on a loaded 2-core machine.
    os._exit(0)


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list:
    """Call ``fn(rank, world_size, *args)`` on every rank; return the results ordered by rank.

    ``fn`` must be a module-level function (it is pickled) and return something picklable.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        _worker, args=(world_size, _free_port(), fn, args, queue), nprocs=world_size, join=True, start_method="spawn"
    )
    results = dict(queue.get() for _ in range(world_size))
    return [results[r] for r in range(world_size)]

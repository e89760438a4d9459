import torch
import torch.distributed as dist

from tests._ddp import run_distributed


def _sum_ranks(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t)


def test_run_distributed_all_reduce():
    assert run_distributed(_sum_ranks) == [3.0, 3.0]

"""Poisson sampling for DP-SGD: moved to :mod:`lightning_privacy.dpsgd.sampling` (re-exported here)."""

from lightning_privacy.dpsgd.sampling import (
    PoissonBatchSampler,
    PoissonDataLoader,
    draw_seed,
    empty_batch_like,
    global_mask,
    global_rows,
    secure_rows,
)

__all__ = [
    "PoissonBatchSampler",
    "PoissonDataLoader",
    "draw_seed",
    "empty_batch_like",
    "global_mask",
    "global_rows",
    "secure_rows",
]

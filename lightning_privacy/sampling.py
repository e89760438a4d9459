"""Deprecated (removed in 0.4.0): Poisson sampling for DP-SGD, moved to :mod:`lightning_privacy.dpsgd.sampling` in
0.3.0; each name still resolves here, with a ``DeprecationWarning`` naming the new import."""

from lightning_privacy._deprecation import moved_module

__getattr__, __dir__, __all__ = moved_module(
    __name__,
    "lightning_privacy.dpsgd.sampling",
    [
        "PoissonBatchSampler",
        "PoissonDataLoader",
        "draw_seed",
        "empty_batch_like",
        "global_mask",
        "global_rows",
        "secure_rows",
    ],
    since="0.3.0",
    removed_in="0.4.0",
)

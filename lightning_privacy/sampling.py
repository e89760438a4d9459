"""Deprecated: Poisson sampling for DP-SGD moved to :mod:`lightning_privacy.dpsgd.sampling` in 0.3.0.

This path (public in 0.2.0) still gives the same objects, each with a ``DeprecationWarning`` naming the new import;
it is removed in 0.4.0. Import from :mod:`lightning_privacy.dpsgd.sampling` instead.
"""

import warnings
from importlib import import_module
from typing import Any

_MOVED = (
    "PoissonBatchSampler",
    "PoissonDataLoader",
    "draw_seed",
    "empty_batch_like",
    "global_mask",
    "global_rows",
    "secure_rows",
)
__all__ = list(_MOVED)
_NEW = "lightning_privacy.dpsgd.sampling"


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"lightning_privacy.sampling.{name} moved to {_NEW}.{name} in 0.3.0 and this path is removed in 0.4.0: "
            f"`from {_NEW} import {name}`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(_NEW), name)
    raise AttributeError(f"module 'lightning_privacy.sampling' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(__all__)

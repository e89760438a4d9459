"""The precision losses and gradient statistics are computed in: float32 at least, never narrower than given."""

from __future__ import annotations

import torch


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if it is a floating tensor narrower than that (bf16, fp16, fp8), else ``t`` itself (a float64
    tensor stays float64)."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t

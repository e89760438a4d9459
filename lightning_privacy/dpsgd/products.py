"""Products of 16-bit operands with float32 accumulation and output, for ghost clipping under bf16 autocast.

Two bfloat16 (or float16) numbers multiply exactly in float32 (8 + 8 significant bits fit in 24), so a product of
16-bit matrices accumulated and returned in float32 is the exact product up to float32's own summation. On CUDA that
is one call with ``out_dtype=torch.float32`` (``torch.mm``/``torch.bmm``, tensor cores); elsewhere, or with a torch
that has no ``out_dtype``, the same products of operands cast to float32. :func:`native` says which ran.

Used by :func:`lightning_privacy.dpsgd.samplers.linear_norm_sample` (the ghost norms' Gram matrices) and by
book-keeping's ``"split"`` products (:func:`split_product`, :mod:`lightning_privacy.dpsgd.bookkeeping`).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["SIXTEEN_BIT", "float32_product", "native", "split_product", "wide"]

SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_NATIVE = {"ok": True}  # out_dtype=torch.float32 ran on CUDA (until it is found missing)


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms, clipped sums and noise are computed in for gradients of ``dtype``: float32 at least.

    Example::

        >>> wide(torch.bfloat16), wide(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.promote_types(dtype, torch.float32)


def native() -> bool:
    """No CUDA product has had to fall back to float32 operands (a torch without ``out_dtype``) in this process."""
    return _NATIVE["ok"]


def float32_product(op: Callable[..., torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``op(a, b)`` (``torch.mm`` or ``torch.bmm``) with float32 accumulation and output where ``a`` is 16-bit; other
    dtypes as they are.

    Example::

        >>> a, b = torch.tensor([[1.0, 2.0**-8]]).bfloat16(), torch.tensor([[1.0], [1.0]]).bfloat16()
        >>> float(float32_product(torch.mm, a, b)), float(torch.mm(a, b))  # 1 + 2⁻⁸ is not a bfloat16
        (1.00390625, 1.0)
    """
    if a.dtype not in SIXTEEN_BIT:
        return op(a, b)
    if a.is_cuda and _NATIVE["ok"]:
        try:
            return op(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError) as error:  # a torch without it: float32 operands
            if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error):
                raise  # (not a missing out_dtype: the fallback would need more memory still)
            _NATIVE["ok"] = False
    return op(a.float(), b.float())


def split_product(x: torch.Tensor, w: torch.Tensor, *, transpose: bool) -> torch.Tensor:
    """``xᵀw`` (``transpose=False``, ``[in, out]``) or ``wᵀx`` (``[out, in]``) for float32 ``w`` and any ``x``, as
    two bfloat16 products with float32 accumulation: ``w ≈ hi + lo``, ``hi = bf16(w)``, ``lo = bf16(w − hi)``,
    ``|w − hi − lo| ≤ 2⁻¹⁶·|w|``; ``x`` is taken in bfloat16.

    Example::

        >>> _ = torch.manual_seed(0)
        >>> x, w = torch.randn(64, 3).bfloat16(), torch.randn(64, 2)
        >>> exact = x.double().t() @ w.double()
        >>> float((split_product(x, w, transpose=False).double() - exact).abs().max()) < 1e-3
        True
        >>> float((x.float().t() @ w.bfloat16().float()).double().sub(exact).abs().max()) > 1e-2  # hi alone
        True
    """
    hi = w.to(torch.bfloat16)
    lo = (w - hi.to(w.dtype)).to(torch.bfloat16)
    x = x.to(torch.bfloat16)
    if transpose:
        return float32_product(torch.mm, hi.t(), x).add_(float32_product(torch.mm, lo.t(), x))
    return float32_product(torch.mm, x.t(), hi).add_(float32_product(torch.mm, x.t(), lo))

"""16-bit products accumulated in float32 (``dpsgd/products.py``): CUDA's ``out_dtype`` where torch has it, float32
operands where it has not, and an out-of-memory error left as it is (no fallback that needs more memory)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from lightning_privacy.dpsgd import products


def _on_cuda():
    """Tensors that say they are on CUDA (the dispatch reads ``is_cuda``; the products themselves run on the CPU)."""
    return mock.patch.object(torch.Tensor, "is_cuda", new_callable=mock.PropertyMock, return_value=True)


def test_out_dtype_missing_falls_back_to_float32_operands(monkeypatch):
    monkeypatch.setitem(products._NATIVE, "ok", True)
    a, b = torch.randn(3, 4).bfloat16(), torch.randn(4, 2).bfloat16()
    calls = []

    def old_mm(x, y, **kwargs):
        calls.append(kwargs)
        if kwargs:
            raise TypeError("mm() got an unexpected keyword argument 'out_dtype'")
        return torch.mm(x, y)

    with _on_cuda():
        out = products.float32_product(old_mm, a, b)
    assert calls == [{"out_dtype": torch.float32}, {}] and not products.native()
    assert out.dtype == torch.float32 and torch.equal(out, a.float() @ b.float())


def test_out_of_memory_is_raised_not_taken_for_a_missing_out_dtype(monkeypatch):
    monkeypatch.setitem(products._NATIVE, "ok", True)

    def full(x, y, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    with _on_cuda(), pytest.raises(torch.OutOfMemoryError):
        products.float32_product(full, torch.ones(2, 2).bfloat16(), torch.ones(2, 2).bfloat16())
    assert products.native()


def test_float32_and_float64_operands_multiply_as_they_are():
    a = torch.randn(2, 3, dtype=torch.float64)
    assert products.float32_product(torch.mm, a, a.t()).dtype == torch.float64

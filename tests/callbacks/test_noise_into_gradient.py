"""DPSGD's in-place noise (``_NoiseIntoGradient``) gives Opacus' ``add_noise`` numbers bit for bit, in fewer tensors."""

from __future__ import annotations

import pytest
import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

from lightning_privacy.dpsgd import optimizers
from lightning_privacy.dpsgd.optimizers import _NoiseIntoGradient


class _Ours(_NoiseIntoGradient, DPOptimizer):
    pass


class _OursGhost(_NoiseIntoGradient, DPOptimizerFastGradientClipping):
    pass


# fewer than 16 elements, exactly 16, a multiple of 16, one more, chunks with a short tail, a long matrix
SHAPES = [(3,), (16,), (4, 8), (17,), (7, 5), (2, 3, 17), (1000,)]


def _fill(params, grad: str, layout: str):
    torch.manual_seed(0)
    for p in params:
        p.summed_grad = torch.randn(p.shape)
        if layout == "transposed" and p.ndim == 2:  # a non-contiguous clipped sum: drawn whole
            p.summed_grad = torch.randn(tuple(reversed(p.shape))).t()
        p.grad = torch.randn(p.shape) if grad == "present" else None


def _noised(cls, grad: str, layout: str, sigma: float, seed: int = 5):
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    optimizer = cls(torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma, max_grad_norm=0.7, expected_batch_size=4)
    _fill(params, grad, layout)
    optimizer.generator = torch.Generator().manual_seed(seed)
    optimizer.add_noise()
    return [p.grad.clone() for p in params], params


@pytest.mark.parametrize("chunk", [32, 1 << 16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("grad", ["present", "none"])
@pytest.mark.parametrize("sigma", [1.3, 0.0])
@pytest.mark.parametrize(("opacus", "ours"), [(DPOptimizer, _Ours), (DPOptimizerFastGradientClipping, _OursGhost)])
def test_same_bits_as_opacus(opacus, ours, sigma, grad, layout, chunk, monkeypatch):
    monkeypatch.setattr(optimizers, "NOISE_CHUNK", chunk)  # 32: many chunks, tails of 4 to 40 elements
    expected, _ = _noised(opacus, grad, layout, sigma)
    got, params = _noised(ours, grad, layout, sigma)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)  # bit for bit, not close
    for p in params:
        assert p.grad.shape == p.shape
        assert p.summed_grad._processed  # Opacus' guard against noising one sum twice


def test_the_noise_is_gaussian_with_the_claimed_scale():
    p = torch.nn.Parameter(torch.zeros(200_000))
    optimizer = _Ours(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.5, max_grad_norm=2.0, expected_batch_size=4)
    p.summed_grad = torch.zeros(p.shape)
    optimizer.generator = torch.Generator().manual_seed(1)
    optimizer.add_noise()
    assert abs(float(p.grad.std()) - 3.0) < 0.02 and abs(float(p.grad.mean())) < 0.02
    assert optimizer._noise_buffer.numel() == optimizers.NOISE_CHUNK + 16  # one small buffer, reused
    chunks = p.grad.view(-1)[: 3 * optimizers.NOISE_CHUNK].view(3, -1)
    assert not torch.equal(chunks[0], chunks[1])  # each chunk its own draws


def test_a_noised_sum_is_not_noised_twice():
    p = torch.nn.Parameter(torch.zeros(3))
    optimizer = _Ours(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4)
    p.summed_grad, p.grad = torch.zeros(3), torch.zeros(3)
    optimizer.add_noise()
    with pytest.raises(ValueError, match="zero_grad"):
        optimizer.add_noise()


@pytest.mark.parametrize("secure", [False, True])
def test_16_bit_parameters_are_noised_in_float32_and_rounded_after(secure):
    """A bfloat16 parameter's float32 clipped sum gets float32 noise (the same numbers a float32 parameter gets from
    the same generator); only the noised gradient is rounded to bfloat16. A 16-bit sum is widened first."""
    wide = torch.nn.Parameter(torch.zeros(1000))
    narrow = torch.nn.Parameter(torch.zeros(1000, dtype=torch.bfloat16))
    grads = []
    for p in (wide, narrow):  # (the same float32 clipped sum for both)
        optimizer = _Ours(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.3, max_grad_norm=0.7,
                          expected_batch_size=4, secure_mode=secure)  # fmt: skip
        p.summed_grad = torch.randn(1000, generator=torch.Generator().manual_seed(0))
        optimizer.generator = torch.Generator().manual_seed(5)
        optimizer.add_noise()
        grads.append(p.grad)
    assert grads[1].dtype == torch.bfloat16 and grads[0].dtype == torch.float32
    if not secure:  # (secure mode draws from the OS as well: the same law, other numbers)
        assert torch.equal(grads[1], grads[0].to(torch.bfloat16))
    noise = grads[1].double() - torch.randn(1000, generator=torch.Generator().manual_seed(0)).double()
    assert 0.7 * 1.3 * 0.8 < float(noise.std()) < 0.7 * 1.3 * 1.2
    narrow.summed_grad = torch.randn(1000).to(torch.bfloat16)  # (a bfloat16 sum: widened, noised in float32)
    optimizer.add_noise()
    assert narrow.grad.dtype == torch.bfloat16 and float(narrow.grad.double().std()) > 0.7

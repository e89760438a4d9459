"""DPSGD's in-place noise (``_NoiseIntoGradient``) gives Opacus' ``add_noise`` numbers bit for bit, in fewer tensors."""

from __future__ import annotations

import pytest
import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

from lightning_privacy.callbacks._optimizers import _NoiseIntoGradient


class _Ours(_NoiseIntoGradient, DPOptimizer):
    pass


class _OursGhost(_NoiseIntoGradient, DPOptimizerFastGradientClipping):
    pass


def _fill(params, grad: str):
    torch.manual_seed(0)
    for p in params:
        p.summed_grad = torch.randn(p.shape)
        if grad == "fresh":
            p.grad = torch.randn(p.shape)
        elif grad == "none":
            p.grad = None
        elif grad == "strided":
            p.grad = torch.randn(tuple(reversed(p.shape))).permute(*reversed(range(p.ndim)))
        elif grad == "alias":
            p.grad = p.summed_grad


def _noised(cls, grad: str, sigma: float, seed: int = 5):
    params = [
        torch.nn.Parameter(torch.zeros(7, 5)),
        torch.nn.Parameter(torch.zeros(33)),
        torch.nn.Parameter(torch.zeros(2, 3, 4)),
    ]
    optimizer = cls(torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma, max_grad_norm=0.7, expected_batch_size=4)
    _fill(params, grad)
    optimizer.generator = torch.Generator().manual_seed(seed)
    before = [p.grad for p in params]
    optimizer.add_noise()
    return [p.grad.clone() for p in params], [p.grad is b for p, b in zip(params, before)], params


@pytest.mark.parametrize("grad", ["fresh", "none", "strided", "alias"])
@pytest.mark.parametrize("sigma", [1.3, 0.0])
@pytest.mark.parametrize(("opacus", "ours"), [(DPOptimizer, _Ours), (DPOptimizerFastGradientClipping, _OursGhost)])
def test_same_bits_as_opacus(opacus, ours, grad, sigma):
    expected, _, _ = _noised(opacus, grad, sigma)
    got, reused, params = _noised(ours, grad, sigma)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)  # bit for bit, not close
    # the gradient's own memory is reused where it can hold the result, and only there
    assert all(reused) == (grad == "fresh")
    for p in params:
        assert p.grad.shape == p.shape and p.grad.is_contiguous()
        assert p.summed_grad._processed  # Opacus' guard against noising one sum twice


def test_the_noise_is_gaussian_with_the_claimed_scale():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(200_000))
    optimizer = _Ours(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.5, max_grad_norm=2.0, expected_batch_size=4)
    p.summed_grad, p.grad = torch.zeros(p.shape), torch.zeros(p.shape)
    optimizer.generator = torch.Generator().manual_seed(1)
    optimizer.add_noise()
    assert abs(float(p.grad.std()) - 3.0) < 0.02 and abs(float(p.grad.mean())) < 0.02


def test_a_noised_sum_is_not_noised_twice():
    p = torch.nn.Parameter(torch.zeros(3))
    optimizer = _Ours(torch.optim.SGD([p], lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4)
    p.summed_grad, p.grad = torch.zeros(3), torch.zeros(3)
    optimizer.add_noise()
    with pytest.raises(ValueError, match="zero_grad"):
        optimizer.add_noise()

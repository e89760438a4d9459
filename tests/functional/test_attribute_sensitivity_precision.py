"""Attribute sensitivity under reduced precision: full-width computation, the rounding allowance, centring (issue 24)."""

import itertools

import pytest
import torch
from torch import nn

from lightning_privacy.functional.attribute_sensitivity import (
    attribute_sensitivities,
    attribute_sensitivity,
    sensitivity_from_gradients,
    sensitivity_rounding_allowance,
)
from lightning_privacy.functional.attributes import SensitiveAttribute

C = 0.05
NUMERIC = SensitiveAttribute.numeric(column=0, values=[-2.0, -1.0, 0.0, 0.5, 1.0, 3.0], name="num")


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(n=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("backend", ["gram", "func"])
@pytest.mark.parametrize("method", ["exact", "approximate"])
def test_autocast_and_16_bit_tensors_give_the_float32_value(method, backend):
    """Autocast is switched off and bf16/fp16 parameters and inputs are upcast: the float32 computation on the same
    (exactly representable) values, whatever precision the caller runs in."""
    model, (x, y) = _model(), _batch()
    kw = dict(attribute=NUMERIC, max_grad_norm=C, method=method, backend=backend)
    for dtype in (torch.bfloat16, torch.float16):
        low, x_low = _model().to(dtype), x.to(dtype)
        same = _model().to(dtype).float()  # the same low-precision values, in float32
        reference = attribute_sensitivities(same, x_low.float(), y, **kw)
        got = attribute_sensitivities(low, x_low, y, **kw)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, reference, rtol=1e-6, atol=1e-9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = attribute_sensitivities(model, x, y, **kw)
    torch.testing.assert_close(inside, attribute_sensitivities(model, x, y, **kw), rtol=1e-6, atol=1e-9)


def test_float64_models_stay_float64():
    model, (x, y) = _model().double(), _batch()
    got = attribute_sensitivities(model, x.double(), y, attribute=NUMERIC, max_grad_norm=C)
    assert got.dtype == torch.float64


@pytest.mark.parametrize("method", ["exact", "approximate"])
def test_allowance_is_added_to_every_example_before_the_maximum_and_capped_at_2c(method):
    model, (x, y) = _model(), _batch()
    kw = dict(attribute=NUMERIC, max_grad_norm=C, method=method)
    plain = attribute_sensitivities(model, x, y, **kw)
    allowance = 0.01 * C
    torch.testing.assert_close(
        attribute_sensitivities(model, x, y, rounding_allowance=allowance, **kw),
        (plain + allowance).clamp(max=2 * C),
        rtol=0,
        atol=1e-9,
    )
    assert attribute_sensitivity(model, x, y, rounding_allowance=allowance, **kw) == pytest.approx(
        float(plain.max()) + allowance, rel=1e-6
    )
    capped = attribute_sensitivities(model, x, y, rounding_allowance=3 * C, **kw)
    assert bool((capped == torch.tensor(2 * C)).all())  # never above 2C: clipped gradients differ by at most 2C
    empty = attribute_sensitivity(model, x[:0], y[:0], rounding_allowance=allowance, **kw)
    assert empty == 0.0  # no example, nothing to leak


def test_rounding_allowance_values():
    eps32 = 2.0**-23
    assert sensitivity_rounding_allowance(torch.float32, max_grad_norm=C) == 1024 * eps32 * C
    # bf16/fp16 models are measured in float32, so they get the float32 allowance
    assert sensitivity_rounding_allowance(torch.bfloat16, max_grad_norm=C) == 1024 * eps32 * C
    assert sensitivity_rounding_allowance(torch.float16, max_grad_norm=C) == 1024 * eps32 * C
    assert sensitivity_rounding_allowance(torch.float64, max_grad_norm=C) == 1024 * 2.0**-52 * C


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: sensitivity_rounding_allowance(torch.int64, max_grad_norm=1.0), TypeError, "floating"),
        (lambda: sensitivity_rounding_allowance("float32", max_grad_norm=1.0), TypeError, "floating"),
        (lambda: sensitivity_rounding_allowance(torch.float32, max_grad_norm=0.0), ValueError, "max_grad_norm"),
        (lambda: _with_allowance(-1e-6), ValueError, "rounding_allowance"),
        (lambda: _with_allowance(float("inf")), ValueError, "rounding_allowance"),
        (lambda: _with_allowance(float("nan")), ValueError, "rounding_allowance"),
        (lambda: _with_allowance(True), TypeError, "rounding_allowance"),
        (lambda: _with_allowance("1e-4"), TypeError, "rounding_allowance"),
    ],
)
def test_bad_allowance_arguments_raise(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _with_allowance(value):
    x, y = _batch()
    return attribute_sensitivity(_model(), x, y, attribute=NUMERIC, max_grad_norm=C, rounding_allowance=value)


@pytest.mark.parametrize("spread", [1e-1, 1e-2, 1e-3])
def test_nearly_equal_clipped_gradients_keep_their_diameter_in_float32(spread):
    """|A| clipped gradients of norm C that differ by ``spread``·C: differences of nearly equal vectors. Measured
    from norms and inner products at the scale of C², float32 cancellation (~√D·2⁻²⁴·C² ≈ 1e-5·C²) could pick the
    wrong pair or point and under-report the diameter by up to ~1e-4·C (what the uncentred computation did here);
    centred on their mean first, the float32 values stay within 1e-7·C of float64."""
    torch.manual_seed(0)
    b, k, d = 16, 6, 20_000
    base = torch.randn(b, 1, d, dtype=torch.float64) * 3 / d**0.5  # norm ≈ 3 > C = 1: every point is clipped
    g = base + spread * torch.randn(b, k, d, dtype=torch.float64) / d**0.5
    clipped = g * (1.0 / (g.norm(dim=2, keepdim=True) + 1e-6)).clamp(max=1.0)
    diameter = torch.tensor(
        [max(float((p[i] - p[j]).norm()) for i, j in itertools.combinations(range(k), 2)) for p in clipped]
    )
    centre_bound = 2 * (clipped - clipped.mean(dim=1, keepdim=True)).norm(dim=2).max(dim=1).values
    for method, reference in (("exact", diameter), ("approximate", centre_bound)):
        got = sensitivity_from_gradients(g.float(), max_grad_norm=1.0, method=method).double()
        assert float((got - reference).abs().max()) <= 1e-7, method

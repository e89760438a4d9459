"""The Epsilon* membership loss against a float64 / high-precision reference."""

import mpmath
import numpy as np
import pytest
import torch

from lightning_privacy.functional.membership_loss import membership_loss, membership_losses_from_loader

mpmath.mp.dps = 60


def _reference(logits_row, label):
    """Footnote 1 of the paper evaluated literally in 60-digit arithmetic: -(log f_y - log(1 - f_y))."""
    z = [mpmath.mpf(float(v)) for v in logits_row]
    total = mpmath.fsum(mpmath.exp(v) for v in z)
    f = [mpmath.exp(v) / total for v in z]
    one_minus_f_y = mpmath.fsum(f[j] for j in range(len(z)) if j != label)  # 1 - f_y without cancellation
    return float(-(mpmath.log(f[label]) - mpmath.log(one_minus_f_y)))


def _reference_binary(logit, label):
    z = mpmath.mpf(float(logit))
    f, one_minus_f = 1 / (1 + mpmath.exp(-z)), 1 / (1 + mpmath.exp(z))
    return float((1 - 2 * label) * (mpmath.log(f) - mpmath.log(one_minus_f)))


@pytest.mark.parametrize("scale", [1.0, 30.0, 300.0])
@pytest.mark.parametrize("num_classes", [2, 3, 10])
def test_multiclass_matches_high_precision_reference(scale, num_classes):
    gen = torch.Generator().manual_seed(num_classes)
    logits = torch.randn(40, num_classes, generator=gen, dtype=torch.float64) * scale
    target = torch.randint(0, num_classes, (40,), generator=gen)
    got = membership_loss(logits, target)
    want = torch.tensor([_reference(logits[i], int(target[i])) for i in range(40)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # float32 logits: the result is the float32 rounding of the exact value (no catastrophic loss)
    got32 = membership_loss(logits.float(), target)
    want32 = torch.tensor([_reference(logits.float()[i].double(), int(target[i])) for i in range(40)])
    torch.testing.assert_close(got32.double(), want32.double(), rtol=1e-5, atol=1e-4 * scale)


def test_extreme_logits_stay_exact():
    # P(true class) rounds to 1 (or 0) in float64: a loss from probabilities would be inf here.
    logits = torch.tensor([[-800.0, 800.0, -900.0], [800.0, -800.0, 0.0], [0.0, 1000.0, 999.0], [50.0, -50.0, -50.0]])
    target = torch.tensor([1, 1, 1, 0])
    got = membership_loss(logits.double(), target)
    want = torch.tensor([_reference(logits[i], int(target[i])) for i in range(4)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(membership_loss(logits, target).double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(got[:2], torch.tensor([-1600.0, 1600.0], dtype=torch.float64))


@pytest.mark.parametrize("shape", [(50,), (50, 1)])
def test_binary_single_logit(shape):
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(50, generator=gen, dtype=torch.float64) * 40).reshape(shape)
    target = torch.randint(0, 2, (50,), generator=gen)
    got = membership_loss(logits, target)
    want = torch.tensor(
        [_reference_binary(logits.reshape(-1)[i], int(target[i])) for i in range(50)], dtype=torch.float64
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_binary_logit_equals_two_class_logits_and_one_hot():
    gen = torch.Generator().manual_seed(2)
    two = torch.randn(30, 2, generator=gen, dtype=torch.float64) * 5
    target = torch.randint(0, 2, (30,), generator=gen)
    single = membership_loss(two[:, 1] - two[:, 0], target)
    torch.testing.assert_close(membership_loss(two, target), single)
    torch.testing.assert_close(membership_loss(two, torch.nn.functional.one_hot(target, 2)), single)
    torch.testing.assert_close(membership_loss(two, target.bool()), single)


def test_sign_convention_low_loss_for_confident_correct_prediction():
    logits = torch.tensor([[0.0, 5.0], [0.0, -5.0]])
    losses = membership_loss(logits, torch.tensor([1, 1]))
    assert losses[0] < 0 < losses[1]


def test_half_precision_is_computed_in_float32():
    logits = torch.tensor([[0.0, 3.0, 1.0]], dtype=torch.bfloat16)
    assert membership_loss(logits, torch.tensor([1])).dtype == torch.float32


@pytest.mark.parametrize(
    "logits, target, match",
    [
        (torch.tensor([[0.0, float("nan")]]), torch.tensor([0]), "finite"),
        (torch.tensor([[0.0, float("inf")]]), torch.tensor([0]), "finite"),
        (torch.zeros(3, 4), torch.tensor([0, 1, 4]), r"labels in \[0, 3\]"),
        (torch.zeros(3), torch.tensor([0, 1, 2]), r"labels in \[0, 1\]"),
        (torch.zeros(3, 4), torch.tensor([0, 1]), "shape"),
        (torch.zeros(3, 2), torch.tensor([[1, 1], [0, 1], [1, 0]]), "one-hot"),
        (torch.zeros(2, 2, 2), torch.tensor([0, 1]), "shape"),
        (torch.zeros(2, 2), torch.tensor([0.5, 1.0]), "integer"),
    ],
)
def test_bad_inputs_raise(logits, target, match):
    with pytest.raises(ValueError, match=match):
        membership_loss(logits, target)


def test_integer_logits_raise_type_error():
    with pytest.raises(TypeError, match="logits"):
        membership_loss(torch.zeros(2, 2, dtype=torch.long), torch.tensor([0, 1]))


def test_losses_from_loader_keeps_order_and_mode():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    net.train()
    got = membership_losses_from_loader(net, batches)
    assert net.training
    net.eval()
    torch.testing.assert_close(got, membership_loss(net(x), y))
    custom = membership_losses_from_loader(net, [{"x": x, "y": y}], forward_fn=lambda m, b: (m(b["x"]), b["y"]))
    torch.testing.assert_close(custom, got)
    assert np.all(np.isfinite(got.numpy()))

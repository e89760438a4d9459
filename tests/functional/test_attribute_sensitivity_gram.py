"""Gram backend of the attribute sensitivity: every supported layer against a brute-force per-example loop.

The reference runs plain autograd on ONE example with ONE substituted value at a time, clips the flat
gradient by hand as Opacus does (``min(1, C / (‖g‖ + 1e-6))``) and measures the diameter and the centre
bound with Python loops. Everything is float64 and must agree to 1e-6 relative.
"""

import itertools

import pytest
import torch
from opacus.layers import DPLSTM, DPMultiheadAttention
from torch import nn
from torch.nn import functional as F

from lightning_privacy.functional import _gram
from lightning_privacy.functional.attribute_sensitivity import (
    BACKENDS,
    attribute_sensitivities,
    attribute_sensitivity,
    gram_backend_reason,
)
from lightning_privacy.functional.attributes import SensitiveAttribute

C = 0.5  # most per-sample gradients of these small models exceed it; the tests also use other norms
RTOL = 1e-6


def unclipped_points(model, x, y, attribute):
    """Per example and value: one autograd pass, the flat gradient of the trainable parameters: ``(B, |A|, D)``."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(len(y)):
        points = []
        for value in attribute.values:
            inputs = attribute.substitute(x[i : i + 1], value)
            loss = F.cross_entropy(model(inputs), y[i : i + 1])
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            points.append(
                torch.cat([(torch.zeros_like(p) if d is None else d).flatten() for p, d in zip(params, grads)])
            )
        rows.append(torch.stack(points))
    return torch.stack(rows).double()


def brute_force(points, max_grad_norm):
    """Clipping by hand as Opacus does; diameter and centre bound by Python loops."""
    exact, approx = [], []
    for example in points:
        clipped = [g * min(1.0, max_grad_norm / (float(g.norm()) + 1e-6)) for g in example]
        exact.append(max(float((a - b).norm()) for a, b in itertools.combinations(clipped, 2)))
        centre = torch.stack(clipped).mean(0)
        approx.append(min(2 * max(float((p - centre).norm()) for p in clipped), 2 * max_grad_norm))
    return torch.tensor(exact, dtype=torch.float64), torch.tensor(approx, dtype=torch.float64)


def assert_matches_brute_force(model, x, y, attribute, backend="gram", every_norm=True, **kwargs):
    """Equal to the brute force at three clipping norms: every gradient clipped, about half, none."""
    points = unclipped_points(model, x, y, attribute)
    median = float(points.norm(dim=2).median())
    for max_grad_norm in (C, median, 1e3) if every_norm else (median,):
        exact_bf, approx_bf = brute_force(points, max_grad_norm)
        kw = dict(attribute=attribute, max_grad_norm=max_grad_norm, backend=backend) | kwargs
        exact = attribute_sensitivities(model, x, y, method="exact", **kw)
        approx = attribute_sensitivities(model, x, y, method="approximate", **kw)
        assert exact.dtype == torch.float64
        torch.testing.assert_close(exact, exact_bf, rtol=RTOL, atol=1e-12)
        torch.testing.assert_close(approx, approx_bf, rtol=RTOL, atol=1e-12)
    assert float(exact_bf.max()) > 1e-3  # the attribute really moves the gradient
    return exact


def pixel(values):
    """Custom attribute: the first input entry of every row (image pixel, sequence feature) set to the value."""

    def substitute(x, v):
        x = x.clone()
        x.view(len(x), -1)[:, 0] = v
        return x

    return SensitiveAttribute.custom(substitute=substitute, values=values, name="first-entry")


def token(values, position=1):
    """Custom attribute: the token at ``position`` of every sequence replaced by the value."""

    def substitute(idx, v):
        idx = idx.clone()
        idx[:, position] = v
        return idx

    return SensitiveAttribute.custom(substitute=substitute, values=values, name="token")


VALUES = [-2.0, -0.5, 1.0, 3.0]


def _data(shape, n=4, classes=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


class Mean(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.mean(self.dim)


class SeqFirst(nn.Module):
    """[B, T, d] -> [T, B, d] -> inner -> [B, T, d]."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x.transpose(0, 1)).transpose(0, 1)


class Attention(nn.Module):
    """Self-attention block around Opacus' DPMultiheadAttention (batch-first or sequence-first)."""

    def __init__(self, dim, heads, batch_first, **kwargs):
        super().__init__()
        self.batch_first = batch_first
        self.attn = DPMultiheadAttention(dim, heads, batch_first=batch_first, **kwargs)

    def forward(self, x):  # x: [B, T, d]
        h = x if self.batch_first else x.transpose(0, 1)
        out, _ = self.attn(h, h, h)
        return out if self.batch_first else out.transpose(0, 1)


class LastStep(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, _ = self.rnn(x)
        return out[:, -1]


def _seeded(build):
    torch.manual_seed(0)
    return build().double()


# ---------------------------------------------------------------------------------------- every layer type
def conv1d():
    model = _seeded(
        lambda: nn.Sequential(
            nn.Conv1d(2, 4, 3, padding="same", padding_mode="reflect"),
            nn.Tanh(),
            nn.Conv1d(4, 4, 3, stride=2, dilation=2, groups=2),
            nn.Flatten(),
            nn.Linear(16, 3),
        )
    )
    return model, *_data((2, 12)), pixel(VALUES)


def conv2d():
    model = _seeded(
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.Tanh(),
            nn.Conv2d(4, 6, (3, 2), stride=2, groups=2, bias=False),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(6, 3),
        )
    )
    return model, *_data((3, 6, 6)), pixel(VALUES)


def conv3d():
    model = _seeded(
        lambda: nn.Sequential(
            nn.Conv3d(2, 3, 2, padding=(1, 0, 1), dilation=(1, 2, 1)), nn.Tanh(), nn.Flatten(), nn.LazyLinear(3)
        )
    )
    x, y = _data((2, 3, 4, 3))
    model(x)  # materialise the lazy layer (it becomes an nn.Linear)
    return model, x, y, pixel(VALUES)


def embedding():
    model = _seeded(lambda: nn.Sequential(nn.Embedding(20, 6, padding_idx=0), Mean(1), nn.Linear(6, 3)))
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 20, (4, 5), generator=g)
    idx[0, 3] = idx[1, 1] = 7  # a repeated token and the substituted one collide
    return model, idx, torch.randint(0, 3, (4,), generator=g), token([0, 3, 7, 19])


def layer_norm():
    model = _seeded(lambda: nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Tanh(), Mean(1), nn.Linear(6, 3)))
    return model, *_data((5, 4)), pixel(VALUES)


def layer_norm_2d_shape():
    model = _seeded(lambda: nn.Sequential(nn.LayerNorm((5, 4)), nn.Flatten(), nn.Linear(20, 3)))
    return model, *_data((5, 4)), pixel(VALUES)


def rms_norm():
    model = _seeded(lambda: nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(6, eps=1e-5), Mean(1), nn.Linear(6, 3)))
    return model, *_data((5, 4)), pixel(VALUES)


def group_norm():
    model = _seeded(
        lambda: nn.Sequential(
            nn.Conv1d(2, 6, 3), nn.GroupNorm(3, 6), nn.Tanh(), nn.GroupNorm(2, 6, affine=True), Mean(2), nn.Linear(6, 3)
        )
    )
    return model, *_data((2, 7)), pixel(VALUES)


def linear_sequence():
    model = _seeded(lambda: nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 5), Mean(1), nn.Linear(5, 3)))
    return model, *_data((6, 4)), pixel(VALUES)


def linear_sequence_first():
    model = _seeded(
        lambda: nn.Sequential(SeqFirst(nn.Sequential(nn.Linear(4, 5), nn.Tanh())), Mean(1), nn.Linear(5, 3))
    )
    return model, *_data((6, 4)), pixel(VALUES)


def attention_batch_first():
    model = _seeded(lambda: nn.Sequential(Attention(6, 2, batch_first=True), Mean(1), nn.Linear(6, 3)))
    return model, *_data((5, 6)), pixel(VALUES)


def attention_sequence_first():
    model = _seeded(
        lambda: nn.Sequential(
            Attention(6, 3, batch_first=False, add_bias_kv=True, add_zero_attn=True), Mean(1), nn.Linear(6, 3)
        )
    )
    return model, *_data((5, 6)), pixel(VALUES)


def lstm():
    model = _seeded(
        lambda: nn.Sequential(
            LastStep(DPLSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)), nn.Linear(8, 3)
        )
    )
    return model, *_data((5, 3)), pixel(VALUES)


class Transformer(nn.Module):
    """Embedding + DPMultiheadAttention + LayerNorm + Linear, plus a Conv1d over the sequence."""

    def __init__(self, vocab=30, dim=8, heads=2, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = DPMultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.head = nn.Linear(dim, classes)

    def forward(self, idx):
        h = self.embed(idx)
        a, _ = self.attn(h, h, h)
        h = self.norm(h + a)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.head(h.mean(1))


def mixed():
    model = _seeded(Transformer)
    g = torch.Generator().manual_seed(3)
    return model, torch.randint(0, 30, (4, 6), generator=g), torch.randint(0, 3, (4,), generator=g), token([1, 5, 29])


MODELS = [
    conv1d,
    conv2d,
    conv3d,
    embedding,
    layer_norm,
    layer_norm_2d_shape,
    rms_norm,
    group_norm,
    linear_sequence,
    linear_sequence_first,
    attention_batch_first,
    attention_sequence_first,
    lstm,
    mixed,
]


@pytest.mark.parametrize("build", MODELS, ids=lambda f: f.__name__)
def test_every_layer_type_equals_brute_force(build):
    model, x, y, attribute = build()
    assert gram_backend_reason(model) is None
    assert_matches_brute_force(model, x, y, attribute)


@pytest.mark.parametrize("form", ["ghost", "materialise"])
@pytest.mark.parametrize("build", [conv2d, embedding, linear_sequence, attention_sequence_first, lstm, mixed])
def test_ghost_and_materialised_forms_agree_with_brute_force(build, form, monkeypatch):
    monkeypatch.setattr(_gram, "FORCE", form)
    assert_matches_brute_force(*build(), every_norm=False)


def test_default_backend_is_the_gram_backend_for_supported_models(monkeypatch):
    model, x, y, attribute = mixed()
    calls = []
    real = _gram.chunk_gram
    monkeypatch.setattr(_gram, "chunk_gram", lambda *a, **k: calls.append(1) or real(*a, **k))
    attribute_sensitivity(model, x, y, attribute=attribute, max_grad_norm=C)
    assert calls
    assert "gram" in BACKENDS and "linear" in BACKENDS  # "linear" stays accepted (same backend)


@pytest.mark.parametrize("backend", ["gram", "linear", "auto"])
def test_backend_names_give_the_same_values(backend):
    model, x, y, attribute = conv2d()
    reference = attribute_sensitivities(
        model, x, y, attribute=attribute, max_grad_norm=C, method="exact", backend="func"
    )
    got = attribute_sensitivities(model, x, y, attribute=attribute, max_grad_norm=C, method="exact", backend=backend)
    torch.testing.assert_close(got, reference, rtol=RTOL, atol=1e-12)


# ---------------------------------------------------------------------------------------- semantics
def test_frozen_layers_contribute_nothing():
    model, x, y, attribute = mixed()
    for module in (model.embed, model.attn.qlinear, model.norm):
        module.requires_grad_(False)
    model.conv.bias.requires_grad_(False)
    assert gram_backend_reason(model) is None
    frozen = assert_matches_brute_force(model, x, y, attribute)
    model.requires_grad_(True)
    full = attribute_sensitivities(model, x, y, attribute=attribute, max_grad_norm=C, method="exact")
    assert not torch.allclose(frozen, full)


def test_frozen_unsupported_layers_are_fine():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(5).double().eval().requires_grad_(False)  # frozen, eval mode: a fixed affine map
    model = nn.Sequential(nn.Linear(4, 5).double(), bn, nn.Tanh(), nn.Linear(5, 3).double())
    assert gram_backend_reason(model) is None
    assert_matches_brute_force(model, *_data((4,)), pixel(VALUES))


def test_a_layer_called_twice_sums_both_calls():
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), nn.Linear(4, 3)).double()
    assert_matches_brute_force(model, *_data((4,)), pixel(VALUES))


def test_in_place_operations_after_a_hooked_layer():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(12, 5),
        nn.ReLU(inplace=True),
        nn.Linear(5, 3),
    ).double()
    assert_matches_brute_force(model, *_data((2, 4, 4)), pixel(VALUES))


def test_sequence_length_equal_to_the_row_count_is_resolved_by_splitting_the_chunk():
    model, _, _, attribute = linear_sequence_first()
    x, y = _data((8, 4), n=4)  # chunk of 4 examples x |A| = 2 values = 8 rows = sequence length
    two = SensitiveAttribute.custom(substitute=attribute._substitute, values=[-2.0, 3.0])
    assert_matches_brute_force(model, x, y, two, chunk_size=4)


@pytest.mark.parametrize("chunk_size", [1, 3, None])
def test_chunking_does_not_change_the_result(chunk_size):
    model, x, y, attribute = mixed()
    kw = dict(attribute=attribute, max_grad_norm=C, method="exact")
    whole = attribute_sensitivities(model, x, y, chunk_size=len(y), **kw)
    torch.testing.assert_close(
        attribute_sensitivities(model, x, y, chunk_size=chunk_size, **kw), whole, rtol=1e-12, atol=0
    )


def test_float32_model_agrees_with_torch_func():
    model, x, y, attribute = conv2d()
    model, x = model.float(), x.float()
    kw = dict(attribute=attribute, max_grad_norm=C, method="exact")
    gram = attribute_sensitivities(model, x, y, backend="gram", **kw)
    func = attribute_sensitivities(model, x, y, backend="func", **kw)
    assert gram.dtype == torch.float32
    torch.testing.assert_close(gram, func, rtol=1e-4, atol=1e-6)


def test_inside_no_grad():
    model, x, y, attribute = mixed()
    reference = attribute_sensitivity(model, x, y, attribute=attribute, max_grad_norm=C, method="exact")
    with torch.no_grad():
        got = attribute_sensitivity(model, x, y, attribute=attribute, max_grad_norm=C, method="exact", backend="gram")
    assert got == pytest.approx(reference, rel=1e-12)


# ---------------------------------------------------------------------------------------- fallback and errors
class Scaled(nn.Module):
    """A trainable parameter outside any supported layer."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x * self.scale)


def test_unsupported_parameters_fall_back_to_torch_func():
    model = _seeded(Scaled)
    assert "'scale'" in gram_backend_reason(model)
    assert_matches_brute_force(model, *_data((4,)), pixel(VALUES), backend="auto")
    with pytest.raises(ValueError, match=r"backend='gram' cannot take this module: parameter 'scale'"):
        attribute_sensitivity(model, *_data((4,)), attribute=pixel(VALUES), max_grad_norm=C, backend="gram")


def test_tied_weights_fall_back_to_torch_func():
    torch.manual_seed(0)
    embed, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, Mean(1), head).double()
    assert "tied" in gram_backend_reason(model)
    g = torch.Generator().manual_seed(0)
    idx, y = torch.randint(0, 10, (3, 4), generator=g), torch.randint(0, 10, (3,), generator=g)
    assert_matches_brute_force(model, idx, y, token([1, 2, 9]), backend="auto")


def test_active_dropout_uses_torch_func_and_the_gram_backend_refuses_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, 3)).double().train()
    assert "dropout" in gram_backend_reason(model)
    x, y = _data((4,))
    with pytest.raises(ValueError, match="dropout"):
        attribute_sensitivity(model, x, y, attribute=pixel(VALUES), max_grad_norm=C, backend="gram")
    assert 0.0 < attribute_sensitivity(model, x, y, attribute=pixel(VALUES), max_grad_norm=C) <= 2 * C
    model.eval()  # eval mode: no dropout, the Gram backend applies
    assert gram_backend_reason(model) is None


def test_batch_folded_into_another_dimension_falls_back_at_run_time():
    class Folded(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):  # [B, T, 4] -> [B*T, 4] -> [B, 3]
            return self.linear(x.reshape(-1, 4)).view(len(x), -1, 3).mean(1)

    model = _seeded(Folded)
    x, y = _data((5, 4))
    assert gram_backend_reason(model) is None  # only the run tells
    with pytest.raises(ValueError, match="no batch dimension"):
        attribute_sensitivity(model, x, y, attribute=pixel(VALUES), max_grad_norm=C, backend="gram")
    assert_matches_brute_force(model, x, y, pixel(VALUES), backend="auto")

"""Per-step attribute sensitivity R_t: Opacus parity, brute force, bounds, chunking, DDP, dropout, errors."""

import itertools

import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.nn import functional as F

from lightning_privacy.functional.attribute_sensitivity import (
    attribute_sensitivities,
    attribute_sensitivity,
    clip_factors,
    hook_free_twin,
    per_sample_gradients,
    sensitivity_from_gradients,
    sensitivity_rounding_allowance,
    step_sensitivity,
)
from lightning_privacy.functional.attributes import SensitiveAttribute
from tests._ddp import run_distributed

C = 0.05  # small enough that most per-sample gradients are clipped


def _mlp(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 8), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _batch(n=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    x[:, 3:6] = F.one_hot(torch.randint(0, 3, (n,), generator=g), 3).float()
    return x, torch.randint(0, 3, (n,), generator=g)


NUMERIC = SensitiveAttribute.numeric(column=0, values=[-2.0, -1.0, 0.0, 0.5, 1.0, 3.0], name="num")
ONE_HOT = SensitiveAttribute.one_hot(columns=[3, 4, 5], values=["a", "b", "c"], name="cat")
CUSTOM = SensitiveAttribute.custom(
    substitute=lambda x, v: torch.cat([x[:, :1], x[:, 1:3] * v, x[:, 3:]], 1),
    values=[-1.0, 0.0, 2.0, 5.0],
    name="scale",
)
ATTRIBUTES = [NUMERIC, ONE_HOT, CUSTOM]


def _brute_force(model, x, y, attribute, max_grad_norm):
    """Clipped gradients by one autograd pass per (example, value); diameter and centre bound by loops."""
    exact, approx = [], []
    for i in range(len(x)):
        points = []
        for value in attribute.values:
            model.zero_grad()
            F.cross_entropy(model(attribute.substitute(x[i : i + 1], value)), y[i : i + 1]).backward()
            g = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
            points.append(g * min(1.0, max_grad_norm / (float(g.norm()) + 1e-6)))
        exact.append(max(float((a - b).norm()) for a, b in itertools.combinations(points, 2)))
        centre = torch.stack(points).mean(0)
        approx.append(min(2 * max(float((p - centre).norm()) for p in points), 2 * max_grad_norm))
    return torch.tensor(exact), torch.tensor(approx)


def test_per_sample_gradients_equal_opacus():
    model, (x, y) = _mlp(), _batch()
    ours = per_sample_gradients(model, x, y)
    gsm = GradSampleModule(_mlp(), loss_reduction="mean")
    F.cross_entropy(gsm(x), y).backward()
    for name, p in gsm._module.named_parameters():
        torch.testing.assert_close(ours[name], p.grad_sample, atol=1e-6, rtol=1e-5)


def test_clipping_equals_opacus_dp_optimizer():
    model, (x, y) = _mlp(), _batch()
    ours = per_sample_gradients(model, x, y)
    flat = torch.cat([g.flatten(1) for g in ours.values()], 1)
    summed = (clip_factors(flat.square().sum(1), C).unsqueeze(1) * flat).sum(0)
    gsm = GradSampleModule(_mlp(), loss_reduction="mean")
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=0.0, max_grad_norm=C, expected_batch_size=len(x)
    )
    F.cross_entropy(gsm(x), y).backward()
    opt.pre_step()
    opacus = torch.cat([p.summed_grad.flatten() for p in gsm.parameters()])
    torch.testing.assert_close(summed, opacus, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["func", "linear"])
@pytest.mark.parametrize("attribute", ATTRIBUTES, ids=lambda a: a.kind)
def test_exact_and_approximate_equal_brute_force(attribute, backend):
    model, (x, y) = _mlp(), _batch()
    exact_bf, approx_bf = _brute_force(model, x, y, attribute, C)
    exact = attribute_sensitivities(model, x, y, attribute=attribute, max_grad_norm=C, method="exact", backend=backend)
    approx = attribute_sensitivities(model, x, y, attribute=attribute, max_grad_norm=C, backend=backend)
    torch.testing.assert_close(exact.double(), exact_bf.double(), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(approx.double(), approx_bf.double(), atol=1e-6, rtol=1e-4)
    assert exact.max() > 0
    assert bool((approx >= exact - 1e-7).all()) and bool((approx <= 2 * C).all())
    r_exact = attribute_sensitivity(model, x, y, attribute=attribute, max_grad_norm=C, method="exact", backend=backend)
    r_approx = attribute_sensitivity(model, x, y, attribute=attribute, max_grad_norm=C, backend=backend)
    assert r_exact == pytest.approx(float(exact_bf.max()), rel=1e-4) and r_exact <= r_approx + 1e-7 <= 2 * C + 1e-7


def test_unclipped_regime_reaches_the_2c_cap_and_exceeds_nothing():
    """Huge gradients: every point sits on the sphere of radius C, so R_t <= 2C must still hold."""
    g = torch.tensor([[[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]]])
    assert float(sensitivity_from_gradients(g, max_grad_norm=1.0, method="exact")) == pytest.approx(2.0, rel=1e-6)
    assert float(sensitivity_from_gradients(g, max_grad_norm=1.0, method="approximate")) <= 2.0


def test_extremes_uses_the_two_extreme_values_only():
    model, (x, y) = _mlp(), _batch()
    two = SensitiveAttribute.numeric(column=0, values=[-2.0, 3.0])
    ext = attribute_sensitivities(model, x, y, attribute=NUMERIC, values="extremes", max_grad_norm=C, method="exact")
    torch.testing.assert_close(
        ext, attribute_sensitivities(model, x, y, attribute=two, max_grad_norm=C, method="exact")
    )
    approx = attribute_sensitivities(model, x, y, attribute=NUMERIC, values="extremes", max_grad_norm=C)
    torch.testing.assert_close(approx, ext, atol=1e-7, rtol=1e-5)  # |A| = 2: the centre bound is exact
    full = attribute_sensitivities(model, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact")
    assert bool((ext <= full + 1e-7).all())  # a subset of values has a smaller diameter


@pytest.mark.parametrize("backend", ["func", "linear"])
@pytest.mark.parametrize("method", ["exact", "approximate"])
def test_chunking_does_not_change_the_result(method, backend):
    model, (x, y) = _mlp(), _batch(n=13)
    kw = dict(attribute=NUMERIC, max_grad_norm=C, method=method, backend=backend)
    whole = attribute_sensitivities(model, x, y, chunk_size=13, **kw)
    for chunk in (1, 4, None):
        torch.testing.assert_close(
            attribute_sensitivities(model, x, y, chunk_size=chunk, **kw), whole, atol=1e-7, rtol=1e-6
        )
        assert attribute_sensitivity(model, x, y, chunk_size=chunk, **kw) == pytest.approx(float(whole.max()), rel=1e-6)


def test_empty_batch_is_zero():
    model = _mlp()
    empty = (torch.zeros(0, 6), torch.zeros(0, dtype=torch.long))
    assert attribute_sensitivity(model, *empty, attribute=NUMERIC, max_grad_norm=C, method="exact") == 0.0
    assert attribute_sensitivities(model, *empty, attribute=NUMERIC, max_grad_norm=C).shape == (0,)


def test_twin_of_a_hooked_module_with_live_parameters():
    live, (x, y) = _mlp(), _batch()
    reference = attribute_sensitivity(live, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact", backend="func")
    gsm = GradSampleModule(live)  # Opacus hooks on the live module
    with pytest.raises(ValueError, match="hook_free_twin"):
        attribute_sensitivity(gsm, x, y, attribute=NUMERIC, max_grad_norm=C)
    twin = hook_free_twin(gsm)
    params = dict(gsm.named_parameters())
    got = attribute_sensitivity(
        twin, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact", params=params, backend="func"
    )
    assert got == pytest.approx(reference, rel=1e-6)
    with torch.no_grad():  # the twin follows the live weights it is given, not its own copy
        params["_module.0.weight"].mul_(2.0)
    moved = attribute_sensitivity(twin, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact", params=params)
    assert moved != pytest.approx(reference, rel=1e-3)


def test_dropout_masks_are_shared_by_the_substitutions_of_one_example():
    model, (x, y) = _mlp(dropout=0.5), _batch()
    model.train()
    ignores_value = SensitiveAttribute.custom(substitute=lambda inputs, v: inputs.clone(), values=[0, 1, 2])
    r = attribute_sensitivities(model, x, y, attribute=ignores_value, max_grad_norm=C, method="exact")
    assert float(r.max()) < 1e-7  # same input + same mask -> same gradient (up to rounding)
    live = attribute_sensitivity(model, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact")
    assert 0.0 < live <= 2 * C
    model.eval()  # eval mode: no dropout, deterministic and equal to the dropout-free model
    evaluated = attribute_sensitivity(model, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact")
    plain = _mlp()
    plain.load_state_dict({k.replace("3.", "2."): v for k, v in model.state_dict().items()})
    assert evaluated == pytest.approx(
        attribute_sensitivity(plain, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact"), rel=1e-6
    )


def test_batchnorm_in_training_mode_is_rejected():
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    with pytest.raises(ValueError, match="BatchNorm1d in training mode"):
        attribute_sensitivity(model, *_batch(), attribute=NUMERIC, max_grad_norm=C)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(method="diameter"), "`method`"),
        (dict(max_grad_norm=0.0), "`max_grad_norm`"),
        (dict(max_grad_norm=float("inf")), "`max_grad_norm`"),
        (dict(chunk_size=0), "`chunk_size`"),
        (dict(backend="jax"), "`backend`"),
        (dict(randomness="error"), "`randomness`"),
        (dict(values="middle"), "`values`"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    args = dict(attribute=NUMERIC, max_grad_norm=C) | kwargs
    with pytest.raises(ValueError, match=match):
        attribute_sensitivity(_mlp(), *_batch(), **args)


def test_bad_inputs_raise():
    x, y = _batch()
    with pytest.raises(ValueError, match="batch size"):
        attribute_sensitivity(_mlp(), x, y[:3], attribute=NUMERIC, max_grad_norm=C)
    with pytest.raises(TypeError, match="SensitiveAttribute"):
        attribute_sensitivity(_mlp(), x, y, attribute="age", max_grad_norm=C)
    with pytest.raises(ValueError, match="backend='linear'"):
        attribute_sensitivity(_mlp(dropout=0.5), x, y, attribute=NUMERIC, max_grad_norm=C, backend="linear")


def _rank_sensitivity(rank, world_size, method):
    model, (x, y) = _mlp(), _batch(n=12)
    half = slice(rank * 6, (rank + 1) * 6)
    return attribute_sensitivity(model, x[half], y[half], attribute=NUMERIC, max_grad_norm=C, method=method)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["exact", "approximate"])
def test_two_processes_give_the_single_process_r_t(method):
    model, (x, y) = _mlp(), _batch(n=12)
    single = attribute_sensitivity(model, x, y, attribute=NUMERIC, max_grad_norm=C, method=method)
    per_rank = run_distributed(_rank_sensitivity, method)
    assert per_rank == [pytest.approx(single, rel=1e-6)] * 2
    local = [
        attribute_sensitivity(model, x[s], y[s], attribute=NUMERIC, max_grad_norm=C, method=method)
        for s in (slice(0, 6), slice(6, 12))
    ]
    assert min(local) < single  # the ranks really saw different halves


def test_works_inside_no_grad():
    model, (x, y) = _mlp(), _batch()
    reference = attribute_sensitivity(model, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact")
    with torch.no_grad():
        for backend in ("linear", "func"):
            got = attribute_sensitivity(
                model, x, y, attribute=NUMERIC, max_grad_norm=C, method="exact", backend=backend
            )
            assert got == pytest.approx(reference, rel=1e-5)


def test_step_sensitivity_takes_the_modules_mode_and_the_allowance_of_its_dtype():
    """What the monitor measures at a step, without a Trainer: the twin follows the live module's training mode, and
    the value is attribute_sensitivity's plus the allowance of the trainable parameters' dtype (bf16's here)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    twin = hook_free_twin(model)
    model.eval()
    attribute = SensitiveAttribute.one_hot(columns=[1, 2], values=["F", "M"])
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    params = {k: v.to(torch.bfloat16) for k, v in model.named_parameters()}
    model.to(torch.bfloat16)
    r = step_sensitivity(twin, model, x, y, attribute=attribute, max_grad_norm=1.0, params=params)
    assert not twin.training
    allowance = sensitivity_rounding_allowance(torch.bfloat16, max_grad_norm=1.0)
    plain = attribute_sensitivity(twin, x, y, attribute=attribute, max_grad_norm=1.0, params=params)
    assert allowance > 0 and r == pytest.approx(min(plain + allowance, 2.0), abs=1e-7)

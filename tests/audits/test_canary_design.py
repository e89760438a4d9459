"""Metagradient-optimised input canaries (``audits.canary_design``) and ``CanaryAudit(kind="input", examples=...)``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from scipy.stats import mannwhitneyu
from torch import nn
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, CanaryAudit, names
from lightning_privacy.audits import canary_design as design_module
from lightning_privacy.audits.canary_design import optimize_input_canaries
from lightning_privacy.functional.membership_loss import membership_loss
from lightning_privacy.models import TabularMLP
from tests.callbacks._tiny import D, N, tiny_dataset, trainer


def _data(n=300, d=6, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    return TensorDataset(x, (x[:, 0] - 0.5 * x[:, 1] > 0).long())


# ------------------------------------------------------------------------------------------ the metagradient
@pytest.mark.parametrize("adam", [False, True])
def test_the_metagradient_through_the_unrolled_run_matches_finite_differences(adam):
    """The gradient of the gap with respect to the canaries' inputs, through every SGD (or Adam) step (an independent
    computation: central differences of the whole training run, in float64)."""
    data = _data(40, 3, dtype=torch.float64)
    x, y = data.tensors
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    z0 = torch.randn(6, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    included = torch.tensor([True, False, True, True, False, False])
    start = {k: v.detach().clone() for k, v in model.named_parameters()}

    def gap(z):
        params = {k: v.clone().requires_grad_(True) for k, v in start.items()}
        generator = torch.Generator().manual_seed(5)
        lr = 0.05 if adam else 0.8
        params = design_module._train(model, params, x, y, z, labels, included, 0.5, 6, lr, generator, True, adam)
        losses = membership_loss(functional_call(model, params, (z,)), labels)
        return losses[~included].mean() - losses[included].mean()

    z = z0.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(gap(z), z)
    h, numeric = 1e-6, torch.zeros_like(z0)
    for index in np.ndindex(*z0.shape):
        up, down = z0.clone(), z0.clone()
        up[index] += h
        down[index] -= h
        numeric[index] = (gap(up) - gap(down)) / (2 * h)
    assert torch.allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    assert grad[~included].abs().sum() > 0  # excluded canaries get a gradient too: through their final loss only


def test_optimised_canaries_are_told_apart_better_than_the_rows_they_start_from():
    """On a fresh proxy run (new initialisation, new halves, new batches) the optimised canaries' included half has a
    lower loss than the excluded half more often than the starting rows' (AUC, mean of 6 checks; measured 0.517 →
    0.606 here, and ≈ 0.60 → ≈ 0.52 in 25 meta-steps: the metagradient is noisy, a few dozen steps are not enough)."""
    data = _data(400, 6)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    design = optimize_input_canaries(model, data, 60, sample_rate=0.2, steps=30, lr=0.5, meta_steps=100, seed=3)
    x, y = data.tensors

    def auc(canaries, check):
        z, labels = canaries.tensors
        g = torch.Generator().manual_seed(100 + check)
        included = torch.rand(len(z), generator=g) < 0.5
        params = design_module._fresh(model, 1000 + check)
        params = design_module._train(model, params, x, y, z, labels, included, 0.2, 30, 0.5, g, False)
        with torch.no_grad():
            scores = -membership_loss(functional_call(model, params, (z,)), labels).numpy()
        inc = included.numpy()
        return mannwhitneyu(scores[inc], scores[~inc]).statistic / (inc.sum() * (~inc).sum())

    before = np.mean([auc(design.initial, c) for c in range(6)])
    after = np.mean([auc(design.examples, c) for c in range(6)])
    assert after > before + 0.05, (before, after)


def test_the_design_keeps_the_labels_wrong_and_the_inputs_in_the_datas_range():
    data = _data()
    x, y = data.tensors
    design = optimize_input_canaries(nn.Linear(6, 2), data, 30, sample_rate=0.1, steps=5, lr=1.0, meta_steps=8)
    z, labels = design.examples.tensors
    start, same = design.initial.tensors
    assert torch.equal(labels, same) and torch.equal(start, x[design.rows])
    assert bool((labels != y[design.rows]).all())  # K = 2: the other class
    assert bool((z >= x.min(0).values).all() and (z <= x.max(0).values).all())
    assert not torch.equal(z, start)  # it moved
    unbounded = optimize_input_canaries(nn.Linear(6, 2), data, 30, sample_rate=0.1, steps=5, lr=1.0, meta_steps=8,
                                        bounds=None, meta_lr=5.0)  # fmt: skip
    assert bool((unbounded.examples.tensors[0].abs() > x.abs().max()).any())  # without the box it leaves the range
    boxed = optimize_input_canaries(nn.Linear(6, 2), data, 30, sample_rate=0.1, steps=5, lr=1.0, meta_steps=8,
                                    bounds=(-0.5, 0.5), meta_lr=5.0)  # fmt: skip
    assert float(boxed.examples.tensors[0].abs().max()) <= 0.5


def test_the_same_seed_gives_the_same_canaries_and_leaves_the_global_generator_alone():
    data, model = _data(), nn.Linear(6, 2)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    one = optimize_input_canaries(model, data, 10, sample_rate=0.2, steps=4, lr=0.5, meta_steps=3, seed=7)
    assert torch.equal(torch.rand(1), before)
    two = optimize_input_canaries(nn.Linear(6, 2), data, 10, sample_rate=0.2, steps=4, lr=0.5, meta_steps=3, seed=7)
    assert torch.equal(one.examples.tensors[0], two.examples.tensors[0]) and one.objective == two.objective
    other = optimize_input_canaries(nn.Linear(6, 2), data, 10, sample_rate=0.2, steps=4, lr=0.5, meta_steps=3, seed=8)
    assert one.rows != other.rows


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_canaries=0), "`num_canaries` must be a positive int, got 0"),
        (dict(num_canaries=301), "`num_canaries`=301 needs as many training rows to start from; the data has 300"),
        (dict(sample_rate=0.0), r"`sample_rate` must be in \(0, 1\], got 0.0"),
        (dict(steps=2.5), "`steps` must be a positive int, got 2.5"),
        (dict(lr=-1), "`lr` must be a positive number, got -1"),
        (dict(meta_steps=0), "`meta_steps` must be a positive int, got 0"),
        (dict(meta_lr=True), "`meta_lr` must be a positive number, got True"),
        (dict(bounds="box"), "`bounds` must be 'data', None or \\(low, high\\), got 'box'"),
        (dict(bounds=(1.0, 0.0)), "`bounds` must have low <= high everywhere"),
        (dict(num_classes=1), "`num_classes` must be >= 2 and above every label \\(max 1\\), got 1"),
        (dict(optimizer="rmsprop"), "`optimizer` must be 'sgd' or 'adam', got 'rmsprop'"),
    ],
)
def test_bad_arguments_name_argument_and_value(kwargs, match):
    args = {**dict(num_canaries=10, sample_rate=0.1, steps=2, lr=0.5, meta_steps=1), **kwargs}
    with pytest.raises(ValueError, match=match):
        optimize_input_canaries(nn.Linear(6, 2), _data(), **args)


def test_data_that_are_not_float_inputs_with_int_labels_are_refused():
    data = TensorDataset(torch.randint(0, 5, (20, 3)), torch.zeros(20, dtype=torch.long))
    with pytest.raises(ValueError, match="floating-point inputs and one integer class label"):
        optimize_input_canaries(nn.Linear(3, 2), data, 5, sample_rate=0.1, steps=1, lr=0.1, meta_steps=1)


# ------------------------------------------------------------------------------------------ CanaryAudit(examples=)
def _examples(m=40, seed=9):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(3 * torch.randn(m, D, generator=g), torch.randint(0, 2, (m,), generator=g))


def _fit(callbacks, epochs=2, tmp_path=None, **kwargs):
    torch.manual_seed(0)
    t = trainer(callbacks, tmp_path, max_epochs=epochs, **kwargs)
    t.fit(TabularMLP(D, hidden=(32,), lr=0.5), DataLoader(tiny_dataset(), batch_size=26, shuffle=True))
    return t


def test_given_examples_are_the_canaries_appended_and_scored():
    examples = _examples()
    audit = CanaryAudit("input", examples=examples, seed=4)
    assert audit.num_canaries == 40
    t = _fit([DPSGD(noise_multiplier=1.0), audit], epochs=1)
    included = int(audit.included.sum())
    assert 0 < included < 40 and len(t.train_dataloader.dataset) == N + included
    order = audit.state_dict()["canaries"]  # canary j is examples[order[j]]
    assert sorted(order) == list(range(40))
    appended = [t.train_dataloader.dataset[N + i] for i in range(included)]
    expected = [examples[order[j]] for j in np.flatnonzero(audit.included)]
    for (x, y), (ex, ey) in zip(appended, expected):
        assert torch.equal(x, ex) and int(y) == int(ey)  # the example with its own label
    model = t.lightning_module.eval()
    z, labels = examples.tensors
    with torch.no_grad():
        scores = -membership_loss(model(z[order]), labels[order]).double().numpy()
    assert np.allclose(audit.scores, scores, rtol=0, atol=1e-6)
    assert 0 <= audit.results[names.CANARY_EPSILON_LOWER] <= audit.accountant_epsilon


def test_examples_arguments_are_checked_at_construction():
    with pytest.raises(MisconfigurationException, match="pass them with kind='input', not kind='gradient'"):
        CanaryAudit("gradient", examples=_examples())
    with pytest.raises(MisconfigurationException, match="`num_canaries`=10 but `examples` holds 40 canaries"):
        CanaryAudit("input", num_canaries=10, examples=_examples())
    with pytest.raises(MisconfigurationException, match="`examples` must be a map-style dataset.*got 'list_iterator'"):
        CanaryAudit("input", examples=iter([1, 2]))
    with pytest.raises(MisconfigurationException, match="`examples` must be a non-empty dataset"):
        CanaryAudit("input", examples=TensorDataset(torch.zeros(0, D), torch.zeros(0, dtype=torch.long)))
    with pytest.raises(MisconfigurationException, match="one integer class label per example"):
        CanaryAudit("input", examples=TensorDataset(torch.zeros(3, D), torch.zeros(3, 2)))


def test_a_resumed_audit_checks_its_canaries_by_their_fingerprint(tmp_path):
    first = CanaryAudit("input", examples=_examples(), seed=1)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    _fit([first, ckpt], epochs=1, tmp_path=tmp_path, enable_checkpointing=True)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"][first.state_key]
    again = CanaryAudit("input", examples=_examples(), seed=1)
    again.load_state_dict(state)  # the same canaries: accepted
    assert np.array_equal(again.included, first.included)
    with pytest.raises(
        RuntimeError, match="checkpoint audited canary examples .*, this CanaryAudit has canary examples"
    ):
        CanaryAudit("input", examples=_examples(seed=10), seed=1).load_state_dict(state)
    with pytest.raises(RuntimeError, match="this CanaryAudit has the mislabelled training rows"):
        CanaryAudit("input", num_canaries=40, seed=1).load_state_dict(state)
    plain = CanaryAudit("input", num_canaries=40, seed=1).state_dict()
    with pytest.raises(RuntimeError, match="checkpoint audited the mislabelled training rows"):
        CanaryAudit("input", examples=_examples(), seed=1).load_state_dict(plain)

"""The canary machinery without a Trainer: the canary set follows the seed, each sampled canary is added once across
ranks, the state is strict, input canaries are wrong-label copies, and the fit-end audit reads DP-SGD's settings."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_privacy import names
from lightning_privacy.audits import canary_run as run
from lightning_privacy.models import TabularMLP
from tests.callbacks._tiny import D, tiny_dataset

WIDE = 128  # TabularMLP(8, hidden=(128,)): 1410 trainable coordinates
COORDS = D * WIDE + WIDE + WIDE * 2 + 2


def _model():
    return TabularMLP(D, hidden=(WIDE,), lr=0.5)


def _hooked(world_size, rank, *, seed=3, m=200, rate=0.5, clip=2.0):
    """Gradient canaries on a model, as one simulated DDP rank would wire them."""
    model = _model()
    canaries = run.CanarySet("gradient", m, seed)
    optimizer = SimpleNamespace(
        param_groups=[{"params": list(model.parameters())}],
        loss_reduction="sum",
        expected_batch_size=16,
        accumulated_iterations=1,
        summed=lambda p: p.summed_grad,  # DPSGD's optimizers give the clipped sum this way
    )
    dpsgd = SimpleNamespace(sample_rate=rate, max_grad_norm=clip, noise_multiplier=1.0)
    gradient = run.GradientCanaries(
        canaries, model, optimizer, dpsgd, score="released_minus_batch", adds=rank == 0, world=world_size
    )
    for p in model.parameters():
        p.summed_grad = torch.zeros_like(p)
    return gradient, model, optimizer


def _flat_summed(model):
    return torch.cat([p.summed_grad.reshape(-1) for p in model.parameters()])


def test_canary_set_inclusion_and_sampling_follow_the_seed():
    gradient, _, _ = _hooked(1, 0, m=1000, rate=0.1)
    canaries = gradient.canaries
    coords = np.asarray(canaries.canaries)
    assert len(set(coords.tolist())) == 1000 and coords.min() >= 0 and coords.max() < COORDS
    assert 400 < canaries.included.sum() < 600
    rates = np.mean([canaries.sampled(t, 0.1)[canaries.included].mean() for t in range(200)])
    assert rates == pytest.approx(0.1, abs=0.01)
    assert not canaries.sampled(0, 0.1)[~canaries.included].any()  # excluded canaries are never sampled
    again, _, _ = _hooked(1, 0, m=1000, rate=0.1)
    assert again.canaries.canaries == canaries.canaries
    assert np.array_equal(again.canaries.sampled(17, 0.1), canaries.sampled(17, 0.1))
    other, _, _ = _hooked(1, 0, m=1000, rate=0.1, seed=4)
    assert other.canaries.canaries != canaries.canaries


def test_before_noise_adds_each_sampled_canary_once_across_ranks():
    single, model, opt = _hooked(1, 0)
    ranks = [_hooked(2, r) for r in (0, 1)]
    coords = torch.as_tensor(single.canaries.canaries)
    for step in range(3):
        for gradient, m, o in [(single, model, opt), *ranks]:
            for p in m.parameters():
                p.summed_grad.zero_()
            gradient.before_noise(o)
        expected = torch.zeros(COORDS)
        expected[coords[torch.as_tensor(single.canaries.sampled(step, 0.5))]] = 2.0  # C·e_j, C = 2
        assert torch.equal(_flat_summed(model), expected)
        assert torch.equal(_flat_summed(ranks[0][1]), expected)  # global rank 0 adds them …
        assert not _flat_summed(ranks[1][1]).any()  # … rank 1 adds nothing: DDP's sum counts them once
        assert expected.sum() > 0
    assert single.canaries.steps == ranks[0][0].canaries.steps == ranks[1][0].canaries.steps == 3


def test_after_step_scores_the_released_sum_minus_the_batch():
    """σ → 0: p.grad is the clipped sum plus the canaries; the score is C per canary sampled this step."""
    gradient, model, opt = _hooked(1, 0, m=50)
    for p in model.parameters():
        p.summed_grad.normal_()  # the batch's own clipped sum
    pending = gradient.before_noise(opt)
    for p in model.parameters():
        p.grad = p.summed_grad.clone()  # released: sum (with the canaries) / unit, unit = 1 for "sum"
    score = gradient.after_step(pending)
    np.testing.assert_allclose(score, 2.0 * gradient.canaries.sampled(0, 0.5), atol=1e-6)
    np.testing.assert_allclose(gradient.canaries.scores, score)


def test_the_default_adapts_to_a_small_model_and_an_explicit_number_does_not():
    canaries = run.CanarySet("gradient", None, 0)
    assert "one canary on each (num_canaries=30)" in canaries.draw(30, "trainable coordinates")
    assert canaries.num_canaries == 30 and sorted(canaries.canaries) == list(range(30))
    with pytest.raises(ValueError, match=r"num_canaries=40 needs as many trainable coordinates, but the run has 30"):
        run.CanarySet("gradient", 40, 0).draw(30, "trainable coordinates")
    with pytest.raises(RuntimeError, match="drawn for 30 trainable coordinates, this run has 31"):
        canaries.draw(31, "trainable coordinates")


def test_state_round_trip_and_strictness():
    canaries = run.CanarySet("gradient", 20, 1)
    canaries.draw(100, "trainable coordinates")
    canaries.scores += 1.5
    canaries.steps = 7
    state = canaries.state_dict()
    again = run.CanarySet("gradient", 20, 1)
    again.load_state_dict(dict(state, score="released"), {"score": "released"})
    assert again.state_dict() == state
    with pytest.raises(RuntimeError, match="missing"):
        again.load_state_dict({"version": 1}, {})
    with pytest.raises(RuntimeError, match="seed=1, this CanaryAudit has 2"):
        run.CanarySet("gradient", 20, 2).load_state_dict(state, {})
    with pytest.raises(RuntimeError, match="score='released', this CanaryAudit has 'likelihood_ratio'"):
        run.CanarySet("gradient", 20, 1).load_state_dict(dict(state, score="released"), {"score": "likelihood_ratio"})


def test_input_canaries_are_wrong_label_copies_appended_to_the_loader():
    dataset = tiny_dataset()
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    canaries = run.CanarySet("input", 40, 4)
    inputs = run.InputCanaries(canaries, loader, num_classes=None, model=_model())
    included = int(canaries.included.sum())
    assert len(inputs.loader.dataset) == len(dataset) + included and inputs.loader.batch_size == 32
    for j, (row, label) in enumerate(zip(canaries.canaries, canaries.labels)):
        x, y = run.CanaryRows(dataset, canaries.canaries, canaries.labels)[j]
        assert torch.equal(x, dataset[row][0]) and int(y) == label != int(dataset[row][1])
    assert inputs.scores(_model()).shape == (40,)
    with pytest.raises(ValueError, match="needs one DataLoader with a batch_size"):
        run.InputCanaries(canaries, [1, 2], num_classes=2, model=None)
    with pytest.raises(ValueError, match="needs one integer class label per example"):
        run.label_of((torch.zeros(2), torch.zeros(2)))


def test_arguments_and_claims_are_checked_without_lightning():
    with pytest.raises(ValueError, match="`kind` must be one of .*got 'labels'"):
        run.check_arguments("labels", None, 0, 0.05, None, "bonferroni", "released", None)
    assert run.parse_claim(None) is None and run.parse_claim((1.0, 1e-5)).epsilon == pytest.approx(1.0)
    with pytest.raises(ValueError):
        run.parse_claim("not a claim")


def test_the_run_audit_takes_the_accountants_epsilon_and_delta():
    rng = np.random.default_rng(0)
    canaries = run.CanarySet("gradient", 500, 0)
    canaries.draw(1000, "trainable coordinates")
    canaries.scores = rng.normal(size=500) + 3.0 * canaries.included
    dpsgd = SimpleNamespace(delta=1e-6, epsilon=lambda delta: 9.0, ledger=SimpleNamespace(steps=0))
    result = run.audit_run(canaries, kind="gradient", alpha=0.05, delta=None, correction="bonferroni", dpsgd=dpsgd)
    assert result.accountant_epsilon == 9.0 and result.claim is None
    assert 0 < result.values[names.CANARY_EPSILON_LOWER] < 9.0
    alone = run.audit_run(canaries, kind="scores", alpha=0.05, delta=None, correction="bonferroni")
    assert alone.accountant_epsilon is None

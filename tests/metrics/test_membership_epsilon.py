"""MembershipEpsilon: state, the compute() contract, errors, and sync across two gloo processes."""

from __future__ import annotations

import pytest
import torch

from lightning_privacy.analysis.estimation import epsilon_lower_bound
from lightning_privacy.metrics.membership_epsilon import MembershipEpsilon
from tests._ddp import run_distributed

CONTRACT_KEYS = {"epsilon_lower", "interval_low", "interval_high", "threshold", "tp", "fp", "tn", "fn", "optimistic"}


def _data(n: int = 400, shift: float = 1.5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    member = torch.arange(n) % 2 == 0
    scores = torch.randn(n, generator=gen) + shift * member
    return scores, member


@pytest.mark.parametrize("selection", ["holdout", "bonferroni", "none"])
def test_compute_matches_pure_function_and_contract(selection):
    scores, member = _data()
    metric = MembershipEpsilon(delta=1e-5, method="jeffreys", selection=selection, seed=3)
    for chunk_s, chunk_m in zip(scores.split(70), member.split(70)):
        metric.update(chunk_s, chunk_m.int())
    out = metric.compute()
    expected = epsilon_lower_bound(
        scores.double().numpy(), member.numpy(), delta=1e-5, method="jeffreys", selection=selection, seed=3
    )
    assert CONTRACT_KEYS <= set(out)
    assert out == expected.as_dict()
    assert out["optimistic"] is (selection == "none")
    for key in ("epsilon_lower", "interval_low", "interval_high", "threshold"):
        assert type(out[key]) is float
    for key in ("tp", "fp", "tn", "fn"):
        assert type(out[key]) is int
    assert out["epsilon_lower"] == out["interval_low"] <= out["interval_high"]
    assert out["epsilon_lower"] > 0.3  # a shift of 1.5 sd is a real attack


def test_bayes_default_and_reset():
    scores, member = _data(n=300)
    metric = MembershipEpsilon(delta=1e-5)
    metric.update(scores, member)
    first = metric.compute()
    assert first["method"] == "bayes" and first["selection"] == "holdout"
    assert first["tp"] + first["fn"] == 75 and first["fp"] + first["tn"] == 75  # the held-out half
    metric.reset()
    metric.update(scores, member)
    assert metric.compute() == first


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delta": -0.1}, "`delta`"),
        ({"delta": 1e-5, "alpha": 0.0}, "`alpha`"),
        ({"delta": 1e-5, "method": "beta"}, "`method`"),
        ({"delta": 1e-5, "selection": "best"}, "`selection`"),
        ({"delta": 1e-5, "sided": "left"}, "`sided`"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MembershipEpsilon(**kwargs)


def test_bad_updates():
    metric = MembershipEpsilon(delta=1e-5)
    with pytest.raises(TypeError, match="`scores`"):
        metric.update(torch.ones(3, dtype=torch.long), torch.ones(3))
    with pytest.raises(ValueError, match="same shape"):
        metric.update(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="`is_member`"):
        metric.update(torch.ones(3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="NaN"):
        metric.update(torch.tensor([0.0, float("nan")]), torch.tensor([0, 1]))
    metric.update(torch.ones(3), torch.ones(3, dtype=torch.bool))  # members only
    with pytest.raises(ValueError, match="non-members"):
        metric.compute()


def _ddp_compute(rank: int, world_size: int, scores: torch.Tensor, member: torch.Tensor) -> dict:
    metric = MembershipEpsilon(delta=1e-5, method="clopper_pearson", selection="holdout", seed=1)
    metric.update(scores[rank::world_size], member[rank::world_size])
    return metric.compute()


@pytest.mark.slow
def test_synced_across_processes():
    scores, member = _data(n=400, seed=5)
    results = run_distributed(_ddp_compute, scores, member)
    # "cat" gathers rank 0's trials, then rank 1's
    order = torch.cat([torch.arange(400)[0::2], torch.arange(400)[1::2]])
    expected = epsilon_lower_bound(
        scores[order].double().numpy(),
        member[order].numpy(),
        delta=1e-5,
        method="clopper_pearson",
        selection="holdout",
        seed=1,
    )
    assert results[0] == results[1] == expected.as_dict()
    assert results[0]["tp"] + results[0]["fn"] + results[0]["fp"] + results[0]["tn"] == 200

"""The privacy-loss distribution of a group of k records (``ComposedPLD(group_size=k)``) and the group claim
(``Claim.dp_sgd(..., group_size=k)``, ``Claim.from_ledger(..., group_size=k)``): what canaries inserted k times audit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from lightning_privacy.analysis import composition
from lightning_privacy.analysis.composition import ComposedPLD
from lightning_privacy.claims import Claim
from lightning_privacy.ledger import PrivacyLedger

dp_pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")


def _reference(k: int, q: float, sigma: float, steps: int):
    weights = [float(stats.binom.pmf(j, k, q)) for j in range(k + 1)]
    pld = dp_pld.from_mixture_gaussian_mechanism(sigma, list(range(k + 1)), weights, value_discretization_interval=1e-3)
    return pld.self_compose(steps)


@pytest.mark.parametrize(("k", "q", "sigma", "steps"), [(2, 0.05, 1.0, 200), (4, 0.02, 1.5, 300)])
def test_the_group_pld_matches_dp_accounting(k, q, sigma, steps):
    """An independent computation: dp_accounting's pessimistic ``MixtureGaussianPrivacyLoss`` (sensitivities 0…k,
    binomial weights; connect-the-dots) self-composed on the same grid."""
    ours = ComposedPLD(relation="add_remove", group_size=k).compose(sample_rate=q, noise_multiplier=sigma, steps=steps)
    reference = _reference(k, q, sigma, steps)
    assert ours.value_discretization_interval == 1e-3
    for delta in (1e-3, 1e-5):
        assert ours.epsilon(delta) == pytest.approx(reference.get_epsilon_for_delta(delta), rel=1e-3)
    for eps in (0.0, 1.0, 3.0):
        assert float(ours.delta(eps)) == pytest.approx(reference.get_delta_for_epsilon(eps), abs=1e-6)


def test_the_group_pld_is_above_a_monte_carlo_estimate_of_the_true_delta():
    """A second independent computation: δ(ε) = E_P[(1 − e^{ε − L})₊] of the composed mechanism, L the sum of the
    per-step losses, estimated from 60,000 draws of each order (k = 3, q = 0.1, σ = 2, 300 steps; δ(0) ≈ 0.819):
    the PLD's value is never below the estimate by more than 4 standard errors, and within 0.005 above it."""
    k, q, sigma, steps = 3, 0.1, 2.0, 300
    pld = ComposedPLD(relation="add_remove", group_size=k).compose(sample_rate=q, noise_multiplier=sigma, steps=steps)
    weights = np.array([stats.binom.pmf(j, k, q) for j in range(k + 1)])
    rng = np.random.default_rng(1)
    for eps in (0.0, 1.0):
        estimates = []
        for direction in ("remove", "add"):
            losses = []
            for _ in range(6):
                if direction == "remove":
                    x = rng.normal(-rng.choice(k + 1, p=weights, size=(10_000, steps)), sigma)
                else:
                    x = rng.normal(0.0, sigma, size=(10_000, steps))
                losses.append(composition._group_losses(direction, x.ravel(), q, sigma, 1.0, k).reshape(x.shape).sum(1))
            values = np.maximum(1.0 - np.exp(eps - np.concatenate(losses)), 0.0)
            estimates.append((values.mean(), values.std() / math.sqrt(values.size)))
        mean, error = max(estimates)
        assert mean - 4 * error <= float(pld.delta(eps)) <= mean + 0.005, (eps, mean, error, float(pld.delta(eps)))


def test_without_subsampling_a_group_is_one_gaussian_of_k_times_the_sensitivity():
    """q = 1: every copy is in every step, so the group's mechanism is the Gaussian with sensitivity k: its exact
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), μ = k√T/σ (Balle and Wang 2018)."""
    k, sigma, steps = 3, 4.0, 10
    mu = k * math.sqrt(steps) / sigma

    def exact_delta(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)

    pld = ComposedPLD(relation="add_remove", group_size=k).compose(sample_rate=1.0, noise_multiplier=sigma, steps=steps)
    exact = optimize.brentq(lambda e: exact_delta(e) - 1e-5, 0.0, 100.0)
    assert exact <= pld.epsilon(1e-5) <= exact + 0.01
    for eps in (0.5, 2.0):
        assert exact_delta(eps) <= float(pld.delta(eps)) <= exact_delta(eps) + 1e-3
    # beyond the loss cap of 50: epsilon() is inf, epsilon_uncapped() recomposes the group with a wider cap
    big = ComposedPLD(relation="add_remove", group_size=2).compose(sample_rate=1.0, noise_multiplier=0.3, steps=5)
    mu = 2 * math.sqrt(5) / 0.3
    exact = optimize.brentq(lambda e: exact_delta(e) - 1e-5, 0.0, 400.0)
    assert big.epsilon(1e-5) == math.inf and exact <= big.epsilon_uncapped(1e-5) <= exact + 0.05


def test_the_outputs_at_each_loss_come_from_bisection_as_exactly_as_the_closed_form():
    eps = np.linspace(-0.3, 3.0, 23)
    for direction in ("remove", "add"):
        closed = composition._inverse_loss(direction, eps, 0.1, 1.3, 1.0)
        found = composition._inverse_group_loss(direction, eps, 0.1, 1.3, 1.0, 1)
        reached = np.isfinite(closed)
        np.testing.assert_allclose(found[reached], closed[reached], rtol=0, atol=1e-12)
        losses = composition._group_losses(direction, found[reached], 0.1, 1.3, 1.0, 1)
        np.testing.assert_allclose(losses, eps[reached], rtol=0, atol=1e-12)


def test_a_larger_group_has_a_larger_epsilon_and_the_state_keeps_the_group():
    values = [
        ComposedPLD(relation="add_remove", group_size=k).compose(sample_rate=0.05, noise_multiplier=1.0, steps=100)
        for k in (1, 2, 4)
    ]
    eps = [v.epsilon(1e-5) for v in values]
    assert eps[0] < eps[1] < eps[2]
    assert eps[0] == ComposedPLD(relation="add_remove").compose(
        sample_rate=0.05, noise_multiplier=1.0, steps=100
    ).epsilon(1e-5)
    four = values[2]
    assert four.copy().group_size == 4 and four.copy().epsilon(1e-5) == eps[2]
    again = ComposedPLD.from_chunks(four.chunks, relation="add_remove", group_size=4)
    assert again.epsilon(1e-5) == eps[2] and "group_size=4" in repr(again)
    assert four.bayes_security() < values[0].bayes_security()
    assert four.bayes_security_after(sample_rate=0.05, noise_multiplier=1.0, steps=10) == pytest.approx(
        four.after(sample_rate=0.05, noise_multiplier=1.0, steps=10).bayes_security(), abs=1e-9
    )


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_a_bad_group_size_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="`group_size` to be an int >= 1"):
        ComposedPLD(relation="add_remove", group_size=bad)
    with pytest.raises(ValueError, match="`group_size` must be an int >= 1"):
        Claim.dp_sgd(noise_multiplier=1.0, sample_rate=0.1, steps=10, group_size=bad)


def test_groups_are_for_add_remove_only():
    with pytest.raises(ValueError, match="`group_size`=2 needs relation='add_remove', got 'replace'"):
        ComposedPLD(relation="replace", group_size=2)


def test_the_group_claim_is_the_group_pld_of_the_ledgers_history():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.2, sample_rate=0.05, steps=200)
    ledger.step(noise_multiplier=2.0, sample_rate=0.05, steps=100)
    claim = Claim.from_ledger(ledger, group_size=3)
    pld = ComposedPLD(relation="add_remove", group_size=3).compose(
        sample_rate=[0.05, 0.05], noise_multiplier=[1.2, 2.0], steps=[200, 100]
    )
    assert claim.epsilon == pytest.approx(pld.epsilon(1e-5), abs=1e-9)
    assert claim.epsilon > Claim.from_ledger(ledger).epsilon
    assert claim.to_dict()["group_size"] == 3 and "groups of 3" in claim.label
    np.testing.assert_allclose(claim.tpr_bound([1e-3, 0.1]), pld.tpr_bound([1e-3, 0.1]))
    single = Claim.dp_sgd(noise_multiplier=1.2, sample_rate=0.05, steps=200)
    assert "group_size" not in single.to_dict() and "groups" not in single.label


def test_canaries_inserted_k_times_contradict_the_record_claim_and_not_the_group_claim():
    """The one-run game with every canary a group of k = 4 copies (simulated DP-SGD: each step j ~ Binomial(4, q)
    copies of an included canary join, its score sums j·C plus the noise): the record-level claim is contradicted
    in every run, the group claim (the guarantee those canaries have) in none."""
    sigma, q, steps, k, m = 2.0, 0.1, 100, 4, 1000
    record = Claim.dp_sgd(noise_multiplier=sigma, sample_rate=q, steps=steps)
    group = Claim.dp_sgd(noise_multiplier=sigma, sample_rate=q, steps=steps, group_size=k)
    contradicted = {"record": 0, "group": 0}
    runs = 8
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        copies = rng.binomial(k, q, size=(steps, m)).sum(0)
        scores = copies * included + rng.normal(0.0, sigma * math.sqrt(steps), size=m)
        for name, claim in (("record", record), ("group", group)):
            contradicted[name] += claim.check_canaries(scores, included, tests="fdp", seed=seed).contradicted
    assert contradicted == {"record": runs, "group": 0}, contradicted

"""Epsilon* (Negoescu et al. 2023): Equation 7, its supremum, both estimators and input checks."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from lightning_privacy.analysis.epsilon_star import (
    EMPIRICAL_RATE_RANGE,
    default_delta,
    epsilon_star,
    epsilon_star_details,
    epsilon_star_from_distributions,
    epsilon_star_from_rates,
    transform_losses,
)


def _eq7_loop(fpr, fnr, delta):
    """Equation 7 written out literally, one threshold at a time."""
    best = 1.0
    for t, eta in zip(fpr, fnr):
        best = max(best, (1 - delta - eta) / t, (1 - delta - t) / eta, (eta - delta) / (1 - t), (t - delta) / (1 - eta))
    return math.log(best)


def _brute_force(member, nonmember, delta, points=400_001):
    """Equation 7 on a dense grid of thresholds, keeping rates in (delta, 1 - delta)."""
    low = min(member.ppf(delta / 10), nonmember.ppf(delta / 10))
    high = max(member.isf(delta / 10), nonmember.isf(delta / 10))
    tau = np.linspace(low, high, points)
    t, eta = nonmember.cdf(tau), member.sf(tau)
    keep = (t > delta) & (t < 1 - delta) & (eta > delta) & (eta < 1 - delta)
    t, eta = t[keep], eta[keep]
    ratios = np.stack([(1 - delta - eta) / t, (1 - delta - t) / eta, (eta - delta) / (1 - t), (t - delta) / (1 - eta)])
    return max(0.0, float(np.log(ratios.max())))


# --- Equation 7 ------------------------------------------------------------------------------
def test_from_rates_matches_literal_formula():
    rng = np.random.default_rng(0)
    fpr, fnr = rng.uniform(0.01, 0.99, 50), rng.uniform(0.01, 0.99, 50)
    assert epsilon_star_from_rates(fpr=fpr, fnr=fnr, delta=1e-3) == pytest.approx(_eq7_loop(fpr, fnr, 1e-3), rel=1e-12)


def test_from_rates_known_value_and_zero_for_chance():
    # t = 0.1, eta = 0.6: ratio 1 = (1 - 0.6 - d) / 0.1 ~ 4
    assert epsilon_star_from_rates(fpr=[0.1], fnr=[0.6], delta=1e-9) == pytest.approx(math.log(4.0), rel=1e-6)
    # the chance line eta = 1 - t gives all ratios < 1 for delta > 0
    t = np.linspace(0.01, 0.99, 99)
    assert epsilon_star_from_rates(fpr=t, fnr=1 - t, delta=1e-6) == 0.0


# --- the supremum for continuous CDFs vs a brute-force grid ----------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_sup_matches_brute_force_grid_on_random_binormal_curves(seed):
    rng = np.random.default_rng(seed)
    member = stats.norm(rng.uniform(-1, 1), rng.uniform(0.3, 2.0))
    nonmember = stats.norm(rng.uniform(-1, 2), rng.uniform(0.3, 2.0))
    delta = float(10 ** rng.uniform(-6, -2))
    ours = epsilon_star_from_distributions(member, nonmember, delta=delta)
    grid = _brute_force(member, nonmember, delta)
    assert ours >= grid - 1e-9  # the optimiser never does worse than the dense grid
    assert ours == pytest.approx(grid, abs=1e-4, rel=1e-4)


@pytest.mark.parametrize(
    "member, nonmember",
    [
        (stats.gamma(2, scale=5), stats.gamma(4, scale=5)),
        (stats.logistic(0, 1), stats.logistic(1.5, 1.3)),
        (stats.gamma(3, scale=2), stats.gamma(2, scale=2)),  # members have HIGHER loss: still >= 0
        (stats.t(5, 0, 1), stats.norm(0.5, 2.0)),
    ],
)
def test_sup_matches_brute_force_grid_on_other_curves(member, nonmember):
    delta = 1e-4
    ours = epsilon_star_from_distributions(member, nonmember, delta=delta)
    grid = _brute_force(member, nonmember, delta)
    assert ours >= grid - 1e-9
    assert ours == pytest.approx(grid, abs=1e-4, rel=1e-4)


def test_identical_distributions_give_zero():
    for dist in (stats.norm(0.3, 2.0), stats.gamma(2, scale=5)):
        assert epsilon_star_from_distributions(dist, dist, delta=1e-6) == 0.0
    rng = np.random.default_rng(0)
    losses = rng.gamma(2, 5, 1000)
    for method in ("parametric", "empirical"):
        assert epsilon_star(losses, losses.copy(), delta=1e-5, method=method) == 0.0


def test_swapping_members_and_nonmembers_keeps_the_value():
    # (t, eta) -> (1 - eta, 1 - t) maps ratio 1 <-> 4 and 2 <-> 3
    a, b = stats.norm(0, 1), stats.norm(1, 1.5)
    assert epsilon_star_from_distributions(a, b, delta=1e-5) == pytest.approx(
        epsilon_star_from_distributions(b, a, delta=1e-5), rel=1e-8
    )
    rng = np.random.default_rng(1)
    x, y = rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000)
    for method in ("parametric", "empirical"):
        assert epsilon_star(x, y, delta=1e-5, method=method) == pytest.approx(
            epsilon_star(y, x, delta=1e-5, method=method), rel=1e-8
        )


def test_larger_delta_never_increases_epsilon():
    a, b = stats.norm(0, 1), stats.norm(1, 1.3)
    values = [epsilon_star_from_distributions(a, b, delta=d) for d in (1e-8, 1e-6, 1e-4, 1e-2, 0.1)]
    assert all(x >= y - 1e-12 for x, y in zip(values, values[1:]))
    assert values[0] > values[-1]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(20, 300),
    shift=st.floats(-3, 3),
    delta=st.floats(1e-8, 0.49),
    method=st.sampled_from(["parametric", "empirical"]),
)
def test_epsilon_star_is_never_negative(seed, n, shift, delta, method):
    rng = np.random.default_rng(seed)
    value = epsilon_star(rng.normal(0, 1, n), rng.normal(shift, 1, n + 7), delta=delta, method=method)
    assert value >= 0.0 and math.isfinite(value)


# --- the parametric estimator ------------------------------------------------------------------
def _losses_for_phi(phi):
    """Invert the transform for losses already in [0, 1]: v = -log sigmoid(phi), loss = v - 1."""
    return np.logaddexp(0.0, -phi) - 1.0


def test_transform_round_trip_and_monotone():
    phi = np.linspace(-1.8, -0.6, 7)
    losses = _losses_for_phi(phi)
    np.testing.assert_allclose(transform_losses(losses, low=0.0, high=1.0), phi, rtol=1e-12)
    assert np.all(np.diff(transform_losses(np.linspace(0, 3, 50), low=0.0, high=3.0)) < 0)


def test_parametric_converges_to_the_value_of_the_true_cdfs():
    # Normals in the transformed space; the losses are placed in [0, 1] with 0 and 1 present so the
    # joint normalisation is the identity. phi decreases with the loss, so the attack works on -phi.
    mu_tr, sd_tr, mu_pop, sd_pop, delta = -1.05, 0.07, -1.2, 0.09, 1e-4
    truth = epsilon_star_from_distributions(stats.norm(-mu_tr, sd_tr), stats.norm(-mu_pop, sd_pop), delta=delta)
    assert truth == pytest.approx(7.0032, abs=1e-3)
    errors = []
    for n in (1_000, 10_000, 100_000):
        err = []
        for rep in range(3):
            rng = np.random.default_rng(rep)
            members = np.concatenate([_losses_for_phi(rng.normal(mu_tr, sd_tr, n)), [0.0, 1.0]])
            nonmembers = _losses_for_phi(rng.normal(mu_pop, sd_pop, n))
            assert members.min() == 0.0 and members.max() == 1.0 and 0 < nonmembers.min() < nonmembers.max() < 1
            err.append(abs(epsilon_star(members, nonmembers, delta=delta) - truth))
        errors.append(np.mean(err))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.03


def test_parametric_details_are_consistent():
    rng = np.random.default_rng(3)
    members, nonmembers = rng.gamma(2, 5, 5000), rng.gamma(3, 5, 5000)
    d = epsilon_star_details(members, nonmembers, delta=1e-5)
    low, high = min(members.min(), nonmembers.min()), max(members.max(), nonmembers.max())
    assert (d.loss_min, d.loss_max) == (low, high)
    phi_tr, phi_pop = transform_losses(members, low=low, high=high), transform_losses(nonmembers, low=low, high=high)
    assert d.member_mean == pytest.approx(phi_tr.mean()) and d.member_std == pytest.approx(phi_tr.std())
    assert d.nonmember_mean == pytest.approx(phi_pop.mean()) and d.nonmember_std == pytest.approx(phi_pop.std())
    # the reported threshold, mapped back through the transform, reproduces the rates and the value
    phi_tau = transform_losses([d.threshold], low=low, high=high)[0]
    fpr = stats.norm.sf(phi_tau, d.nonmember_mean, d.nonmember_std)  # non-members with phi >= phi_tau
    fnr = stats.norm.cdf(phi_tau, d.member_mean, d.member_std)
    assert (d.fpr, d.fnr) == (pytest.approx(fpr, rel=1e-6), pytest.approx(fnr, rel=1e-6))
    assert d.delta <= d.fpr <= 1 - d.delta and d.delta * (1 - 1e-6) <= d.fnr <= 1 - d.delta
    assert d.ratio in (1, 2, 3, 4)
    assert epsilon_star_from_rates(fpr=[fpr], fnr=[fnr], delta=1e-5) == pytest.approx(d.epsilon_star, rel=1e-5)
    assert 0.0 <= d.ks_pvalue_member <= 1.0 and 0.0 <= d.ks_pvalue_nonmember <= 1.0


def test_ks_pvalues_flag_a_bad_fit():
    rng = np.random.default_rng(0)
    normal_like = _losses_for_phi(rng.normal(-1.2, 0.05, 20_000))
    bimodal = _losses_for_phi(np.concatenate([rng.normal(-1.6, 0.03, 10_000), rng.normal(-0.8, 0.03, 10_000)]))
    d = epsilon_star_details(bimodal, normal_like, delta=1e-5)
    assert d.ks_pvalue_member < 1e-6
    assert d.ks_pvalue_nonmember > 1e-3


# --- the empirical estimator -------------------------------------------------------------------
def test_empirical_matches_brute_force_with_ties():
    rng = np.random.default_rng(7)
    members, nonmembers = rng.poisson(8, 3000).astype(float), rng.poisson(10, 2500).astype(float)
    fpr, fnr = [], []
    for tau in np.unique(np.concatenate([members, nonmembers])):
        fpr.append(np.mean(nonmembers <= tau))
        fnr.append(np.mean(members > tau))
    fpr, fnr = np.array(fpr), np.array(fnr)
    lo, hi = EMPIRICAL_RATE_RANGE
    keep = (fpr > lo) & (fpr < hi) & (fnr > lo) & (fnr < hi)
    want = _eq7_loop(fpr[keep], fnr[keep], 1e-5)
    d = epsilon_star_details(members, nonmembers, delta=1e-5, method="empirical")
    assert d.epsilon_star == pytest.approx(want, rel=1e-12)
    assert d.fpr == pytest.approx(np.mean(nonmembers <= d.threshold))
    assert d.fnr == pytest.approx(np.mean(members > d.threshold))


def test_parametric_beats_empirical_at_zero_distance():
    # Appendix B, d = 0 (true eps* = 0): the parametric estimate is nearer 0 than the empirical one
    param, emp = [], []
    for rep in range(4):
        rng = np.random.default_rng(100 + rep)
        x, y = rng.gamma(2, 5, 10_000), rng.gamma(2, 5, 10_000)
        delta = default_delta(10_000)
        param.append(epsilon_star(x, y, delta=delta))
        emp.append(epsilon_star(x, y, delta=delta, method="empirical"))
    assert np.mean(param) < np.mean(emp)


# --- inputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("delta", [0.0, 0.5, -1e-3, 0.7, float("nan")])
def test_delta_outside_open_interval_raises(delta):
    with pytest.raises(ValueError, match=r"`delta`.*\(0, 0.5\)"):
        epsilon_star([1.0, 2.0], [1.5, 3.0], delta=delta)


@pytest.mark.parametrize(
    "members, nonmembers, match",
    [
        ([1.0, float("nan")], [1.0, 2.0], "member_losses.*finite"),
        ([1.0, 2.0], [float("inf"), 2.0], "nonmember_losses.*finite"),
        ([], [1.0, 2.0], "member_losses.*empty"),
        ([1.0, 2.0], [], "nonmember_losses.*empty"),
        ([[1.0, 2.0], [3.0, 4.0]], [1.0, 2.0], "member_losses.*1-D"),
    ],
)
def test_bad_losses_raise(members, nonmembers, match):
    for method in ("parametric", "empirical"):
        with pytest.raises(ValueError, match=match):
            epsilon_star(members, nonmembers, delta=1e-3, method=method)


def test_other_bad_arguments_raise():
    with pytest.raises(ValueError, match="`method`"):
        epsilon_star([1.0, 2.0], [1.0, 3.0], delta=1e-3, method="bayes")
    with pytest.raises(TypeError, match="`delta`"):
        epsilon_star([1.0, 2.0], [1.0, 3.0], delta="1e-3")
    with pytest.raises(ValueError, match="all equal|every value"):
        epsilon_star([1.0, 1.0], [1.0, 1.0], delta=1e-3)
    with pytest.raises(ValueError, match="member_losses"):
        epsilon_star([2.0, 2.0, 2.0], [1.0, 3.0], delta=1e-3)
    assert epsilon_star([2.0, 2.0, 2.0], [1.0, 3.0], delta=1e-3, method="empirical") >= 0.0
    with pytest.raises(ValueError, match="num_train"):
        default_delta(2)


def test_default_delta():
    assert default_delta(1000) == pytest.approx(1 / (1000 * math.log(1000)))


def test_analysis_module_imports_no_torch():
    code = "import sys, lightning_privacy.analysis.epsilon_star; assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

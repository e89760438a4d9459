"""Tests for lightning_privacy.analysis.bayes_security (Cherubin et al. 2024)."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from lightning_privacy.analysis import bayes_security as bs

P = 1e-3  # the paper's sample rate for Fig. 4


def steps_for(epochs, p=P):
    return int(round(epochs / p))


# --------------------------------------------------------------------------------------------------
# closed form vs PLD ground truth (paper Fig. 4 / Appendix B)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [1.0, 1.5, 2.0, 4.0])
@pytest.mark.parametrize("epochs", [1, 10, 50])
def test_closed_form_close_to_pld_for_sigma_at_least_1(sigma, epochs):
    kw = dict(sample_rate=P, noise_multiplier=sigma, steps=steps_for(epochs))
    closed = bs.mia_bayes_security(**kw)
    exact = bs.mia_bayes_security_exact(**kw)
    # Paper (Fig. 4): error <= 0.01 for sigma >= 1 up to 50 epochs. Measured: it holds except at the
    # corner sigma = 1, 50 epochs, where the gap is 0.0143 (confirmed by the CLT check below).
    tolerance = 0.015 if (sigma, epochs) == (1.0, 50) else 0.01
    assert abs(closed - exact) <= tolerance


def _clt_bayes_security(p, sigma, steps):
    """Independent ground truth: 1 - E_P[(1 - exp(-L))_+] with L ~ N(T*m, T*v), m, v by quadrature."""
    mix = lambda shift: lambda x: (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, shift, sigma)
    P_, Q_ = mix(-1.0), mix(1.0)
    loss = lambda x: math.log(P_(x) / Q_(x))
    m = integrate.quad(lambda x: P_(x) * loss(x), -30, 30, limit=400)[0]
    v = integrate.quad(lambda x: P_(x) * loss(x) ** 2, -30, 30, limit=400)[0] - m * m
    mean, sd = steps * m, math.sqrt(steps * v)
    delta0 = integrate.quad(lambda z: (1 - math.exp(-z)) * stats.norm.pdf(z, mean, sd), 0, mean + 15 * sd)[0]
    return 1 - delta0


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0])
def test_exact_matches_clt_for_many_steps(sigma):
    kw = dict(sample_rate=P, noise_multiplier=sigma, steps=steps_for(50))
    exact = bs.mia_bayes_security_exact(**kw)
    assert exact == pytest.approx(_clt_bayes_security(P, sigma, steps_for(50)), abs=1e-3)


@pytest.mark.parametrize(
    "sigma, closed_ref, exact_ref",
    [(0.8, 0.780, 0.737), (1.0, 0.823, 0.809), (2.0, 0.9110, 0.9105)],
)
def test_reference_values_50_epochs(sigma, closed_ref, exact_ref):
    kw = dict(sample_rate=P, noise_multiplier=sigma, steps=steps_for(50))
    assert bs.mia_bayes_security(**kw) == pytest.approx(closed_ref, abs=1e-3)
    assert bs.mia_bayes_security_exact(**kw) == pytest.approx(exact_ref, abs=1e-3)


def test_closed_form_overstates_security_below_sigma_1():
    kw = dict(sample_rate=P, noise_multiplier=0.8, steps=steps_for(50))
    assert bs.mia_bayes_security(**kw) - bs.mia_bayes_security_exact(**kw) > 0.03


def _tv_density(f, g, lo=-40.0, hi=40.0):
    return 0.5 * integrate.quad(lambda x: abs(f(x) - g(x)), lo, hi, limit=400, points=[-1.0, 0.0, 1.0])[0]


@pytest.mark.parametrize("p, sigma", [(0.3, 1.0), (0.05, 0.7), (1.0, 2.0)])
@pytest.mark.parametrize("relation", ["replace", "add_remove"])
def test_exact_one_step_matches_brute_force_tv_and_errs_safe(p, sigma, relation):
    # One step: TV between the two subsampled mixtures, by numerical integration.
    mix = lambda shift: lambda x: (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, shift, sigma)
    if relation == "replace":
        tv = _tv_density(mix(-1.0), mix(1.0))
    else:
        tv = _tv_density(mix(1.0), lambda x: stats.norm.pdf(x, 0, sigma))
    exact = bs.mia_bayes_security_exact(sample_rate=p, noise_multiplier=sigma, steps=1, relation=relation)
    assert exact == pytest.approx(1 - tv, abs=1e-3)
    assert exact <= 1 - tv + 1e-9  # pessimistic PLD: never more security than the truth


def test_exact_two_steps_matches_brute_force_tv():
    p, sigma = 0.3, 1.0
    x = np.linspace(-14, 14, 2801)
    dx = x[1] - x[0]
    f = (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, -1, sigma)
    g = (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, 1, sigma)
    tv = 0.5 * np.abs(np.outer(f, f) - np.outer(g, g)).sum() * dx * dx
    exact = bs.mia_bayes_security_exact(sample_rate=p, noise_multiplier=sigma, steps=2)
    assert exact == pytest.approx(1 - tv, abs=1e-3)
    assert exact <= 1 - tv + 1e-6


def test_exact_coarser_grid_is_more_pessimistic():
    kw = dict(sample_rate=P, noise_multiplier=2.0, steps=steps_for(10))
    fine = bs.mia_bayes_security_exact(**kw)
    coarse = bs.mia_bayes_security_exact(**kw, value_discretization_interval=1e-3)
    assert coarse < fine


def test_exact_zero_steps_is_perfect_security():
    assert bs.mia_bayes_security_exact(sample_rate=0.1, noise_multiplier=1.0, steps=0) == 1.0
    assert bs.mia_bayes_security(sample_rate=0.1, noise_multiplier=1.0, steps=0) == 1.0


# --------------------------------------------------------------------------------------------------
# closed form: formula, segments, add/remove
# --------------------------------------------------------------------------------------------------
def test_closed_form_formula_and_add_remove_halves_argument():
    p, sigma, t = 0.004, 1.3, 777
    x = p * math.sqrt(t) / (math.sqrt(2) * sigma)
    assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=t) == pytest.approx(
        1 - math.erf(x), rel=1e-12
    )
    assert bs.mia_bayes_security(
        sample_rate=p, noise_multiplier=sigma, steps=t, relation="add_remove"
    ) == pytest.approx(1 - math.erf(x / 2), rel=1e-12)


def test_equal_segments_compose_to_one_segment():
    one = bs.mia_bayes_security(sample_rate=0.01, noise_multiplier=1.5, steps=3000)
    split = bs.mia_bayes_security(sample_rate=0.01, noise_multiplier=1.5, steps=[1000, 1500, 500])
    assert split == pytest.approx(one, rel=1e-12)
    err_one = bs.approximation_error(sample_rate=0.01, noise_multiplier=1.5, steps=3000)
    err_split = bs.approximation_error(sample_rate=[0.01] * 3, noise_multiplier=1.5, steps=[1000, 1500, 500])
    assert err_split == pytest.approx(err_one, rel=1e-12)


def test_mixed_segments_match_manual_sum():
    p, s, t = [0.01, 0.02, 0.005], [1.0, 2.0, 0.9], [100, 250, 4000]
    x = math.sqrt(sum(ti * pi**2 / si**2 for pi, si, ti in zip(p, s, t))) / math.sqrt(2)
    assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=s, steps=t) == pytest.approx(
        special.erfc(x), rel=1e-12
    )
    err = math.sqrt(sum(ti * pi * (1 - pi) / si**2 for pi, si, ti in zip(p, s, t)))
    assert bs.approximation_error(sample_rate=p, noise_multiplier=s, steps=t) == pytest.approx(err, rel=1e-12)


def test_exact_segments_equal_single_segment():
    one = bs.mia_bayes_security_exact(sample_rate=P, noise_multiplier=2.0, steps=20_000)
    split = bs.mia_bayes_security_exact(sample_rate=[P, P], noise_multiplier=[2.0, 2.0], steps=[5_000, 15_000])
    assert split == pytest.approx(one, abs=1e-3)


def test_exact_mixed_segments_between_their_extremes():
    grid = dict(value_discretization_interval=1e-3)
    lo = bs.mia_bayes_security_exact(sample_rate=0.01, noise_multiplier=1.0, steps=2000, **grid)
    hi = bs.mia_bayes_security_exact(sample_rate=0.01, noise_multiplier=3.0, steps=2000, **grid)
    mixed = bs.mia_bayes_security_exact(sample_rate=0.01, noise_multiplier=[1.0, 3.0], steps=[1000, 1000], **grid)
    assert lo < mixed < hi


def test_history_segments_follow_opacus_order():
    history = [(1.1, 0.01, 10), (0.9, 0.02, 20)]
    seg = bs.history_segments(history)
    assert seg["noise_multiplier"].tolist() == [1.1, 0.9]
    assert seg["sample_rate"].tolist() == [0.01, 0.02]
    assert seg["steps"].tolist() == [10, 20]
    assert bs.mia_bayes_security(**seg) == pytest.approx(
        bs.mia_bayes_security(sample_rate=[0.01, 0.02], noise_multiplier=[1.1, 0.9], steps=[10, 20])
    )
    empty = bs.history_segments([])
    assert bs.mia_bayes_security(**empty) == 1.0
    assert bs.mia_bayes_security_exact(**empty) == 1.0
    assert bs.approximation_error(**empty) == 0.0


# --------------------------------------------------------------------------------------------------
# approximation error (Proposition 4)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p, sigma", [(0.1, 1.0), (0.3, 2.0), (0.02, 0.5)])
def test_proposition_4_bound_holds_for_one_step(p, sigma):
    mixture = lambda x: (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, 1.0, sigma)
    gaussian = lambda x: stats.norm.pdf(x, p, sigma)
    tv = _tv_density(mixture, gaussian)
    per_distribution = bs.approximation_error(sample_rate=p, noise_multiplier=sigma, steps=1) / 2
    assert tv <= per_distribution


@pytest.mark.parametrize("p, sigma, t", [(0.3, 2.0, 1), (0.1, 1.0, 2), (0.05, 3.0, 10)])
def test_closed_form_gap_within_approximation_error(p, sigma, t):
    kw = dict(sample_rate=p, noise_multiplier=sigma, steps=t)
    gap = abs(bs.mia_bayes_security(**kw) - bs.mia_bayes_security_exact(**kw))
    assert gap <= bs.approximation_error(**kw)


def test_approximation_error_is_vacuous_for_long_training():
    # Documented behaviour: the proven bound says nothing after 50 epochs although the gap is tiny.
    assert bs.approximation_error(sample_rate=P, noise_multiplier=2.0, steps=steps_for(50)) > 1


# --------------------------------------------------------------------------------------------------
# planner (Equation 4)
# --------------------------------------------------------------------------------------------------
def test_planner_purchase_paper_check():
    p = 512 / 197_324
    sigma = bs.noise_multiplier_for(target=0.9, sample_rate=p, steps=20 / p)
    assert sigma == pytest.approx(1.8, abs=0.02)
    # Paper's table (best model, <= 30 epochs): MIA beta* 0.87, success 57%, TPR@FPR=0.1 <= 23%.
    # After all 30 epochs we get 0.8768 (success 56.2%, TPR <= 22.3%): within a point of each.
    beta = bs.mia_bayes_security(sample_rate=p, noise_multiplier=1.8, steps=30 / p)
    assert beta == pytest.approx(0.87, abs=0.01)
    assert (2 - beta) / 2 == pytest.approx(0.57, abs=0.01)
    assert bs.tpr_upper_bound(bayes_security=beta, fpr=0.1) == pytest.approx(0.23, abs=0.01)


def test_planner_adult_paper_check():
    # The paper's Adult training size is not stated; an 80% split of its 32,561 records is assumed.
    p = 256 / round(0.8 * 32_561)
    assert bs.noise_multiplier_for(target=0.9, sample_rate=p, steps=20 / p) == pytest.approx(3.51, abs=0.03)
    beta = bs.mia_bayes_security(sample_rate=p, noise_multiplier=3.51, steps=30 / p)
    assert beta == pytest.approx(0.88, abs=0.01)  # paper's table: MIA beta* 0.88, success 56%
    assert (2 - beta) / 2 == pytest.approx(0.56, abs=0.01)


@settings(max_examples=60, deadline=None)
@given(
    target=st.floats(0.5, 0.999),
    p=st.floats(1e-4, 0.2),
    epochs=st.floats(1, 100),
    relation=st.sampled_from(bs.RELATIONS),
)
def test_planner_round_trip_is_safe_and_tight(target, p, epochs, relation):
    steps = epochs / p
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sigma = bs.noise_multiplier_for(target=target, sample_rate=p, steps=steps, relation=relation)
    achieved = bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=steps, relation=relation)
    assert achieved >= target
    factor = 2.0 if relation == "add_remove" else 1.0
    unrounded = p * math.sqrt(steps) / (factor * math.sqrt(2) * special.erfinv(1 - target))
    assert unrounded - 1e-9 <= sigma <= unrounded + 1e-4 + 1e-9  # Equation 4, rounded up to 4 decimals
    assert sigma == round(sigma, 4)
    smaller = round(sigma - 1e-4, 4)
    if smaller > 0:
        assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=smaller, steps=steps, relation=relation) < target


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(target=0.9, sample_rate=0.05, steps=200, relation="add_remove"),  # closed plan falls short
        dict(target=0.9, sample_rate=0.05, steps=200),  # closed plan already meets the PLD value
    ],
)
def test_exact_planner_is_safe_and_near_minimal(kwargs):
    grid = dict(value_discretization_interval=1e-3)
    sigma = bs.noise_multiplier_for_exact(**kwargs, **grid)
    closed_plan = bs.noise_multiplier_for(**kwargs)
    exact = lambda s: bs.mia_bayes_security_exact(
        sample_rate=kwargs["sample_rate"],
        noise_multiplier=s,
        steps=kwargs["steps"],
        relation=kwargs.get("relation", "replace"),
        **grid,
    )
    assert sigma >= closed_plan
    assert exact(sigma) >= kwargs["target"]
    assert sigma == round(sigma, 4)
    if sigma > closed_plan:
        assert exact(sigma * (1 - 3e-4)) < kwargs["target"]


def test_planner_warns_below_sigma_1():
    with pytest.warns(UserWarning, match="below 1"):
        sigma = bs.noise_multiplier_for(target=0.9, sample_rate=1e-3, steps=1000)
    assert sigma < 1


# --------------------------------------------------------------------------------------------------
# attribute inference (Corollary 10)
# --------------------------------------------------------------------------------------------------
def test_ai_equals_mia_at_maximal_sensitivity():
    c, t = 1.7, 400
    ai = bs.ai_bayes_security(sample_rate=0.02, noise_multiplier=1.2, max_grad_norm=c, sensitivities=[2 * c] * t)
    mia = bs.mia_bayes_security(sample_rate=0.02, noise_multiplier=1.2, steps=t)
    assert ai == pytest.approx(mia, rel=1e-12)
    # Per-segment aggregation: one entry sqrt(sum R_t^2) per segment of `steps` steps.
    seg = bs.ai_bayes_security(
        sample_rate=[0.02, 0.01],
        noise_multiplier=[1.2, 2.0],
        max_grad_norm=c,
        sensitivities=[2 * c * math.sqrt(150), 2 * c * math.sqrt(250)],
        steps=[150, 250],
    )
    assert seg == pytest.approx(
        bs.mia_bayes_security(sample_rate=[0.02, 0.01], noise_multiplier=[1.2, 2.0], steps=[150, 250]), rel=1e-12
    )


def test_ai_paper_formula_constant_parameters():
    p, sigma, c = 0.01, 3.51, 1.0
    r = np.linspace(0.1, 1.9, 500)
    expected = 1 - math.erf(p * np.linalg.norm(r) / (2 * math.sqrt(2) * sigma * c))
    got = bs.ai_bayes_security(sample_rate=p, noise_multiplier=sigma, max_grad_norm=c, sensitivities=r)
    assert got == pytest.approx(expected, rel=1e-12)


def test_ai_per_step_aggregation_matches_per_step():
    rng = np.random.default_rng(0)
    r = rng.uniform(0, 2, size=300)
    per_step = bs.ai_bayes_security(sample_rate=0.05, noise_multiplier=2.0, max_grad_norm=1.0, sensitivities=r)
    agg = bs.ai_bayes_security(
        sample_rate=0.05,
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        sensitivities=[np.linalg.norm(r[:100]), np.linalg.norm(r[100:])],
        steps=[100, 200],
    )
    assert agg == pytest.approx(per_step, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    r=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=50),
    p=st.floats(1e-3, 1.0),
    sigma=st.floats(0.3, 10.0),
    c=st.floats(0.1, 10.0),
)
def test_ai_at_least_mia(r, p, sigma, c):
    sens = [x * c for x in r]
    ai = bs.ai_bayes_security(sample_rate=p, noise_multiplier=sigma, max_grad_norm=c, sensitivities=sens)
    mia = bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=len(r))
    assert ai >= mia - 1e-12


def test_ai_zero_sensitivity_and_empty():
    assert (
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1.0, sensitivities=[0.0, 0.0]) == 1.0
    )
    assert bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1.0, sensitivities=[]) == 1.0


def test_ai_rejects_sensitivity_above_2c():
    with pytest.raises(ValueError, match=r"sensitivities.*2\.5.*index 1"):
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1.0, sensitivities=[1.0, 2.5])
    with pytest.raises(ValueError, match="sqrt"):
        bs.ai_bayes_security(
            sample_rate=0.1,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sensitivities=[2.0 * math.sqrt(4) + 0.1],
            steps=[4],
        )


# --------------------------------------------------------------------------------------------------
# monotonicity (hypothesis)
# --------------------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(p=st.floats(1e-4, 0.5), sigma=st.floats(0.3, 20), t=st.integers(1, 10**6), factor=st.floats(1.01, 10))
def test_closed_form_monotone(p, sigma, t, factor):
    base = bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=t)
    assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=t * factor) <= base
    assert bs.mia_bayes_security(sample_rate=min(1.0, p * factor), noise_multiplier=sigma, steps=t) <= base
    assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma * factor, steps=t) >= base
    assert bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=t, relation="add_remove") >= base
    assert 0.0 <= base <= 1.0
    err = bs.approximation_error(sample_rate=p, noise_multiplier=sigma, steps=t)
    assert bs.approximation_error(sample_rate=p, noise_multiplier=sigma, steps=t * factor) >= err


@settings(max_examples=60, deadline=None)
@given(p=st.floats(1e-6, 1.0), sigma=st.floats(1e-3, 1e3), t=st.floats(0, 1e7), relation=st.sampled_from(bs.RELATIONS))
def test_scalar_fast_path_equals_array_path(p, sigma, t, relation):
    scalar = bs.mia_bayes_security(sample_rate=p, noise_multiplier=sigma, steps=t, relation=relation)
    array = bs.mia_bayes_security(sample_rate=[p], noise_multiplier=np.array([sigma]), steps=[t], relation=relation)
    assert scalar == pytest.approx(array, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_exact_monotone_in_steps_and_sigma(sigma):
    exact = lambda s, t: bs.mia_bayes_security_exact(
        sample_rate=0.01, noise_multiplier=s, steps=t, value_discretization_interval=1e-3
    )
    values = [exact(sigma, t) for t in (10, 100, 1000)]
    assert values[0] > values[1] > values[2]
    assert exact(sigma * 1.5, 100) > values[1]


@settings(max_examples=80, deadline=None)
@given(beta=st.floats(0, 1), fpr=st.floats(0, 1), dfpr=st.floats(0, 1), prior=st.floats(0.01, 0.99))
def test_tpr_bound_monotone(beta, fpr, dfpr, prior):
    b = bs.tpr_upper_bound(bayes_security=beta, fpr=fpr, prior=prior)
    assert 0.0 <= b <= 1.0
    assert bs.tpr_upper_bound(bayes_security=beta, fpr=min(1.0, fpr + dfpr), prior=prior) >= b
    assert bs.tpr_upper_bound(bayes_security=max(0.0, beta - dfpr), fpr=fpr, prior=prior) >= b


# --------------------------------------------------------------------------------------------------
# Proposition 9 and Section 4.2.1
# --------------------------------------------------------------------------------------------------
def test_tpr_bound_paper_figure_7():
    beta = bs.mia_bayes_security(sample_rate=1e-4, noise_multiplier=2.0, steps=steps_for(50, 1e-4))
    assert bs.tpr_upper_bound(bayes_security=beta, fpr=0.1) == pytest.approx(0.128, abs=5e-4)
    assert bs.tpr_upper_bound(bayes_security=beta, fpr=0.01) == pytest.approx(0.038, abs=5e-4)


def test_tpr_bound_prior_cases_and_cap():
    assert bs.tpr_upper_bound(bayes_security=0.9, fpr=0.1, prior=0.2) == pytest.approx(0.2)
    assert bs.tpr_upper_bound(bayes_security=0.9, fpr=0.1, prior=0.75) == pytest.approx(0.6)
    assert bs.tpr_upper_bound(bayes_security=0.1, fpr=0.5) == 1.0
    assert bs.tpr_upper_bound(bayes_security=1.0, fpr=0.3) == pytest.approx(0.3)  # no leakage: TPR <= FPR


def test_tpr_bound_attained_by_likelihood_ratio_test_on_gaussians():
    # For two Gaussians at uniform prior beta* = 1 - TV, and the threshold test at the midpoint has
    # TPR - FPR = TV, so Proposition 9 holds with equality there.
    mu = 0.7
    tv = math.erf(mu / (2 * math.sqrt(2)))
    fpr = stats.norm.sf(mu / 2)
    tpr = stats.norm.sf(-mu / 2)
    assert bs.tpr_upper_bound(bayes_security=1 - tv, fpr=fpr) == pytest.approx(tpr, rel=1e-12)


@pytest.mark.parametrize("beta, delta", [(0.9, 1e-5), (0.5, 0.0), (0.99, 1e-3)])
def test_epsilon_estimate_inverts_humphries(beta, delta):
    eps = bs.epsilon_estimate(bayes_security=beta, delta=delta)
    adv = (math.exp(eps) - 1 + 2 * delta) / (math.exp(eps) + 1)
    assert adv == pytest.approx(1 - beta, rel=1e-9)


def test_epsilon_estimate_edges():
    assert bs.epsilon_estimate(bayes_security=0.999, delta=0.01) == 0.0
    assert bs.epsilon_estimate(bayes_security=0.0, delta=0.0) == math.inf


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------
GOOD = dict(sample_rate=0.01, noise_multiplier=1.0, steps=100)


@pytest.mark.parametrize(
    "override, exc, match",
    [
        (dict(sample_rate=0.0), ValueError, r"`sample_rate`.*\(0, 1\].*0\.0"),
        (dict(sample_rate=1.5), ValueError, r"`sample_rate`.*1\.5"),
        (dict(noise_multiplier=0.0), ValueError, r"`noise_multiplier`.*> 0.*0\.0"),
        (dict(noise_multiplier=-1.0), ValueError, r"`noise_multiplier`.*-1\.0"),
        (dict(steps=-3), ValueError, r"`steps`.*>= 0.*-3"),
        (dict(steps=float("nan")), ValueError, r"`steps`.*finite.*nan"),
        (dict(sample_rate=float("inf")), ValueError, r"`sample_rate`.*finite"),
        (dict(steps="100"), TypeError, r"`steps`.*'100'"),
        (dict(noise_multiplier=True), TypeError, r"`noise_multiplier`.*True"),
        (dict(noise_multiplier=None), TypeError, r"`noise_multiplier`.*None"),
        (dict(steps=[[1, 2]]), ValueError, r"`steps`.*1-D"),
        (dict(steps=[1, 2], sample_rate=[0.1, 0.1, 0.1]), ValueError, r"lengths"),
        (dict(relation="remove"), ValueError, r"`relation`.*'remove'"),
    ],
)
@pytest.mark.parametrize("fn", [bs.mia_bayes_security, bs.mia_bayes_security_exact, bs.approximation_error])
def test_bad_arguments(fn, override, exc, match):
    kwargs = {**GOOD, **override}
    if fn is bs.approximation_error and "relation" in kwargs:
        pytest.skip("approximation_error has no relation")
    with pytest.raises(exc, match=match):
        fn(**kwargs)


def test_positional_arguments_rejected():
    with pytest.raises(TypeError):
        bs.mia_bayes_security(0.01, 1.0, 100)  # type: ignore[misc]


def test_exact_rejects_fractional_steps_and_bad_grid():
    with pytest.raises(ValueError, match=r"`steps`.*whole.*2\.5"):
        bs.mia_bayes_security_exact(sample_rate=0.1, noise_multiplier=1.0, steps=2.5)
    with pytest.raises(ValueError, match=r"`value_discretization_interval`.*0"):
        bs.mia_bayes_security_exact(sample_rate=0.1, noise_multiplier=1.0, steps=2, value_discretization_interval=0)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(target=1.0, sample_rate=0.01, steps=100), ValueError, r"`target`.*\(0, 1\).*1\.0"),
        (dict(target=0.0, sample_rate=0.01, steps=100), ValueError, r"`target`"),
        (dict(target=0.9, sample_rate=0.01, steps=0), ValueError, r"`steps`.*> 0.*0"),
        (dict(target=0.9, sample_rate=[0.01, 0.02], steps=100), TypeError, r"`sample_rate`.*scalar"),
        (dict(target=0.9, sample_rate=2.0, steps=100), ValueError, r"`sample_rate`.*2\.0"),
        (dict(target=0.9, sample_rate=0.01, steps=100, relation="x"), ValueError, r"`relation`"),
    ],
)
def test_planner_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        bs.noise_multiplier_for(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(bayes_security=1.2, fpr=0.1), r"`bayes_security`.*\[0, 1\].*1\.2"),
        (dict(bayes_security=0.9, fpr=-0.1), r"`fpr`.*-0\.1"),
        (dict(bayes_security=0.9, fpr=0.1, prior=1.0), r"`prior`.*\(0, 1\)"),
        (dict(bayes_security=float("nan"), fpr=0.1), r"`bayes_security`.*finite"),
    ],
)
def test_tpr_bound_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bs.tpr_upper_bound(**kwargs)


def test_other_bad_arguments():
    with pytest.raises(ValueError, match=r"`delta`.*\[0, 1\).*1\.0"):
        bs.epsilon_estimate(bayes_security=0.9, delta=1.0)
    with pytest.raises(ValueError, match=r"`max_grad_norm`.*> 0.*0"):
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=0, sensitivities=[0.1])
    with pytest.raises(ValueError, match=r"`sensitivities`.*>= 0"):
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1, sensitivities=[-0.1])
    with pytest.raises(ValueError, match=r"one entry per sensitivity"):
        bs.ai_bayes_security(
            sample_rate=[0.1, 0.1], noise_multiplier=1.0, max_grad_norm=1, sensitivities=[0.1, 0.2, 0.3]
        )
    with pytest.raises(ValueError, match=r"`steps`.*one entry per sensitivity"):
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1, sensitivities=[0.1], steps=[1, 2])
    with pytest.raises(TypeError, match=r"history.*entry 1"):
        bs.history_segments([(1.0, 0.1, 10), (1.0, 0.1)])
    with pytest.raises(ValueError, match=r"`steps`.*whole"):
        bs.history_segments([(1.0, 0.1, 10.5)])


# --------------------------------------------------------------------------------------------------
# layering
# --------------------------------------------------------------------------------------------------
def test_import_loads_neither_torch_nor_lightning():
    code = (
        "import sys, lightning_privacy.analysis.bayes_security as bs\n"
        "bs.mia_bayes_security(sample_rate=0.01, noise_multiplier=1.0, steps=10)\n"
        "bs.mia_bayes_security_exact(sample_rate=0.01, noise_multiplier=1.0, steps=10)\n"
        "bad = [m for m in ('torch', 'lightning', 'pytorch_lightning', 'opacus', 'torchmetrics') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------
# exact values at the sample rates of real DP-SGD (tight_bounds.md)
# --------------------------------------------------------------------------------------------------
def test_closed_form_overstates_at_p005_where_exact_is_safe():
    kw = dict(sample_rate=0.05, noise_multiplier=1.0, steps=400)
    closed, exact = bs.mia_bayes_security(**kw), bs.mia_bayes_security_exact(**kw)
    assert (round(closed, 4), round(exact, 4)) == (0.3173, 0.3059)
    assert closed - exact == pytest.approx(0.011, abs=1e-3)


def test_exact_uses_the_finest_automatic_grid_of_its_segments_first():
    # the grid follows the first segment (ComposedPLD's rule); an explicit grid overrides it
    auto = bs.mia_bayes_security_exact(sample_rate=[0.01, 0.01], noise_multiplier=[1.0, 1.0], steps=[100, 100])
    fixed = bs.mia_bayes_security_exact(
        sample_rate=0.01, noise_multiplier=1.0, steps=200, value_discretization_interval=1e-3
    )
    assert auto == pytest.approx(fixed, abs=1e-9)


# --------------------------------------------------------------------------------------------------
# trade-off curve
# --------------------------------------------------------------------------------------------------
def test_tradeoff_curve_spec_table():
    kw = dict(sample_rate=0.02, noise_multiplier=1.5, steps=1000)
    fpr = [0.001, 0.01, 0.1]
    curve = bs.mia_tradeoff_curve(**kw, fpr=fpr)
    beta = bs.mia_bayes_security_exact(**kw)
    prop9 = [bs.tpr_upper_bound(bayes_security=beta, fpr=a) for a in fpr]
    np.testing.assert_allclose(prop9, [0.331, 0.340, 0.430], atol=1e-3)
    np.testing.assert_allclose(curve, [0.0126, 0.070, 0.334], atol=1e-3)
    assert np.all(curve <= np.array(prop9))


@pytest.mark.parametrize("relation", bs.RELATIONS)
def test_tradeoff_curve_one_step_neyman_pearson(relation):
    """One step: the likelihood ratio of the two outputs is monotone in x, so the best test is a threshold."""
    from scipy import optimize

    p, sigma = 0.2, 0.8
    F_P = lambda t: (1 - p) * stats.norm.cdf(t / sigma) + p * stats.norm.cdf((t + 1) / sigma)  # with the target
    if relation == "replace":
        F_Q = lambda t: (1 - p) * stats.norm.cdf(t / sigma) + p * stats.norm.cdf((t - 1) / sigma)
    else:
        F_Q = lambda t: stats.norm.cdf(t / sigma)
    fpr = np.array([1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.3, 0.6])
    exact = np.array([F_P(optimize.brentq(lambda t: F_Q(t) - a, -60, 60, xtol=1e-14)) for a in fpr])
    ours = bs.mia_tradeoff_curve(sample_rate=p, noise_multiplier=sigma, steps=1, fpr=fpr, relation=relation)
    assert np.all(ours >= exact - 1e-12)
    np.testing.assert_allclose(ours, exact, rtol=2e-3)


def test_tradeoff_curve_segments_shapes_and_no_steps():
    seg = dict(sample_rate=[0.01, 0.02], noise_multiplier=[1.0, 2.0], steps=[500, 200])
    one = bs.mia_tradeoff_curve(**seg, fpr=0.01)
    assert isinstance(one, float)
    many = bs.mia_tradeoff_curve(**seg, fpr=np.array([0.01, 0.1]))
    assert many.shape == (2,) and many[0] == one
    assert bs.mia_tradeoff_curve(sample_rate=0.1, noise_multiplier=1.0, steps=0, fpr=0.2) == 0.2
    assert bs.mia_tradeoff_curve(**bs.history_segments([]), fpr=[0.1, 0.2]).tolist() == [0.1, 0.2]


@pytest.mark.parametrize(
    "override, exc, match",
    [
        (dict(fpr=1.5), ValueError, r"`fpr`.*\[0, 1\].*1\.5"),
        (dict(fpr=[0.1, -0.1]), ValueError, r"`fpr`"),
        (dict(fpr="0.1"), TypeError, r"`fpr`"),
        (dict(relation="x"), ValueError, r"`relation`"),
        (dict(steps=1.5), ValueError, r"`steps`.*whole"),
        (dict(value_discretization_interval=-1.0), ValueError, r"`value_discretization_interval`"),
    ],
)
def test_tradeoff_curve_bad_arguments(override, exc, match):
    with pytest.raises(exc, match=match):
        bs.mia_tradeoff_curve(**{**GOOD, "fpr": 0.1, **override})


# --------------------------------------------------------------------------------------------------
# exact attribute inference (issue 14)
# --------------------------------------------------------------------------------------------------
def test_ai_exact_issue_14_numbers():
    kw = dict(sample_rate=0.05, noise_multiplier=1.0, max_grad_norm=1.0)
    for r, closed, exact in [(2.0, 0.3173, 0.3059), (1.0, 0.6171, 0.6179)]:
        assert bs.ai_bayes_security(**kw, sensitivities=[r] * 400) == pytest.approx(closed, abs=1e-4)
        assert bs.ai_bayes_security_exact(**kw, sensitivities=[r] * 400) == pytest.approx(exact, abs=1e-4)


@pytest.mark.parametrize("c", [1.0, 1.7])
def test_ai_exact_at_maximal_sensitivity_equals_mia_exact(c):
    ai = bs.ai_bayes_security_exact(
        sample_rate=0.02, noise_multiplier=1.2, max_grad_norm=c, sensitivities=[2 * c] * 300
    )
    mia = bs.mia_bayes_security_exact(sample_rate=0.02, noise_multiplier=1.2, steps=300)
    assert ai == mia
    seg = bs.ai_bayes_security_exact(
        sample_rate=[0.02, 0.01],
        noise_multiplier=[1.2, 2.0],
        max_grad_norm=c,
        sensitivities=[2 * c] * 2,
        steps=[150, 250],
    )
    assert seg == pytest.approx(
        bs.mia_bayes_security_exact(sample_rate=[0.02, 0.01], noise_multiplier=[1.2, 2.0], steps=[150, 250]), abs=1e-9
    )


def test_ai_exact_constant_sensitivity_equals_dp_accounting():
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    p, sigma, c, r, steps = 0.05, 1.0, 1.7, 0.5 * 1.7, 400  # R/(2C) = 0.25, a level of the default grid
    grid = 1e-3
    reference = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma * c,
        sensitivity=r / 2,
        sampling_prob=p,
        value_discretization_interval=grid,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    ).self_compose(steps)
    ours = bs.ai_bayes_security_exact(
        sample_rate=p,
        noise_multiplier=sigma,
        max_grad_norm=c,
        sensitivities=[r] * steps,
        value_discretization_interval=grid,
    )
    assert ours == pytest.approx(1 - reference.get_delta_for_epsilon(0.0), abs=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    r=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=10),
    p=st.floats(1e-3, 0.3),
    sigma=st.floats(0.5, 4.0),
    repeat=st.integers(1, 20),
)
def test_ai_exact_rounding_up_never_raises_bayes_security(r, p, sigma, repeat):
    kw = dict(sample_rate=p, noise_multiplier=sigma, max_grad_norm=1.0, value_discretization_interval=1e-3)
    sens = np.repeat(r, repeat)
    rounded = bs.ai_bayes_security_exact(**kw, sensitivities=sens)
    halves = np.asarray(r) / 2.0
    exact = np.maximum(halves[halves > 0], bs.MIN_SENSITIVITY_LEVEL)  # no rounding above the smallest admissible level
    exact_levels = np.unique(np.concatenate([exact, [1.0]]))
    unrounded = bs.ai_bayes_security_exact(**kw, sensitivities=sens, levels=exact_levels)
    coarse = bs.ai_bayes_security_exact(**kw, sensitivities=sens, levels=[0.25, 0.5, 1.0])
    assert coarse <= rounded + 1e-12 <= unrounded + 2e-12
    assert unrounded - rounded <= 2e-3  # 128 levels per octave: close
    assert (
        rounded
        >= bs.mia_bayes_security_exact(
            sample_rate=p, noise_multiplier=sigma, steps=sens.size, value_discretization_interval=1e-3
        )
        - 1e-12
    )


def test_ai_exact_aggregated_entries_are_bounded_safely():
    kw = dict(sample_rate=0.05, noise_multiplier=1.0, max_grad_norm=1.0)
    per_step = bs.ai_bayes_security_exact(**kw, sensitivities=[0.5] * 100)
    aggregated = bs.ai_bayes_security_exact(**kw, sensitivities=[0.5 * math.sqrt(100)], steps=[100])
    assert aggregated <= per_step  # each step bounded by min(2C, √ΣR²) = 2C here: MIA
    assert aggregated == bs.mia_bayes_security_exact(sample_rate=0.05, noise_multiplier=1.0, steps=100)
    one = bs.ai_bayes_security_exact(**kw, sensitivities=[0.5], steps=[1])
    assert one == bs.ai_bayes_security_exact(**kw, sensitivities=[0.5])


def test_ai_exact_zero_and_empty():
    kw = dict(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1.0)
    assert bs.ai_bayes_security_exact(**kw, sensitivities=[0.0, 0.0]) == 1.0
    assert bs.ai_bayes_security_exact(**kw, sensitivities=[]) == 1.0


def test_ai_symmetric_model_is_not_a_bound_over_every_gradient_pair():
    """Documented caveat: with R_t = C the record's gradients C·e and 0 (both within the clipping ball) form
    the add/remove pair, which leaks more than issue 14's symmetric pair (±C/2)."""
    kw = dict(sample_rate=0.05, noise_multiplier=1.0)
    symmetric = bs.ai_bayes_security_exact(**kw, max_grad_norm=1.0, sensitivities=[1.0] * 400)
    collinear = bs.mia_bayes_security_exact(**kw, steps=400, relation="add_remove")
    assert symmetric == pytest.approx(0.618, abs=1e-3)
    assert collinear == pytest.approx(0.542, abs=1e-3)


def test_sensitivity_levels_round_up_and_count():
    rng = np.random.default_rng(1)
    c = 1.3
    r = np.concatenate([rng.uniform(0, 2 * c, size=500), [0.0, 2 * c, 2 * c * (1 + 1e-12)]])
    values, counts = bs.sensitivity_levels(r, max_grad_norm=c)
    assert counts.sum() == np.count_nonzero(r) and counts.dtype.kind == "i"
    assert np.all(np.diff(values) > 0) and values[-1] == 1.0
    s = np.minimum(r[r > 0] / (2 * c), 1.0)
    idx = np.searchsorted(values, s, side="left")
    assert np.all(values[idx] >= s)
    assert np.all(values[idx] / s < 2 ** (1 / 128) + 1e-12)  # the next level up, not further
    empty = bs.sensitivity_levels([], max_grad_norm=1.0)
    assert empty[0].size == 0 and empty[1].size == 0
    agg_values, agg_counts = bs.sensitivity_levels([0.1, 5.0], max_grad_norm=1.0, steps=[1, 10])
    assert agg_values.tolist() == [0.05, 1.0] or agg_values[-1] == 1.0
    assert agg_counts.tolist()[-1] == 10


def test_sensitivity_levels_feed_composed_pld():
    from lightning_privacy.analysis.composition import ComposedPLD

    r = [2.0, 1.0, 1.0, 0.3, 0.0, 1.9]
    kw = dict(sample_rate=0.05, noise_multiplier=1.0)
    values, counts = bs.sensitivity_levels(r, max_grad_norm=1.0)
    pld = ComposedPLD().compose(**kw, steps=counts, sensitivity=values)
    assert pld.steps == 5
    assert pld.bayes_security() == pytest.approx(
        bs.ai_bayes_security_exact(**kw, max_grad_norm=1.0, sensitivities=r), abs=1e-9
    )


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(sensitivities=[2.5]), ValueError, r"sensitivities.*2\.5"),
        (dict(sensitivities=[-0.1]), ValueError, r"`sensitivities`.*>= 0"),
        (dict(sensitivities=[0.1], levels=[0.5, 0.9]), ValueError, r"`levels`.*1\.0"),
        (dict(sensitivities=[0.1], levels=[0.5, 0.4, 1.0]), ValueError, r"`levels`"),
        (dict(sensitivities=[0.1], steps=[1.5]), ValueError, r"`steps`.*whole"),
        (dict(sensitivities=[0.1], max_grad_norm=0.0), ValueError, r"`max_grad_norm`"),
        (dict(sensitivities=[0.1], value_discretization_interval=0.0), ValueError, r"`value_discretization_interval`"),
        (dict(sensitivities="x"), TypeError, r"`sensitivities`"),
    ],
)
def test_ai_exact_bad_arguments(kwargs, exc, match):
    base = dict(sample_rate=0.1, noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(exc, match=match):
        bs.ai_bayes_security_exact(**{**base, **kwargs})


def test_new_functions_are_keyword_only_and_import_no_torch():
    with pytest.raises(TypeError):
        bs.mia_tradeoff_curve(0.01, 1.0, 100, 0.1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        bs.ai_bayes_security_exact(0.01, 1.0, 1.0, [0.1])  # type: ignore[misc]
    code = (
        "import sys, lightning_privacy.analysis.bayes_security as bs\n"
        "bs.mia_tradeoff_curve(sample_rate=0.01, noise_multiplier=1.0, steps=10, fpr=0.1)\n"
        "bs.ai_bayes_security_exact(sample_rate=0.01, noise_multiplier=1.0, max_grad_norm=1.0, sensitivities=[0.5])\n"
        "bad = [m for m in ('torch', 'lightning', 'pytorch_lightning', 'opacus', 'torchmetrics') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

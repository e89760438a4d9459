"""ε intervals from membership-inference outcomes (Zanella-Béguelin et al. 2023): paper numbers, exact
references (quadrature, brute force), properties, and the validity of the threshold selection."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from lightning_privacy.analysis import estimation as E
from lightning_privacy.analysis.estimation import (
    epsilon_cdf,
    epsilon_density,
    epsilon_from_rates,
    epsilon_interval,
    epsilon_lower_bound,
    max_informative_delta,
    rate_interval,
    roc_counts,
)

WORKED = dict(fn=35, tp=65, fp=25, tn=75, delta=0.05, alpha=0.05)


# --------------------------------------------------------------------------------------- paper numbers


@pytest.mark.parametrize(
    ("method", "low", "high"),
    [("bayes", 0.522, 1.268), ("jeffreys", 0.321, 1.456), ("clopper_pearson", 0.295, 1.489)],
)
@pytest.mark.parametrize("region", ["attack", "full"])
def test_worked_example_section_3_2(method, low, high, region):
    lo, hi = epsilon_interval(**WORKED, method=method, region=region)
    assert lo == pytest.approx(low, abs=0.003)
    assert hi == pytest.approx(high, abs=0.003)


@pytest.mark.parametrize(
    ("method", "sided", "expected"),
    [("clopper_pearson", "two", 5.60), ("clopper_pearson", "one", 5.81), ("jeffreys", "one", 6.25)],
)
def test_perfect_attack_on_2000_trials_section_3_1(method, sided, expected):
    lo, hi = epsilon_interval(fn=0, tp=1000, fp=0, tn=1000, delta=1e-5, alpha=0.1, method=method, sided=sided)
    assert lo == pytest.approx(expected, abs=0.005)
    assert hi == math.inf


def test_footnote_1_corner_not_the_dropped_term():
    # (TP, FP, TN, FN) = (90, 0, 100, 10), δ = 1e-5, 90% CP: the minimum over the rectangle is the corner
    # value 3.124; the footnote's 1.736 at (FNR+, 0) drops the term that is +inf at FPR = 0.
    lo, _ = epsilon_interval(fn=10, tp=90, fp=0, tn=100, delta=1e-5, alpha=0.1, method="clopper_pearson")
    assert lo == pytest.approx(3.124, abs=5e-4)
    xu = rate_interval(10, 100, alpha=0.05, method="clopper_pearson")[1]
    assert math.log((1 - 1e-5) / xu) == pytest.approx(1.736, abs=5e-4)  # the dropped-term value


def test_jeffreys_rectangle_and_union_bound_by_hand():
    # each rate at 97.5% two-sided (tails 1.25%), min / max of Equation 1 at the corners
    xl, xu = stats.beta.ppf([0.0125, 0.9875], 35.5, 65.5)
    yl, yu = stats.beta.ppf([0.0125, 0.9875], 25.5, 75.5)
    eq1 = lambda x, y: max(math.log((0.95 - x) / y), math.log((0.95 - y) / x))  # noqa: E731
    assert epsilon_interval(**WORKED, method="jeffreys") == pytest.approx((eq1(xu, yu), eq1(xl, yl)), abs=1e-9)


# ------------------------------------------------------------------------------- ε̂ of a point / rectangle


_EPS_GRID = np.linspace(0, 12, 120001)


def _brute_eps(x, y, delta, region, grid=_EPS_GRID):
    """Smallest ε on a fine grid whose region holds (x, y) (the four inequalities of Kairouz et al.)."""
    e = np.exp(grid)
    ok = (x + e * y >= 1 - delta - 1e-12) & (y + e * x >= 1 - delta - 1e-12)
    if region == "full":
        ok &= (y + e * x <= e + delta + 1e-12) & (x + e * y <= e + delta + 1e-12)
    return grid[np.argmax(ok)] if ok.any() else math.inf


RATE = st.floats(0, 1).map(lambda v: round(v, 6))  # keeps points off the 1e-12 tolerance of the brute force


@given(x=RATE, y=RATE, delta=st.sampled_from([0.0, 1e-5, 0.05, 0.2, 0.5]), region=st.sampled_from(["attack", "full"]))
@settings(max_examples=150, deadline=None)
def test_epsilon_from_rates_is_smallest_epsilon_of_the_region(x, y, delta, region):
    got = epsilon_from_rates(fnr=x, fpr=y, delta=delta, region=region)
    ref = _brute_eps(x, y, delta, region)
    if ref > 11.9:
        assert got > 11.9
    else:
        assert got == pytest.approx(ref, abs=2e-4)


def test_epsilon_from_rates_zero_rates():
    assert epsilon_from_rates(fnr=0.0, fpr=0.0, delta=1e-5) == math.inf
    assert epsilon_from_rates(fnr=0.0, fpr=0.3, delta=0.0) == math.inf
    assert epsilon_from_rates(fnr=0.0, fpr=1.0, delta=0.0) == 0.0
    assert epsilon_from_rates(fnr=1.0, fpr=0.0, delta=0.5) == 0.0
    assert epsilon_from_rates(fnr=0.9, fpr=0.9, delta=0.0, region="full") == pytest.approx(math.log(9))
    assert epsilon_from_rates(fnr=0.9, fpr=0.9, delta=0.0) == 0.0


@given(data=st.data(), region=st.sampled_from(["attack", "full"]), delta=st.sampled_from([0.0, 0.01, 0.3]))
@settings(max_examples=60, deadline=None)
def test_rectangle_min_max_equals_dense_grid_including_edges(data, region, delta):
    xs = sorted(data.draw(st.lists(st.floats(0, 1), min_size=2, max_size=2)))
    ys = sorted(data.draw(st.lists(st.floats(0, 1), min_size=2, max_size=2)))
    low, high = E._rectangle_interval(
        np.float64(xs[0]), np.float64(xs[1]), np.float64(ys[0]), np.float64(ys[1]), delta, region
    )
    gx, gy = np.meshgrid(np.linspace(*xs, 201), np.linspace(*ys, 201))
    values = E._eps_hat(gx, gy, delta, region)
    assert float(high) == pytest.approx(values.max(), abs=1e-9) or (high == values.max() == math.inf)
    # the grid can only miss the true minimum from above (it holds the corners exactly)
    assert float(low) <= values.min() + 1e-12
    if np.isfinite(values.min()):
        assert float(low) >= values.min() - 0.05 * max(1.0, values.min())


# ---------------------------------------------------------------------------------- Bayesian posterior


def _reference_cdf(eps, fn, tp, fp, tn, delta, region):
    """Definition 3.1 by adaptive QUADPACK on the same x-slices (independent of our panels)."""
    bx, by = stats.beta(fn + 0.5, tp + 0.5), stats.beta(fp + 0.5, tn + 0.5)
    e = math.exp(eps)

    def lo(x):
        return max(0.0, 1 - delta - e * x, (1 - delta - x) / e)

    def hi(x):
        return 1.0 if region == "attack" else min(1.0, 1 + (delta - x) / e, delta + (1 - x) * e)

    points = [p for p in ((1 - delta) / (1 + e), 1 - delta, delta, 1 - (1 - delta) / (1 + e)) if 0 < p < 1]
    points += list(bx.ppf([1e-6, 1e-3, 0.5, 1 - 1e-3]))
    return integrate.quad(
        lambda x: bx.pdf(x) * max(0.0, by.cdf(hi(x)) - by.cdf(lo(x))),
        0,
        1,
        epsabs=1e-14,
        epsrel=1e-12,
        limit=1000,
        points=sorted(set(points)),
    )[0]


COUNTS = [
    (35, 65, 25, 75, 0.05),
    (0, 1000, 0, 1000, 1e-5),
    (3, 997, 0, 1000, 0.0),
    (500, 500, 480, 520, 1e-5),
    (2, 3, 1, 9, 0.3),
    (60, 40, 70, 30, 0.01),
]


@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("region", ["attack", "full"])
def test_cdf_matches_adaptive_quadrature(counts, region):
    *c, delta = counts
    eps = np.array([0.0, 0.05, 0.3, 1.0, 3.0, 6.0])
    got = epsilon_cdf(eps, fn=c[0], tp=c[1], fp=c[2], tn=c[3], delta=delta, region=region)
    ref = [_reference_cdf(e, *c, delta, region) for e in eps]
    np.testing.assert_allclose(got, ref, atol=1e-8)
    assert np.all(np.diff(got) >= -1e-12)


@pytest.mark.slow
def test_cdf_matches_dblquad_of_the_paper():
    fx, fy = stats.beta(35.5, 65.5), stats.beta(25.5, 75.5)
    e = math.exp(0.8)
    ref = integrate.dblquad(
        lambda y, x: fx.pdf(x) * fy.pdf(y),
        0,
        1,
        lambda x: max(0, 0.95 - e * x, (0.95 - x) / e),
        lambda x: min(1, 1 + (0.05 - x) / e, 0.05 + (1 - x) * e),
        epsabs=1e-7,
    )[0]
    assert epsilon_cdf(0.8, fn=35, tp=65, fp=25, tn=75, delta=0.05, region="full") == pytest.approx(ref, abs=2e-7)


@pytest.mark.parametrize("counts", [(35, 65, 25, 75, 0.05), (10, 90, 3, 97, 1e-5), (60, 40, 50, 50, 0.1)])
@pytest.mark.parametrize("region", ["attack", "full"])
def test_density_is_the_derivative_and_integrates_to_one_minus_point_mass(counts, region):
    *c, delta = counts
    kw = dict(fn=c[0], tp=c[1], fp=c[2], tn=c[3], delta=delta, region=region)
    eps = np.linspace(0.05, 4.0, 40)
    h = 1e-5
    fd = (epsilon_cdf(eps + h, **kw) - epsilon_cdf(eps - h, **kw)) / (2 * h)
    np.testing.assert_allclose(epsilon_density(eps, **kw), fd, atol=1e-4, rtol=1e-4)
    mass = integrate.quad(lambda t: epsilon_density(t, **kw), 0, 30, limit=200, points=[0.5, 1, 2])[0]
    assert mass == pytest.approx(1 - epsilon_cdf(0.0, **kw), abs=1e-6)


def test_bayes_interval_ends_are_the_cdf_quantiles():
    lo, hi = epsilon_interval(**WORKED)
    kw = dict(fn=35, tp=65, fp=25, tn=75, delta=0.05)
    assert epsilon_cdf([lo, hi], **kw) == pytest.approx([0.025, 0.975], abs=1e-9)
    one, inf = epsilon_interval(**WORKED, sided="one")
    assert inf == math.inf and epsilon_cdf(one, **kw) == pytest.approx(0.05, abs=1e-9)
    assert lo < one


# ---------------------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
@pytest.mark.parametrize("delta", [0.0, 1e-5, 0.1, 0.5])
@pytest.mark.parametrize("sided", ["two", "one"])
def test_zero_counts_fp_fn_zero(method, delta, sided):
    lo, hi = epsilon_interval(fn=0, tp=200, fp=0, tn=200, delta=delta, alpha=0.05, method=method, sided=sided)
    assert 0 < lo < math.inf and lo <= hi
    # more trials, still perfect: a larger lower bound
    lo2, _ = epsilon_interval(fn=0, tp=2000, fp=0, tn=2000, delta=delta, alpha=0.05, method=method, sided=sided)
    assert lo2 > lo
    if method != "bayes":  # the rectangle touches FNR = FPR = 0, where ε̂ = inf
        assert hi == math.inf


@pytest.mark.parametrize("counts", [(0, 5, 7, 0), (5, 0, 0, 7), (0, 1, 1, 0), (100, 0, 100, 0), (1, 0, 0, 1)])
@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
@pytest.mark.parametrize("delta", [0.0, 0.5])
def test_degenerate_counts_give_ordered_finite_or_infinite_limits(counts, method, delta):
    fn, tp, fp, tn = counts
    lo, hi = epsilon_interval(fn=fn, tp=tp, fp=fp, tn=tn, delta=delta, method=method)
    assert 0 <= lo <= hi
    assert not math.isnan(lo) and not math.isnan(hi)


# ------------------------------------------------------------------------------------------ properties


def _mode_estimate(fn, tp, fp, tn, delta):
    x, y = E._Posterior(fn, tp, fp, tn).mode()
    return epsilon_from_rates(fnr=x, fpr=y, delta=delta)


counts_st = st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(1, 300), st.integers(1, 300))


@given(counts=counts_st, delta=st.sampled_from([0.0, 1e-5, 0.05]), alpha=st.sampled_from([0.05, 0.1]))
@settings(max_examples=40, deadline=None)
def test_bayes_interval_inside_jeffreys_rectangle_and_contains_mode_estimate(counts, delta, alpha):
    fn, tp, fp, tn = counts
    kw = dict(fn=fn, tp=tp, fp=fp, tn=tn, delta=delta, alpha=alpha)
    blo, bhi = epsilon_interval(**kw, method="bayes")
    jlo, jhi = epsilon_interval(**kw, method="jeffreys")
    clo, chi = epsilon_interval(**kw, method="clopper_pearson")
    assert jlo - 1e-9 <= blo <= bhi <= jhi + 1e-9
    assert clo <= jlo + 1e-9 and jhi <= chi + 1e-9
    mode = _mode_estimate(fn, tp, fp, tn, delta)
    assert blo - 1e-9 <= mode <= bhi + 1e-9


@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
def test_lower_bound_grows_with_attack_accuracy(method):
    n = 500
    lows = [
        epsilon_interval(
            fn=round(r * n), tp=n - round(r * n), fp=round(r * n), tn=n - round(r * n), delta=1e-5, method=method
        )[0]
        for r in (0.5, 0.45, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01)
    ]
    assert lows[0] == 0.0
    assert all(b > a for a, b in zip(lows[1:], lows[2:]))


@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
@pytest.mark.parametrize("sided", ["two", "one"])
def test_lower_bound_grows_with_trials_at_fixed_rates(method, sided):
    lows = [
        epsilon_interval(fn=3 * k, tp=7 * k, fp=2 * k, tn=8 * k, delta=1e-5, method=method, sided=sided)[0]
        for k in (5, 10, 30, 100, 300)
    ]
    assert all(b > a for a, b in zip(lows, lows[1:]))
    assert lows[-1] < epsilon_from_rates(fnr=0.3, fpr=0.2, delta=1e-5)


@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
@pytest.mark.parametrize(
    ("members", "nonmembers", "sided", "region"), [(100, 100, "two", "attack"), (7, 30, "one", "full")]
)
def test_max_informative_delta_is_where_a_perfect_attack_stops_showing_anything(
    method, members, nonmembers, sided, region
):
    """Below it a perfect attack's lower limit is positive (so some outcome shows ε > 0); from just above it no
    outcome does: every confusion matrix of the game has lower limit 0 (the perfect attack is the best)."""
    settings = dict(alpha=0.05, method=method, sided=sided, region=region)
    largest = max_informative_delta(members=members, nonmembers=nonmembers, **settings)
    assert 0 < largest < 1
    perfect = dict(fn=0, tp=members, fp=0, tn=nonmembers, **settings)
    assert epsilon_interval(delta=largest - 1e-4, **perfect)[0] > 0
    assert epsilon_interval(delta=largest + 2e-4, **perfect)[0] == 0
    rng = np.random.default_rng(0)
    for fn, fp in zip(rng.integers(0, members + 1, 20), rng.integers(0, nonmembers + 1, 20)):
        low = epsilon_interval(fn=fn, tp=members - fn, fp=fp, tn=nonmembers - fp, delta=largest + 2e-4, **settings)[0]
        assert low == 0
    if method == "clopper_pearson" and sided == "two":  # the rectangle's closed form: 1 − both upper limits
        tail = 1 - 0.05 / 4
        closed = 1 - stats.beta.ppf(tail, 1, members) - stats.beta.ppf(tail, 1, nonmembers)
        assert largest == pytest.approx(closed, abs=1.5e-4) and largest <= closed


def test_max_informative_delta_grows_with_the_trials_and_is_zero_for_a_game_too_small():
    values = [max_informative_delta(members=n, nonmembers=n) for n in (10, 30, 100, 1000)]
    assert all(b > a for a, b in zip(values, values[1:])) and values[0] > 0.5 and values[-1] < 1
    assert max_informative_delta(members=1, nonmembers=1) == 0.0
    with pytest.raises(ValueError, match="at least one member and one non-member"):
        max_informative_delta(members=0, nonmembers=5)


# ------------------------------------------------------------------------------------- threshold sweep


def _loop_counts(scores, member, t):
    pred = scores >= t
    return (
        int(np.sum(~pred & member)),
        int(np.sum(pred & member)),
        int(np.sum(pred & ~member)),
        int(np.sum(~pred & ~member)),
    )


@given(n=st.integers(2, 25), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_roc_counts_equals_loop(n, seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=n).astype(float)  # many ties
    member = rng.random(n) < 0.5
    thresholds, tp, fp, tn, fn = roc_counts(scores, member)
    assert len(thresholds) == len(np.unique(scores)) + 1
    for j, t in enumerate(thresholds):
        assert (fn[j], tp[j], fp[j], tn[j]) == _loop_counts(scores, member, t)


@pytest.mark.parametrize("method", ["bayes", "jeffreys", "clopper_pearson"])
@pytest.mark.parametrize("selection", ["none", "bonferroni"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_equals_brute_force_loop(method, selection, seed):
    rng = np.random.default_rng(seed)
    member = np.r_[np.ones(15, bool), np.zeros(15, bool)]
    scores = np.round(rng.normal(loc=3.0 * member), 1)
    res = epsilon_lower_bound(scores, member, delta=1e-5, method=method, selection=selection)
    thresholds = np.r_[np.inf, np.unique(scores)[::-1]]
    alpha = 0.05 / len(thresholds) if selection == "bonferroni" else 0.05
    best = max(
        epsilon_interval(
            **dict(zip(("fn", "tp", "fp", "tn"), _loop_counts(scores, member, t))),
            delta=1e-5,
            alpha=alpha,
            method=method,
        )[0]
        for t in thresholds
    )
    assert res.epsilon_lower == pytest.approx(best, abs=1e-9)
    assert (res.fn, res.tp, res.fp, res.tn) == _loop_counts(scores, member, res.threshold)
    assert res.alpha_per_test == pytest.approx(alpha) and res.n_thresholds == len(thresholds)
    assert res.optimistic is (selection == "none")
    assert best > 0 or selection == "bonferroni"


def test_holdout_bounds_the_other_half():
    rng = np.random.default_rng(0)
    member = np.r_[np.ones(301, bool), np.zeros(200, bool)]
    scores = rng.normal(loc=2.0 * member)
    res = epsilon_lower_bound(scores, member, delta=1e-5, selection="holdout", seed=4)
    assert (res.tp + res.fn, res.fp + res.tn) == (151, 100)  # stratified halves; the odd one held out
    assert res.epsilon_lower == pytest.approx(
        epsilon_interval(fn=res.fn, tp=res.tp, fp=res.fp, tn=res.tn, delta=1e-5)[0], abs=1e-12
    )
    assert res.epsilon_lower > 0.5
    assert epsilon_lower_bound(scores, member, delta=1e-5, seed=4) == res  # seeded


@pytest.mark.slow
def test_holdout_keeps_nominal_level_for_an_attack_without_power():
    """Scores independent of membership: the true ε̂ is 0, so ε̂₋ > 0 is a false claim of leakage."""
    rng = np.random.default_rng(1)
    reps, n, alpha = 150, 100, 0.05
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    false_claims = {"holdout": 0, "none": 0}
    for rep in range(reps):
        scores = rng.normal(size=2 * n)
        for selection in false_claims:
            res = epsilon_lower_bound(scores, member, delta=1e-5, alpha=alpha, selection=selection, seed=rep)
            false_claims[selection] += res.epsilon_lower > 0
    assert false_claims["holdout"] / reps <= alpha
    assert false_claims["none"] / reps > 2 * alpha  # why "none" is labelled optimistic


# --------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(fn=-1), ValueError, "`fn`"),
        (dict(tp=2.5), TypeError, "`tp`"),
        (dict(fp=True), TypeError, "`fp`"),
        (dict(fn=0, tp=0), ValueError, "member trial"),
        (dict(fp=0, tn=0), ValueError, "non-member trial"),
        (dict(delta=1.0), ValueError, "`delta`"),
        (dict(delta=-1e-9), ValueError, "`delta`"),
        (dict(alpha=0.0), ValueError, "`alpha`"),
        (dict(alpha=1.0), ValueError, "`alpha`"),
        (dict(method="beta"), ValueError, "`method`"),
        (dict(sided="left"), ValueError, "`sided`"),
        (dict(region="all"), ValueError, "`region`"),
    ],
)
def test_interval_errors_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        epsilon_interval(**{**WORKED, **kwargs})


def test_other_errors_name_the_argument():
    with pytest.raises(ValueError, match="`fnr`"):
        epsilon_from_rates(fnr=1.5, fpr=0.1, delta=0.0)
    with pytest.raises(ValueError, match="`epsilon`"):
        epsilon_cdf(-0.1, fn=1, tp=1, fp=1, tn=1, delta=0.0)
    with pytest.raises(ValueError, match="same number"):
        epsilon_lower_bound([0.1, 0.2], [1], delta=0.0)
    with pytest.raises(ValueError, match="`is_member`"):
        epsilon_lower_bound([0.1, 0.2], [1, 2], delta=0.0)
    with pytest.raises(ValueError, match="NaN"):
        epsilon_lower_bound([0.1, np.nan], [1, 0], delta=0.0)
    with pytest.raises(ValueError, match="at least 2 members"):
        epsilon_lower_bound([0.1, 0.2, 0.3], [1, 0, 0], delta=0.0)
    with pytest.raises(ValueError, match="`selection`"):
        epsilon_lower_bound([0.1, 0.2], [1, 0], delta=0.0, selection="best")


def test_analysis_module_imports_without_torch():
    code = (
        "import sys, lightning_privacy.analysis.estimation; "
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

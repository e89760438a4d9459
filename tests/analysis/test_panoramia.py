"""PANORAMIA's binomial-tail bounds (Propositions 1-2) against brute force, plus their properties."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from lightning_privacy.analysis.panoramia import (
    MEANING,
    guess_counts,
    logit_lower_bound,
    panoramia_bounds,
    precision_lower_bound,
    top_k_counts,
)


def _brute_force_theta(tp: int, r: int, beta: float) -> float:
    """Largest theta on a fine grid (then bisection) with P[Bin(r, sigmoid(theta)) >= tp] <= beta."""
    if tp == 0:
        return 0.0
    tail = lambda th: stats.binom.sf(tp - 1, r, special.expit(th))  # noqa: E731
    if tail(0.0) > beta:
        return 0.0
    grid = np.linspace(0.0, 30.0, 30001)
    ok = grid[tail(grid) <= beta]
    lo, hi = ok.max(), ok.max() + 1e-3
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tail(mid) <= beta else (lo, mid)
    return lo


@pytest.mark.parametrize(
    "tp,r,beta",
    [(90, 100, 0.05), (10, 10, 0.01), (30, 40, 0.00025), (500, 700, 0.05 / 200), (3, 3, 0.2), (51, 100, 0.05)],
)
def test_logit_bound_matches_brute_force(tp, r, beta):
    got = logit_lower_bound(true_positives=tp, guesses=r, beta=beta)
    want = _brute_force_theta(tp, r, beta)
    assert got == pytest.approx(want, abs=2e-6)
    if got > 0:  # safe side: the returned value itself is rejected at level beta
        assert stats.binom.sf(tp - 1, r, special.expit(got)) <= beta


def test_precision_bound_is_clopper_pearson_one_sided():
    # The two-sided 90% Clopper-Pearson interval's lower end is the one-sided 95% lower bound.
    lo, _ = stats.binomtest(90, 100).proportion_ci(confidence_level=0.90, method="exact")
    assert precision_lower_bound(true_positives=90, guesses=100, beta=0.05) == pytest.approx(lo, rel=1e-9)


def test_vectorised_equals_scalar():
    tp, r = np.array([0, 5, 9, 40]), np.array([3, 10, 10, 41])
    vec = logit_lower_bound(true_positives=tp, guesses=r, beta=0.01)
    for i in range(4):
        assert vec[i] == logit_lower_bound(true_positives=int(tp[i]), guesses=int(r[i]), beta=0.01)


@settings(max_examples=60, deadline=None)
@given(r=st.integers(1, 400), data=st.data(), beta=st.floats(1e-6, 0.5))
def test_more_correct_guesses_give_larger_bound(r, data, beta):
    tp = data.draw(st.integers(0, r - 1))
    a = logit_lower_bound(true_positives=tp, guesses=r, beta=beta)
    b = logit_lower_bound(true_positives=tp + 1, guesses=r, beta=beta)
    assert b >= a
    if a > 0:
        assert b > a


@settings(max_examples=40, deadline=None)
@given(r=st.integers(2, 300), data=st.data())
def test_bound_grows_with_beta_and_with_r_at_fixed_precision(r, data):
    tp = data.draw(st.integers(1, r))
    assert logit_lower_bound(true_positives=tp, guesses=r, beta=0.1) >= logit_lower_bound(
        true_positives=tp, guesses=r, beta=0.01
    )
    # same precision, twice the evidence
    assert logit_lower_bound(true_positives=2 * tp, guesses=2 * r, beta=0.05) >= logit_lower_bound(
        true_positives=tp, guesses=r, beta=0.05
    )


def test_bad_counts_and_beta_raise():
    with pytest.raises(ValueError, match="`true_positives` cannot exceed `guesses`"):
        logit_lower_bound(true_positives=5, guesses=4, beta=0.05)
    with pytest.raises(ValueError, match="`guesses` must hold non-negative integers"):
        logit_lower_bound(true_positives=1, guesses=2.5, beta=0.05)
    with pytest.raises(ValueError, match=r"`beta` must be in \(0, 1\), got 1.5"):
        logit_lower_bound(true_positives=1, guesses=2, beta=1.5)
    with pytest.raises(TypeError, match="`beta`"):
        logit_lower_bound(true_positives=1, guesses=2, beta="0.05")


def test_top_k_counts_brute_force():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 2, 200)
    t = np.round(rng.normal(size=200), 1)  # many ties
    counts = guess_counts(200, num_thresholds=30)
    r, tp = top_k_counts(s, t, counts)
    for k, ri, tpi in zip(counts, r, tp):
        thr = np.sort(t)[::-1][k - 1]
        guess = t >= thr
        assert ri == guess.sum() and tpi == s[guess].sum() and ri >= k


def test_guess_counts_depend_on_m_only():
    c = guess_counts(5000, num_thresholds=100)
    assert c[0] == 1 and c[-1] == 5000 and np.all(np.diff(c) > 0) and len(c) <= 100


def test_perfect_and_useless_scorers():
    rng = np.random.default_rng(1)
    s = rng.integers(0, 2, 2000)
    noise = rng.normal(size=2000)
    res = panoramia_bounds(s, noise, s + 0.01 * noise, beta=0.05)
    # Useless baseline: c_lb is 0 unless the union bound failed (prob <= beta / 2).
    assert res.c_lb == 0.0
    # Perfect MIA: the largest candidate k <= #members guesses only members -> logit(beta'^(1/k)).
    r = res.counts[res.counts <= res.members].max()
    want = special.logit(res.per_threshold_beta ** (1 / r))
    assert res.c_plus_epsilon_lb == pytest.approx(want, rel=1e-9)
    assert res.epsilon == pytest.approx(res.c_plus_epsilon_lb)
    assert res.per_threshold_beta == pytest.approx(0.05 / (2 * len(res.counts)))
    assert res.c_lb_curve.shape == res.counts.shape == res.mia_recall.shape


def test_epsilon_is_clipped_at_zero_when_baseline_wins():
    rng = np.random.default_rng(2)
    s = rng.integers(0, 2, 1000)
    res = panoramia_bounds(s, s.astype(float), rng.normal(size=1000))
    assert res.c_lb > res.c_plus_epsilon_lb and res.epsilon == 0.0


def test_union_bound_keeps_confidence_under_null():
    """Scores independent of s: P[c_lb > 0 or {c+eps}_lb > 0] <= beta over many games."""
    rng = np.random.default_rng(3)
    rejections = 0
    for _ in range(300):
        s = rng.integers(0, 2, 300)
        res = panoramia_bounds(s, rng.normal(size=300), rng.normal(size=300), beta=0.2, num_thresholds=50)
        rejections += (res.c_lb > 0) or (res.c_plus_epsilon_lb > 0)
    assert rejections / 300 <= 0.2


def test_panoramia_bounds_input_errors():
    with pytest.raises(ValueError, match=r"`baseline_scores` must have shape \(3,\)"):
        panoramia_bounds([1, 0, 1], [0.1, 0.2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="`labels` must hold only 0 and 1"):
        panoramia_bounds([1, 2, 1], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="`labels` must be a non-empty"):
        panoramia_bounds([], [], [])
    with pytest.raises(ValueError, match="`mia_scores` must be finite"):
        panoramia_bounds([1, 0], [0.1, 0.2], [np.nan, 0.2])
    with pytest.raises(ValueError, match="`num_thresholds` must be a positive int, got 0"):
        panoramia_bounds([1, 0], [0.1, 0.2], [0.1, 0.2], num_thresholds=0)


def test_meaning_states_it_is_not_a_dp_lower_bound():
    assert "NOT a lower bound" in MEANING


def test_analysis_module_imports_without_torch():
    code = (
        "import sys, lightning_privacy.analysis.panoramia; "
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

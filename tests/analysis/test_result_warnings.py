"""The objective criteria behind the audits' warnings: reversed-looking scores and PANORAMIA results without information."""

import numpy as np
import pytest
from scipy import stats

from lightning_privacy.analysis.estimation import (
    REVERSED_LEVEL,
    counts_orientation,
    epsilon_lower_bound,
    score_orientation,
)
from lightning_privacy.analysis.panoramia import information_warnings, min_correct_guesses, panoramia_bounds


def _game(n=800, shift=1.5, seed=1):
    rng = np.random.default_rng(seed)
    is_member = rng.random(n) < 0.5
    return rng.normal(loc=shift * is_member), is_member


# --- reversed-looking scores ----------------------------------------------------------------------
def test_reversed_scores_are_flagged_and_the_bound_says_so():
    scores, is_member = _game()
    flipped = epsilon_lower_bound(-scores, is_member, delta=1e-5)
    assert flipped.epsilon_lower == 0.0  # the wrong orientation finds nothing ...
    assert epsilon_lower_bound(scores, is_member, delta=1e-5).epsilon_lower > 0.5  # ... the right one a lot
    (warning,) = flipped.warnings
    assert "look reversed" in warning and "negate" in warning and "AUC = 0.1" in warning
    assert flipped.as_dict()["warnings"] == [warning]
    orientation = score_orientation(-scores, is_member)
    assert orientation.reversed and orientation.auc < 0.25 and orientation.pvalue < 1e-30


def test_scores_of_the_right_orientation_or_without_power_are_not_flagged():
    scores, is_member = _game()
    assert epsilon_lower_bound(scores, is_member, delta=1e-5).warnings == ()
    assert not score_orientation(scores, is_member).reversed
    # an attack with no power: AUC about 0.5, flagged only at the level's rate
    rng = np.random.default_rng(0)
    flagged = [score_orientation(rng.normal(size=200), rng.random(200) < 0.5).reversed for _ in range(300)]
    assert sum(flagged) <= 3  # expected 0.3 at REVERSED_LEVEL = 1e-3


def test_orientation_auc_and_pvalue_are_mann_whitney():
    scores, is_member = _game(n=300, shift=-0.3, seed=4)
    res = score_orientation(scores, is_member)
    members, nonmembers = scores[is_member], scores[~is_member]
    auc = np.mean([(m > n) + 0.5 * (m == n) for m in members for n in nonmembers])
    assert res.auc == pytest.approx(auc, rel=1e-12)
    assert res.pvalue == pytest.approx(stats.mannwhitneyu(members, nonmembers, alternative="less").pvalue)
    assert res.level == REVERSED_LEVEL and res.reversed == (res.pvalue < REVERSED_LEVEL)
    assert score_orientation(scores, is_member, level=0.5).reversed  # AUC < 0.5: significant at a loose level
    with pytest.raises(ValueError, match="level"):
        score_orientation(scores, is_member, level=1.0)


def test_reversed_counts():
    assert counts_orientation(fn=70, tp=30, fp=60, tn=40).reversed
    assert not counts_orientation(fn=30, tp=70, fp=40, tn=60).reversed  # the right way round
    assert not counts_orientation(fn=50, tp=50, fp=50, tn=50).reversed  # no power
    assert not counts_orientation(fn=3, tp=1, fp=1, tn=3).reversed  # too few trials to tell
    assert counts_orientation(fn=70, tp=30, fp=60, tn=40).auc == pytest.approx((0.3 + 0.4) / 2)


# --- PANORAMIA: too few correct guesses -------------------------------------------------------
def test_min_correct_guesses_is_the_all_correct_binomial_test():
    for beta in (0.05, 2.5e-4, 1e-6):
        k = min_correct_guesses(beta)
        assert 0.5**k <= beta < 0.5 ** (k - 1)  # k all-correct guesses reject, k - 1 do not
    assert min_correct_guesses(0.05 / 200) == 12


def test_a_mia_without_correct_guesses_carries_no_information():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 2, 300)
    b = panoramia_bounds(s, rng.random(300), rng.random(300))  # neither classifier sees anything
    assert b.c_plus_epsilon_lb == 0.0 and b.epsilon == 0.0
    (warning,) = information_warnings(b)
    assert warning.startswith("no information") and "not evidence of privacy" in warning
    assert f"at least {min_correct_guesses(b.per_threshold_beta)} correct guesses" in warning and "m = 300" in warning


def test_an_audit_set_below_the_minimum_can_never_inform():
    s = np.array([1, 0, 1, 1, 0, 1, 0, 1])  # m = 8, 5 members, with a perfect MIA
    b = panoramia_bounds(s, np.zeros(8), s.astype(float), num_thresholds=4)
    assert b.c_plus_epsilon_lb == 0.0 and min_correct_guesses(b.per_threshold_beta) == 8
    (warning,) = information_warnings(b)
    assert "m = 8 points holds 5 real members, fewer than the 8 correct" in warning and "whatever the model" in warning


def test_a_positive_bound_carries_information_even_when_the_baseline_matches_it():
    s = np.array([1, 0] * 100)
    perfect = s.astype(float)
    assert information_warnings(panoramia_bounds(s, np.zeros(200), perfect)) == ()  # eps_tilde > 0
    matched = panoramia_bounds(s, perfect, perfect)  # eps_tilde = 0, but the MIA found something
    assert matched.epsilon == 0.0 and matched.c_plus_epsilon_lb > 0 and information_warnings(matched) == ()

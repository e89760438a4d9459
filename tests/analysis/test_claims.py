"""Verdicts on claims: the curves, synthetic scores whose truth is known, and the multiple-comparison correction
checked by simulation (a true claim, simulated from its own extreme trade-off curve, is contradicted at most at α)."""

import math

import numpy as np
import pytest
from scipy import stats

from lightning_privacy.analysis.canary import epsilon_from_mu
from lightning_privacy.analysis.claims import (
    CLAIM_FPRS,
    check_attack_scores,
    check_canaries,
    epsilon_delta_tpr_bound,
    gdp_tpr_bound,
    symmetric_concave_inverse,
    tpr_point_tests,
)
from lightning_privacy.analysis.estimation import epsilon_from_rates

ALPHA = 0.05
MANY_FPRS = tuple(np.geomspace(1e-3, 0.5, 20))  # 20 FPR points: the correction has work to do


def _members(n):
    return np.r_[np.ones(n, bool), np.zeros(n, bool)]


def _gdp(mu):
    return lambda f: gdp_tpr_bound(f, mu=mu)


# --------------------------------------------------------------------------------------------------------- curves
def test_epsilon_delta_curve_is_the_boundary_of_the_privacy_region():
    fpr = np.linspace(0.0, 1.0, 101)
    for eps, delta in ((0.5, 0.0), (1.0, 1e-5), (3.0, 0.01)):
        tpr = epsilon_delta_tpr_bound(fpr, epsilon=eps, delta=delta)
        inside = (tpr < 1.0) & (fpr > 0.0)
        # a point on the curve has ε̂ = ε exactly (Zanella-Béguelin et al.'s Equation 1 on (FNR, FPR))
        got = [epsilon_from_rates(fnr=1 - t, fpr=f, delta=delta) for t, f in zip(tpr[inside], fpr[inside])]
        np.testing.assert_allclose(got, eps, atol=1e-9)
    assert epsilon_delta_tpr_bound(0.3, epsilon=math.inf, delta=0.0) == 1.0
    assert epsilon_delta_tpr_bound(0.3, epsilon=0.0, delta=0.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="`epsilon`"):
        epsilon_delta_tpr_bound(0.1, epsilon=-1.0, delta=0.0)
    with pytest.raises(ValueError, match="`fpr`"):
        epsilon_delta_tpr_bound(1.5, epsilon=1.0, delta=0.0)


def test_gdp_curve_is_the_neyman_pearson_test_of_two_gaussians():
    fpr = np.array([1e-4, 0.01, 0.2, 0.7])
    np.testing.assert_allclose(gdp_tpr_bound(fpr, mu=1.3), stats.norm.sf(stats.norm.isf(fpr) - 1.3))


def test_the_symmetric_concave_inverse_is_below_both_orders():
    """For an asymmetric curve ξ(x) = min(1, 4x) (its reverse: 1 − (1 − x)/4 … as a TPR bound) the inverse used
    by the one-run test is at most the inverse of each order, so the test only rejects less."""
    forward = lambda f: np.minimum(1.0, 4.0 * np.asarray(f) + 0.01)
    inverse = symmetric_concave_inverse(forward)
    for y in (0.02, 0.1, 0.5, 0.9, 0.999):
        assert inverse(y) <= max(0.0, (y - 0.01) / 4) + 1e-12  # ξ⁻¹ of the forward order
    mu_inverse = symmetric_concave_inverse(_gdp(1.0))
    for y in (1e-6, 1e-3, 0.1, 0.5, 0.99):
        exact = stats.norm.cdf(stats.norm.ppf(y) - 1.0)
        assert exact * 0.97 <= mu_inverse(y) <= exact  # below, and within the grid's resolution
    with pytest.raises(ValueError, match="`points`"):
        symmetric_concave_inverse(forward, points=3)


# ------------------------------------------------------------------------------------------- known truth: ROC
def test_scores_far_above_the_claim_contradict_it_and_name_the_evidence():
    rng = np.random.default_rng(3)
    member = _members(1000)
    scores = rng.normal(loc=2.5 * member)  # the mechanism is 2.5-GDP; claimed: 1-GDP
    verdict = check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=epsilon_from_mu(mu=1.0, delta=1e-5))
    assert verdict.verdict == "contradicted" and verdict.contradicted
    e = verdict.evidence
    assert e["contradicts"] and e["tpr_low"] > e["bound"] == pytest.approx(gdp_tpr_bound(e["fpr_high"], mu=1.0))
    assert e["margin"] == max(t["margin"] for t in verdict.tests)
    assert "contradicted at confidence 95%" in verdict.sentence() and f"{e['bound']:.4f}" in verdict.sentence()
    assert verdict.to_dict()["evidence"] == e


def test_scores_below_the_claim_are_consistent():
    rng = np.random.default_rng(4)
    member = _members(1000)
    scores = rng.normal(loc=0.7 * member)
    verdict = check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=epsilon_from_mu(mu=1.0, delta=1e-5))
    assert verdict.verdict == "consistent" and verdict.evidence is None
    kinds = [t["kind"] for t in verdict.tests]
    assert kinds == ["tpr_at_fpr"] * len(CLAIM_FPRS) + ["epsilon_lower"]
    assert all(t["level"] == pytest.approx(ALPHA / 2 / len(CLAIM_FPRS)) for t in verdict.tests[:-1])
    assert verdict.tests[-1]["level"] == pytest.approx(ALPHA / 2)
    assert verdict.sentence().startswith("consistent")


def test_fpr_points_with_the_same_allowed_false_positives_are_one_test():
    member = _members(100)
    scores = np.r_[np.arange(100) + 100.0, np.arange(100.0)]
    tests = tpr_point_tests(scores, member, lambda f: f, fprs=(0.001, 0.002, 0.005, 0.01, 0.5, 1.0), alpha=0.06)
    assert [t["fp_allowed"] for t in tests] == [0, 1, 50]  # 100 non-members: k = 0, 0, 0, 1, 50; k = 100 tests nothing
    assert all(t["level"] == pytest.approx(0.02) for t in tests)
    assert [t["fp"] for t in tests] == [0, 1, 50] and [t["tp"] for t in tests] == [100, 100, 100]
    assert tests[0]["fpr"] == 0.005  # the largest FPR point with that k
    with pytest.raises(ValueError, match="members and non-members"):
        tpr_point_tests(scores, np.ones(200, bool), lambda f: f)


def test_the_epsilon_evidence_alone_can_decide():
    """A claim whose curve is loose (no ROC test can beat 1) but whose ε is tiny: only the ε test contradicts."""
    rng = np.random.default_rng(5)
    member = _members(2000)
    scores = rng.normal(loc=4.0 * member)
    verdict = check_attack_scores(scores, member, tpr_bound=lambda f: np.ones_like(f), epsilon=0.5, delta=1e-5)
    assert verdict.contradicted and verdict.evidence["kind"] == "epsilon_lower"
    assert verdict.evidence["statistic"] > 0.5 and "ε lower bound" in verdict.sentence()


def test_bad_arguments_are_named():
    member = _members(10)
    scores = np.arange(20.0)
    with pytest.raises(ValueError, match="`alpha`"):
        check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=None, alpha=1.0)
    with pytest.raises(ValueError, match="`epsilon_share`"):
        check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=1.0, epsilon_share=0.0)
    with pytest.raises(ValueError, match="`delta`"):
        check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=1.0, delta=1.0)
    with pytest.raises(ValueError, match="`fprs`"):
        check_attack_scores(scores, member, tpr_bound=_gdp(1.0), epsilon=None, fprs=(2.0,))
    with pytest.raises(ValueError, match="finite TPR bounds"):
        check_canaries(scores, member, epsilon=None, delta=0.0, tpr_bound=lambda f: np.full_like(f, np.nan))
    with pytest.raises(ValueError, match="neither"):
        check_canaries(scores, member, epsilon=None, delta=0.0)


# ------------------------------------------------------------------------------- the correction, by simulation
def test_a_true_gdp_claim_is_falsely_contradicted_at_most_at_alpha():
    """500 audits of a mechanism on the claim's own curve (scores N(0, 1) vs N(μ, 1), μ-GDP claimed), 20 FPR points
    and the ε test: contradictions ≤ α. Without the correction (every point at α) the rate would be far above."""
    rng = np.random.default_rng(0)
    mu, n, runs = 1.0, 1000, 500
    member = _members(n)
    eps = epsilon_from_mu(mu=mu, delta=1e-5)
    false, uncorrected = 0, 0
    for run in range(runs):
        scores = rng.normal(loc=mu * member)
        verdict = check_attack_scores(
            scores, member, tpr_bound=_gdp(mu), epsilon=eps, delta=1e-5, fprs=MANY_FPRS, seed=run
        )
        false += verdict.contradicted
        # the same points each at α (no correction) with the observed point estimate: the naive practice
        naive = tpr_point_tests(scores, member, _gdp(mu), fprs=MANY_FPRS, alpha=1.0 - 1e-12)
        uncorrected += any(t["tpr"] > gdp_tpr_bound(t["fp"] / n, mu=mu) for t in naive)
    assert false / runs <= ALPHA
    assert uncorrected / runs > 0.5  # the question the correction answers is real


def test_a_true_epsilon_delta_claim_with_tied_scores_is_falsely_contradicted_at_most_at_alpha():
    """The extreme (ε, δ) pair (four outcomes; scores tie within each): 500 audits, contradictions ≤ α."""
    rng = np.random.default_rng(1)
    eps, delta, n, runs = 1.0, 0.01, 500, 500
    q = (1 - delta) / (1 + math.exp(eps))
    with_x = [delta, (1 - delta) - q, q, 0.0]  # outcomes scored 3, 2, 1, 0
    without_x = [0.0, q, (1 - delta) - q, delta]
    member = _members(n)
    false = 0
    for run in range(runs):
        scores = np.r_[3 - rng.choice(4, n, p=with_x), 3 - rng.choice(4, n, p=without_x)].astype(float)
        claim = lambda f: epsilon_delta_tpr_bound(f, epsilon=eps, delta=delta)
        verdict = check_attack_scores(scores, member, tpr_bound=claim, epsilon=eps, delta=delta, seed=run)
        false += verdict.contradicted
    assert false / runs <= ALPHA


def test_a_wrong_claim_is_caught_almost_always():
    rng = np.random.default_rng(2)
    member = _members(1000)
    caught = sum(
        check_attack_scores(
            rng.normal(loc=1.6 * member), member, tpr_bound=_gdp(1.0), epsilon=None, fprs=MANY_FPRS
        ).contradicted
        for _ in range(100)
    )
    assert caught >= 90


# ----------------------------------------------------------------------------------------------------- canaries
def test_canaries_contradict_a_claim_far_below_the_truth():
    rng = np.random.default_rng(6)
    included = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 4.0 * included
    verdict = check_canaries(
        scores, included, epsilon=epsilon_from_mu(mu=1.0, delta=1e-5), delta=1e-5, tpr_bound=_gdp(1.0)
    )
    assert verdict.contradicted
    binomial, fdp = verdict.tests
    assert binomial["kind"] == "binomial" and fdp["kind"] == "fdp" and fdp["contradicts"]
    assert fdp["correct"] > fdp["bound"] and fdp["level"] == pytest.approx(ALPHA / 2)
    assert "canary guesses are right" in verdict.sentence()


def test_canaries_of_a_true_claim_are_contradicted_at_most_at_alpha():
    """120 one-run games of m = 400 canaries on the claim's own 1.5-GDP curve: contradictions ≤ α."""
    rng = np.random.default_rng(7)
    mu, m, runs = 1.5, 400, 120
    eps = epsilon_from_mu(mu=mu, delta=1e-5)
    false = 0
    for run in range(runs):
        included = rng.random(m) < 0.5
        scores = rng.normal(size=m) + mu * included
        false += check_canaries(scores, included, epsilon=eps, delta=1e-5, tpr_bound=_gdp(mu), seed=run).contradicted
    assert false / runs <= ALPHA


def test_the_binomial_test_alone_uses_all_of_alpha():
    rng = np.random.default_rng(8)
    included = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 6.0 * included
    verdict = check_canaries(scores, included, epsilon=1.0, delta=0.0)
    (test,) = verdict.tests
    assert test["kind"] == "binomial" and test["level"] == ALPHA and verdict.contradicted
    assert verdict.evidence["statistic"] > 1.0


def test_a_hand_picked_inclusion_vector_is_refused_not_read_as_a_contradiction():
    """All canaries 'included' (no Bernoulli(1/2) draw): every 'in' guess is right by construction, so a true claim
    (scores that carry no signal at all) used to be contradicted. It is refused, naming the count (issue 37)."""
    scores = np.random.default_rng(9).normal(size=1000)
    with pytest.raises(ValueError, match=r"`included`.*1000 of 1000 canaries included.*default_rng"):
        check_canaries(scores, np.ones(1000, bool), epsilon=1.0, delta=1e-5, tpr_bound=_gdp(0.5))
    honest = np.random.default_rng(10).random(1000) < 0.5
    assert not check_canaries(scores, honest, epsilon=1.0, delta=1e-5, tpr_bound=_gdp(0.5)).contradicted


def test_a_tied_scores_fpr_limit_is_from_the_allowed_count_not_the_observed_one():
    """Ties: at FPR 0.01 (k = 10 of 1000) the cut is the 11th largest non-member score, 0, shared by 995 of them, so
    the rule flags only the 5 above it. Its FPR upper limit must be k's (10 of 1000), chosen before the scores, not
    the observed count's (5 of 1000, smaller: it would contradict this claim)."""
    from lightning_privacy.analysis.estimation import rate_interval

    member = _members(1000)
    scores = np.r_[np.full(60, 2.0), np.zeros(940), np.full(5, 2.0), np.zeros(995)]  # members, then non-members
    claim = lambda f: np.minimum(1.0, 3.0 * np.asarray(f))
    (test,) = tpr_point_tests(scores, member, claim, fprs=(0.01,), alpha=ALPHA)
    assert (test["fp_allowed"], test["fp"], test["tp"]) == (10, 5, 60)
    assert test["fpr_high"] == rate_interval(10, 1000, alpha=ALPHA, method="clopper_pearson")[1]
    observed = rate_interval(5, 1000, alpha=ALPHA, method="clopper_pearson")[1]
    assert test["tpr_low"] > claim(observed)  # what the observed count would have concluded
    assert not test["contradicts"] and test["bound"] == pytest.approx(3.0 * test["fpr_high"])


def test_the_canary_fdp_test_is_bonferroni_corrected_over_the_guess_grid():
    """1000 canaries of a 3-GDP mechanism against a 1.5-GDP claim: some grid pair rejects the claim at the kind's
    level α, none at α/|grid| (27 pairs). The test may only use the corrected level: it chose the pair after seeing
    the scores. (At α uncorrected the verdict would be 'contradicted'.)"""
    from lightning_privacy.analysis.canary import _Game, fdp_excess, guess_grid

    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 3.0 * included
    inverse = symmetric_concave_inverse(_gdp(1.5))
    game = _Game(scores, included, np.random.default_rng(0).permutation(1000))
    counts = [game.counts(k_plus, k_minus) for k_plus, k_minus in game.pairs]

    def rejects(level):
        return any(v > 0 and fdp_excess(1000, r, v, level, inverse) > 0.0 for r, v in counts)

    grid = len(guess_grid(1000))
    assert grid == 27 and rejects(ALPHA) and not rejects(ALPHA / grid)
    verdict = check_canaries(scores, included, epsilon=None, delta=1e-5, tpr_bound=_gdp(1.5), alpha=ALPHA, seed=0)
    (fdp,) = verdict.tests
    assert fdp["level"] == ALPHA and fdp["level_per_pair"] == pytest.approx(ALPHA / grid)
    assert verdict.verdict == "consistent" and not fdp["contradicts"]

"""Score-based one-run estimators (analysis/canary_fdp.py): soundness on simulated μ-GDP canaries (Monte Carlo),
the gain over the binomial test on the same scores, the Gaussian model's failure on a non-Gaussian score, the
tightest bound's choice and correction, the claim test, argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from lightning_privacy.analysis.canary import canary_audit_from_scores, epsilon_from_mu
from lightning_privacy.analysis.canary_fdp import (
    INDEPENDENT_METHODS,
    INDEPENDENT_WEIGHTS,
    gauss_mu_lower,
    orderstat_claim_test,
    orderstat_epsilon_lower,
    orderstat_mu_lower,
    orderstat_rungs,
    tightest_canary_bound,
)
from lightning_privacy.analysis.claims import check_canaries, gdp_tpr_bound, symmetric_concave_xi

ALPHA = 0.05
REPS = 200


def _draw(seed: int, m: int, mu: float) -> tuple:
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    return rng.normal(size=m) + mu * included, included


def _max_violation_rate() -> float:
    return ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_orderstat_is_sound_on_gaussian_canaries(mu):
    """μ-GDP canaries (N(μ·b, 1)): μ̂ > μ in at most α of 200 runs (it is conservative: far fewer)."""
    over = sum(orderstat_mu_lower(*_draw(seed, 1000, mu), alpha=ALPHA).mu_lower > mu for seed in range(REPS))
    assert over / REPS <= _max_violation_rate()


def test_orderstat_is_sound_with_ties_and_a_monotone_transform():
    """Rounded scores (atoms, ties at the threshold) of a 1-GDP pair, then exp: still sound, and the transform
    changes nothing (the estimator reads ranks only)."""
    over = 0
    for seed in range(REPS):
        s, inc = _draw(seed, 600, 1.0)
        rounded = np.round(s * 2) / 2
        a = orderstat_mu_lower(rounded, inc, alpha=ALPHA).mu_lower
        assert orderstat_mu_lower(np.exp(rounded), inc, alpha=ALPHA).mu_lower == a
        over += a > 1.0
    assert over / REPS <= _max_violation_rate()


def test_orderstat_is_sound_at_the_rate_alpha_when_its_test_is_fixed():
    """One rung at level α (no Bonferroni): the two Clopper–Pearson limits fail together at most at rate α; the
    measured rate is below α but not far below, so the check is not vacuous."""
    from lightning_privacy.analysis import canary_fdp as F

    over = 0
    for seed in range(2000):
        s, inc = _draw(seed, 400, 1.0)
        pos, neg = s[inc], s[~inc]
        ((_, k, tp, n_pos, n_neg),) = [r for r in F._rows(pos, neg) if r[0] == "in" and r[1] == 8]
        tpr_low, fpr_high = F._limits(tp, n_pos, k, n_neg, ALPHA / 2)
        over += F._mu_of(tpr_low, fpr_high) > 1.0
    assert 0.002 < over / 2000 <= ALPHA


@pytest.mark.parametrize("mu", [1.0, 2.0])
def test_gauss_is_exact_on_gaussian_canaries(mu):
    """Under its model the noncentral-t bound exceeds μ at the rate α (exact), within 3 SE."""
    over = sum(gauss_mu_lower(*_draw(seed, 1000, mu), alpha=ALPHA).mu_lower > mu for seed in range(REPS))
    assert over / REPS <= _max_violation_rate()
    assert over >= 1  # exact, not conservative: some of 200 runs land above μ


def test_gauss_overstates_on_a_non_gaussian_score_and_orderstat_does_not():
    """A bounded score of a 3-GDP pair, tanh(LLR/2) (the Fisher-discriminant optimum), shifts by 4.04 pooled sds:
    the Gaussian model reads μ̂ above the true μ (why "gauss" never decides a verdict); orderstat stays below."""
    mu = 3.0
    s, inc = _draw(0, 2000, mu)
    bounded = np.tanh((mu * s - mu * mu / 2) / 2)
    assert gauss_mu_lower(bounded, inc).mu_lower > mu
    assert orderstat_mu_lower(bounded, inc).mu_lower < mu


def test_gain_over_the_binomial_test():
    """On the same 2-GDP scores (m = 1000, δ = 1e-5, 20 seeds) orderstat reports ≥ 2× the binomial bound (median;
    measured 2.7×: 7.9 against 2.9, and 4.1 for the f-DP recursion; the true ε is 10.0)."""
    ratios, orderstat, binomial = [], [], []
    for seed in range(20):
        s, inc = _draw(seed, 1000, 2.0)
        b = canary_audit_from_scores(scores=s, included=inc, delta=1e-5).epsilon_lower
        o = orderstat_mu_lower(s, inc, delta=1e-5).epsilon_lower
        ratios.append(o / b)
        orderstat.append(o)
        binomial.append(b)
    assert np.median(ratios) >= 2.0
    assert np.median(orderstat) > np.median(binomial) + 3.0
    assert max(orderstat) < epsilon_from_mu(mu=2.0, delta=1e-5)


def test_tightest_names_the_test_and_corrects_for_the_choice():
    s, inc = _draw(3, 1000, 2.0)
    res = tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=("fdp", "orderstat_gaussian"))
    assert res.method == "orderstat_gaussian" and res.epsilon_lower == res.bounds["orderstat_gaussian"]
    assert not res.sound  # a Gaussian reading among the methods: valid only for μ-GDP runs
    assert res.alpha_per_method == pytest.approx(ALPHA / 2)
    assert res.epsilon_lower == orderstat_mu_lower(s, inc, alpha=ALPHA / 2, delta=1e-5).epsilon_lower
    assert res.epsilon_lower < orderstat_mu_lower(s, inc, alpha=ALPHA, delta=1e-5).epsilon_lower
    only = tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=("binomial",))
    assert only.method == "binomial" and only.sound
    assert only.epsilon_lower == canary_audit_from_scores(scores=s, included=inc, delta=1e-5).epsilon_lower
    default = tightest_canary_bound(scores=s, included=inc, delta=1e-5)  # the audit's headline for any canaries
    assert default.methods == ("fdp",) and default.method == "fdp" and default.sound
    fdp = canary_audit_from_scores(scores=s, included=inc, delta=1e-5, method="fdp")
    assert default.epsilon_lower == fdp.epsilon_lower


def test_tightest_is_sound():
    """binomial + gdp + orderstat's Gaussian reading at α/3 each on 1-GDP canaries (m = 200): ε̂ > ε(μ) in at most α
    of runs (the Gaussian readings hold for a μ-GDP run)."""
    true_eps = epsilon_from_mu(mu=1.0, delta=1e-5)
    over = 0
    for seed in range(100):
        s, inc = _draw(seed, 200, 1.0)
        methods = ("binomial", "gdp", "orderstat_gaussian")
        res = tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=methods)
        over += res.epsilon_lower > true_eps
    assert over / 100 <= ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / 100)


def test_tightest_with_fixed_shares_of_alpha():
    """``weights`` gives each test its share of α (Bonferroni): the bound is the one at that level, the levels are
    reported, the audit's shares for independent canaries put 0.9 of α on the f-DP test of the (ε, δ) curve and 0.1
    on the order statistics' (ε, δ) reading, and bad shares are refused by name."""
    s, inc = _draw(3, 1000, 1.0)
    methods = INDEPENDENT_METHODS
    res = tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=methods, weights=INDEPENDENT_WEIGHTS)
    assert methods == ("fdp", "orderstat") and INDEPENDENT_WEIGHTS == {"fdp": 0.9, "orderstat": 0.1}
    assert res.levels == pytest.approx({"fdp": 0.045, "orderstat": 0.005}) and res.sound
    assert res.method == "fdp" and res.alpha_per_method == pytest.approx(0.045)
    fdp = canary_audit_from_scores(scores=s, included=inc, delta=1e-5, alpha=0.045, method="fdp").epsilon_lower
    assert res.epsilon_lower == fdp
    assert res.bounds["orderstat"] == orderstat_epsilon_lower(s, inc, alpha=0.005, delta=1e-5).epsilon_lower
    equal = tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=methods)
    assert equal.levels == pytest.approx(dict.fromkeys(methods, ALPHA / 2))
    assert res.epsilon_lower > equal.epsilon_lower  # more of α on the test that wins
    for bad, match in (
        ({"fdp": 0.5}, "exactly the keys of `methods`"),
        ({"fdp": 0.8, "orderstat": 0.3}, "sum to at most 1"),
        ({"fdp": 0.0, "orderstat": 0.5}, r"`weights\['fdp'\]`"),
        ([0.5, 0.5], "a mapping"),
    ):
        with pytest.raises(ValueError, match=match):
            tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=methods, weights=bad)


def test_tightest_with_the_audit_s_shares_is_sound():
    """The headline of independent canaries, f-DP (ε, δ) test + order statistics' (ε, δ) reading at 0.9 / 0.1 of α,
    on 1-GDP canaries (m = 200): ε̂ > ε(μ) in at most α of runs (the shares are fixed before the scores)."""
    true_eps = epsilon_from_mu(mu=1.0, delta=1e-5)
    over = 0
    for seed in range(100):
        s, inc = _draw(seed, 200, 1.0)
        res = tightest_canary_bound(
            scores=s, included=inc, delta=1e-5, methods=INDEPENDENT_METHODS, weights=INDEPENDENT_WEIGHTS
        )
        over += res.epsilon_lower > true_eps
    assert over / 100 <= ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / 100)


def test_orderstat_rungs_and_limits():
    assert orderstat_rungs(0) == [] and orderstat_rungs(1) == [0] and orderstat_rungs(3) == [0]
    assert orderstat_rungs(100) == [0, 1, 2, 4, 8, 16, 32]
    s, inc = _draw(1, 300, 1.0)
    res = orderstat_mu_lower(s, inc, delta=1e-5)
    # the reported μ̂ is Φ⁻¹(TPR_low) − Φ⁻¹(FPR_high) of its rung, and the ε is the Gaussian profile's
    assert res.mu_lower == pytest.approx(float(special.ndtri(res.tpr_low) - special.ndtri(res.fpr_high)))
    assert res.epsilon_lower == pytest.approx(epsilon_from_mu(mu=res.mu_lower, delta=1e-5))
    assert res.tests == len(orderstat_rungs(res.num_excluded)) + len(orderstat_rungs(res.num_included))
    assert res.optimistic >= res.mu_lower
    # no signal: nothing rejected
    rng = np.random.default_rng(5)
    null_inc = rng.random(500) < 0.5
    assert orderstat_mu_lower(rng.normal(size=500), null_inc).mu_lower < 0.5


def test_orderstat_claim_test_rejects_a_false_claim_and_keeps_a_true_one():
    s, inc = _draw(0, 1000, 3.0)
    false_claim = orderstat_claim_test(s, inc, xi=lambda f: gdp_tpr_bound(f, mu=1.0), alpha=ALPHA)
    assert false_claim["contradicts"] and false_claim["statistic"] > false_claim["bound"]
    true_claim = orderstat_claim_test(s, inc, xi=lambda f: gdp_tpr_bound(f, mu=3.0), alpha=ALPHA)
    assert not true_claim["contradicts"]


@pytest.mark.parametrize(("alpha", "m"), [(0.05, 1000), (0.1, 300), (0.01, 64)])
def test_orderstat_claim_test_puts_each_limit_at_alpha_over_twice_the_rungs(alpha, m):
    """Bonferroni over the K rungs of both tails, each rung's two one-sided limits at α/(2K): the reported
    ``level_per_limit`` is that value and the reported limits are Clopper–Pearson's at it."""
    s, inc = _draw(3, m, 2.0)
    k = len(orderstat_rungs(int((~inc).sum()))) + len(orderstat_rungs(int(inc.sum())))
    test = orderstat_claim_test(s, inc, xi=lambda f: gdp_tpr_bound(f, mu=1.0), alpha=alpha)
    assert test["level"] == alpha and k >= 10
    assert test["level_per_limit"] == alpha / (2 * k)
    n_pos, n_neg = (inc.sum(), (~inc).sum()) if test["tail"] == "in" else ((~inc).sum(), inc.sum())
    level, tp, rung = test["level_per_limit"], test["positives"], test["rung"]
    assert test["tpr_low"] == pytest.approx(float(special.betaincinv(tp, n_pos - tp + 1, level)), rel=1e-12)
    assert test["fpr_high"] == pytest.approx(float(special.betaincinv(rung + 1, n_neg - rung, 1 - level)), rel=1e-12)


def test_orderstat_claim_test_never_contradicts_a_true_claim():
    """A true 1-GDP claim against 1-GDP canaries, 200 runs: contradicted in at most α (+ 3 SE) of them."""
    xi = symmetric_concave_xi(lambda f: gdp_tpr_bound(f, mu=1.0))
    false_alarms = sum(
        orderstat_claim_test(*_draw(seed, 1000, 1.0), xi=xi, alpha=ALPHA)["contradicts"] for seed in range(REPS)
    )
    assert false_alarms / REPS <= _max_violation_rate()


def test_check_canaries_with_independent_canaries():
    """The verdict with the orderstat test (α split three ways) catches a 2-GDP run claimed 1-GDP that the
    binomial and recursion tests miss; a true claim stays consistent."""
    claim = lambda f: gdp_tpr_bound(f, mu=1.0)  # noqa: E731
    eps = epsilon_from_mu(mu=1.0, delta=1e-5)
    s, inc = _draw(0, 1000, 2.0)
    old = check_canaries(s, inc, epsilon=eps, delta=1e-5, tpr_bound=claim)
    new = check_canaries(s, inc, epsilon=eps, delta=1e-5, tpr_bound=claim, independent=True)
    assert not old.contradicted
    assert new.contradicted and new.evidence["kind"] == "orderstat"
    assert "independent canaries" in new.sentence()
    assert [t["kind"] for t in new.tests] == ["binomial", "fdp", "orderstat"]
    assert all(t["level"] == pytest.approx(ALPHA / 3) for t in new.tests)
    true = check_canaries(*_draw(1, 1000, 1.0), epsilon=eps, delta=1e-5, tpr_bound=claim, independent=True)
    assert not true.contradicted
    with pytest.raises(ValueError, match="tpr_bound"):
        check_canaries(s, inc, epsilon=eps, delta=1e-5, independent=True)


def test_errors_name_the_argument():
    s, inc = _draw(0, 100, 1.0)
    with pytest.raises(ValueError, match="methods"):
        tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=())
    with pytest.raises(ValueError, match="methods"):
        tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=("binomial", "binomial"))
    with pytest.raises(ValueError, match="methods"):
        tightest_canary_bound(scores=s, included=inc, delta=1e-5, methods=("lira",))
    with pytest.raises(ValueError, match="delta"):
        tightest_canary_bound(scores=s, included=inc, delta=0.0, methods=("binomial", "orderstat_gaussian"))
    with pytest.raises(ValueError, match="alpha"):
        orderstat_mu_lower(s, inc, alpha=1.5)
    with pytest.raises(ValueError, match="at least 2 included"):
        gauss_mu_lower([0.0, 1.0, 2.0], [True, False, False])
    with pytest.raises(ValueError, match="vary"):
        gauss_mu_lower(np.ones(10), np.arange(10) % 2 == 0)
    assert tightest_canary_bound(scores=s, included=inc, delta=0.0, methods=("binomial",)).method == "binomial"
    assert tightest_canary_bound(scores=s, included=inc, delta=0.0, methods=("fdp", "orderstat")).sound  # (ε, 0)


def test_audit_canaries_reports_the_tightest_bound_and_names_the_test():
    from lightning_privacy import names
    from lightning_privacy.audits.canary import audit_canaries

    s, inc = _draw(0, 1000, 2.0)
    plain = audit_canaries(s, inc, delta=1e-5)
    assert names.CANARY_EPSILON_LOWER_ORDERSTAT not in plain.values and not plain.score_bounds
    assert plain.tightest.methods == ("fdp",) and plain.tightest.sound
    assert plain.values[names.CANARY_EPSILON_LOWER_TIGHTEST] == plain.tightest.epsilon_lower
    assert plain.values[names.CANARY_EPSILON_LOWER_TIGHTEST] == plain.values[names.CANARY_EPSILON_LOWER_FDP]
    res = audit_canaries(s, inc, delta=1e-5, independent=True, claim=(1.0, 1e-5))  # a false (ε, δ) claim
    v = res.metrics()
    assert v[names.CANARY_EPSILON_LOWER_ORDERSTAT] == orderstat_epsilon_lower(s, inc, delta=1e-5).epsilon_lower
    reading = orderstat_mu_lower(s, inc, delta=1e-5).epsilon_lower
    assert v[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING] == reading > 2 * v[names.CANARY_EPSILON_LOWER]
    assert v[names.CANARY_EPSILON_GAUSS] == gauss_mu_lower(s, inc, delta=1e-5).epsilon_lower
    assert res.tightest.method == "fdp" and res.tightest.sound
    assert v[names.CANARY_EPSILON_LOWER_TIGHTEST] == res.tightest.epsilon_lower < reading  # the reading: not headline
    assert res.tightest.levels == pytest.approx({"fdp": 0.045, "orderstat": 0.005})
    assert plain.tightest.levels == pytest.approx({"fdp": 0.05})  # interacting canaries: the f-DP test alone
    assert "from the fdp test, the largest of the tests valid for every (ε, δ)-DP mechanism" in res.summary()
    assert "(α = 0.05 split before the run: fdp at 0.045, orderstat at 0.005)" in res.summary()
    # the console shows the first line only: it leads with the sound headline, then the readings under their names
    first = res.summary().splitlines()[0]
    assert first.startswith(
        f"Canary audit (scores, m = 1000): ε ≥ {res.tightest.epsilon_lower:.3f} (sound for any (ε, δ)-DP mechanism: "
        "fdp test); accountant ε n/a (no DP-SGD). Gaussian readings, if the mechanism is μ-GDP: f-DP "
        f"{v[names.CANARY_EPSILON_GDP_GAUSSIAN_READING]:.3f}, order statistics {reading:.3f}"
    )
    assert [t["kind"] for t in res.claim_verdict.tests] == ["binomial", "fdp", "orderstat"]
    assert res.verdict == "contradicted" and res.claim_verdict.tests[2]["contradicts"]
    d = res.to_dict()
    assert d["tightest"]["method"] == "fdp" and set(d["score_bounds"]) == {"orderstat", "orderstat_gaussian", "gauss"}
    rows = [r[0] for r in res.report_section().rows]
    assert rows.index(f"`{names.CANARY_EPSILON_LOWER_TIGHTEST}`") < rows.index(f"`{names.CANARY_EPSILON_LOWER}`")
    assert f"`{names.CANARY_EPSILON_LOWER_ORDERSTAT}`" in rows
    assert rows.index(f"`{names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING}`") > rows.index(
        f"`{names.CANARY_EPSILON_LOWER_ORDERSTAT}`"
    )


def test_orderstat_ceiling():
    """Every included score above every excluded one (n₊ = n₋ = 500): μ̂ = 2·Φ⁻¹((α/2K)^{1/500}) = 4.448 (K = 18),
    ε = 28.16 at δ = 1e-5, the guide's ceiling (the binomial bound tops out at 4.79 there, Bonferroni over 27)."""
    inc = np.r_[np.ones(500, bool), np.zeros(500, bool)]
    res = orderstat_mu_lower(inc * 10.0 + np.arange(1000) * 1e-3, inc, delta=1e-5)
    x = (ALPHA / 18 / 2) ** (1 / 500)
    assert res.tests == 18 and res.mu_lower == pytest.approx(float(special.ndtri(x) - special.ndtri(1 - x)))
    assert res.mu_lower == pytest.approx(4.448, abs=1e-3) and res.epsilon_lower == pytest.approx(28.16, abs=0.01)


def test_on_a_dp_sgd_run_the_readings_beat_the_binomial_bound_and_nothing_passes_the_accountant():
    """A real fit (tiny MLP, p = 0.1, 100 steps, σ = 0.7: accountant ε = 14.6 at δ = 1e-5, 1000 gradient canaries,
    likelihood-ratio score): the order statistics' Gaussian reading is measured 2.9× the binomial bound (medians of 3
    seeds: 7.12 against 2.44; guide), the sound headline is at least the binomial bound, and no bound passes the
    accountant's ε."""
    from lightning_privacy import DPSGD, CanaryAudit, names
    from tests.callbacks.test_canary_audit import _fit

    dpsgd = DPSGD(noise_multiplier=0.7, noise_seed=0)
    audit = CanaryAudit(num_canaries=1000, seed=1, score="likelihood_ratio")
    _fit([dpsgd, audit], epochs=10, seed=0)
    v, eps = audit.result.values, dpsgd.epsilon()
    assert v[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING] > 1.5 * v[names.CANARY_EPSILON_LOWER]
    assert audit.result.tightest.sound and audit.result.tightest.methods == ("fdp", "orderstat")
    assert v[names.CANARY_EPSILON_LOWER_TIGHTEST] >= v[names.CANARY_EPSILON_LOWER] * 0.95
    readings = (names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING, names.CANARY_EPSILON_GDP_GAUSSIAN_READING)
    assert max(v[names.CANARY_EPSILON_LOWER_TIGHTEST], *(v[k] for k in readings)) < eps
    assert audit.result.verdict == "consistent"


def test_on_a_dp_sgd_run_the_orderstat_test_catches_half_the_claimed_noise():
    """Noise σ = 0.5 while σ = 1 is claimed (p = 0.1, 100 steps, 1000 gradient canaries, default score): the verdict
    with the order-statistic test is "contradicted" (measured 4 of 4 seeds) where the f-DP test alone at all of α
    is not (0 of 4); the true claim stays consistent (0 of 4, both ways)."""
    from lightning_privacy import DPSGD, CanaryAudit
    from tests.callbacks.test_canary_audit import _fit

    audit = CanaryAudit(num_canaries=1000, seed=1, claim=(1.0, 0.1, 100))
    _fit([DPSGD(noise_multiplier=0.5, noise_seed=0), audit], epochs=10, seed=0)
    assert audit.result.verdict == "contradicted" and audit.result.evidence["kind"] == "orderstat"
    fdp_only = audit.result.claim.check_canaries(audit.scores, audit.included, tests="fdp")
    assert not fdp_only.contradicted


def test_orderstat_epsilon_reading_is_the_epsilon_delta_curve_at_its_rung():
    """The order statistics read through the (ε, δ) curve: the reported ε is the least one whose curve allows the
    rung's TPR lower limit at its FPR upper limit (the curve meets the point there), and for Gaussian canaries it
    stays below the Gaussian reading of the same scores (which assumes the Gaussian curve)."""
    s, inc = _draw(1, 1000, 2.0)
    res = orderstat_epsilon_lower(s, inc, delta=1e-5)
    eps, tpr, fpr = res.epsilon_lower, res.tpr_low, res.fpr_high
    assert eps > 0 and res.method == "orderstat" and "any (ε, δ)-DP mechanism" in res.assumption
    allowed = min(1e-5 + math.exp(eps) * fpr, 1 - math.exp(-eps) * (1 - 1e-5 - fpr))
    assert allowed == pytest.approx(tpr, rel=1e-9)
    assert eps < orderstat_mu_lower(s, inc, delta=1e-5).epsilon_lower
    assert res.alpha_per_test == ALPHA / res.tests and res.optimistic >= eps
    assert orderstat_epsilon_lower(s, inc, delta=0.0).epsilon_lower >= eps  # δ only lowers what a rung refutes


def test_the_fdp_test_of_the_epsilon_delta_curve():
    """ξ⁻¹ inverts ξ of the (ε, δ) curve; the f-DP test's ceiling at a Bonferroni share is far above the binomial
    test's (whose 2mδ term caps it), the module docstring's numbers; both bound the same (r, v) on the safe side of
    the exact δ = 0 value."""
    from lightning_privacy.analysis.canary import epsilon_delta_inverse, epsilon_one_run, max_epsilon_lower

    inverse = epsilon_delta_inverse(1.5, 1e-3)
    for y in np.linspace(0.01, 0.99, 25):
        x = inverse(float(y))
        xi = min(1.0, 1e-3 + math.exp(1.5) * x, 1 - math.exp(-1.5) * (1 - 1e-3 - x))
        assert xi == pytest.approx(y, abs=1e-12) or (x == 0.0 and y <= 1e-3)
    share = 0.0025 / 27
    assert max_epsilon_lower(num_canaries=1000, alpha=share, delta=1e-5, method="fdp") == pytest.approx(4.662, abs=1e-3)
    assert max_epsilon_lower(num_canaries=1000, alpha=share, delta=1e-5) == pytest.approx(1.472, abs=1e-3)
    fdp = epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=95, delta=0.0, method="fdp")
    binomial = epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=95, delta=0.0)
    assert 0 < binomial and 0 < fdp < 10

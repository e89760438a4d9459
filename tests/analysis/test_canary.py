"""One-run canary audit (Steinke et al. 2023; Mahloujifar et al. 2025): independent references written from
the theorems (exact binomial sums, a convex program for the f-DP test), edge cases, monotonicity, the
ceiling, the (k₊, k₋) selection and its corrections, and validity on simulated mechanisms of known ε."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from lightning_privacy.analysis import canary as C
from lightning_privacy.analysis.canary import (
    CanaryAuditResult,
    canary_audit_from_scores,
    check_inclusion,
    epsilon_from_mu,
    epsilon_one_run,
    guess_grid,
    max_epsilon_lower,
    mu_one_run,
)

# ----------------------------------------------------------------- reference for Theorem 3.1 (binomial)


def _ref_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p(ε) of Theorem 3.1 from exact binomial sums (math.comb; no scipy)."""
    q = 1.0 / (1.0 + math.exp(-eps))
    qbar = math.exp(-eps) / (1.0 + math.exp(-eps))
    pmf = [math.comb(r, j) * q**j * qbar ** (r - j) for j in range(r + 1)]
    tail = math.fsum(pmf[v:])
    if delta == 0 or v == 0:
        return tail
    best, window = 0.0, 0.0
    for i in range(1, v + 1):  # window = P[v − i ≤ B ≤ v − 1]
        window += pmf[v - i]
        best = max(best, window / i)
    return tail + 2 * m * delta * best


_REF_GRID = [0.04 * k for k in range(301)]  # ε ∈ [0, 12]


def _ref_bound(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """Largest ε with p(ε) ≤ α: scan a grid (checking that the rejected ε form a prefix), then bisect."""
    rejected = [_ref_p_value(m, r, v, e, delta) <= alpha for e in _REF_GRID]
    assert not rejected[-1], "grid too short"
    n = rejected.index(False)
    assert not any(rejected[n:]), "rejected ε are not an interval starting at 0"
    if n == 0:
        return 0.0
    lo, hi = _REF_GRID[n - 1], _REF_GRID[n]
    for _ in range(45):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _ref_p_value(m, r, v, mid, delta) <= alpha else (lo, mid)
    return lo


HELD_OUT = [
    # (m, r, v, delta, alpha)
    (10, 0, 0, 0.0, 0.05),  # r = 0
    (10, 6, 0, 1e-5, 0.05),  # v = 0
    (1, 1, 1, 0.0, 0.05),  # one canary can never reject at 5%
    (1, 1, 1, 0.0, 0.6),
    (5, 5, 5, 0.0, 0.05),  # v = r, δ = 0
    (10, 10, 10, 1e-3, 0.05),  # v = r, δ > 0
    (100, 50, 50, 0.0, 0.05),
    (100, 50, 45, 1e-5, 0.05),
    (100, 100, 80, 1e-5, 0.05),
    (100, 100, 50, 0.0, 0.05),  # chance level
    (1000, 100, 95, 1e-5, 0.05),
    (1000, 100, 95, 1e-3, 0.05),
    (1000, 60, 60, 1e-6, 0.01),
    (50, 40, 30, 1e-2, 0.2),
    (200, 120, 100, 0.0, 1e-4),
    (200, 120, 120, 1e-4, 0.05),
    (100_000, 50, 50, 1e-7, 0.05),
    (20, 20, 20, 0.05, 0.05),  # 2mδ = 2: nothing survives
]


@pytest.mark.parametrize(("m", "r", "v", "delta", "alpha"), HELD_OUT)
def test_binomial_equals_independent_reference(m, r, v, delta, alpha):
    got = epsilon_one_run(num_canaries=m, num_guesses=r, num_correct=v, delta=delta, alpha=alpha)
    assert got == pytest.approx(_ref_bound(m, r, v, delta, alpha), abs=1e-6)
    if got > 0:  # rounded toward the safe side: the returned ε is itself rejected
        assert _ref_p_value(m, r, v, got, delta) <= alpha * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 300),
    r_frac=st.floats(0.0, 1.0),
    v_frac=st.floats(0.0, 1.0),
    delta=st.sampled_from([0.0, 1e-7, 1e-5, 1e-3]) | st.floats(0.0, 0.01),
    alpha=st.floats(1e-3, 0.5),
)
def test_binomial_equals_independent_reference_property(m, r_frac, v_frac, delta, alpha):
    r = min(round(r_frac * m), 80)
    v = round(v_frac * r)
    got = epsilon_one_run(num_canaries=m, num_guesses=r, num_correct=v, delta=delta, alpha=alpha)
    assert got == pytest.approx(_ref_bound(m, r, v, delta, alpha), abs=1e-6)


def test_edge_cases_exact():
    assert epsilon_one_run(num_canaries=0, num_guesses=0, num_correct=0, delta=0.0) == 0.0
    assert epsilon_one_run(num_canaries=10, num_guesses=0, num_correct=0, delta=1e-5) == 0.0
    assert epsilon_one_run(num_canaries=10, num_guesses=7, num_correct=0, delta=0.0) == 0.0
    for method in ("binomial", "gdp"):
        assert epsilon_one_run(num_canaries=10, num_guesses=0, num_correct=0, delta=1e-5, method=method) == 0.0
        assert epsilon_one_run(num_canaries=500, num_guesses=300, num_correct=0, delta=1e-5, method=method) == 0.0
    # v = r with δ = 0: q^r = α exactly
    for r in (1, 7, 100, 1000):
        q = 0.3 ** (1 / r)
        got = epsilon_one_run(num_canaries=1000, num_guesses=r, num_correct=r, delta=0.0, alpha=0.3)
        assert got == pytest.approx(max(0.0, math.log(q / (1 - q))), abs=1e-9)


def test_delta_zero_is_the_clopper_pearson_logit():
    # δ = 0: the largest ε with P[Binomial(r, q) ≥ v] ≤ α is the logit of the one-sided CP lower limit
    for r, v, alpha in [(100, 80, 0.05), (1000, 700, 0.01), (37, 30, 0.2), (5000, 4990, 0.05)]:
        lower = special.betaincinv(v, r - v + 1, alpha)
        got = epsilon_one_run(num_canaries=r, num_guesses=r, num_correct=v, delta=0.0, alpha=alpha)
        assert got == pytest.approx(math.log(lower / (1 - lower)), rel=1e-9)


# ------------------------------------------------------------------ reference for the f-DP (Gaussian) test


def _xi(x, mu):
    return special.ndtr(special.ndtri(np.clip(x, 0.0, 1.0)) + mu)


def _min_mass(m: int, k: int, c: int, tau: float, mu: float) -> float:
    """Least Σ_l p_l over distributions of the number correct C ∈ {0..k} with P[C ≥ c] ≥ τ and, for
    i = 1..k, Σ_{l≥i} l·p_l/m ≤ ξ(Σ_{l≥i−1} (k − l)·p_l/m), the per-canary f_μ-DP inequalities averaged
    by Jensen (module docstring). A convex program (ξ is concave), solved with SLSQP from several starts."""
    levels = np.arange(k + 1)
    cons = [{"type": "ineq", "fun": lambda p: np.sum(p[c:]) - tau}]
    for i in range(1, k + 1):
        cons.append(
            {
                "type": "ineq",
                "fun": lambda p, i=i: (
                    _xi(np.sum((k - levels[i - 1 :]) * p[i - 1 :]) / m, mu) - np.sum(levels[i:] * p[i:]) / m
                ),
            }
        )
    rng = np.random.default_rng(0)
    best = np.inf
    for _ in range(4):
        res = optimize.minimize(
            lambda p: p.sum(),
            rng.dirichlet(np.ones(k + 1)) * 3,
            constraints=cons,
            bounds=[(0, None)] * (k + 1),
            method="SLSQP",
            options={"maxiter": 1000, "ftol": 1e-12},
        )
        if res.success and all(cn["fun"](res.x) > -1e-8 for cn in cons):
            best = min(best, res.x.sum())
    return best


@pytest.mark.parametrize(
    ("m", "k", "c", "tau", "mu"),
    [(6, 6, 4, 0.05, 1.26), (7, 4, 3, 0.2, 0.05), (9, 7, 7, 0.05, 0.7), (22, 9, 8, 0.2, 0.45), (8, 3, 3, 0.5, 2.37)],
)
def test_gdp_recursion_is_the_least_mass_of_the_convex_program(m, k, c, tau, mu):
    greedy = C._gdp_excess(m, k, c, tau, mu) + k / m  # (r_0 + h_0), or the partial sum once it exceeds k/m
    exact = _min_mass(m, k, c, tau, mu) * k / m
    if greedy > k / m:  # early exit: only the verdict "needs more than all the mass" is computed
        assert exact > k / m - 1e-9
    else:
        assert greedy == pytest.approx(exact, abs=1e-7)


@pytest.mark.parametrize(("m", "r", "v"), [(8, 8, 8), (12, 9, 9)])
def test_mu_one_run_is_the_boundary_of_feasibility(m, r, v):
    # just below μ̂ no distribution of C with P[C ≥ v] ≥ α fits in total mass 1; just above one does
    mu = mu_one_run(num_canaries=m, num_guesses=r, num_correct=v, alpha=0.2)
    assert mu > 0
    assert _min_mass(m, r, v, 0.2, mu - 0.02) > 1 + 1e-6
    assert _min_mass(m, r, v, 0.2, mu + 0.02) < 1 - 1e-6


def _ref_gdp_delta(eps: float, mu: float) -> float:
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))
    return phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)


def _ref_gdp_epsilon(mu: float, delta: float) -> float:
    lo, hi = 0.0, 100.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _ref_gdp_delta(mid, mu) > delta else (lo, mid)
    return lo


@pytest.mark.parametrize(("mu", "delta"), [(0.3, 1e-5), (1.0, 1e-5), (2.0, 1e-6), (4.0, 1e-3), (1.0, 0.3)])
def test_epsilon_from_mu_inverts_the_gaussian_profile(mu, delta):
    got = epsilon_from_mu(mu=mu, delta=delta)
    assert got == pytest.approx(_ref_gdp_epsilon(mu, delta), abs=1e-8)
    assert _ref_gdp_delta(got, mu) >= delta * (1 - 1e-9)  # rounded down: δ at the returned ε ≥ the target


def test_epsilon_from_mu_round_trips_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    for eps, delta in [(0.5, 1e-5), (2.0, 1e-5), (8.0, 1e-6)]:
        mu = 1.0 / dp_accounting.get_sigma_gaussian(eps, delta)
        assert epsilon_from_mu(mu=mu, delta=delta) == pytest.approx(eps, rel=1e-3)


def test_epsilon_from_mu_limits():
    assert epsilon_from_mu(mu=0.0, delta=1e-5) == 0.0
    assert epsilon_from_mu(mu=1.0, delta=0.0) == math.inf
    assert epsilon_from_mu(mu=1.0, delta=0.39) == 0.0  # δ ≥ 2Φ(1/2) − 1 = 0.383: the whole curve
    with pytest.raises(ValueError, match="`mu`"):
        epsilon_from_mu(mu=-1.0, delta=1e-5)


def test_gdp_is_tighter_than_binomial_on_confident_guesses():
    args = dict(num_canaries=1000, num_guesses=200, num_correct=195, delta=1e-5)
    assert epsilon_one_run(**args, method="gdp") > epsilon_one_run(**args, method="binomial") > 0


# ---------------------------------------------------------------------------------------------- monotonicity


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 2000),
    r_frac=st.floats(0.0, 1.0),
    v_frac=st.floats(0.0, 1.0),
    delta=st.floats(0.0, 1e-3),
    alpha=st.floats(1e-4, 0.5),
    method=st.sampled_from(["binomial", "gdp"]),
)
def test_bound_rises_with_correct_guesses_and_alpha_and_falls_with_delta(m, r_frac, v_frac, delta, alpha, method):
    r = round(r_frac * m)
    v = round(v_frac * r)
    delta = max(delta, 1e-12) if method == "gdp" else delta
    f = lambda **kw: epsilon_one_run(**{**dict(num_canaries=m, num_guesses=r, num_correct=v, delta=delta), **kw})
    base = f(alpha=alpha, method=method)
    if v < r:
        assert f(num_correct=v + 1, alpha=alpha, method=method) >= base - 1e-9
    assert f(alpha=alpha / 2, method=method) <= base + 1e-9
    assert f(delta=delta * 4 + 1e-9, alpha=alpha, method=method) <= base + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 500),
    r_frac=st.floats(0.0, 1.0),
    v_frac=st.floats(0.0, 1.0),
    alpha=st.floats(1e-3, 0.5),
    mus=st.tuples(st.floats(0.0, 6.0), st.floats(0.0, 6.0)),
)
def test_gdp_rejection_is_monotone_in_mu(m, r_frac, v_frac, alpha, mus):
    r = max(1, round(r_frac * m))
    v = max(1, round(v_frac * r))
    lo, hi = sorted(mus)
    if C._gdp_excess(m, r, v, alpha, hi) > 0:  # rejecting a weaker claim rejects every stronger one
        assert C._gdp_excess(m, r, v, alpha, lo) > 0


# --------------------------------------------------------------------------------------------------- ceiling


def test_max_epsilon_lower_for_1000_canaries():
    got = max_epsilon_lower(num_canaries=1000, alpha=0.05)
    q = 0.05 ** (1 / 1000)
    assert got == pytest.approx(math.log(q / (1 - q)), abs=1e-9)
    assert got == pytest.approx(5.809, abs=1e-3)  # the working spec's "about 5.8"
    assert max_epsilon_lower(num_canaries=1000, alpha=0.05, delta=1e-5) == pytest.approx(5.782, abs=1e-3)
    assert max_epsilon_lower(num_canaries=1000, alpha=0.05 / 27, delta=1e-5) == pytest.approx(4.794, abs=1e-3)
    assert max_epsilon_lower(num_canaries=0, alpha=0.05) == 0.0


@pytest.mark.parametrize("method", ["binomial", "gdp"])
@pytest.mark.parametrize(("m", "delta"), [(8, 1e-5), (25, 1e-5), (25, 1e-2), (40, 1e-3)])
def test_all_correct_is_the_best_outcome(method, m, delta):
    every = [
        epsilon_one_run(num_canaries=m, num_guesses=r, num_correct=v, delta=delta, alpha=0.2, method=method)
        for r in range(1, m + 1)
        for v in range(r + 1)
    ]
    assert max(every) == pytest.approx(max_epsilon_lower(num_canaries=m, alpha=0.2, delta=delta, method=method))


# ------------------------------------------------------------------------------------------------ from scores


def _gaussian_canaries(seed: int, m: int, mu: float):
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    return rng.normal(size=m) + mu * included, included


def _counts(scores, included, k_plus, k_minus):
    order = np.argsort(scores)  # continuous scores: no ties
    return k_plus + k_minus, int(included[order[len(scores) - k_plus :]].sum() + (~included[order[:k_minus]]).sum())


@pytest.mark.parametrize("method", ["binomial", "gdp"])
@pytest.mark.parametrize("mu", [0.0, 1.0, 3.0])
def test_bonferroni_and_optimistic_equal_the_unpruned_maximum(method, mu):
    scores, included = _gaussian_canaries(3, 400, mu)
    grid = guess_grid(400)
    counts = [_counts(scores, included, kp, km) for kp, km in grid]

    def best(alpha):
        return max(
            epsilon_one_run(num_canaries=400, num_guesses=r, num_correct=v, delta=1e-5, alpha=alpha, method=method)
            for r, v in counts
        )

    res = canary_audit_from_scores(scores=scores, included=included, delta=1e-5, method=method)
    assert res.grid_size == len(grid) == 24
    assert res.alpha_per_test == pytest.approx(0.05 / 24)
    assert res.epsilon_lower == pytest.approx(best(0.05 / 24), abs=1e-9)
    assert res.optimistic == pytest.approx(best(0.05), abs=1e-9)
    assert res.optimistic >= res.epsilon_lower
    assert (res.num_guesses, res.num_correct) == _counts(scores, included, res.k_plus, res.k_minus)
    if res.epsilon_lower > 0:  # the reported pair attains the bound
        again = epsilon_one_run(
            num_canaries=400,
            num_guesses=res.num_guesses,
            num_correct=res.num_correct,
            delta=1e-5,
            alpha=res.alpha_per_test,
            method=method,
        )
        assert again == pytest.approx(res.epsilon_lower)
    none = canary_audit_from_scores(scores=scores, included=included, delta=1e-5, method=method, correction="none")
    assert none.epsilon_lower == none.optimistic == res.optimistic


def test_split_bounds_the_held_out_half_only():
    scores, included = _gaussian_canaries(1, 1001, 3.0)
    res = canary_audit_from_scores(scores=scores, included=included, delta=1e-5, correction="split", seed=7)
    assert res.num_canaries == 1001 and res.num_canaries_tested == 501
    assert res.alpha_per_test == 0.05 and res.k_plus + res.k_minus == res.num_guesses <= 501
    again = epsilon_one_run(
        num_canaries=501, num_guesses=res.num_guesses, num_correct=res.num_correct, delta=1e-5, alpha=0.05
    )
    assert res.epsilon_lower == pytest.approx(again) and res.epsilon_lower > 2.0
    held_out = np.random.default_rng(7).permutation(1001)[500:]
    assert (res.num_guesses, res.num_correct) == _counts(scores[held_out], included[held_out], res.k_plus, res.k_minus)


def test_guess_grid_depends_on_m_only():
    assert guess_grid(0) == []
    assert guess_grid(1) == [(1, 0), (0, 1)]
    assert guess_grid(3) == [(1, 0), (0, 1), (1, 1)]
    for m in (2, 10, 999, 1000, 4096):
        grid = guess_grid(m)
        assert len(grid) == 3 * int(math.log2(m)) and len(set(grid)) == len(grid)
        assert all(kp + km <= m and kp + km > 0 for kp, km in grid)


def test_ties_never_follow_the_input_order():
    # every score equal and the included canaries first: a stable index sort would guess them all right
    included = np.r_[np.ones(100, bool), np.zeros(100, bool)]
    for seed in range(5):
        res = canary_audit_from_scores(scores=np.zeros(200), included=included, delta=1e-5, seed=seed)
        assert res.epsilon_lower == 0.0
        assert res.optimistic < 1.0  # the stable sort would give the ceiling, ≈ 3.3


def test_result_is_deterministic_and_plain():
    scores, included = _gaussian_canaries(0, 300, 2.0)
    a = canary_audit_from_scores(scores=scores, included=included.astype(int), delta=1e-5, correction="split")
    b = canary_audit_from_scores(scores=list(scores), included=list(included), delta=1e-5, correction="split")
    assert a == b and isinstance(a, CanaryAuditResult)
    d = a.to_dict()
    assert set(d) >= {"epsilon_lower", "optimistic", "num_guesses", "num_correct", "k_plus", "k_minus", "alpha"}
    assert all(type(x) in (float, int, str) for x in d.values())
    with pytest.raises(AttributeError):
        a.epsilon_lower = 1.0  # frozen


def test_empty_and_single_canary():
    res = canary_audit_from_scores(scores=[], included=[], delta=1e-5)
    assert (res.epsilon_lower, res.optimistic, res.grid_size, res.num_guesses) == (0.0, 0.0, 0, 0)
    res = canary_audit_from_scores(scores=[1.0], included=[True], delta=0.0, correction="split")
    assert res.epsilon_lower == 0.0


# -------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_canaries=-1, num_guesses=0, num_correct=0), ValueError, "`num_canaries`.*non-negative"),
        (dict(num_canaries=10, num_guesses=2.5, num_correct=0), TypeError, "`num_guesses`.*integer.*2.5"),
        (dict(num_canaries=10, num_guesses=True, num_correct=0), TypeError, "`num_guesses`"),
        (dict(num_canaries=10, num_guesses=11, num_correct=0), ValueError, "`num_guesses` <= `num_canaries` = 10"),
        (dict(num_canaries=10, num_guesses=5, num_correct=6), ValueError, "`num_correct` <= `num_guesses` = 5"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, alpha=0.0), ValueError, r"`alpha`.*\(0, 1\).*0.0"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, alpha=1.5), ValueError, r"`alpha`.*\(0, 1\)"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, alpha="0.05"), TypeError, "`alpha`.*real"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, delta=1.0), ValueError, r"`delta`.*\[0, 1\).*1.0"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, delta=-1e-5), ValueError, r"`delta`.*\[0, 1\)"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, delta=None), TypeError, "`delta`.*real"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, method="exact"), ValueError, "`method`.*'exact'"),
        (dict(num_canaries=10, num_guesses=5, num_correct=5, delta=0.0, method="gdp"), ValueError, "delta.*> 0"),
    ],
)
def test_epsilon_one_run_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        epsilon_one_run(**{"delta": 1e-5, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(scores=[0.1, 0.2], included=[True]), ValueError, "same number of elements.*2 and 1"),
        (dict(scores=[0.1, float("nan")], included=[True, False]), ValueError, "`scores`.*NaN"),
        (dict(scores=[0.1, 0.2], included=[1, 2]), ValueError, "`included`.*0/1"),
        (dict(scores=[0.1, 0.2], included=[1, 0], correction="holdout"), ValueError, "`correction`.*'holdout'"),
        (dict(scores=[0.1, 0.2], included=[1, 0], method="gdp", delta=0.0), ValueError, "delta.*> 0"),
        (dict(scores=[0.1, 0.2], included=[1, 0], seed=1.5), TypeError, "`seed`.*integer"),
        (dict(scores=[0.1, 0.2], included=[1, 0], alpha=2.0), ValueError, "`alpha`"),
    ],
)
def test_canary_audit_from_scores_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        canary_audit_from_scores(**{"delta": 1e-5, **kwargs})


# ---------------------------------------------------------------------------------------------------- validity

ALPHA = 0.05


def _slack(n: int) -> float:
    """Largest exceedance rate compatible with a true rate ≤ α: α + 3 binomial standard errors."""
    return ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_validity_randomized_response(epsilon, delta):
    # ε-DP randomized response, all m guesses: the setting where Theorem 3.1 is tight, so the
    # exceedance rate sits just below α rather than at 0.
    m, runs = 1000, 400
    rng = np.random.default_rng(11)
    bounds = []
    for _ in range(runs):
        s = rng.random(m) < 0.5
        keep = rng.random(m) < math.exp(epsilon) / (1 + math.exp(epsilon))
        released = np.where(keep, s, ~s)
        v = int(np.sum(released == s))  # guess "in" where the released bit says so
        bounds.append(epsilon_one_run(num_canaries=m, num_guesses=m, num_correct=v, delta=delta))
    bounds = np.array(bounds)
    rate = np.mean(bounds > epsilon)
    assert rate <= _slack(runs)
    assert 0.01 <= rate  # not vacuous: the bound does exceed the true ε at about rate α
    assert np.median(bounds) > 0.75 * epsilon  # and close to it: the bound is tight for randomized response


def _validity_rates(mu: float, m: int, runs: int, seed0: int) -> dict:
    true_eps = _ref_gdp_epsilon(mu, 1e-5) if mu > 0 else 0.0
    rates = {}
    for method in ("binomial", "gdp"):
        for correction in ("bonferroni", "split"):
            over, optimistic_over = 0, 0
            for seed in range(runs):
                scores, included = _gaussian_canaries(seed0 + seed, m, mu)
                res = canary_audit_from_scores(
                    scores=scores, included=included, delta=1e-5, method=method, correction=correction, seed=seed
                )
                over += res.epsilon_lower > true_eps
                optimistic_over += res.optimistic > true_eps
            rates[method, correction] = over / runs
            rates[method, "none"] = optimistic_over / runs
    return rates


@pytest.mark.parametrize("mu", [0.0, 1.0, 2.0])
def test_validity_gaussian_mechanism(mu):
    # canary scores N(μ, 1) if included, N(0, 1) if not: exactly μ-GDP per canary, so ε(δ) is known.
    # μ = 0 is the sharp case: any positive bound is false.
    runs = 200
    rates = _validity_rates(mu, m=200, runs=runs, seed0=10_000)
    for key, rate in rates.items():
        if key[1] != "none":
            assert rate <= _slack(runs), (key, rate)
    if mu == 0.0:  # the uncorrected best over 24 tests is not a level-α bound
        assert rates["binomial", "none"] > ALPHA and rates["gdp", "none"] > ALPHA


@pytest.mark.slow
def test_validity_gaussian_mechanism_long():
    runs = 500
    for mu in (0.0, 2.0):
        rates = _validity_rates(mu, m=1000, runs=runs, seed0=20_000)
        for key, rate in rates.items():
            if key[1] != "none":
                assert rate <= _slack(runs), (mu, key, rate)


def test_imports_without_torch():
    code = (
        "import sys, lightning_privacy.analysis.canary\n"
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------- the inclusion draw checked


def test_an_honest_inclusion_draw_is_never_refused_and_a_hand_picked_one_is():
    """check_inclusion: exact two-sided binomial test of the count at 1e-6 (issue 37, item 7)."""
    rng = np.random.default_rng(0)
    for m in (1, 7, 20, 100, 1000, 100_000):
        for _ in range(20):
            check_inclusion(rng.random(m) < 0.5)  # an honest draw passes (refused with probability ≤ 1e-6)
    check_inclusion(np.ones(20, bool))  # too few canaries to tell: p = 2·2⁻²⁰ ≥ 1e-6
    check_inclusion(np.r_[np.ones(550, bool), np.zeros(450, bool)])  # p = 0.0017: plausible at 1e-6
    for included in (np.ones(21, bool), np.zeros(1000, bool), np.r_[np.ones(600, bool), np.zeros(400, bool)]):
        k, m = int(included.sum()), included.size
        with pytest.raises(ValueError, match=rf"`included`.*Bernoulli\(1/2\).*{k} of {m} canaries.*default_rng"):
            check_inclusion(included)
    with pytest.raises(ValueError, match=r"`included`.*1000 of 1000"):  # the audit refuses it too
        canary_audit_from_scores(scores=np.arange(1000.0), included=np.ones(1000, int), delta=1e-5)
    with pytest.raises(ValueError, match="`level`"):
        check_inclusion([True, False], level=0.0)
    assert check_inclusion([]).size == 0

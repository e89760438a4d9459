"""One-run canary audit: an ε lower bound from m canaries, each inserted with probability 1/2 (numpy/scipy only).

**The game** (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
Section 2). Each of m canaries is included in the training run independently with probability 1/2
(S_j ∈ {−1, +1}). After training the auditor scores every canary (higher = more likely included),
guesses "in" for the k₊ highest scores and "out" for the k₋ lowest and abstains on the rest: r = k₊ + k₋
guesses, v of them correct. If the run is (ε, δ)-DP with respect to each canary, few correct guesses
are likely; many are evidence against the claim.

**method="binomial"** (Steinke et al., Theorem 3.1). With B ~ Binomial(r, q), q = e^ε / (1 + e^ε),

    P[V ≥ v] ≤ p(ε) = P[B ≥ v] + 2·m·δ · max_{1 ≤ i ≤ v} (P[B ≥ v − i] − P[B ≥ v]) / i,

so p(ε) ≤ α rejects "(ε, δ)-DP" at level α. The bound is the largest ε with p(ε) ≤ α, and 0 when even
ε = 0 is not rejected. The paper is not among the project's seed texts; this statement is the working
spec's, and it matches the p-value code the authors published with the paper (``p_value_DP_audit``,
reproduced in several public repositories; jax_privacy's ``auditing.py`` computes the same) term for
term — no disagreement found. Taking the
maximum over a longer range, 1 ≤ i ≤ m, changes nothing: for i ≥ v the numerator is P[B < v] and i = v
is the largest of those terms. The numerator is summed from the binomial pmf, P[v − i ≤ B ≤ v − 1],
not taken as a difference of two tails near 1. r must be fixed before the outcome is seen (as with
top-k₊ / bottom-k₋ guessing), since the theorem bounds ‖T‖₁ ≤ r in advance. For δ = 0 the bound has a
closed form, P[B ≥ v] = I_q(v, r − v + 1) (regularised incomplete beta), so q = I⁻¹(α; v, r − v + 1) and
ε = log(q / (1 − q)); for δ > 0 that value brackets the root from above (the δ term is ≥ 0) and
:func:`scipy.optimize.brentq` finds it. Every result is checked on the p-value before it is returned
and moved down if rounding put it past the root, so it never exceeds the exact bound.

**method="gdp"** (Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025,
arXiv:2410.22235). It tests the Gaussian trade-off f_μ instead of (ε, δ) and is tighter for Gaussian
mechanisms such as DP-SGD. That paper is not among the seed texts either, and its text could not be
read here; the test used is the recursion of the authors' reference code (``audit_rh_with_cap`` in
facebookresearch/PrivacyGuard, the same in google-deepmind/jax_privacy), re-derived below from first
principles — the derivation is ours, and it is what the tests check. For canary j and the event "guess
j correct and C ≥ i" (C = number correct), flipping S_j turns it into "guess j wrong and C ≥ i − 1";
f_μ-DP (a symmetric trade-off) bounds the first probability by ξ(second), ξ(x) = 1 − f_μ(x) =
Φ(Φ⁻¹(x) + μ), which is concave, so averaging over S and j (Jensen) gives, with p_l = P[C = l] and
exactly r guesses (fixed in advance),

    r_i ≤ ξ(h_{i−1}),   r_i = Σ_{l≥i} l·p_l / m,   h_i = Σ_{l≥i} (r − l)·p_l / m   (i = 1, …, r)

(r_i, h_i: mass of correct and wrong guesses when at least i are correct; r alone is the number of
guesses). If P[C ≥ v] ≥ α, some distribution (p_l) satisfies all of these with Σ p_l = 1. The recursion
computes the least total mass that can support P[C ≥ v] ≥ α, greedily from (r_v, h_v) = (α·v/m,
α·(r − v)/m) downwards, h_i = max(h_{i+1}, ξ⁻¹(r_{i+1})), r_i = r_{i+1} + i/(r − i)·(h_i − h_{i+1}); the
least mass is (m/r)·(r_0 + h_0). So r_0 + h_0 > r/m proves P[C ≥ v] < α: f_μ is rejected. That the
greedy value is the exact minimum of this convex program is checked numerically, not proven here:
``tests/analysis/test_canary.py`` solves the program with SLSQP and finds the same value. The bound μ̂
is the largest rejected μ (brentq on the recursion), reported as ε at the given δ through the Gaussian
privacy profile δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Balle & Wang 2018), inverted by brentq.

Read it as "the strongest Gaussian-DP claim the data refute, expressed at δ": a valid lower bound on ε
for mechanisms whose trade-off curve is Gaussian (the Gaussian mechanism; DP-SGD approximately), not
for every (ε, δ)-DP mechanism. At δ = 0 a Gaussian trade-off gives no finite ε, so ``"gdp"`` needs
δ > 0. Note that the simpler test "V ~ Binomial(r, Φ(μ/2))" is *not* valid here: the auditor guesses
only on its most confident canaries, where a Gaussian mechanism's privacy loss is unbounded.

**method="fdp"**: the same recursion with the (ε, δ) trade-off curve of Kairouz et al. (2015) instead of f_μ,
ξ(x) = min(1, δ + e^ε·x, 1 − e^(−ε)·(1 − δ − x)) (:func:`epsilon_delta_inverse`), which is concave and which every
(ε, δ)-DP mechanism satisfies, so the largest rejected ε is a lower bound on ε for *any* mechanism, interacting
canaries too, like the binomial test. It handles δ better than Theorem 3.1's 2mδ term: its ceiling for m = 1000 at
α = 9.3e-5 (a Bonferroni share) and δ = 1e-5 is 4.66 against the binomial test's 1.47, and on every simulated
mechanism measured (``lightning_privacy.analysis.canary_fdp``'s docstring) it bounded at least as high.

**Choosing (k₊, k₋)** (:func:`guess_grid`). Papers try many (k₊, k₋) and report the best, which is a
multiple-testing choice. The grid here depends on m alone: k ∈ {⌊m/2⌋, ⌊m/4⌋, …, 1} (geometric), tried as
"in only" (k, 0), "out only" (0, k) and "both" (k, k), 3·⌊log₂ m⌋ tests. :func:`canary_audit_from_scores`
then corrects for the choice: Bonferroni runs every test at α/|grid| (default), ``"split"`` chooses the
test on a seeded random half and bounds on the other half at α, and the uncorrected best at α over all
canaries is kept only as the ``optimistic`` value (``correction="none"`` reports it as the bound).

**The ceiling** (:func:`max_epsilon_lower`). All m guesses correct is the best outcome; for δ = 0 the
binomial bound is then exactly log(q/(1 − q)) with q = α^(1/m): 5.809 for m = 1000 and α = 0.05 (5.782
at δ = 1e-5, 3.489 at δ = 1e-3; Bonferroni over the 27 tests of m = 1000 lowers it to 5.065, and to 4.794
at δ = 1e-5). The Gaussian test tops out at μ̂ = 2.368 for m = 1000, α = 0.05 (ε = 12.33 at δ = 1e-5).
A one-run audit with m canaries can never report more, whatever the true ε; no other (r, v) gives
more (checked exhaustively for small m in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from numbers import Integral
from typing import Any, Callable

import numpy as np
from scipy import optimize, special, stats

from ._checks import expect_choice, expect_count, expect_real

__all__ = [
    "CanaryAuditResult",
    "canary_audit_from_scores",
    "check_inclusion",
    "epsilon_delta_inverse",
    "epsilon_from_mu",
    "epsilon_one_run",
    "guess_grid",
    "max_epsilon_lower",
    "mu_one_run",
]

METHODS = ("binomial", "gdp", "fdp")
CORRECTIONS = ("bonferroni", "split", "none")

_XTOL = 1e-12
_TIE = 1e-9  # bounds this close count as equal when choosing a (k₊, k₋) pair
_MU_MAX = 1e3  # far beyond any μ a finite number of canaries can reject
_EPS_MAX = 700.0  # (ε, δ) curves: far beyond any ε a finite number of canaries can reject (e^ε stays finite)
INCLUSION_LEVEL = 1e-6
"""False-alarm level of :func:`check_inclusion`: an honest Bernoulli(1/2) draw is refused with probability ≤ 1e-6."""

# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


_check_choice = expect_choice


def _check_real(name: str, value: Any) -> float:
    return expect_real(name, value)


def _check_alpha(alpha: Any) -> float:
    return expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_delta(delta: Any) -> float:
    return expect_real("delta", delta, low=0.0, high=1.0, high_open=True)


_check_count = expect_count


def _check_game(num_canaries: Any, num_guesses: Any, num_correct: Any) -> tuple[int, int, int]:
    m = _check_count("num_canaries", num_canaries)
    r = _check_count("num_guesses", num_guesses)
    v = _check_count("num_correct", num_correct)
    if r > m:
        raise ValueError(f"Expected `num_guesses` <= `num_canaries` = {m}, but got num_guesses={r}.")
    if v > r:
        raise ValueError(f"Expected `num_correct` <= `num_guesses` = {r}, but got num_correct={v}.")
    return m, r, v


def _gdp_needs_delta(delta: float) -> None:
    if delta == 0.0:
        raise ValueError(
            "Expected argument `delta` to be > 0 for method='gdp': a Gaussian trade-off is (ε, 0)-DP for no "
            "finite ε, but got delta=0.0. Use mu_one_run for the δ-free Gaussian-DP bound."
        )


def _safe_root(f_rejects: Callable[[float], bool], x: float) -> float:
    """Move ``x`` down until the test rejects there (so rounding never overstates a bound); 0 if it never does."""
    step = _XTOL * max(1.0, x)
    for _ in range(64):
        if x <= 0.0:
            return 0.0
        if f_rejects(x):
            return x
        x, step = x - step, 2 * step
    return 0.0


# ---------------------------------------------------------------------------------------------------
# Steinke, Nasr, Jagielski (2023), Theorem 3.1
# ---------------------------------------------------------------------------------------------------


def _binomial_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p(ε) of Theorem 3.1 (not capped at 1).

    The tail is scipy.special.bdtrc, the exact binomial survival function (scipy.stats.binom.sf without
    its per-call argument handling, which costs ~50x more here); the window sums add the pmf from v − 1
    downwards, the pmf in logs (log q and log(1 − q) from log_expit, exact for large ε).
    """
    if v == 0:
        return 1.0
    tail = float(special.bdtrc(v - 1, r, special.expit(eps)))  # P[B > v − 1] = P[B ≥ v]
    if delta == 0.0:
        return tail
    j = np.arange(v - 1, -1, -1, dtype=float)  # B = v − 1, …, 0
    log_pmf = (
        special.gammaln(r + 1.0)
        - special.gammaln(j + 1.0)
        - special.gammaln(r - j + 1.0)
        + j * special.log_expit(eps)
        + (r - j) * special.log_expit(-eps)
    )
    window = np.cumsum(np.exp(log_pmf)) / np.arange(1, v + 1)  # P[v − i ≤ B ≤ v − 1] / i, i = 1..v
    return tail + 2.0 * m * delta * float(np.max(window))


def _binomial_bound_delta0(r, v, alpha):
    """Exact δ = 0 bound, vectorised: logit of the one-sided Clopper-Pearson lower limit (0 below q = 1/2)."""
    r, v = np.asarray(r, dtype=float), np.asarray(v, dtype=float)
    ok = v > 0
    a, b = np.where(ok, v, 1.0), np.where(ok, r - v + 1, 1.0)
    q = special.betaincinv(a, b, alpha)  # P[Binomial(r, q) ≥ v] = I_q(v, r − v + 1) = α
    one_minus_q = special.betaincinv(b, a, 1.0 - alpha)  # the same q, accurate near 1
    with np.errstate(divide="ignore"):
        eps = np.log(q) - np.log(one_minus_q)
    return np.where(ok & (q > 0.5), eps, 0.0)


def _binomial_bound(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    if r == 0 or v == 0:
        return 0.0
    hi = float(_binomial_bound_delta0(r, v, alpha))
    if hi <= 0.0:
        return 0.0

    def rejects(eps: float) -> bool:
        return _binomial_p_value(m, r, v, eps, delta) <= alpha

    if delta == 0.0:
        return _safe_root(rejects, hi)
    if not rejects(0.0):
        return 0.0
    if rejects(hi):  # the δ term vanished numerically: the δ = 0 root is the bound
        return hi
    root = optimize.brentq(lambda e: _binomial_p_value(m, r, v, e, delta) - alpha, 0.0, hi, xtol=_XTOL)
    return _safe_root(rejects, float(root))


# ---------------------------------------------------------------------------------------------------
# Mahloujifar, Melis, Chaudhuri (2025): Gaussian trade-off
# ---------------------------------------------------------------------------------------------------


def _gdp_excess(m: int, r: int, v: int, alpha: float, mu: float) -> float:
    """(r_0 + h_0) − r/m of the recursion in the module docstring; > 0 rejects μ-GDP at level α."""
    return fdp_excess(m, r, v, alpha, lambda y: float(special.ndtr(special.ndtri(y) - mu)))


def fdp_excess(m: int, r: int, v: int, alpha: float, inverse: Callable[[float], float]) -> float:
    """(r_0 + h_0) − r/m of the recursion in the module docstring for any trade-off; > 0 rejects it at level α.

    ``inverse(y)`` is ξ⁻¹(y) of a concave, non-decreasing ξ (ξ(x): the largest probability of an event under
    one neighbour when it has probability x under the other, in both orders); for μ-GDP ξ⁻¹(y) = Φ(Φ⁻¹(y) − μ).
    A ξ above the claim's (its ``inverse`` below) only rejects less. Stops once h stops changing (then nothing
    changes any more), or once the total exceeds 2·r/m (it only grows downwards, so the verdict is settled;
    stopping there, not at r/m, keeps the result continuous in μ near its root, where brentq needs it). r is
    capped at 1, a probability, which keeps ξ⁻¹ defined (the total then exceeds r/m ≤ 1 anyway).
    """
    cap = r / m
    rr, hh = alpha * v / m, alpha * (r - v) / m
    for i in range(v - 1, -1, -1):
        need = inverse(rr)  # ξ⁻¹(r_{i+1})
        if need <= hh:
            break
        rr = min(1.0, rr + i / (r - i) * (need - hh))
        hh = need
        if rr + hh > 2.0 * cap:
            break
    return rr + hh - cap


def _gdp_mu(m: int, r: int, v: int, alpha: float, floor: float = 0.0) -> float:
    """Largest μ whose Gaussian trade-off is rejected (``floor`` if nothing above it is)."""
    if r == 0 or v == 0:
        return floor
    return _largest_rejected(lambda mu: _gdp_excess(m, r, v, alpha, mu), floor, _MU_MAX)


# ---------------------------------------------------------------------------------------------------
# The same f-DP test of the (ε, δ) trade-off curve: sound for every (ε, δ)-DP mechanism
# ---------------------------------------------------------------------------------------------------


def epsilon_delta_inverse(epsilon: float, delta: float) -> Callable[[float], float]:
    """ξ⁻¹ of the (ε, δ)-DP trade-off (Kairouz et al. 2015): ξ(x) = min(1, δ + e^ε·x, 1 − e^(−ε)·(1 − δ − x)), the
    largest probability of an event under one neighbour when it has probability x under the other (both orders);
    concave, so :func:`fdp_excess` tests it. ξ⁻¹(y) = max(0, (y − δ)·e^(−ε), 1 − δ − e^ε·(1 − y)).

    Example::

        >>> inverse = epsilon_delta_inverse(1.0, 0.0)
        >>> round(inverse(0.5), 4), round(inverse(0.9), 4)  # e^-1 / 2 and 1 - e·0.1
        (0.1839, 0.7282)
    """
    grow, shrink = math.exp(epsilon), math.exp(-epsilon)

    def inverse(y: float) -> float:
        return max(0.0, (y - delta) * shrink, 1.0 - delta - grow * (1.0 - y))

    return inverse


def _fdp_excess(m: int, r: int, v: int, alpha: float, eps: float, delta: float) -> float:
    """(r_0 + h_0) − r/m of the recursion for the (ε, δ) curve; > 0 rejects (ε, δ)-DP at level α."""
    return fdp_excess(m, r, v, alpha, epsilon_delta_inverse(eps, delta))


def _largest_rejected(excess: Callable[[float], float], floor: float, ceiling: float) -> float:
    """The largest x ≥ ``floor`` whose claim ``excess(x) > 0`` rejects (excess non-increasing in x), rounded down;
    ``floor`` if nothing above it is rejected, ``ceiling`` if everything below it is."""

    def rejects(x: float) -> bool:
        return excess(x) > 0.0

    if not rejects(floor):
        return floor
    lo, hi = floor, max(1.0, 2.0 * floor)
    while rejects(hi):
        if hi >= ceiling:
            return ceiling
        lo, hi = hi, min(2.0 * hi, ceiling)
    root = optimize.brentq(excess, lo, hi, xtol=_XTOL)
    return max(floor, _safe_root(rejects, float(root)))


def _fdp_epsilon(m: int, r: int, v: int, alpha: float, delta: float, floor: float = 0.0) -> float:
    """Largest ε whose (ε, δ) trade-off the f-DP recursion rejects (``floor`` if nothing above it is)."""
    if r == 0 or v == 0:
        return floor
    return _largest_rejected(lambda eps: _fdp_excess(m, r, v, alpha, eps, delta), floor, _EPS_MAX)


def _gdp_delta(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (the second term in logs)."""
    return float(special.ndtr(-eps / mu + mu / 2) - math.exp(eps + special.log_ndtr(-eps / mu - mu / 2)))


def _epsilon_from_mu(mu: float, delta: float) -> float:
    if mu <= 0.0 or _gdp_delta(0.0, mu) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    lo, hi = 0.0, max(1.0, mu * mu)
    while _gdp_delta(hi, mu) > delta:
        lo, hi = hi, 2.0 * hi
    root = optimize.brentq(lambda e: _gdp_delta(e, mu) - delta, lo, hi, xtol=_XTOL)
    # safe side: δ(ε) must still exceed the target at the returned ε, i.e. ε ≤ the exact root
    return _safe_root(lambda e: _gdp_delta(e, mu) >= delta, float(root))


def epsilon_from_mu(*, mu: float, delta: float) -> float:
    """The ε at which μ-Gaussian DP gives δ: the root of Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) = δ.

    Balle & Wang (ICML 2018), Theorem 8 (the analytic Gaussian mechanism; Dong, Roth, Su 2022,
    Corollary 2.13). Rounded down, so the returned ε never exceeds the exact one.

    Args:
        mu: the Gaussian-DP parameter μ ≥ 0 (sensitivity / noise standard deviation).
        delta: δ in [0, 1); δ = 0 gives ``inf`` for μ > 0.

    Returns:
        ε ≥ 0 (0 when δ ≥ 2Φ(μ/2) − 1, i.e. when δ alone covers the whole trade-off).

    Raises:
        TypeError: a non-numeric argument.
        ValueError: μ < 0 or not finite, δ outside [0, 1).

    Example::

        >>> round(epsilon_from_mu(mu=1.0, delta=1e-5), 4)
        4.3772
        >>> epsilon_from_mu(mu=0.5, delta=0.5)
        0.0
    """
    mu = _check_real("mu", mu)
    if not (math.isfinite(mu) and mu >= 0.0):
        raise ValueError(f"Expected argument `mu` to be a finite number >= 0, but got {mu!r}.")
    delta = _check_delta(delta)
    if delta == 0.0:
        return math.inf if mu > 0.0 else 0.0
    return _epsilon_from_mu(mu, delta)


def mu_one_run(*, num_canaries: int, num_guesses: int, num_correct: int, alpha: float = 0.05) -> float:
    """Largest μ for which "the run is μ-Gaussian-DP" is rejected at level α (Mahloujifar et al. 2025).

    The δ-free output of the f-DP test described in the module docstring; :func:`epsilon_one_run` with
    ``method="gdp"`` reports it as ε at a given δ.

    Args:
        num_canaries: m, canaries each included independently with probability 1/2.
        num_guesses: r ≤ m guesses made (the rest abstained), fixed before the outcome is seen (top-k).
        num_correct: v ≤ r correct guesses.
        alpha: significance in (0, 1).

    Returns:
        μ̂ ≥ 0 (0 when nothing is rejected), rounded down.

    Raises:
        TypeError: a count that is not an integer, or a non-numeric α.
        ValueError: a negative count, v > r, r > m, or α outside (0, 1).

    Example::

        >>> round(mu_one_run(num_canaries=1000, num_guesses=100, num_correct=95), 3)
        0.787
        >>> mu_one_run(num_canaries=1000, num_guesses=100, num_correct=50)
        0.0
    """
    m, r, v = _check_game(num_canaries, num_guesses, num_correct)
    return _gdp_mu(m, r, v, _check_alpha(alpha))


def epsilon_one_run(
    *,
    num_canaries: int,
    num_guesses: int,
    num_correct: int,
    delta: float,
    alpha: float = 0.05,
    method: str = "binomial",
) -> float:
    """ε lower bound from one run: m canaries, r guesses, v correct (see the module docstring).

    ``"binomial"``: the largest ε whose (ε, δ) claim Theorem 3.1 of Steinke et al. (2023) rejects at
    level α. ``"gdp"``: the largest μ-Gaussian-DP claim the f-DP test of Mahloujifar et al. (2025)
    rejects, as ε at δ (a lower bound for Gaussian-trade-off mechanisms; needs δ > 0).

    Args:
        num_canaries: m, canaries each included independently with probability 1/2.
        num_guesses: r ≤ m guesses made (the rest abstained), fixed before the outcome is seen (top-k).
        num_correct: v ≤ r correct guesses.
        delta: δ in [0, 1) (> 0 for ``"gdp"``).
        alpha: significance in (0, 1).
        method: ``"binomial"``, ``"fdp"`` (both: any (ε, δ)-DP mechanism) or ``"gdp"`` (a Gaussian reading).

    Returns:
        ε ≥ 0, rounded down; 0 when nothing is rejected (in particular for r = 0 or v = 0).

    Raises:
        TypeError: a count that is not an integer, or a non-numeric δ or α.
        ValueError: a negative count, v > r, r > m, α outside (0, 1), δ outside [0, 1), δ = 0 with
            ``"gdp"``, or an unknown ``method``.

    Example::

        >>> round(epsilon_one_run(num_canaries=1000, num_guesses=1000, num_correct=1000, delta=0), 4)
        5.8091
        >>> for method in ("binomial", "gdp"):
        ...     eps = epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=95, delta=1e-5, method=method)
        ...     print(method, round(eps, 3))
        binomial 2.165
        gdp 3.323
        >>> epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=50, delta=1e-5)
        0.0
    """
    m, r, v = _check_game(num_canaries, num_guesses, num_correct)
    delta, alpha = _check_delta(delta), _check_alpha(alpha)
    _check_choice("method", method, METHODS)
    if method == "gdp":
        _gdp_needs_delta(delta)
        return _epsilon_from_mu(_gdp_mu(m, r, v, alpha), delta)
    if method == "fdp":
        return _fdp_epsilon(m, r, v, alpha, delta)
    return _binomial_bound(m, r, v, delta, alpha)


def max_epsilon_lower(*, num_canaries: int, alpha: float = 0.05, delta: float = 0.0, method: str = "binomial") -> float:
    """The largest bound an audit with m canaries can report: all r = m guesses correct.

    For δ = 0 and ``"binomial"`` this is exactly log(q/(1 − q)) with q = α^(1/m); δ > 0 lowers it. No
    other (r, v) gives more (checked exhaustively for small m in the tests). With a correction, pass
    the per-test level (α/|grid| for Bonferroni, see :func:`guess_grid`) and, for a split, the size of
    the half that is bounded.

    Args:
        num_canaries: m ≥ 0.
        alpha: significance in (0, 1).
        delta: δ in [0, 1) (> 0 for ``"gdp"``).
        method: ``"binomial"``, ``"fdp"`` (both: any (ε, δ)-DP mechanism) or ``"gdp"`` (a Gaussian reading).

    Returns:
        The ceiling ε ≥ 0 (0 for m = 0).

    Raises:
        TypeError, ValueError: as for :func:`epsilon_one_run`.

    Example::

        >>> round(max_epsilon_lower(num_canaries=1000, alpha=0.05), 3)
        5.809
        >>> q = 0.05 ** (1 / 1000)
        >>> round(math.log(q / (1 - q)), 3)
        5.809
        >>> round(max_epsilon_lower(num_canaries=1000, alpha=0.05 / len(guess_grid(1000)), delta=1e-5), 3)
        4.794
    """
    m = _check_count("num_canaries", num_canaries)
    return epsilon_one_run(num_canaries=m, num_guesses=m, num_correct=m, delta=delta, alpha=alpha, method=method)


# ---------------------------------------------------------------------------------------------------
# From canary scores to the bound
# ---------------------------------------------------------------------------------------------------


def _ladder(n: int) -> list[int]:
    """k ∈ {⌊n/2⌋, ⌊n/4⌋, …, 1} (n ≥ 2); [1] for n = 1; [] for n = 0."""
    if n <= 0:
        return []
    levels = max(1, n.bit_length() - 1)  # ⌊log₂ n⌋, at least one level
    return sorted({max(1, n >> j) for j in range(1, levels + 1)}, reverse=True)


def guess_grid(num_canaries: int) -> list[tuple[int, int]]:
    """The (k₊, k₋) pairs tried for m canaries: fixed by m alone, never by the inclusion bits.

    k runs over the geometric ladder ⌊m/2⌋, ⌊m/4⌋, …, 1 (⌊log₂ m⌋ values; [1] for m = 1), each tried as
    (k, 0) "in only", (0, k) "out only" and (k, k) "both" — pairs with k₊ + k₋ > m are dropped.
    Guessing on the highest and lowest scores first is where one-run bounds peak (Steinke et al. 2023,
    Section 6); the ladder keeps |grid| = 3·⌊log₂ m⌋ small, so a Bonferroni correction costs little.

    Args:
        num_canaries: m ≥ 0.

    Returns:
        List of (k_plus, k_minus) pairs, in the order the ties are broken (first wins).

    Raises:
        TypeError, ValueError: ``num_canaries`` is not a non-negative integer.

    Example::

        >>> guess_grid(10)
        [(5, 0), (0, 5), (5, 5), (2, 0), (0, 2), (2, 2), (1, 0), (0, 1), (1, 1)]
        >>> len(guess_grid(1000)), guess_grid(1)
        (27, [(1, 0), (0, 1)])
    """
    m = _check_count("num_canaries", num_canaries)
    pairs = []
    for k in _ladder(m):
        pairs += [(k, 0), (0, k)] + ([(k, k)] if 2 * k <= m else [])
    return pairs


@dataclass(frozen=True)
class CanaryAuditResult:
    """Result of :func:`canary_audit_from_scores`.

    Attributes:
        epsilon_lower: the corrected lower bound on ε (valid at level ``alpha``; with
            ``correction="none"`` it is the optimistic value).
        optimistic: the best bound over the grid at level α on all canaries, *uncorrected* for the
            choice of (k₊, k₋): the number papers usually report; its level α does not hold.
        method: ``"binomial"`` (Steinke et al.) or ``"gdp"`` (Mahloujifar et al., Gaussian trade-off).
        correction: ``"bonferroni"``, ``"split"`` or ``"none"``.
        num_canaries: m, all canaries scored.
        num_canaries_tested: canaries in the game the bound was computed on (the held-out half for
            ``"split"``, m otherwise); it is the m of the theorem.
        num_guesses, num_correct: r and v of the reported test.
        k_plus, k_minus: its guesses "in" (highest scores) and "out" (lowest scores). When no test
            rejects anything, the first grid pair is reported.
        alpha: overall significance; ``alpha_per_test``: the level each test ran at (α/|grid| for
            Bonferroni, α otherwise).
        delta: the δ of the (ε, δ) claim.
        grid_size: number of (k₊, k₋) pairs compared.
    """

    epsilon_lower: float
    optimistic: float
    method: str
    correction: str
    num_canaries: int
    num_canaries_tested: int
    num_guesses: int
    num_correct: int
    k_plus: int
    k_minus: int
    alpha: float
    alpha_per_test: float
    delta: float
    grid_size: int

    def to_dict(self) -> dict:
        """Plain Python values (floats, ints, str)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_scores(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float).reshape(-1)
    inc = np.asarray(included).reshape(-1)
    if s.shape != inc.shape:
        raise ValueError(
            f"Expected `scores` and `included` to have the same number of elements, but got {s.size} and {inc.size}."
        )
    if np.any(np.isnan(s)):
        raise ValueError(f"Expected argument `scores` to contain no NaN, but got {int(np.isnan(s).sum())} NaN values.")
    if inc.dtype != bool:
        if inc.size and not np.all((inc == 0) | (inc == 1)):
            raise ValueError(
                f"Expected argument `included` to hold booleans or 0/1, but got values {np.unique(inc)[:5]}."
            )
        inc = inc.astype(bool)
    check_inclusion(inc)
    return s, inc


def check_inclusion(included: Any, *, level: float = INCLUSION_LEVEL) -> np.ndarray:
    """Refuse an ``included`` vector that is no plausible Bernoulli(1/2) draw (the game's one assumption).

    The one-run bounds and verdicts hold because each canary is included independently with probability 1/2,
    before training. A vector chosen by hand — all True, say — makes "in" guesses right by construction, so a true
    claim looks contradicted and the ε lower bound means nothing. The number included, k of m, is tested with the
    exact two-sided binomial test (:func:`scipy.stats.binomtest`, p = 1/2) at ``level``: an honest draw is refused
    with probability at most ``level`` (1e-6 by default), and every m ≤ 20 passes (even all True has p ≥ 2·2⁻²⁰).

    Args:
        included: whether each canary was included (booleans or 0/1).
        level: the false-alarm level, in (0, 1).

    Returns:
        ``included`` as a boolean array.

    Raises:
        ValueError: when the binomial test rejects at ``level`` (naming the count and how to draw the vector), or
            a bad ``level``.

    Example::

        >>> int(check_inclusion(np.random.default_rng(0).random(1000) < 0.5).sum())
        473
        >>> check_inclusion(np.ones(100, bool))
        Traceback (most recent call last):
        ...
        ValueError: Expected argument `included` to be a Bernoulli(1/2) draw (each canary included independently with probability 1/2), but got 100 of 100 canaries included (exact two-sided binomial test: p = 1.6e-30 < 1e-06). Draw it with a generator, e.g. `np.random.default_rng(seed).random(m) < 0.5`, before training (or let CanaryAudit draw it): a vector chosen by hand makes the guesses right by construction, so a true claim looks contradicted.
    """
    level = expect_real("level", level, low=0.0, high=1.0, low_open=True, high_open=True)
    inc = np.asarray(included).reshape(-1).astype(bool)
    m, k = int(inc.size), int(inc.sum())
    if m == 0:
        return inc
    pvalue = float(stats.binomtest(k, m, 0.5).pvalue)
    if pvalue < level:
        raise ValueError(
            "Expected argument `included` to be a Bernoulli(1/2) draw (each canary included independently with "
            f"probability 1/2), but got {k} of {m} canaries included (exact two-sided binomial test: p = "
            f"{pvalue:.2g} < {level:g}). Draw it with a generator, e.g. `np.random.default_rng(seed).random(m) < "
            "0.5`, before training (or let CanaryAudit draw it): a vector chosen by hand makes the guesses right by "
            "construction, so a true claim looks contradicted."
        )
    return inc


class _Game:
    """Correct-guess counts of every grid pair on one set of canaries (ties broken by a seeded order)."""

    def __init__(self, scores: np.ndarray, included: np.ndarray, order: np.ndarray) -> None:
        ranked = order[np.argsort(scores[order], kind="stable")]  # ascending score; ties in seeded order
        inc = included[ranked].astype(np.int64)
        self.n = inc.size
        self.in_bottom = np.concatenate([[0], np.cumsum(inc)])  # included among the k lowest
        self.in_top = np.concatenate([[0], np.cumsum(inc[::-1])])  # included among the k highest
        self.pairs = guess_grid(self.n)

    def counts(self, k_plus: int, k_minus: int) -> tuple[int, int]:
        correct = int(self.in_top[k_plus]) + (k_minus - int(self.in_bottom[k_minus]))
        return k_plus + k_minus, correct


def _best_over_grid(game: _Game, *, delta: float, alpha: float, method: str) -> tuple[float, int]:
    """(largest bound over the grid at level ``alpha``, index of its pair); pruned, exact.

    Bounds within ``_TIE`` of the maximum count as ties and the first pair in grid order wins (its own
    bound is reported), so the choice does not flip with floating-point noise between equal counts.
    """
    if not game.pairs:
        return 0.0, 0
    rv = np.array([game.counts(kp, km) for kp, km in game.pairs], dtype=np.int64).reshape(-1, 2)
    m = game.n
    if method == "binomial":
        ceiling = _binomial_bound_delta0(rv[:, 0], rv[:, 1], alpha)  # ≥ the δ > 0 bound
        found: dict[int, float] = {}
        for j in np.argsort(-ceiling, kind="stable"):
            if ceiling[j] < max(found.values(), default=0.0) - _TIE:
                break
            found[int(j)] = _binomial_bound(m, int(rv[j, 0]), int(rv[j, 1]), delta, alpha)
        top = max(found.values(), default=0.0)
        if top <= 0.0:
            return 0.0, 0
        best_index = min(j for j, eps in found.items() if eps >= top - _TIE)
        return found[best_index], best_index
    if method == "fdp":  # the (ε, δ) curve: the bound is an ε directly
        excess = lambda r, v, x: _fdp_excess(m, r, v, alpha, x, delta)  # noqa: E731
        largest = lambda r, v, floor: _fdp_epsilon(m, r, v, alpha, delta, floor=floor)  # noqa: E731
    else:
        excess = lambda r, v, x: _gdp_excess(m, r, v, alpha, x)  # noqa: E731
        largest = lambda r, v, floor: _gdp_mu(m, r, v, alpha, floor=floor)  # noqa: E731
    best, best_index = 0.0, 0
    for j in range(len(game.pairs)):
        r, v = int(rv[j, 0]), int(rv[j, 1])
        if v == 0 or excess(r, v, best + _TIE) <= 0.0:
            continue  # cannot beat the current best by more than a tie
        found = largest(r, v, best)
        if found > best + _TIE:
            best, best_index = found, j
    return (best if method == "fdp" else _epsilon_from_mu(best, delta)), best_index


def canary_audit_from_scores(
    *,
    scores: Any,
    included: Any,
    delta: float,
    alpha: float = 0.05,
    method: str = "binomial",
    correction: str = "bonferroni",
    seed: int = 0,
) -> CanaryAuditResult:
    """ε lower bound from the scores of m canaries and their inclusion bits.

    Guesses "in" for the k₊ highest scores and "out" for the k₋ lowest, for every (k₊, k₋) of
    :func:`guess_grid` (ties in the scores are broken by a random order drawn from ``seed``, never
    by the inclusion bits or the input order), and turns the best into a valid bound:

    * ``"bonferroni"`` (default): every test at α/|grid|; the largest bound holds at level α.
    * ``"split"``: a seeded random half (⌊m/2⌋ canaries, not stratified: the split must not depend
      on the inclusion bits) picks the (k₊, k₋) rung with the largest bound at α; the pair at the
      same rung of the other half's ladder is then tested once, at α, on that half alone (its m in
      the theorem is the half's size).
    * ``"none"``: the uncorrected best at α (``epsilon_lower == optimistic``): not a valid level-α
      bound.

    ``optimistic`` is always the uncorrected best on all canaries.

    Args:
        scores: one score per canary, higher = more likely included (NaN not allowed; ±inf is).
        included: whether each canary was included (booleans or 0/1), same length: a Bernoulli(1/2) draw, refused
            by :func:`check_inclusion` when its count is implausible at level 1e-6.
        delta: δ in [0, 1) (> 0 for ``"gdp"``).
        alpha: overall significance in (0, 1).
        method: ``"binomial"``, ``"fdp"`` or ``"gdp"`` (see :func:`epsilon_one_run`).
        correction: ``"bonferroni"``, ``"split"`` or ``"none"``.
        seed: seeds the tie-breaking order and the split.

    Returns:
        A :class:`CanaryAuditResult`.

    Raises:
        TypeError, ValueError: mismatched lengths, NaN scores, non-binary ``included`` or one that is no
            plausible Bernoulli(1/2) draw (:func:`check_inclusion`), or a bad δ, α, method or correction.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = rng.normal(size=1000) + 2.0 * included  # a 2-GDP mechanism: ε = 10.0 at δ = 1e-5
        >>> res = canary_audit_from_scores(scores=scores, included=included, delta=1e-5)
        >>> round(res.epsilon_lower, 2), round(res.optimistic, 2), res.k_plus, res.k_minus, res.grid_size
        (2.87, 3.68, 125, 125, 27)
        >>> res.num_guesses, res.num_correct
        (250, 247)
        >>> res = canary_audit_from_scores(scores=scores, included=included, delta=1e-5, method="gdp")
        >>> round(res.epsilon_lower, 2), round(res.optimistic, 2)
        (4.13, 6.05)
    """
    s, inc = _check_scores(scores, included)
    delta, alpha = _check_delta(delta), _check_alpha(alpha)
    _check_choice("method", method, METHODS)
    _check_choice("correction", correction, CORRECTIONS)
    if method == "gdp":
        _gdp_needs_delta(delta)
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise TypeError(f"Expected argument `seed` to be an integer, but got {seed!r}.")
    m = s.size
    order = np.random.default_rng(int(seed)).permutation(m)
    full = _Game(s, inc, order)
    optimistic, opt_index = _best_over_grid(full, delta=delta, alpha=alpha, method=method)
    grid_size = len(full.pairs)

    if correction == "split":
        select, test = order[: m // 2], order[m // 2 :]
        chosen = _Game(s, inc, select)
        _, index = _best_over_grid(chosen, delta=delta, alpha=alpha, method=method)
        game = _Game(s, inc, test)
        # the same rung of the held-out half's ladder (its ladder has at least as many rungs)
        rung = chosen.pairs[index] if chosen.pairs else (0, 0)
        k_plus, k_minus = _same_rung(rung, chosen.n, game.n)
        r, v = game.counts(k_plus, k_minus)
        eps = epsilon_one_run(
            num_canaries=game.n, num_guesses=r, num_correct=v, delta=delta, alpha=alpha, method=method
        )
        tested, per_test = game.n, alpha
    else:
        if correction == "bonferroni":
            per_test = alpha / max(grid_size, 1)
            eps, index = _best_over_grid(full, delta=delta, alpha=per_test, method=method)
        else:
            per_test, eps, index = alpha, optimistic, opt_index
        k_plus, k_minus = full.pairs[index] if full.pairs else (0, 0)
        r, v = full.counts(k_plus, k_minus)
        tested = m
    return CanaryAuditResult(
        epsilon_lower=float(eps),
        optimistic=float(optimistic),
        method=method,
        correction=correction,
        num_canaries=int(m),
        num_canaries_tested=int(tested),
        num_guesses=int(r),
        num_correct=int(v),
        k_plus=int(k_plus),
        k_minus=int(k_minus),
        alpha=alpha,
        alpha_per_test=float(per_test),
        delta=delta,
        grid_size=int(grid_size),
    )


def _same_rung(pair: tuple[int, int], n_from: int, n_to: int) -> tuple[int, int]:
    """Map (k₊, k₋) on the ladder of ``n_from`` canaries to the same rung j (k = ⌊n/2^j⌋) for ``n_to``."""
    ladder_from, ladder_to = _ladder(n_from), _ladder(n_to)

    def one(k: int) -> int:
        if k == 0 or not ladder_to:
            return 0
        j = ladder_from.index(k)
        return ladder_to[min(j, len(ladder_to) - 1)]

    k_plus, k_minus = one(pair[0]), one(pair[1])
    if k_plus + k_minus > n_to:
        k_minus = n_to - k_plus
    return k_plus, k_minus

"""Score-based one-run estimators beside Steinke et al.'s and Mahloujifar et al.'s (numpy/scipy only).

:mod:`lightning_privacy.analysis.canary` turns canary scores into yes/no guesses (top-k₊ "in", bottom-k₋ "out") and
bounds ε from the number of right guesses; those bounds hold for *any* mechanism that is (ε, δ)-DP (binomial) or
f_μ-DP (``"gdp"``) with respect to each canary, however the canaries interact. The estimators here use more of the
scores — their order statistics within the included and the excluded canaries, or their continuous values — and buy
that power with an assumption about how the scores were made. Each states its assumption; none holds for every DP
mechanism, so :func:`tightest_canary_bound` only takes the ones whose assumption the caller vouches for.

**Assumption (I), independent canaries.** Given the inclusion bits, the m scores are independent; every included
canary's score has one law P, every excluded one's one law Q (the canaries are exchangeable). This holds exactly for
the package's white-box gradient canaries scored ``"released_minus_batch"`` or ``"likelihood_ratio"``
(:mod:`lightning_privacy.audits.canary_run`): distinct Dirac coordinates, independent Gaussian noise per coordinate,
independent Poisson sampling per canary, the batch's own gradient subtracted. It does *not* hold for input canaries
(they train the same model together) nor for ``score="released"`` (the data's gradient is a shared nuisance).
Under (I) "the run is μ-GDP with respect to each canary" implies that (P, Q) is μ-GDP: every test of P against Q has
TPR ≤ Φ(Φ⁻¹(FPR) + μ), in both orders (Dong, Roth, Su 2022) — a two-sample problem.

**method="orderstat"** (:func:`orderstat_mu_lower`; under (I) only, no parametric form). For a rung k of a fixed
ladder, the threshold t is the (k + 1)-th largest excluded score and the test "in iff score > t". Its FPR,
Q(score > t), is distribution-free: it is stochastically below Beta(k + 1, n₋ − k) (exactly that law for continuous
Q; atoms only lower it), so the Clopper–Pearson upper limit of k of n₋ bounds it. Given t, the number of included
canaries above t is Binomial(n₊, P(score > t)), so its Clopper–Pearson lower limit bounds the TPR. Each limit at
level α/(2K) and Bonferroni over the K tests (both tails: the mirror test "out iff score < t", t the (k + 1)-th
smallest included score, is valid because f_μ is symmetric), so μ̂ = max_k [Φ⁻¹(TPR_low) − Φ⁻¹(FPR_high)] is a lower
bound on μ at level α: μ-GDP gives Φ⁻¹(TPR) − Φ⁻¹(FPR) ≤ μ, and both limits hold together with probability ≥ 1 − α.
The thresholds come from the excluded (or included) scores alone, never from the guesses' correctness, which is
what keeps the Beta law exact. This is what we take Xiang et al. (arXiv 2509.08704, "tight one-run audits through
f-DP": order statistics of the canary scores, μ-GDP) to do; the paper could not be read here (no network), so this
is our sound construction from the idea, not theirs: their statistic, their rule for choosing the rung and whether
their bound needs (I) may differ. Without (I) only Mahloujifar et al.'s recursion (``method="gdp"``) is known to us
to be sound for f-DP; we did not prove that the top-k correct count of a general μ-GDP mechanism is dominated by
the count of independent Gaussian canaries, so nothing here relies on that.

**method="gauss"** (:func:`gauss_mu_lower`; under (I) *and* (G): P = N(a + μs, s²), Q = N(a, s²), equal
variances). The standardised mean difference of the included and excluded scores, t = (x̄₊ − x̄₋) /
(s_pooled·√(1/n₊ + 1/n₋)), has exactly the noncentral t law with n₊ + n₋ − 2 degrees of freedom and noncentrality
μ/√(1/n₊ + 1/n₋); μ̂ is the largest μ with P[T ≥ t_obs] ≤ α (exact, root-found on scipy's ``nct``). It uses every
score's value, not yes/no guesses — the idea of "Let's Ask Gauss" (arXiv 2606.12733), whose exact estimator we could
not read either. (G) is a *model*, not a consequence of DP: for a score that is not Gaussian the standardised mean
shift can exceed the true μ — the bounded score tanh(LLR/2) of a 3-GDP pair shifts by 4.04 pooled sds (the test
file's example) — so a true claim can look refuted. The summed released coordinate of a gradient canary is only approximately Gaussian (the
included one carries C·Binomial(T, p)). Hence ``"gauss"`` is reported, never used by :func:`tightest_canary_bound`
unless asked for, and never used by the claim verdicts.

**Gaussian readings and the (ε, δ) reading.** μ̂ is a lower bound on the μ of a μ-GDP run; read as ε through the
Gaussian curve (``epsilon_lower`` of :func:`orderstat_mu_lower` and :func:`gauss_mu_lower`, ``"gdp"`` of
:mod:`~lightning_privacy.analysis.canary`) it is a lower bound on ε only for a mechanism whose trade-off curve *is*
Gaussian. Laplace or randomized-response canaries are (ε₀, 0)-DP and μ-GDP for some μ, but their ε is far below the
Gaussian curve's ε at that μ (Laplace ε₀ = 1: μ ≈ 1.03, read as ε = 4.5 at δ = 1e-5), so the reading overstates ε
in most audits. :func:`orderstat_epsilon_lower` reads the same rungs through the (ε, δ) curve of Kairouz et al.
instead (TPR ≤ δ + e^ε·FPR and 1 − TPR ≥ e^(−ε)(1 − δ − FPR)), which every (ε, δ)-DP mechanism satisfies: valid under
(I) alone.

**The tightest bound** (:func:`tightest_canary_bound`): each chosen estimator at its share of α (Bonferroni over
the K estimators, since the largest of K level-α bounds is not a level-α bound; α/K each unless ``weights`` fixes
other shares before the run), the largest as ε at δ, and the name of the test that gave it. It is sound when the
assumptions of every chosen estimator hold; ``TightestBound.sound`` says whether a Gaussian reading is among them.
The audit's headline uses only :data:`SOUND_METHODS`: the f-DP test of the (ε, δ) curve (``"fdp"``) alone, and for
independent canaries also the order statistics' (ε, δ) reading, at the shares :data:`INDEPENDENT_WEIGHTS` (0.9 and
0.1). The shares were fixed from simulations before any audited run (seeds 2000–2019, m = 1,000, α = 0.05, δ = 1e-5;
medians of the tightest under each split): randomized response ε₀ = 2, Laplace ε₀ = 1 and 4, Gaussian μ = 1, 2, 3
and summed DP-SGD canary scores (q = 0.1, T = 300, σ = 2.07 and 0.5). In every case the f-DP test at α bounded at
least as high as the binomial test and the order-statistic (ε, δ) reading (e.g. Laplace ε₀ = 4: 3.14 against 2.96
and 2.96; DP-SGD σ = 2.07, ε = 4.0: 1.16 against 1.10 and 0.93), also at m = 10,000; 0.9 / 0.1 costs the f-DP test
under 1 % of its bound and keeps the order statistics, which use the scores' values rather than counts, where
they might win. The binomial bound is reported beside it at all of α, not in the headline: at any share it stayed
below the f-DP test's (its 2mδ term caps it at 1.47 at α = 9.3e-5 for m = 1,000).

**Measured** (simulated μ-GDP canaries: scores N(μ·b, 1), m = 1000, α = 0.05, δ = 1e-5, seeds 0–19, medians; the
gain is checked in ``tests/analysis/test_canary_fdp.py``): at μ = 2 (true ε = 10.00) the binomial bound is 2.87,
the Gaussian readings ``"gdp"`` 4.13, ``"orderstat_gaussian"`` 7.87 and ``"gauss"`` 9.22; at μ = 1 (ε = 4.38) 1.35 /
1.81 / 2.92 / 3.87. Soundness of the readings for μ-GDP runs, 200 runs at α = 0.05 for μ ∈ {0.5, 1, 2}: μ̂ > μ in
0 % of runs for orderstat (conservative: Bonferroni over 18 rungs) and 6.5–7 % for gauss (exact: 5.1 % over 1,000
further runs at μ = 1). For mechanisms that are not Gaussian, ``tests/analysis/test_canary_soundness.py`` simulates
the cases of issue 56 (randomized response, Laplace): the headline stays below the true ε, the Gaussian readings do
not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, special, stats

from ._checks import expect_choice, expect_real
from .canary import _check_scores, _epsilon_from_mu, canary_audit_from_scores

__all__ = [
    "INDEPENDENT_WEIGHTS",
    "FdpBound",
    "TightestBound",
    "gauss_mu_lower",
    "orderstat_claim_test",
    "orderstat_epsilon_lower",
    "orderstat_mu_lower",
    "orderstat_rungs",
    "tightest_canary_bound",
]

SCORE_METHODS = ("orderstat", "gauss")
ALL_METHODS = ("binomial", "fdp", "orderstat", "gdp", "orderstat_gaussian", "gauss")
#: valid for every (ε, δ)-DP mechanism (``"orderstat"``: with independent canaries): what a headline may combine
SOUND_METHODS = ("binomial", "fdp", "orderstat")
#: ε read from a μ through the Gaussian trade-off curve: lower bounds only if the mechanism is μ-GDP
GAUSSIAN_READINGS = ("gdp", "orderstat_gaussian", "gauss")
SOUND_DEFAULT = ("fdp",)  # sound for every (ε, δ)-DP mechanism, interacting canaries too
INDEPENDENT_METHODS = ("fdp", "orderstat")
#: shares of α the audit gives each test of the tightest bound for independent canaries (fixed before any run, from
#: simulations: ``tests/analysis/test_canary_soundness.py`` and the module docstring)
INDEPENDENT_WEIGHTS = {"fdp": 0.9, "orderstat": 0.1}
_XTOL = 1e-10


def _check_alpha(alpha: Any) -> float:
    return expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_delta(delta: Any) -> float:
    return expect_real("delta", delta, low=0.0, high=1.0, high_open=True)


@dataclass(frozen=True)
class FdpBound:
    """A μ lower bound from canary scores (:func:`orderstat_mu_lower`, :func:`gauss_mu_lower`).

    Attributes:
        mu_lower: μ̂ ≥ 0, valid at level ``alpha`` under the method's assumptions.
        epsilon_lower: μ̂ as ε at ``delta`` (Gaussian privacy profile; ``nan`` when no δ was given).
        optimistic: (orderstat) the best rung at level α, uncorrected for the choice of rung: not a valid bound.
        method: ``"orderstat"`` or ``"gauss"``.
        assumption: the assumption the bound rests on, in words.
        num_included, num_excluded: n₊ and n₋.
        tail: (orderstat) ``"in"`` (threshold from the excluded scores) or ``"out"`` (the mirror test); ``""`` else.
        rung: (orderstat) k of the reported test; ``tpr_low``, ``fpr_high``: its limits (gauss: 0 and nan).
        alpha, alpha_per_test, delta: the levels and δ; ``tests``: number of tests Bonferroni ran over.
    """

    mu_lower: float
    epsilon_lower: float
    optimistic: float
    method: str
    assumption: str
    num_included: int
    num_excluded: int
    tail: str
    rung: int
    tpr_low: float
    fpr_high: float
    alpha: float
    alpha_per_test: float
    delta: float
    tests: int

    def to_dict(self) -> dict:
        """Plain Python values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


INDEPENDENT = (
    "given the inclusion bits the canary scores are independent, included ones with one law, excluded ones with "
    "another (exact for Dirac gradient canaries scored released_minus_batch or likelihood_ratio; not for input canaries)"
)
GAUSSIAN = INDEPENDENT + ", and both laws are Gaussian with one variance (a model, not implied by DP)"


def orderstat_rungs(n: int) -> list:
    """The ranks k tried in one tail for n scores of the threshold's side: 0, 1, 2, 4, … below n/2 (fixed by n)."""
    if n <= 0:
        return []
    rungs, k = [0], 1
    while k < max(1, n // 2):
        rungs.append(k)
        k *= 2
    return rungs


def _split(scores: Any, included: Any) -> Tuple[np.ndarray, np.ndarray]:
    s, inc = _check_scores(scores, included)
    return s[inc], s[~inc]


def _rows(pos: np.ndarray, neg: np.ndarray) -> list:
    """Every test of both tails as (tail, k, positives above the threshold, n_pos, k, n_neg)."""
    rows = []
    neg_desc, pos_asc = np.sort(neg)[::-1], np.sort(pos)
    for k in orderstat_rungs(neg.size):
        rows.append(("in", k, int(np.sum(pos > neg_desc[k])), pos.size, neg.size))
    for k in orderstat_rungs(pos.size):
        rows.append(("out", k, int(np.sum(neg < pos_asc[k])), neg.size, pos.size))
    return rows


def _limits(tp: int, n_pos: int, k: int, n_neg: int, level: float) -> Tuple[float, float]:
    """(TPR lower, FPR upper) Clopper–Pearson limits, each one-sided at ``level``."""
    tpr_low = float(special.betaincinv(tp, n_pos - tp + 1, level)) if tp > 0 else 0.0
    fpr_high = float(special.betaincinv(k + 1, n_neg - k, 1.0 - level)) if k < n_neg else 1.0
    return tpr_low, fpr_high


def _mu_of(tpr_low: float, fpr_high: float) -> float:
    if tpr_low <= 0.0 or fpr_high >= 1.0:
        return 0.0
    return max(0.0, float(special.ndtri(tpr_low) - special.ndtri(fpr_high)))


def _best(rows: list, level: float) -> Tuple[float, tuple, float, float]:
    best = (0.0, rows[0] if rows else ("in", 0, 0, 0, 0), 0.0, 1.0)
    for row in rows:
        tail, k, tp, n_pos, n_neg = row
        tpr_low, fpr_high = _limits(tp, n_pos, k, n_neg, level)
        mu = _mu_of(tpr_low, fpr_high)
        if mu > best[0]:
            best = (mu, row, tpr_low, fpr_high)
    return best


def orderstat_mu_lower(scores: Any, included: Any, *, alpha: float = 0.05, delta: Optional[float] = None) -> FdpBound:
    """μ lower bound from the order statistics of the included and excluded scores (see the module docstring).

    Valid at level α under assumption (I) (independent, exchangeable canaries given their bits) for a run that is
    μ-GDP with respect to each canary; distribution-free otherwise (no Gaussian shape is assumed of the scores).

    Args:
        scores: one score per canary, higher = looks included (NaN not allowed).
        included: the canaries' Bernoulli(1/2) inclusion bits (checked by
            :func:`~lightning_privacy.analysis.canary.check_inclusion`).
        alpha: significance in (0, 1), Bonferroni over both tails' rungs (:func:`orderstat_rungs`).
        delta: when given, μ̂ is also reported as ε at this δ (Gaussian privacy profile).

    Returns:
        A :class:`FdpBound`.

    Raises:
        TypeError, ValueError: mismatched or bad inputs (named), a bad α or δ.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = rng.normal(size=1000) + 2.0 * included  # 2-GDP canaries: ε = 10.0 at δ = 1e-5
        >>> res = orderstat_mu_lower(scores, included, delta=1e-5)
        >>> round(res.mu_lower, 3), round(res.epsilon_lower, 2), res.tail, res.rung, res.tests
        (1.583, 7.52, 'in', 16, 19)
    """
    alpha = _check_alpha(alpha)
    delta = None if delta is None else _check_delta(delta)
    pos, neg = _split(scores, included)
    rows = _rows(pos, neg)
    tests = max(len(rows), 1)
    per_test = alpha / tests
    mu, row, tpr_low, fpr_high = _best(rows, per_test / 2.0)
    epsilon = math.nan if delta is None else _eps(mu, delta)
    limits = (row, tpr_low, fpr_high, alpha, per_test, tests)
    return _orderstat_bound(mu, epsilon, _best(rows, alpha / 2.0)[0], INDEPENDENT, pos, neg, limits, delta)


def _orderstat_bound(
    mu: float, epsilon: float, optimistic: float, assumption: str, pos: np.ndarray, neg: np.ndarray, limits: tuple,
    delta: Optional[float],
) -> FdpBound:  # fmt: skip
    """An order-statistic :class:`FdpBound` from its rung's ``limits`` (row, TPR low, FPR high, α, α per test, K)."""
    row, tpr_low, fpr_high, alpha, per_test, tests = limits
    return FdpBound(
        mu_lower=mu, epsilon_lower=epsilon, optimistic=optimistic, method="orderstat", assumption=assumption,
        num_included=int(pos.size), num_excluded=int(neg.size), tail=row[0], rung=int(row[1]), tpr_low=tpr_low,
        fpr_high=fpr_high, alpha=alpha, alpha_per_test=per_test, delta=math.nan if delta is None else delta,
        tests=tests,
    )  # fmt: skip


def _epsilon_delta_of(tpr_low: float, fpr_high: float, delta: float) -> float:
    """The least ε whose (ε, δ) curve allows TPR ``tpr_low`` at FPR ``fpr_high``: (ε, δ)-DP bounds every test by
    TPR ≤ δ + e^ε·FPR and 1 − TPR ≥ e^(−ε)·(1 − δ − FPR) (both orders of the pair), so a test with TPR ≥ tpr_low at
    FPR ≤ fpr_high refutes every smaller ε: max(0, log((tpr_low − δ)/fpr_high), log((1 − δ − fpr_high)/(1 − tpr_low)))."""
    out = 0.0
    if tpr_low > delta and fpr_high > 0.0:
        out = max(out, math.log((tpr_low - delta) / fpr_high))
    if tpr_low < 1.0 and 1.0 - delta - fpr_high > 0.0:
        out = max(out, math.log((1.0 - delta - fpr_high) / (1.0 - tpr_low)))
    return out


def orderstat_epsilon_lower(scores: Any, included: Any, *, delta: float, alpha: float = 0.05) -> FdpBound:
    """ε lower bound from the order statistics, read through the (ε, δ) trade-off curve: sound for *every*
    (ε, δ)-DP mechanism whose canaries are independent (assumption (I)), not only Gaussian ones.

    The same rungs, thresholds and Clopper–Pearson limits as :func:`orderstat_mu_lower` (each limit at α/(2K),
    Bonferroni over the K rungs of both tails); each rung's (TPR lower, FPR upper) pair refutes every ε below
    max(log((TPR − δ)/FPR), log((1 − δ − FPR)/(1 − TPR))) — the (ε, δ) curve of Kairouz et al. (2015), which every
    (ε, δ)-DP mechanism satisfies, in both orders of the pair. The largest over the rungs is the bound; ``mu_lower``
    is that rung's Φ⁻¹(TPR) − Φ⁻¹(FPR) (its Gaussian reading, for reference).

    Example::

        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = included + rng.laplace(scale=1.0, size=1000)  # Laplace canaries: (1, 0)-DP each
        >>> round(orderstat_epsilon_lower(scores, included, delta=1e-5).epsilon_lower, 3)  # ≤ 1 (the true ε)
        0.579
        >>> round(orderstat_mu_lower(scores, included, delta=1e-5).epsilon_lower, 3)  # the Gaussian reading: > 1
        2.796
    """
    alpha = _check_alpha(alpha)
    delta = _check_delta(delta)
    pos, neg = _split(scores, included)
    rows = _rows(pos, neg)
    tests = max(len(rows), 1)
    per_test = alpha / tests
    best = (0.0, rows[0] if rows else ("in", 0, 0, 0, 0), 0.0, 1.0)
    optimistic = 0.0
    for row in rows:
        tail, k, tp, n_pos, n_neg = row
        tpr_low, fpr_high = _limits(tp, n_pos, k, n_neg, per_test / 2.0)
        eps = _epsilon_delta_of(tpr_low, fpr_high, delta)
        if eps > best[0]:
            best = (eps, row, tpr_low, fpr_high)
        optimistic = max(optimistic, _epsilon_delta_of(*_limits(tp, n_pos, k, n_neg, alpha / 2.0), delta))
    eps, row, tpr_low, fpr_high = best
    assumption = INDEPENDENT + "; any (ε, δ)-DP mechanism (the (ε, δ) trade-off curve, no Gaussian shape)"
    limits = (row, tpr_low, fpr_high, alpha, per_test, tests)
    return _orderstat_bound(_mu_of(tpr_low, fpr_high), eps, optimistic, assumption, pos, neg, limits, delta)


def _eps(mu: float, delta: float) -> float:
    if delta == 0.0:
        return math.inf if mu > 0.0 else 0.0
    return _epsilon_from_mu(mu, delta)


def gauss_mu_lower(scores: Any, included: Any, *, alpha: float = 0.05, delta: Optional[float] = None) -> FdpBound:
    """μ lower bound from the continuous scores under a Gaussian model (see the module docstring, (I) and (G)).

    Exact (noncentral t) when the included and excluded scores are independent Gaussians with one variance and
    standardised shift μ; *not* a DP bound otherwise (a non-Gaussian score can show a shift above the true μ).

    Args:
        scores, included: as for :func:`orderstat_mu_lower` (at least 2 included and 2 excluded canaries).
        alpha: significance in (0, 1).
        delta: when given, μ̂ is also reported as ε at this δ.

    Returns:
        A :class:`FdpBound` (``tail`` ``""``, ``rung`` 0, ``tpr_low`` 0, ``fpr_high`` nan, one test).

    Raises:
        ValueError: fewer than 2 canaries on a side, scores that do not vary, bad α or δ.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = rng.normal(size=1000) + 2.0 * included
        >>> round(gauss_mu_lower(scores, included).mu_lower, 3)
        1.809
    """
    alpha = _check_alpha(alpha)
    delta = None if delta is None else _check_delta(delta)
    pos, neg = _split(scores, included)
    n1, n0 = pos.size, neg.size
    if n1 < 2 or n0 < 2:
        raise ValueError(
            f"Expected at least 2 included and 2 excluded canaries for method='gauss', but got {n1} and {n0}."
        )
    df = n1 + n0 - 2
    pooled = math.sqrt((np.sum((pos - pos.mean()) ** 2) + np.sum((neg - neg.mean()) ** 2)) / df)
    if not (pooled > 0.0 and math.isfinite(pooled)):
        raise ValueError(f"Expected `scores` that vary within each side and are finite, but got pooled sd {pooled!r}.")
    scale = math.sqrt(1.0 / n1 + 1.0 / n0)
    t_obs = float((pos.mean() - neg.mean()) / (pooled * scale))

    def excess(nc: float) -> float:  # P[T ≥ t_obs; nc] − α, increasing in nc
        return float(stats.nct.sf(t_obs, df, nc)) - alpha

    nc = 0.0
    if excess(0.0) <= 0.0:
        lo, hi = 0.0, max(1.0, 2.0 * t_obs)
        while excess(hi) <= 0.0:
            lo, hi = hi, 2.0 * hi
        nc = float(optimize.brentq(excess, lo, hi, xtol=_XTOL))
        while nc > 0.0 and excess(nc) > 0.0:  # rounding must not put it past the root
            nc = max(0.0, nc - 10 * _XTOL * max(1.0, nc))
    mu = nc * scale
    return FdpBound(
        mu_lower=mu,
        epsilon_lower=math.nan if delta is None else _eps(mu, delta),
        optimistic=mu,
        method="gauss",
        assumption=GAUSSIAN,
        num_included=int(n1),
        num_excluded=int(n0),
        tail="",
        rung=0,
        tpr_low=0.0,
        fpr_high=math.nan,
        alpha=alpha,
        alpha_per_test=alpha,
        delta=math.nan if delta is None else delta,
        tests=1,
    )


@dataclass(frozen=True)
class TightestBound:
    """Result of :func:`tightest_canary_bound`.

    Attributes:
        epsilon_lower: the largest of the estimators' ε lower bounds at δ, each at its level in ``levels``: valid at
            level ``alpha`` when the assumptions of every estimator in ``methods`` hold (for every (ε, δ)-DP
            mechanism when ``sound``: no Gaussian reading among them).
        method: the estimator that gave it (one of :data:`ALL_METHODS`).
        bounds: every estimator's ε lower bound (each at its level).
        methods, alpha, delta: what ran.
        alpha_per_method: the level of the estimator that gave the bound (α/K when α is split equally).
        levels: every estimator's level (its share of α); they sum to at most ``alpha``.
    """

    epsilon_lower: float
    method: str
    bounds: Dict[str, float]
    methods: Tuple[str, ...]
    alpha: float
    alpha_per_method: float
    delta: float
    levels: Dict[str, float]

    @property
    def sound(self) -> bool:
        """Valid for every (ε, δ)-DP mechanism: no Gaussian reading among ``methods``."""
        return not set(self.methods) & set(GAUSSIAN_READINGS)

    def to_dict(self) -> dict:
        """Plain Python values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def tightest_canary_bound(
    *,
    scores: Any,
    included: Any,
    delta: float,
    alpha: float = 0.05,
    methods: Sequence[str] = SOUND_DEFAULT,
    weights: Optional[Mapping[str, float]] = None,
    seed: int = 0,
) -> TightestBound:
    """The tightest ε lower bound among ``methods``, each run at its share of α, and which test gave it.

    Valid for every (ε, δ)-DP mechanism (:data:`SOUND_METHODS`): ``"binomial"`` (Steinke et al.) and ``"fdp"``
    (Mahloujifar et al.'s f-DP test of the (ε, δ) curve), with interacting canaries too; ``"orderstat"`` (the order
    statistics read through the (ε, δ) curve) only when the canaries are independent (assumption (I): white-box
    gradient canaries with the ``released_minus_batch`` or ``likelihood_ratio`` score). Gaussian readings
    (:data:`GAUSSIAN_READINGS`, lower bounds only for μ-GDP mechanisms): ``"gdp"`` (Gaussian f-DP test, needs δ > 0),
    ``"orderstat_gaussian"`` (under (I)) and ``"gauss"`` (under (I) and Gaussian scores of one variance: a model, not a
    guarantee). The grid estimators use the Bonferroni-corrected grid of
    :func:`~lightning_privacy.analysis.canary.canary_audit_from_scores`.

    Args:
        scores, included: the canary scores and their Bernoulli(1/2) inclusion bits.
        delta: δ of the ε reported, in [0, 1) (> 0 with a Gaussian reading: a Gaussian trade-off is (ε, 0)-DP for no
            finite ε).
        alpha: overall significance in (0, 1).
        methods: a non-empty subset of :data:`ALL_METHODS`, no repeats (default: ``("fdp",)``).
        weights: each method's share of α, positive and summing to at most 1 (Bonferroni), keyed by exactly the
            names in ``methods``; ``None`` splits α equally. Fix them before seeing the scores — shares chosen after
            looking make the bound invalid. :data:`INDEPENDENT_WEIGHTS` is the audit's choice for independent canaries.
        seed: tie-breaking order of the grid estimators.

    Returns:
        A :class:`TightestBound` (ties go to the first method in ``methods``).

    Raises:
        ValueError: an empty or unknown ``methods``, ``weights`` that do not match ``methods``, are not positive or
            sum to more than 1, δ = 0 with a Gaussian method, or bad inputs.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = rng.normal(size=1000) + 2.0 * included
        >>> res = tightest_canary_bound(scores=scores, included=included, delta=1e-5,
        ...                             methods=INDEPENDENT_METHODS, weights=INDEPENDENT_WEIGHTS)
        >>> res.method, res.sound, round(res.alpha_per_method, 4), {k: round(v, 2) for k, v in res.bounds.items()}
        ('fdp', True, 0.045, {'fdp': 2.97, 'orderstat': 2.46})
        >>> reading = tightest_canary_bound(scores=scores, included=included, delta=1e-5,
        ...                                 methods=("fdp", "orderstat_gaussian"))  # only if the mechanism is μ-GDP
        >>> reading.method, reading.sound, round(reading.epsilon_lower, 2)
        ('orderstat_gaussian', False, 7.35)
    """
    methods = tuple(methods)
    if not methods or len(set(methods)) != len(methods):
        raise ValueError(f"Expected `methods` to be a non-empty sequence without repeats, but got {methods!r}.")
    for name in methods:
        expect_choice("methods", name, ALL_METHODS)
    alpha, delta = _check_alpha(alpha), _check_delta(delta)
    if delta == 0.0 and set(methods) & set(GAUSSIAN_READINGS):
        raise ValueError(
            f"Expected argument `delta` > 0 with the Gaussian-trade-off methods {methods!r}, but got delta=0.0."
        )
    levels = {name: alpha * share for name, share in _shares(methods, weights).items()}

    def grid(method: str) -> Callable[[float], float]:  # the guess-grid tests of analysis.canary, one per method
        return lambda level: (
            canary_audit_from_scores(
                scores=scores, included=included, delta=delta, alpha=level, method=method, seed=seed
            ).epsilon_lower
        )

    runners: Dict[str, Callable[[float], float]] = {
        **{method: grid(method) for method in ("binomial", "gdp", "fdp")},
        "orderstat": lambda level: orderstat_epsilon_lower(scores, included, alpha=level, delta=delta).epsilon_lower,
        "orderstat_gaussian": lambda level: (
            orderstat_mu_lower(scores, included, alpha=level, delta=delta).epsilon_lower
        ),
        "gauss": lambda level: gauss_mu_lower(scores, included, alpha=level, delta=delta).epsilon_lower,
    }
    bounds = {name: float(runners[name](levels[name])) for name in methods}
    best = max(methods, key=lambda name: (bounds[name], -methods.index(name)))
    return TightestBound(bounds[best], best, bounds, methods, alpha, levels[best], delta, levels)


def _shares(methods: Tuple[str, ...], weights: Optional[Mapping[str, float]]) -> Dict[str, float]:
    """Each method's share of α: equal without ``weights``; else checked (same names, positive, sum ≤ 1)."""
    if weights is None:
        return {name: 1.0 / len(methods) for name in methods}
    if not isinstance(weights, Mapping) or set(weights) != set(methods):
        raise ValueError(
            f"Expected `weights` to be a mapping with exactly the keys of `methods` {methods!r}, but got {weights!r}."
        )
    shares = {
        name: expect_real(f"weights[{name!r}]", weights[name], low=0.0, high=1.0, low_open=True) for name in methods
    }
    if sum(shares.values()) > 1.0 + 1e-12:
        raise ValueError(
            f"Expected argument `weights` to sum to at most 1 (shares of α, Bonferroni), but got {weights!r} "
            f"(sum {sum(shares.values()):.6g})."
        )
    return shares


def orderstat_claim_test(scores: Any, included: Any, *, xi: Callable[[float], float], alpha: float) -> Dict[str, Any]:
    """The order-statistic test of a claim's trade-off curve (assumption (I)): the rung beyond it by the most.

    ``xi(x)``: a non-decreasing bound on the TPR at FPR x valid in both orders of the pair (e.g. the symmetric
    concave majorant of the claim's curve); the claim is rejected at level α when some rung's TPR lower limit
    exceeds ``xi`` at its FPR upper limit (each limit at α/(2K), Bonferroni over the K rungs of both tails).

    Returns:
        A test dict for :class:`~lightning_privacy.analysis.claims.ClaimVerdict` (``kind="orderstat"``; ``statistic``
        the TPR lower limit, ``bound`` the claim's TPR at the FPR upper limit, ``margin`` their difference).
    """
    alpha = _check_alpha(alpha)
    pos, neg = _split(scores, included)
    rows = _rows(pos, neg)
    level = alpha / max(len(rows), 1) / 2.0
    best: Optional[Dict[str, Any]] = None
    for tail, k, tp, n_pos, n_neg in rows:
        tpr_low, fpr_high = _limits(tp, n_pos, k, n_neg, level)
        bound = float(min(1.0, xi(fpr_high)))
        margin = tpr_low - bound
        if best is None or margin > best["margin"]:
            best = {
                "kind": "orderstat",
                "level": alpha,
                "level_per_limit": level,
                "tail": tail,
                "rung": int(k),
                "positives": int(tp),
                "tpr_low": tpr_low,
                "fpr_high": fpr_high,
                "statistic": tpr_low,
                "bound": bound,
                "margin": float(margin),
                "contradicts": bool(margin > 0.0),
            }
    if best is None:
        best = {"kind": "orderstat", "level": alpha, "statistic": 0.0, "bound": 1.0, "margin": -1.0}
        best["contradicts"] = False
    return best

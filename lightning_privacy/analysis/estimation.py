"""Estimating ε from membership-inference outcomes: Clopper-Pearson, Jeffreys and Bayesian intervals.

Implements Zanella-Béguelin, Wutschitz, Tople et al., "Bayesian Estimation of Differential Privacy"
(ICML 2023). A membership game repeated many times gives a confusion matrix (FN, TP, FP, TN); the
false-negative and false-positive rates of the attack locate a point (x, y) = (FNR, FPR) that every
(ε, δ)-DP mechanism must keep inside the privacy region of Kairouz et al.,

    R(ε, δ) = { x + e^ε y ≥ 1 − δ,  y + e^ε x ≥ 1 − δ,  y + e^ε x ≤ e^ε + δ,  x + e^ε y ≤ e^ε + δ }.

The smallest ε whose region holds the point is Equation 1 of the paper (clipped at 0):

    ε̂(x, y) = max{ 0, log((1 − δ − y)/x), log((1 − δ − x)/y) }.

Three ways to turn counts into an interval for ε̂ are implemented (:func:`epsilon_interval`):

* ``"clopper_pearson"`` and ``"jeffreys"``: per-rate intervals combined by the union bound (each rate
  at significance α/2), then the minimum and maximum of ε̂ over the whole rectangle (Section 2.5, 3.1).
* ``"bayes"`` (the paper's method, Section 3.2): FNR ~ Beta(½ + FN, ½ + TP) and FPR ~ Beta(½ + FP,
  ½ + TN) independently; the CDF of ε̂ is the posterior mass of the privacy region (Definition 3.1) and
  the interval is its equal-tailed credible interval (Equations 4 and 5).

The paper evaluates Definition 3.1 with ``scipy.integrate.dblquad``. Here the region is cut at fixed x
into an interval of y, so the CDF is a one-dimensional integral of Beta CDFs,

    F(ε) = ∫ f_FNR(x) · [F_FPR(hi(x)) − F_FPR(lo(x))]₊ dx,

computed with Gauss-Legendre panels whose edges sit at the posterior quantiles of both rates and at the
kinks of lo/hi, vectorised over ε. It agrees with adaptive quadrature to 1e-8 and is several hundred
times faster than the authors' ``dblquad`` (``benchmarks/estimation.py``).

**Region.** ``region="attack"`` (the default) keeps only the first two constraints, the ones an attack
that scores members higher can violate; ε̂ is then exactly Equation 1. ``region="full"`` uses all four
(Definition 3.1 verbatim, as in the authors' ``privacy-estimates`` package), which also credits the
complementary attack when FNR + FPR > 1 + δ. The two agree whenever the posterior puts no mass beyond
the diagonal (the worked example agrees to 1e-12). The default differs for a reason: for an attack with
no power the true point lies on the diagonal, which the full region only covers by a band of width δ, so
the equal-tailed Bayesian lower limit is positive almost every time (a false claim of leakage, e.g.
ε̂₋ = 0.0014 for FN = TP = FP = TN = 500 at δ = 1e−5, where the attack region gives 0). The attack region contains a half-plane
around the diagonal and keeps the nominal error rate (``tests/analysis/test_estimation.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from ._checks import expect_choice, expect_count, expect_real

__all__ = [
    "REVERSED_LEVEL",
    "EpsilonLowerBound",
    "ScoreOrientation",
    "epsilon_cdf",
    "epsilon_density",
    "epsilon_from_rates",
    "epsilon_interval",
    "epsilon_lower_bound",
    "max_informative_delta",
    "rate_interval",
    "counts_orientation",
    "roc_counts",
    "score_orientation",
]

METHODS = ("bayes", "jeffreys", "clopper_pearson")
SIDED = ("two", "one")
SELECTIONS = ("holdout", "bonferroni", "none")
REGIONS = ("attack", "full")
REVERSED_LEVEL = 1e-3
"""Significance at which scores "look reversed" (:func:`score_orientation`): members score lower than
non-members with a one-sided Mann-Whitney p-value below this. Small on purpose: an attack with no power
has AUC 0.5 and is flagged only once in a thousand games, while reversed scores of a real attack give
p-values far below it (e.g. 1e-40 for AUC 0.25 on 800 examples)."""

# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


_check_choice = expect_choice


def _check_delta(delta: Any) -> float:
    return expect_real("delta", delta, low=0.0, high=1.0, high_open=True)


def _check_alpha(alpha: Any) -> float:
    return expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)


_check_count = expect_count


def _check_counts(fn: Any, tp: Any, fp: Any, tn: Any) -> tuple[int, int, int, int]:
    fn, tp, fp, tn = (_check_count(n, v) for n, v in (("fn", fn), ("tp", tp), ("fp", fp), ("tn", tn)))
    if fn + tp == 0:
        raise ValueError(f"Expected at least one member trial (`fn` + `tp` > 0), but got fn={fn}, tp={tp}.")
    if fp + tn == 0:
        raise ValueError(f"Expected at least one non-member trial (`fp` + `tn` > 0), but got fp={fp}, tn={tn}.")
    return fn, tp, fp, tn


def _check_rate(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0):
        raise ValueError(f"Expected argument `{name}` to be in [0, 1], but got {value!r}.")
    return arr


# ---------------------------------------------------------------------------------------------------
# ε̂ of a point and over a rectangle
# ---------------------------------------------------------------------------------------------------


def _log_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """log(num/den) with the limits the region needs: num ≤ 0 → −inf (no constraint), den = 0 → +inf."""
    num, den = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
    out = np.full(num.shape, -np.inf)
    pos = num > 0
    zero_den = pos & (den <= 0)
    out[zero_den] = np.inf
    ok = pos & (den > 0)
    out[ok] = np.log(num[ok]) - np.log(den[ok])
    return out


def _eps_hat(x: np.ndarray, y: np.ndarray, delta: float, region: str) -> np.ndarray:
    """Smallest ε ≥ 0 with (x, y) in the region (vectorised; x = FNR, y = FPR)."""
    terms = [np.zeros(np.broadcast(x, y).shape), _log_ratio(1 - delta - y, x), _log_ratio(1 - delta - x, y)]
    if region == "full":
        terms += [_log_ratio(y - delta, 1 - x), _log_ratio(x - delta, 1 - y)]
    return np.maximum.reduce(np.broadcast_arrays(*terms))


def epsilon_from_rates(*, fnr: float, fpr: float, delta: float, region: str = "attack") -> float:
    """The smallest ε ≥ 0 whose privacy region contains the point (FNR, FPR) (Equation 1).

    Zero rates are exact limits, not errors: FPR = 0 with FNR < 1 − δ refutes every finite ε (returns
    ``inf``), and a point on or beyond the diagonal refutes nothing (returns 0).

    Args:
        fnr: false-negative rate of the attack, in [0, 1].
        fpr: false-positive rate of the attack, in [0, 1].
        delta: the δ of (ε, δ)-DP, in [0, 1).
        region: ``"attack"`` (Equation 1) or ``"full"`` (also the complementary test, Kairouz et al.).

    Returns:
        ε̂ as a float (``inf`` when no finite ε explains the point).

    Raises:
        ValueError: a rate outside [0, 1], ``delta`` outside [0, 1) or an unknown ``region``.

    Example::

        >>> round(epsilon_from_rates(fnr=0.35, fpr=0.25, delta=0.05), 4)
        0.8755
        >>> epsilon_from_rates(fnr=0.1, fpr=0.0, delta=1e-5)
        inf
        >>> epsilon_from_rates(fnr=0.6, fpr=0.5, delta=0.0)
        0.0
    """
    delta = _check_delta(delta)
    _check_choice("region", region, REGIONS)
    x, y = _check_rate("fnr", fnr), _check_rate("fpr", fpr)
    return float(_eps_hat(x, y, delta, region))


def _rectangle_interval(xl, xu, yl, yu, delta: float, region: str) -> tuple[np.ndarray, np.ndarray]:
    """Minimum and maximum of ε̂ over [xl, xu] × [yl, yu] (vectorised).

    ε̂ = max(0, D, I) with D (Equation 1) decreasing and I (complementary test) increasing in both
    rates; D > 0 only below the band x + y ∈ [1 − δ, 1 + δ] and I > 0 only above it. So the maximum is
    at one of the corners (xl, yl), (xu, yu); the minimum is 0 if the rectangle meets the band and the
    nearer of those corners otherwise — exact over the whole rectangle, edges included.
    """
    at_lo = _eps_hat(xl, yl, delta, region)
    at_hi = _eps_hat(xu, yu, delta, region)
    high = np.maximum(at_lo, at_hi)
    if region == "attack":
        low = at_hi
    else:
        meets_band = (np.asarray(xl) + yl <= 1 + delta) & (np.asarray(xu) + yu >= 1 - delta)
        low = np.where(meets_band, 0.0, np.minimum(at_lo, at_hi))
    return low, high


def rate_interval(k, n, *, alpha: float, method: str, sided: str = "two") -> tuple:
    """Confidence interval for a binomial proportion from k successes in n trials (vectorised).

    ``"clopper_pearson"``: [B(α/2; k, n−k+1), B(1−α/2; k+1, n−k)]; ``"jeffreys"``: the α/2 and 1−α/2
    quantiles of Beta(½ + k, ½ + n − k), with the lower limit 0 at k = 0 and the upper 1 at k = n
    (Section 3.1). ``sided="one"`` returns (0, upper limit at 1 − α).

    Args:
        k: successes (int or integer array).
        n: trials (same shape as ``k``), ``n ≥ 1``.
        alpha: significance in (0, 1).
        method: ``"clopper_pearson"`` or ``"jeffreys"``.
        sided: ``"two"`` or ``"one"``.

    Returns:
        (lower, upper) as floats, or arrays for array input.

    Example::

        >>> lo, hi = rate_interval(0, 1000, alpha=0.05, method="clopper_pearson", sided="one")
        >>> print(lo, round(hi, 6))
        0.0 0.002991
    """
    alpha = _check_alpha(alpha)
    _check_choice("method", method, ("clopper_pearson", "jeffreys"))
    _check_choice("sided", sided, SIDED)
    k_arr, n_arr = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    if np.any(n_arr < 1) or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise ValueError(f"Expected 0 <= `k` <= `n` and `n` >= 1, but got k={k!r}, n={n!r}.")
    tail = alpha / 2 if sided == "two" else alpha
    with np.errstate(all="ignore"):
        if method == "clopper_pearson":
            lower = special.betaincinv(k_arr, n_arr - k_arr + 1, tail)
            upper = special.betaincinv(k_arr + 1, n_arr - k_arr, 1 - tail)
        else:
            lower = special.betaincinv(k_arr + 0.5, n_arr - k_arr + 0.5, tail)
            upper = special.betaincinv(k_arr + 0.5, n_arr - k_arr + 0.5, 1 - tail)
    lower = np.where(k_arr == 0, 0.0, lower)
    upper = np.where(k_arr == n_arr, 1.0, upper)
    if sided == "one":
        lower = np.zeros_like(upper)
    if lower.ndim == 0:
        return float(lower), float(upper)
    return lower, upper


def _rect_eps_interval(fn, tp, fp, tn, *, delta, alpha, method, sided, region):
    """Vectorised rectangle interval for ε̂ (union bound: each rate at significance α/2)."""
    fn, tp, fp, tn = (np.asarray(v, dtype=float) for v in (fn, tp, fp, tn))
    xl, xu = rate_interval(fn, fn + tp, alpha=alpha / 2, method=method, sided=sided)
    yl, yu = rate_interval(fp, fp + tn, alpha=alpha / 2, method=method, sided=sided)
    low, high = _rectangle_interval(xl, xu, yl, yu, delta, region)
    if sided == "one":
        high = np.full(np.shape(low), np.inf)
    return low, high


# ---------------------------------------------------------------------------------------------------
# Bayesian posterior of ε̂ (Section 3.2, Appendix A.2)
# ---------------------------------------------------------------------------------------------------

# Quantile levels that cut each rate's posterior into panels: geometric in both tails (so that the
# x^(a-1) endpoint behaviour of a Beta(a<1, ·) density is smooth on every panel) and even in the bulk.
_TAIL = 10.0 ** -np.arange(1.0, 16.0, 1.0)
_U_LEVELS = np.unique(np.concatenate([_TAIL, np.linspace(0.0, 1.0, 11)[1:-1], 1.0 - _TAIL]))
_U_LEVELS = _U_LEVELS[(_U_LEVELS > 0) & (_U_LEVELS < 1)]
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(6)


class _Posterior:
    """Independent Beta posteriors of FNR (x) and FPR (y) under Jeffreys priors (Equation 2)."""

    def __init__(self, fn: int, tp: int, fp: int, tn: int) -> None:
        self.ax, self.bx = fn + 0.5, tp + 0.5
        self.ay, self.by = fp + 0.5, tn + 0.5
        self.x_levels = special.betaincinv(self.ax, self.bx, _U_LEVELS)
        self.y_levels = special.betaincinv(self.ay, self.by, _U_LEVELS)
        self._log_norm_x = special.betaln(self.ax, self.bx)
        self._log_norm_y = special.betaln(self.ay, self.by)

    def pdf_x(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.exp((self.ax - 1) * np.log(x) + (self.bx - 1) * np.log1p(-x) - self._log_norm_x)
        return np.where((x > 0) & (x < 1), out, 0.0)

    def pdf_y(self, y: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.exp((self.ay - 1) * np.log(y) + (self.by - 1) * np.log1p(-y) - self._log_norm_y)
        return np.where((y > 0) & (y < 1), out, 0.0)

    def cdf_y(self, y: np.ndarray) -> np.ndarray:
        return special.betainc(self.ay, self.by, np.clip(y, 0.0, 1.0))

    def mode(self) -> tuple[float, float]:
        """Posterior mode of (FNR, FPR) (a rate whose Beta has a < 1 has its mode at 0)."""

        def one(a, b):
            if a <= 1:
                return 0.0
            if b <= 1:
                return 1.0
            return (a - 1) / (a + b - 2)

        return one(self.ax, self.bx), one(self.ay, self.by)


def _panels(post: _Posterior, e: np.ndarray, delta: float, region: str):
    """Gauss-Legendre nodes/weights in x for each ε (rows), with panel edges at every kink."""
    yq = post.y_levels[None, :]
    edges = [
        np.zeros_like(e),
        np.ones_like(e),
        np.broadcast_to(post.x_levels[None, :], (e.shape[0], post.x_levels.size)),
        # x where lo(x) crosses each y quantile, and lo's kinks
        np.maximum((1 - delta - yq) / e, 1 - delta - yq * e),
        (1 - delta) / (1 + e),
        np.full_like(e, 1 - delta),
    ]
    if region == "full":
        edges += [
            np.minimum(1 - (yq - delta) / e, delta + (1 - yq) * e),
            np.full_like(e, delta),
            1 - (1 - delta) / (1 + e),
        ]
    edges = np.sort(np.clip(np.concatenate(edges, axis=1), 0.0, 1.0), axis=1)
    a, b = edges[:, :-1, None], edges[:, 1:, None]
    half = (b - a) / 2
    nodes = (a + b) / 2 + half * _GL_NODES
    weights = half * _GL_WEIGHTS
    return nodes.reshape(e.shape[0], -1), weights.reshape(e.shape[0], -1)


def _lo_hi(x: np.ndarray, e: np.ndarray, delta: float, region: str):
    """The slice [lo(x), hi(x)] of the region in y, and their derivatives in ε (unclipped branches)."""
    branch_a = 1 - delta - e * x  # active for x < (1 − δ)/(1 + e^ε)
    branch_b = (1 - delta - x) / e
    lo = np.maximum(0.0, np.maximum(branch_a, branch_b))
    dlo = np.where(lo <= 0, 0.0, np.where(branch_a >= branch_b, -e * x, -(1 - delta - x) / e))
    if region == "attack":
        return lo, np.ones_like(lo), dlo, np.zeros_like(lo)
    branch_c = 1 + (delta - x) / e  # active for δ ≤ x < 1 − (1 − δ)/(1 + e^ε)
    branch_d = delta + (1 - x) * e
    hi = np.minimum(1.0, np.minimum(branch_c, branch_d))
    dhi = np.where(hi >= 1, 0.0, np.where(branch_c <= branch_d, (x - delta) / e, (1 - x) * e))
    return lo, hi, dlo, dhi


def _check_epsilons(epsilon: Any) -> np.ndarray:
    eps = np.asarray(epsilon, dtype=float)
    if np.any(np.isnan(eps)) or np.any(eps < 0):
        raise ValueError(f"Expected argument `epsilon` to be non-negative, but got {epsilon!r}.")
    return eps


_MAX_EPS = 700.0  # e^ε stays finite in float64


def _cdf(post: _Posterior, eps: np.ndarray, delta: float, region: str) -> np.ndarray:
    flat = np.minimum(eps.reshape(-1), _MAX_EPS)
    e = np.exp(flat)[:, None]
    x, w = _panels(post, e, delta, region)
    lo, hi, _, _ = _lo_hi(x, e, delta, region)
    if region == "attack":  # hi ≡ 1
        mass = special.betainc(post.by, post.ay, 1.0 - lo)  # = 1 − F_FPR(lo), accurate in the upper tail
    else:
        mass = np.clip(post.cdf_y(hi) - post.cdf_y(lo), 0.0, 1.0) * (hi > lo)
    out = np.clip(np.sum(w * post.pdf_x(x) * mass, axis=1), 0.0, 1.0)
    out = np.where(np.isinf(eps.reshape(-1)), 1.0, out)
    return out.reshape(eps.shape)


def epsilon_cdf(epsilon, *, fn: int, tp: int, fp: int, tn: int, delta: float, region: str = "attack"):
    """Posterior CDF of ε̂, F(ε) = Pr[(FNR, FPR) ∈ R(ε, δ)] (Definition 3.1), vectorised over ε.

    Args:
        epsilon: one ε ≥ 0 or an array of them.
        fn, tp, fp, tn: the confusion matrix of the membership game.
        delta: the δ of (ε, δ)-DP, in [0, 1).
        region: ``"attack"`` (Equation 1, default) or ``"full"`` (Definition 3.1 verbatim).

    Returns:
        F(ε) with the shape of ``epsilon`` (a float for a scalar). F(0) > 0 is the point mass of ε̂ at 0.

    Example::

        >>> print(epsilon_cdf([0.522, 1.268], fn=35, tp=65, fp=25, tn=75, delta=0.05).round(3))
        [0.025 0.975]
    """
    delta = _check_delta(delta)
    _check_choice("region", region, REGIONS)
    post = _Posterior(*_check_counts(fn, tp, fp, tn))
    eps = _check_epsilons(epsilon)
    out = _cdf(post, eps, delta, region)
    return float(out) if out.ndim == 0 else out


def epsilon_density(epsilon, *, fn: int, tp: int, fp: int, tn: int, delta: float, region: str = "attack"):
    """Posterior density of ε̂ for ε > 0 (Appendix A.2, Equation 12), vectorised over ε.

    The boundary integral of Equation 12 in the parameterisation x ↦ (x, lo(x)), (x, hi(x)):
    f(ε) = ∫ f_FNR(x)·[f_FPR(hi)·∂hi/∂ε − f_FPR(lo)·∂lo/∂ε] dx. It integrates to 1 − F(0); the rest is
    the point mass F(0) at ε = 0 (Equation 13), available from :func:`epsilon_cdf`.

    Args:
        epsilon: one ε > 0 or an array of them.
        fn, tp, fp, tn: the confusion matrix of the membership game.
        delta: the δ of (ε, δ)-DP, in [0, 1).
        region: ``"attack"`` (default) or ``"full"``.

    Returns:
        The density with the shape of ``epsilon``.

    Example::

        >>> f = epsilon_density([0.5, 0.9, 1.3], fn=35, tp=65, fp=25, tn=75, delta=0.05)
        >>> bool(f[1] > f[0] > 0 and f[1] > f[2] > 0)
        True
    """
    delta = _check_delta(delta)
    _check_choice("region", region, REGIONS)
    post = _Posterior(*_check_counts(fn, tp, fp, tn))
    eps = _check_epsilons(epsilon)
    flat = np.minimum(eps.reshape(-1), _MAX_EPS)
    e = np.exp(flat)[:, None]
    x, w = _panels(post, e, delta, region)
    lo, hi, dlo, dhi = _lo_hi(x, e, delta, region)
    inside = hi > lo
    flux = post.pdf_y(hi) * dhi - post.pdf_y(lo) * dlo
    out = np.sum(w * post.pdf_x(x) * np.where(inside, flux, 0.0), axis=1).reshape(eps.shape)
    return float(out) if out.ndim == 0 else out


def _bayes_quantile(post: _Posterior, level: float, delta: float, region: str) -> float:
    """ε at which the posterior CDF crosses ``level``: sup{ε : F(ε) ≤ level} (= inf{F ≥ level})."""

    def f(eps: float) -> float:
        return float(_cdf(post, np.array([eps]), delta, region)[0]) - level

    if f(0.0) > 0:
        return 0.0
    hi = 1.0
    while f(hi) <= 0:
        if hi >= _MAX_EPS:
            return math.inf
        hi = min(2 * hi, _MAX_EPS)
    lo = hi / 2 if hi > 1.0 else 0.0
    return float(optimize.brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))


def _bayes_interval(fn, tp, fp, tn, *, delta, alpha, sided, region) -> tuple[float, float]:
    post = _Posterior(fn, tp, fp, tn)
    if sided == "one":
        return _bayes_quantile(post, alpha, delta, region), math.inf
    return _bayes_quantile(post, alpha / 2, delta, region), _bayes_quantile(post, 1 - alpha / 2, delta, region)


def epsilon_interval(
    *,
    fn: int,
    tp: int,
    fp: int,
    tn: int,
    delta: float,
    alpha: float = 0.05,
    method: str = "bayes",
    sided: str = "two",
    region: str = "attack",
) -> tuple[float, float]:
    """A 100(1 − α)% interval for ε̂ from the confusion matrix of a membership game.

    ``method="bayes"``: equal-tailed credible interval of the joint posterior (Equations 4, 5);
    ``sided="one"`` gives sup{ε : F(ε) ≤ α} (Section 3.3). ``"jeffreys"`` / ``"clopper_pearson"``:
    each rate's interval at significance α/2 (union bound), then the min and max of ε̂ over the
    rectangle; one-sided uses the one-sided upper limits at 1 − α/2 (footnote 2). Zero counts are
    handled exactly (e.g. FP = FN = 0 gives a finite lower and an infinite upper limit).

    Args:
        fn, tp, fp, tn: false negatives, true positives, false positives, true negatives (ints ≥ 0, with
            at least one member and one non-member trial).
        delta: the δ of (ε, δ)-DP, in [0, 1).
        alpha: significance in (0, 1).
        method: ``"bayes"``, ``"jeffreys"`` or ``"clopper_pearson"``.
        sided: ``"two"`` or ``"one"`` (returns ``(lower, inf)``).
        region: ``"attack"`` (Equation 1, default) or ``"full"`` (see the module docstring).

    Returns:
        ``(lower, upper)`` as floats.

    Raises:
        TypeError, ValueError: bad counts, δ, α or an unknown method/sided/region, naming the argument.

    Example::

        >>> for m in ("bayes", "jeffreys", "clopper_pearson"):
        ...     lo, hi = epsilon_interval(fn=35, tp=65, fp=25, tn=75, delta=0.05, alpha=0.05, method=m)
        ...     print(m, round(lo, 3), round(hi, 3))
        bayes 0.522 1.267
        jeffreys 0.321 1.456
        clopper_pearson 0.295 1.489
    """
    fn, tp, fp, tn = _check_counts(fn, tp, fp, tn)
    delta, alpha = _check_delta(delta), _check_alpha(alpha)
    _check_choice("method", method, METHODS)
    _check_choice("sided", sided, SIDED)
    _check_choice("region", region, REGIONS)
    if method == "bayes":
        return _bayes_interval(fn, tp, fp, tn, delta=delta, alpha=alpha, sided=sided, region=region)
    low, high = _rect_eps_interval(fn, tp, fp, tn, delta=delta, alpha=alpha, method=method, sided=sided, region=region)
    return float(low), float(high)


def max_informative_delta(
    *,
    members: int,
    nonmembers: int,
    alpha: float = 0.05,
    method: str = "bayes",
    sided: str = "two",
    region: str = "attack",
) -> float:
    """The δ from which no outcome of a membership game of this size gives an ε lower bound above 0.

    At ε = 0, (ε, δ)-DP already allows every attack with FNR + FPR ≥ 1 − δ (an advantage TPR − FPR ≤ δ), so a
    lower limit above 0 needs an attack whose two error rates are, at confidence 1 − α, below that line. No
    outcome shows more than a perfect attack (FN = FP = 0): its rates' upper confidence limits shrink with the
    number of trials but never reach 0, so its lower limit is positive only for δ below
    1 − (the two upper limits) for the rectangle methods, and below a similar value for the posterior. From that
    δ on every interval's lower end is 0 whatever the attack does: the game cannot tell anything about ε, though
    the formula accepts any δ < 1. δ is a probability of failing outright, so a DP claim worth testing has a
    far smaller one (≤ 1/n for n training rows).

    Found by bisection (the lower limit falls as δ grows) and rounded down to 1e-4, so every δ below the returned
    value can show ε > 0. ``0.0`` when even δ = 0 cannot (too few trials for this α).

    Args:
        members, nonmembers: member and non-member trials of the game (ints ≥ 1).
        alpha, method, sided, region: as for :func:`epsilon_interval`.

    Raises:
        TypeError, ValueError: bad counts, α or an unknown method/sided/region, naming the argument.

    Example::

        >>> max_informative_delta(members=100, nonmembers=100, method="clopper_pearson")
        0.9142
        >>> max_informative_delta(members=10, nonmembers=10, method="clopper_pearson")
        0.2903
        >>> max_informative_delta(members=1, nonmembers=1)  # no δ: one trial of each cannot refute ε = 0
        0.0
    """
    members, nonmembers = _check_count("members", members), _check_count("nonmembers", nonmembers)
    if members < 1 or nonmembers < 1:
        raise ValueError(
            f"Expected at least one member and one non-member trial, but got members={members}, "
            f"nonmembers={nonmembers}."
        )
    settings = dict(fn=0, tp=members, fp=0, tn=nonmembers, alpha=alpha, method=method, sided=sided, region=region)

    def informative(delta: float) -> bool:
        return epsilon_interval(delta=delta, **settings)[0] > 0

    if not informative(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > 2e-5:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if informative(mid) else (lo, mid)
    return math.floor(lo * 1e4) / 1e4


# ---------------------------------------------------------------------------------------------------
# From attack scores to a lower bound (Section 4)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpsilonLowerBound:
    """Result of :func:`epsilon_lower_bound`.

    Attributes:
        epsilon_lower: the lower bound on ε (``interval_low``; 0 when nothing is refuted).
        interval_low, interval_high: the interval for ε̂ at the chosen threshold (``inf`` high when
            one-sided).
        threshold: the decision rule is "member iff score ≥ threshold" (``inf``: nobody is a member).
        tp, fp, tn, fn: the confusion matrix the bound was computed from (the held-out half for
            ``selection="holdout"``).
        optimistic: True for ``selection="none"``: the best of many tests, with no correction.
        method, selection, alpha, delta: the settings; ``alpha_per_test`` is the significance each
            threshold was tested at (α / number of thresholds for Bonferroni).
        n_thresholds: how many thresholds were compared.
        warnings: why the bound may carry no information: scores that look reversed
            (:func:`score_orientation` on all the scores, at :data:`REVERSED_LEVEL`).
    """

    epsilon_lower: float
    interval_low: float
    interval_high: float
    threshold: float
    tp: int
    fp: int
    tn: int
    fn: int
    optimistic: bool
    method: str
    selection: str
    alpha: float
    alpha_per_test: float
    delta: float
    n_thresholds: int
    warnings: tuple = ()

    def as_dict(self) -> dict:
        """Plain Python values (floats, ints, bool, str; ``warnings`` as a list of str)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["warnings"] = list(self.warnings)
        return out


@dataclass(frozen=True)
class ScoreOrientation:
    """Result of :func:`score_orientation`.

    Attributes:
        auc: P(member score > non-member score) + ½ P(tie), the area under the ROC curve of the rule
            "member iff score ≥ t" (0.5: no power; below: members score *lower*).
        pvalue: one-sided Mann-Whitney p-value of "members score lower than non-members".
        reversed: ``pvalue < level``: the scores look reversed.
        level: the significance used.
    """

    auc: float
    pvalue: float
    reversed: bool
    level: float

    def warning(self, fix: str = "if lower means member, negate them") -> str:
        """The one-sentence warning for reversed-looking scores, ending with ``fix``."""
        return (
            f"the scores look reversed: members score lower than non-members (AUC = {self.auc:.3f} < 0.5, one-sided "
            f"test p = {self.pvalue:.2g} < {self.level:g}), so the rule 'member iff score >= t' finds no leakage and "
            f"a bound of 0 says nothing about privacy; {fix}"
        )


def score_orientation(scores, is_member, *, level: float = REVERSED_LEVEL) -> ScoreOrientation:
    """Whether membership scores look reversed: members scoring significantly *lower* than non-members.

    A threshold attack calls "member" the examples scoring at least ``t``. Scores of the wrong orientation
    (e.g. losses passed where higher must mean member) give an AUC well below 0.5 and a lower bound of 0,
    although the negated scores may give a large one. The criterion is objective: the one-sided
    Mann-Whitney U test of "members score lower" (ties count half; exact for tiny samples, normal
    approximation with tie correction otherwise) rejects at ``level`` (default :data:`REVERSED_LEVEL`).

    Args:
        scores: attack scores (higher = more likely a member).
        is_member: ground-truth membership (bool or 0/1), same length.
        level: significance of the test, in (0, 1).

    Returns:
        A :class:`ScoreOrientation`. With no member or no non-member: AUC ``nan``, p-value 1, not reversed.

    Example::

        >>> member = np.r_[np.ones(200, bool), np.zeros(200, bool)]
        >>> losses = np.random.default_rng(0).normal(loc=-1.0 * member)  # low = member: losses, not scores
        >>> res = score_orientation(losses, member)
        >>> round(res.auc, 2), res.reversed, score_orientation(-losses, member).reversed
        (0.26, True, False)
    """
    level = expect_real("level", level, low=0.0, high=1.0, low_open=True, high_open=True)
    s, m = _check_scores(scores, is_member)
    members, nonmembers = s[m], s[~m]
    if members.size == 0 or nonmembers.size == 0:
        return ScoreOrientation(auc=float("nan"), pvalue=1.0, reversed=False, level=level)
    test = stats.mannwhitneyu(members, nonmembers, alternative="less")
    auc = float(test.statistic) / (members.size * nonmembers.size)
    pvalue = float(test.pvalue)
    return ScoreOrientation(auc=auc, pvalue=pvalue, reversed=bool(pvalue < level), level=level)


def counts_orientation(*, fn: int, tp: int, fp: int, tn: int, level: float = REVERSED_LEVEL) -> ScoreOrientation:
    """:func:`score_orientation` for a game given as counts: do the guesses look reversed?

    The attack's guesses are the scores (1 = "member"); its AUC is ``(TPR + 1 − FPR) / 2`` and the test is
    Fisher's exact one-sided test of "members are guessed 'member' less often than non-members".

    Example::

        >>> res = counts_orientation(fn=70, tp=30, fp=60, tn=40)  # TPR 0.3 < FPR 0.6
        >>> round(res.auc, 2), res.reversed
        (0.35, True)
    """
    level = expect_real("level", level, low=0.0, high=1.0, low_open=True, high_open=True)
    fn, tp, fp, tn = _check_counts(fn, tp, fp, tn)
    auc = (tp / (tp + fn) + tn / (fp + tn)) / 2
    pvalue = float(stats.fisher_exact([[tp, fn], [fp, tn]], alternative="less").pvalue)
    return ScoreOrientation(auc=float(auc), pvalue=pvalue, reversed=bool(pvalue < level), level=level)


def _check_scores(scores: Any, is_member: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float).reshape(-1)
    m = np.asarray(is_member).reshape(-1)
    if s.shape != m.shape:
        raise ValueError(
            f"Expected `scores` and `is_member` to have the same number of elements, got {s.size} and {m.size}."
        )
    if np.any(np.isnan(s)):
        raise ValueError("Expected argument `scores` to contain no NaN, but it does.")
    if m.dtype != bool:
        if not np.all((m == 0) | (m == 1)):
            raise ValueError(
                f"Expected argument `is_member` to hold 0/1 or booleans, but got values {np.unique(m)[:5]}."
            )
        m = m.astype(bool)
    return s, m


def roc_counts(scores, is_member) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Confusion matrix at every ROC threshold of the rule "member iff score ≥ t" (vectorised).

    The thresholds are ``inf`` (nobody is a member) followed by the distinct scores in decreasing order:
    N + 1 of them for N distinct scores.

    Args:
        scores: attack scores, higher = more likely a member.
        is_member: ground-truth membership (bool or 0/1), same length.

    Returns:
        ``(thresholds, tp, fp, tn, fn)`` as numpy arrays.

    Example::

        >>> t, tp, fp, tn, fn = roc_counts([0.9, 0.2, 0.7, 0.2], [1, 0, 1, 1])
        >>> print(t.tolist(), tp.tolist(), fp.tolist())
        [inf, 0.9, 0.7, 0.2] [0, 1, 2, 3] [0, 0, 0, 1]
    """
    s, m = _check_scores(scores, is_member)
    order = np.argsort(-s, kind="stable")
    s_sorted, m_sorted = s[order], m[order]
    tp_cum = np.cumsum(m_sorted)
    fp_cum = np.cumsum(~m_sorted)
    last_of_group = np.r_[s_sorted[1:] != s_sorted[:-1], True] if s.size else np.zeros(0, bool)
    thresholds = np.r_[np.inf, s_sorted[last_of_group]]
    tp = np.r_[0, tp_cum[last_of_group]].astype(np.int64)
    fp = np.r_[0, fp_cum[last_of_group]].astype(np.int64)
    n_pos, n_neg = int(m.sum()), int((~m).sum())
    return thresholds, tp, fp, n_neg - fp, n_pos - tp


def _lower_limits(fn, tp, fp, tn, *, delta, alpha, method, sided, region) -> np.ndarray:
    """Lower limit of ε̂ for every confusion matrix (exact; Bayesian ones pruned by a cheap bound)."""
    if method != "bayes":
        low, _ = _rect_eps_interval(fn, tp, fp, tn, delta=delta, alpha=alpha, method=method, sided=sided, region=region)
        return np.asarray(low, dtype=float)
    tail = alpha / 2 if sided == "two" else alpha
    fn, tp, fp, tn = (np.asarray(v, dtype=float) for v in (fn, tp, fp, tn))
    bound = _lower_limit_upper_bound(fn, tp, fp, tn, delta=delta, tail=tail, region=region)
    out = np.zeros(fn.shape)
    best = 0.0
    for j in np.argsort(-bound, kind="stable"):
        if bound[j] <= best:
            break
        post = _Posterior(int(fn[j]), int(tp[j]), int(fp[j]), int(tn[j]))
        # the lower limit exceeds `best` only if F(best) < tail: one CDF evaluation settles most
        if best > 0 and _cdf(post, np.array([best]), delta, region)[0] >= tail:
            continue
        out[j] = _bayes_quantile(post, tail, delta, region)
        best = max(best, out[j])
    return out


def _lower_limit_upper_bound(fn, tp, fp, tn, *, delta, tail, region) -> np.ndarray:
    """Cheap upper bounds on the Bayesian lower limits sup{ε : F(ε) ≤ tail} (vectorised).

    A box [a, c] × [b, d] of posterior mass > tail that lies inside R(ε*) gives F(ε*) > tail, hence
    lower limit ≤ ε*. With c = d = 1 (attack region) the box [a, 1] × [b, 1] lies in R(ε̂(a, b)) because
    ε̂ decreases in both rates; its mass P[X ≥ a]·P[Y ≥ b] is split as tail^w · tail^(1−w) over a grid of
    w, keeping the smallest ε*. For the full region the box is also capped above (c, d < 1).
    """
    c = 1 + 1e-6
    if region == "attack":
        weights = np.linspace(0.1, 0.9, 9)[:, None]
        px, py = c * tail**weights, c * tail ** (1 - weights)
        a = special.betaincinv(fn + 0.5, tp + 0.5, 1 - px)
        b = special.betaincinv(fp + 0.5, tn + 0.5, 1 - py)
        return np.min(_eps_hat(a, b, delta, region), axis=0)
    s = math.sqrt(tail) * c
    r = 0.01 * s
    q = 1 - s - r  # each rate in [Q(q), Q(1 − r)]: mass ≥ (1 − q − r)² = s² > tail
    a, b = special.betaincinv(fn + 0.5, tp + 0.5, q), special.betaincinv(fp + 0.5, tn + 0.5, q)
    cx, cy = special.betaincinv(fn + 0.5, tp + 0.5, 1 - r), special.betaincinv(fp + 0.5, tn + 0.5, 1 - r)
    return np.maximum(_eps_hat(a, b, delta, region), _eps_hat(cx, cy, delta, region))


def _sweep(s, m, *, delta, alpha, method, sided, region):
    """Best threshold by lower limit (ties broken by the point estimate ε̂ at the observed rates)."""
    thresholds, tp, fp, tn, fn = roc_counts(s, m)
    if region == "attack":
        # A threshold whose next-lower neighbour adds only members is dominated by it: same FP, more
        # TP, so a stochastically smaller FNR and a lower limit at least as large (every method).
        keep = np.r_[np.diff(fp) > 0, True]
        thresholds, tp, fp, tn, fn = (v[keep] for v in (thresholds, tp, fp, tn, fn))
    lower = _lower_limits(fn, tp, fp, tn, delta=delta, alpha=alpha, method=method, sided=sided, region=region)
    point = _eps_hat(fn / np.maximum(fn + tp, 1), fp / np.maximum(fp + tn, 1), delta, region)
    best = np.lexsort((-np.nan_to_num(point, posinf=1e300), -lower))[0]
    return thresholds[best], float(lower[best])


def epsilon_lower_bound(
    scores,
    is_member,
    *,
    delta: float,
    alpha: float = 0.05,
    method: str = "bayes",
    selection: str = "holdout",
    sided: str = "two",
    region: str = "attack",
    seed: int = 0,
) -> EpsilonLowerBound:
    """Lower bound on ε from membership scores: the best ROC threshold, corrected for choosing it.

    Every threshold of the rule "member iff score ≥ t" gives a confusion matrix and an interval for ε̂
    (:func:`epsilon_interval`); the paper reports the largest lower limit over all N + 1 thresholds
    (Section 4). That maximum is the best of many tests, so its nominal level no longer holds.
    ``selection`` decides what guarantee survives:

    * ``"holdout"`` (default): a random half (stratified by membership, from ``seed``) picks the
      threshold; the bound is computed on the other half, which played no part in the choice, so the
      single test keeps its level. Costs half the samples.
    * ``"bonferroni"``: every threshold is tested at α / (number of thresholds); valid for any choice.
    * ``"none"``: all data, no correction — the common practice of other tools. The result has
      ``optimistic=True``: the level α does not hold for it.

    Args:
        scores: attack scores (higher = more likely a member), any array-like of floats.
        is_member: ground-truth membership, booleans or 0/1, same length.
        delta: the δ of (ε, δ)-DP, in [0, 1).
        alpha: significance in (0, 1).
        method: ``"bayes"``, ``"jeffreys"`` or ``"clopper_pearson"``.
        selection: ``"holdout"``, ``"bonferroni"`` or ``"none"``.
        sided: ``"two"`` (equal-tailed interval, Equation 4; default) or ``"one"`` (one-sided lower
            bound at level α, tighter; ``interval_high`` is then ``inf``).
        region: ``"attack"`` (default) or ``"full"`` (see the module docstring).
        seed: seed of the holdout split.

    Returns:
        An :class:`EpsilonLowerBound`; its ``warnings`` say when the scores look reversed (members scoring
        significantly lower, :func:`score_orientation`): then a bound of 0 says nothing, and the negated
        scores may give a large one.

    Raises:
        ValueError: mismatched or NaN inputs, too few members/non-members, bad settings.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> member = np.r_[np.ones(500, bool), np.zeros(500, bool)]
        >>> scores = rng.normal(loc=2.0 * member)  # a strong attack
        >>> res = epsilon_lower_bound(scores, member, delta=1e-5, method="clopper_pearson")
        >>> res.optimistic, res.epsilon_lower > 0.5, res.tp + res.fn, res.fp + res.tn
        (False, True, 250, 250)
    """
    delta, alpha = _check_delta(delta), _check_alpha(alpha)
    _check_choice("method", method, METHODS)
    _check_choice("selection", selection, SELECTIONS)
    _check_choice("sided", sided, SIDED)
    _check_choice("region", region, REGIONS)
    s, m = _check_scores(scores, is_member)
    n_pos, n_neg = int(m.sum()), int((~m).sum())
    need = 2 if selection == "holdout" else 1
    if n_pos < need or n_neg < need:
        raise ValueError(
            f"Expected at least {need} members and {need} non-members for selection={selection!r}, "
            f"but got {n_pos} members and {n_neg} non-members."
        )
    orientation = score_orientation(s, m)
    settings = dict(delta=delta, method=method, sided=sided, region=region)
    if selection == "holdout":
        rng = np.random.default_rng(seed)
        pick = np.zeros(s.size, dtype=bool)
        for cls in (m, ~m):
            idx = rng.permutation(np.flatnonzero(cls))
            pick[idx[: idx.size // 2]] = True
        n_thresholds = int(np.unique(s[pick]).size) + 1
        threshold, _ = _sweep(s[pick], m[pick], alpha=alpha, **settings)
        s, m = s[~pick], m[~pick]
        alpha_test = alpha
    else:
        n_thresholds = int(np.unique(s).size) + 1
        alpha_test = alpha / n_thresholds if selection == "bonferroni" else alpha
        threshold, _ = _sweep(s, m, alpha=alpha_test, **settings)
    predicted = s >= threshold
    tp, fp = int(np.sum(predicted & m)), int(np.sum(predicted & ~m))
    fn, tn = int(m.sum()) - tp, int((~m).sum()) - fp
    low, high = epsilon_interval(fn=fn, tp=tp, fp=fp, tn=tn, alpha=alpha_test, **settings)
    return EpsilonLowerBound(
        epsilon_lower=low,
        interval_low=low,
        interval_high=high,
        threshold=float(threshold),
        tp=tp,
        fp=fp,
        tn=tn,
        fn=fn,
        optimistic=selection == "none",
        method=method,
        selection=selection,
        alpha=alpha,
        alpha_per_test=alpha_test,
        delta=delta,
        n_thresholds=n_thresholds,
        warnings=(orientation.warning(),) if orientation.reversed else (),
    )

"""Epsilon*: empirical privacy of one trained model instance from its loss distributions.

Negoescu et al., "Epsilon*: Privacy Metric for Machine Learning Models", AAAI PPAI-24
(arXiv:2307.11280). An attacker thresholds the per-example loss ``l`` and says "member" when
``l <= tau``. With the population (non-member) loss CDF ``F_pop`` and the training (member) loss
CDF ``F_tr``, the threshold ``tau`` has

- false positive rate ``t = F_pop(tau)`` (non-members called members) and
- false negative rate ``eta = 1 - F_tr(tau)`` (members called non-members),

and Definition 2 / Equation 7 of the paper is::

    eps* = log max_tau max( (1 - delta - eta) / t,  (1 - delta - t) / eta,
                            (eta - delta) / (1 - t), (t - delta) / (1 - eta),  1 )

which is always ``>= 0``. Following footnote 2 of the paper, thresholds are kept only where both
rates lie in ``(delta, 1 - delta)`` (parametric) or in ``(0.001, 0.999)`` (empirical, Appendix 8.1).

Two estimators:

- ``method="parametric"`` (the paper's default, Section 3.1 / Appendix B): the losses of both sets are
  normalised jointly to ``[0, 1]``, shifted by ``alpha = 1``, mapped to ``p = exp(-value)`` and to
  ``phi = log p - log(1 - p)``; one Normal is fitted to ``phi`` of each set, and the supremum of each
  of the four ratios over all thresholds is found by a dense grid refined by bounded 1-D optimisation
  (Brent) — not only a grid. ``phi`` decreases with the loss, so "``l <= tau``" is
  "``phi >= phi_tau``".
- ``method="empirical"``: empirical CDFs of the raw losses, every distinct loss value as a threshold.

This module is numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from scipy import optimize, stats

from ._checks import expect_choice

__all__ = [
    "EMPIRICAL_RATE_RANGE",
    "EpsilonStarDetails",
    "default_delta",
    "epsilon_star",
    "epsilon_star_details",
    "epsilon_star_from_distributions",
    "epsilon_star_from_rates",
    "transform_losses",
]

METHODS = ("parametric", "empirical")
EMPIRICAL_RATE_RANGE = (0.001, 0.999)
"""Open interval of FPR and FNR values kept by the empirical estimator (Appendix 8.1)."""
ALPHA = 1.0
"""Shift added to the normalised losses before ``exp(-.)`` (Appendix 8.1, step 2)."""
_GRID_POINTS = 2049
RATIO_NAMES = (
    "(1 - delta - fnr) / fpr",
    "(1 - delta - fpr) / fnr",
    "(fnr - delta) / (1 - fpr)",
    "(fpr - delta) / (1 - fnr)",
)


@dataclass(frozen=True)
class EpsilonStarDetails:
    """Everything behind one Epsilon* value.

    Attributes:
        epsilon_star: the value, ``>= 0``.
        method: ``"parametric"`` or ``"empirical"``.
        delta: the delta used in Equation 7.
        ratio: which of the four ratios attains the maximum (1-4, in the order of Equation 7), or
            ``None`` when no ratio exceeds 1 (``epsilon_star == 0``).
        threshold: the maximising loss threshold ``tau`` (members are ``loss <= tau``), in the units of
            the input losses; ``None`` when ``ratio`` is ``None``.
        fpr, fnr: the false positive / false negative rates at ``threshold`` (``None`` likewise).
        num_members, num_nonmembers: sample sizes.
        loss_min, loss_max: the joint range used to normalise the losses (parametric only).
        member_mean, member_std, nonmember_mean, nonmember_std: the Normal fits of the transformed
            losses ``phi`` (parametric only; ``std`` is the maximum-likelihood estimate).
        ks_pvalue_member, ks_pvalue_nonmember: p-values of the two-sample Kolmogorov-Smirnov
            goodness-of-fit check of each Normal fit, as in Appendix 8.2 (fit on one part, compare a
            held-out part with as many draws from the fit); small values mean a poor fit. ``nan`` when
            a set has fewer than 20 losses (parametric only).
    """

    epsilon_star: float
    method: str
    delta: float
    ratio: Optional[int]
    threshold: Optional[float]
    fpr: Optional[float]
    fnr: Optional[float]
    num_members: int
    num_nonmembers: int
    loss_min: Optional[float] = None
    loss_max: Optional[float] = None
    member_mean: Optional[float] = None
    member_std: Optional[float] = None
    nonmember_mean: Optional[float] = None
    nonmember_std: Optional[float] = None
    ks_pvalue_member: Optional[float] = None
    ks_pvalue_nonmember: Optional[float] = None


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def _check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise TypeError(f"Expected argument `delta` to be a float in (0, 0.5), but got {delta!r}")
    delta = float(delta)
    if not (0.0 < delta < 0.5):
        raise ValueError(f"Expected argument `delta` to be in the open interval (0, 0.5), but got {delta!r}")
    return delta


def _check_method(method: Any) -> str:
    return expect_choice("method", method, METHODS)


def _check_losses(losses: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(losses, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"Expected argument `{name}` to be a 1-D array of floats, but got {type(losses).__name__}"
        ) from err
    if array.ndim != 1:
        raise ValueError(f"Expected argument `{name}` to be 1-D, but got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"Expected argument `{name}` to hold at least one loss, but got an empty array")
    bad = ~np.isfinite(array)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"Expected argument `{name}` to be finite, but got {int(bad.sum())} NaN/inf value(s) "
            f"(first at index {first}: {array[first]})"
        )
    return array


def default_delta(num_train: int) -> float:
    """The paper's default ``delta = 1 / (n ln n)`` for a training set of ``n`` examples.

    Args:
        num_train: number of training examples, ``>= 2``.

    Returns:
        ``1 / (n * ln n)``.

    Raises:
        ValueError: if ``num_train < 2``.

    Example::

        >>> round(default_delta(27146), 9)
        3.6e-06
    """
    if isinstance(num_train, bool) or not isinstance(num_train, (int, np.integer)) or num_train < 3:
        # n = 2 gives delta = 0.72 > 0.5, which Equation 7 does not admit.
        raise ValueError(f"Expected argument `num_train` to be an int >= 3, but got {num_train!r}")
    return 1.0 / (num_train * math.log(num_train))


# ---------------------------------------------------------------------------------------------
# Equation 7 on given rates
# ---------------------------------------------------------------------------------------------
def _ratio_rows(fpr: np.ndarray, fnr: np.ndarray, delta: float):
    """The four ratios of Equation 7, one array at a time (rates strictly inside (0, 1))."""
    yield (1.0 - delta - fnr) / fpr
    yield (1.0 - delta - fpr) / fnr
    yield (fnr - delta) / (1.0 - fpr)
    yield (fpr - delta) / (1.0 - fnr)


def epsilon_star_from_rates(*, fpr: Any, fnr: Any, delta: float) -> float:
    """Equation 7 on given pairs of rates: ``log max_i max(four ratios, 1)``.

    Args:
        fpr: false positive rates ``t_i`` (non-members with loss ``<= tau_i``), in ``(0, 1)``.
        fnr: the matching false negative rates ``eta_i`` (members with loss ``> tau_i``), in ``(0, 1)``.
        delta: delta of the empirical-privacy definition, in ``(0, 0.5)``.

    Returns:
        Epsilon*, ``>= 0`` (0 for no pairs).

    Raises:
        ValueError: for rates outside ``(0, 1)``, NaN, shapes that differ, or ``delta`` outside
            ``(0, 0.5)``.

    Example::

        >>> round(epsilon_star_from_rates(fpr=[0.1, 0.5], fnr=[0.6, 0.2], delta=1e-5), 4)
        1.3862
    """
    delta = _check_delta(delta)
    fpr = np.asarray(fpr, dtype=np.float64).reshape(-1)
    fnr = np.asarray(fnr, dtype=np.float64).reshape(-1)
    if fpr.shape != fnr.shape:
        raise ValueError(f"Expected `fpr` and `fnr` of the same length, but got {fpr.size} and {fnr.size}")
    for name, rate in (("fpr", fpr), ("fnr", fnr)):
        if not np.all((rate > 0) & (rate < 1)):
            raise ValueError(f"Expected argument `{name}` to lie in the open interval (0, 1), but got {rate}")
    if fpr.size == 0:
        return 0.0
    return float(max(0.0, math.log(max(float(r.max()) for r in _ratio_rows(fpr, fnr, delta)))))


# ---------------------------------------------------------------------------------------------
# supremum over thresholds for continuous CDFs
# ---------------------------------------------------------------------------------------------
def _log_minus_delta(log_a: np.ndarray, log_delta: float) -> np.ndarray:
    """``log(a - delta)`` from ``log a`` (``-inf`` where ``a <= delta``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = log_a + np.log1p(-np.exp(np.minimum(log_delta - log_a, 0.0)))
    return np.where(log_a > log_delta, out, -np.inf)


def _log_ratios(tau: np.ndarray, member: Any, nonmember: Any, log_delta: float) -> np.ndarray:
    """Logs of the four ratios at thresholds ``tau`` (shape (4, k)), from log-CDFs (no cancellation).

    With ``t = F_pop(tau)`` and ``eta = S_tr(tau)``: ratio 1 = (F_tr - delta)/F_pop,
    2 = (S_pop - delta)/S_tr, 3 = (S_tr - delta)/S_pop, 4 = (F_pop - delta)/F_tr.
    """
    tau = np.atleast_1d(tau)
    lf_pop, ls_pop = nonmember.logcdf(tau), nonmember.logsf(tau)
    lf_tr, ls_tr = member.logcdf(tau), member.logsf(tau)
    return np.stack(
        [
            _log_minus_delta(lf_tr, log_delta) - lf_pop,
            _log_minus_delta(ls_pop, log_delta) - ls_tr,
            _log_minus_delta(ls_tr, log_delta) - ls_pop,
            _log_minus_delta(lf_pop, log_delta) - lf_tr,
        ]
    )


def _sup_over_thresholds(member: Any, nonmember: Any, delta: float) -> tuple:
    """(log of the best ratio, ratio index 1-4, tau) over tau with both rates in [delta, 1 - delta]."""
    low = max(nonmember.ppf(delta), member.ppf(delta))
    high = min(nonmember.isf(delta), member.isf(delta))
    if not (np.isfinite(low) and np.isfinite(high)) or low >= high:
        return -np.inf, None, None
    log_delta = math.log(delta)
    grid = np.linspace(low, high, _GRID_POINTS)
    values = _log_ratios(grid, member, nonmember, log_delta)
    best = (-np.inf, None, None)
    for index in range(4):
        row = values[index]
        i = int(np.argmax(row))
        value, tau = float(row[i]), float(grid[i])
        a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        if b > a:  # refine the grid maximum inside its bracket (bounded Brent)
            res = optimize.minimize_scalar(
                lambda x: -float(_log_ratios(np.array([x]), member, nonmember, log_delta)[index, 0]),
                bounds=(a, b),
                method="bounded",
                options={"xatol": 1e-12 * max(1.0, abs(a), abs(b))},
            )
            if np.isfinite(res.fun) and -res.fun > value:
                value, tau = -float(res.fun), float(res.x)
        if value > best[0]:
            best = (value, index + 1, tau)
    return best


def epsilon_star_from_distributions(member: Any, nonmember: Any, *, delta: float) -> float:
    """Epsilon* of two continuous loss distributions (supremum over all thresholds).

    Args:
        member: frozen ``scipy.stats`` distribution of the member (training) losses.
        nonmember: frozen ``scipy.stats`` distribution of the non-member (population) losses.
        delta: in ``(0, 0.5)``; thresholds are restricted to FPR and FNR in ``[delta, 1 - delta]``.

    Returns:
        ``log max(sup_tau max(four ratios), 1)``, found by a grid of 2,049 thresholds refined by bounded
        Brent optimisation of each ratio around its grid maximum.

    Example::

        >>> round(epsilon_star_from_distributions(stats.norm(0, 1), stats.norm(0, 1), delta=1e-5), 6)
        0.0
        >>> round(epsilon_star_from_distributions(stats.gamma(2, scale=5), stats.gamma(3, scale=5),
        ...                                       delta=1e-4), 3)
        3.528
    """
    delta = _check_delta(delta)
    log_best, _, _ = _sup_over_thresholds(member, nonmember, delta)
    return float(max(0.0, log_best))


# ---------------------------------------------------------------------------------------------
# the parametric transform and the two estimators
# ---------------------------------------------------------------------------------------------
def transform_losses(losses: Any, *, low: float, high: float) -> np.ndarray:
    """The paper's transform of losses before the Normal fit (Appendix 8.1, steps 1-4).

    ``u = (l - low) / (high - low)``, ``v = u + 1``, ``p = exp(-v)``, ``phi = log p - log(1 - p)``,
    computed as ``-v - log(-expm1(-v))``. ``phi`` is decreasing in the loss.

    Args:
        losses: losses to transform.
        low, high: the joint minimum and maximum of the member and non-member losses (``high > low``).

    Returns:
        ``phi`` as a float64 array.

    Example::

        >>> transform_losses([0.0, 1.0], low=0.0, high=1.0).round(4)
        array([-0.5413, -1.8546])
    """
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise ValueError(f"Expected finite `low` < `high`, but got low={low!r}, high={high!r}")
    v = (np.asarray(losses, dtype=np.float64) - low) / (high - low) + ALPHA
    return -v - np.log(-np.expm1(-v))


def _inverse_transform(phi: float, low: float, high: float) -> float:
    v = float(np.logaddexp(0.0, -phi))  # -log(sigmoid(phi))
    return low + (v - ALPHA) * (high - low)


def _ks_pvalue(phi: np.ndarray, rng: np.random.Generator) -> float:
    """Appendix 8.2 with one component: fit a Normal on one part, KS-compare the rest with draws."""
    n = phi.size
    if n < 20:
        return float("nan")
    n_eval = min(1000, n // 2)
    perm = rng.permutation(n)
    evaluation, fit = phi[perm[:n_eval]], phi[perm[n_eval:]]
    std = float(fit.std())
    if std == 0.0:
        return 0.0 if float(np.ptp(evaluation)) > 0 else 1.0
    draws = rng.normal(float(fit.mean()), std, size=n_eval)
    return float(stats.ks_2samp(evaluation, draws).pvalue)


def _parametric(members: np.ndarray, nonmembers: np.ndarray, delta: float, seed: int) -> EpsilonStarDetails:
    low = float(min(members.min(), nonmembers.min()))
    high = float(max(members.max(), nonmembers.max()))
    if high == low:
        raise ValueError(
            "The parametric Epsilon* needs losses that are not all equal: every member and non-member loss "
            f"is {low!r}. Use method='empirical'."
        )
    phi_tr = transform_losses(members, low=low, high=high)
    phi_pop = transform_losses(nonmembers, low=low, high=high)
    fits = []
    for name, phi in (("member_losses", phi_tr), ("nonmember_losses", phi_pop)):
        mean, std = float(phi.mean()), float(phi.std())
        if not std > 0.0:
            raise ValueError(
                f"The parametric Epsilon* fits a Normal to each set, but every value of `{name}` is equal "
                f"({phi.size} value(s)). Use method='empirical' or pass more varied losses."
            )
        fits.append((mean, std))
    (mu_tr, sd_tr), (mu_pop, sd_pop) = fits
    # The attack "member when loss <= tau" is "member when -phi <= -phi_tau": work with psi = -phi,
    # which increases with the loss, so the generic routine (thresholds on an increasing score) applies.
    log_best, ratio, psi_tau = _sup_over_thresholds(stats.norm(-mu_tr, sd_tr), stats.norm(-mu_pop, sd_pop), delta)
    rng = np.random.default_rng(seed)
    ks_tr, ks_pop = _ks_pvalue(phi_tr, rng), _ks_pvalue(phi_pop, rng)
    common = dict(
        method="parametric",
        delta=delta,
        num_members=members.size,
        num_nonmembers=nonmembers.size,
        loss_min=low,
        loss_max=high,
        member_mean=mu_tr,
        member_std=sd_tr,
        nonmember_mean=mu_pop,
        nonmember_std=sd_pop,
        ks_pvalue_member=ks_tr,
        ks_pvalue_nonmember=ks_pop,
    )
    if ratio is None or log_best <= 0.0:
        return EpsilonStarDetails(epsilon_star=0.0, ratio=None, threshold=None, fpr=None, fnr=None, **common)
    fpr = float(stats.norm.cdf(psi_tau, -mu_pop, sd_pop))
    fnr = float(stats.norm.sf(psi_tau, -mu_tr, sd_tr))
    return EpsilonStarDetails(
        epsilon_star=float(log_best),
        ratio=ratio,
        threshold=_inverse_transform(-psi_tau, low, high),
        fpr=fpr,
        fnr=fnr,
        **common,
    )


def _empirical(members: np.ndarray, nonmembers: np.ndarray, delta: float) -> EpsilonStarDetails:
    # Every loss value is a threshold (repeats give repeated pairs, which do not change the maximum);
    # the counts at tau are the numbers of values <= tau. Sorted keys make searchsorted fast.
    tr, pop = np.sort(members), np.sort(nonmembers)
    thresholds = np.concatenate([tr, pop])
    members_below = np.concatenate([np.searchsorted(tr, tr, side="right"), np.searchsorted(tr, pop, side="right")])
    nonmembers_below = np.concatenate([np.searchsorted(pop, tr, side="right"), np.searchsorted(pop, pop, side="right")])
    fpr = nonmembers_below / pop.size
    fnr = 1.0 - members_below / tr.size
    lo, hi = EMPIRICAL_RATE_RANGE
    keep = (fpr > lo) & (fpr < hi) & (fnr > lo) & (fnr < hi)
    common = dict(method="empirical", delta=delta, num_members=members.size, num_nonmembers=nonmembers.size)
    best, index, i = 1.0, None, None
    if keep.any():
        fpr, fnr, thresholds = fpr[keep], fnr[keep], thresholds[keep]
        for k, ratio in enumerate(_ratio_rows(fpr, fnr, delta)):
            j = int(np.argmax(ratio))
            if ratio[j] > best:
                best, index, i = float(ratio[j]), k + 1, j
    if index is None:
        return EpsilonStarDetails(epsilon_star=0.0, ratio=None, threshold=None, fpr=None, fnr=None, **common)
    return EpsilonStarDetails(
        epsilon_star=float(np.log(best)),
        ratio=index,
        threshold=float(thresholds[i]),
        fpr=float(fpr[i]),
        fnr=float(fnr[i]),
        **common,
    )


def epsilon_star_details(
    member_losses: Any, nonmember_losses: Any, *, delta: float, method: str = "parametric", seed: int = 0
) -> EpsilonStarDetails:
    """Epsilon* with its fits, maximising threshold and goodness-of-fit checks.

    Args:
        member_losses: per-example losses of training (member) examples; low = looks like a member.
        nonmember_losses: per-example losses of population (non-member) examples.
        delta: in ``(0, 0.5)``; the paper uses ``1 / (n ln n)`` (:func:`default_delta`).
        method: ``"parametric"`` (default) or ``"empirical"``.
        seed: seed of the random split/draws of the KS goodness-of-fit check (parametric only).

    Returns:
        An :class:`EpsilonStarDetails`.

    Raises:
        TypeError, ValueError: for empty or non-finite losses, ``delta`` outside ``(0, 0.5)``, an
            unknown ``method``, or (parametric) a loss set whose values are all equal.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> d = epsilon_star_details(rng.gamma(2, 5, 10_000), rng.gamma(3, 5, 10_000), delta=1e-5)
        >>> d.method, d.ratio, round(d.epsilon_star, 2), round(d.fnr, 7)
        ('parametric', 2, 4.85, 1e-05)
    """
    delta = _check_delta(delta)
    method = _check_method(method)
    members = _check_losses(member_losses, "member_losses")
    nonmembers = _check_losses(nonmember_losses, "nonmember_losses")
    if method == "parametric":
        return _parametric(members, nonmembers, delta, seed)
    return _empirical(members, nonmembers, delta)


def epsilon_star(member_losses: Any, nonmember_losses: Any, *, delta: float, method: str = "parametric") -> float:
    """Epsilon* of one trained model from its member and non-member per-example losses.

    Args:
        member_losses: losses of training (member) examples (1-D, finite, non-empty); low loss = looks
            like a member, e.g. :func:`lightning_privacy.functional.membership_loss.membership_loss`.
        nonmember_losses: losses of population (non-member) examples never used in training.
        delta: in ``(0, 0.5)``; the paper recommends ``delta << 1/n`` and uses ``1 / (n ln n)``
            (:func:`default_delta`) for ``n`` training examples.
        method: ``"parametric"`` (Normal fits to transformed losses; the paper's default) or
            ``"empirical"`` (empirical CDFs, rates in ``(0.001, 0.999)``).

    Returns:
        Epsilon* (a float ``>= 0``; 0 when no threshold separates the two sets better than chance).

    Raises:
        TypeError, ValueError: see :func:`epsilon_star_details`.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> members, nonmembers = rng.gamma(2, 5, 100_000), rng.gamma(2, 5, 100_000)
        >>> epsilon_star(members, nonmembers, delta=1e-6) < 0.05
        True
        >>> epsilon_star(members, nonmembers, delta=0.7)
        Traceback (most recent call last):
        ...
        ValueError: Expected argument `delta` to be in the open interval (0, 0.5), but got 0.7
    """
    return epsilon_star_details(member_losses, nonmember_losses, delta=delta, method=method).epsilon_star

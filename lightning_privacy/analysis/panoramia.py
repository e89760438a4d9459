"""PANORAMIA: exact binomial-tail bounds of the audit game (numpy/scipy only).

Kazmi, Lautraite, Akbari et al., "PANORAMIA: Privacy Auditing of Machine Learning Models without
Retraining" (NeurIPS 2024), Section 4 and Algorithm 1.

The audit game (Definition 2) draws ``s ~ Bernoulli(1/2)^m``; point ``i`` is a real member when
``s_i = 1`` and a generated one when ``s_i = 0``. A scorer (the baseline ``b``, which sees only ``x``,
or the MIA, which also sees the target model's loss) ranks the ``m`` points; guessing "member" for
its top ``k`` points makes ``r`` guesses of which ``tp`` are correct.

- Proposition 1: if the generator is ``c``-close to the data (Definition 3), then
  ``P[tp >= v] <= P[Binomial(r, e^c / (1 + e^c)) >= v]``.
- Proposition 2: if moreover the target is ``eps``-DP, the same holds for the MIA's guesses with
  ``e^(c+eps) / (1 + e^(c+eps))``.

So a test that observes ``tp`` correct out of ``r`` rejects every ``theta`` (``c`` or ``c + eps``)
with ``P[Binomial(r, sigma(theta)) >= tp] <= beta'``; the bound is the largest rejected value. That
tail is the regularised incomplete beta function, so the largest rejected precision is the one-sided
Clopper-Pearson lower bound ``Beta.ppf(beta', tp, r - tp + 1)`` and the bound is its logit
(:func:`logit_lower_bound`; checked against a brute-force search in the tests, and verified on the
binomial tail before it is returned so rounding never makes it larger than the exact value).

**Picking the best recall level keeps its confidence** by a union bound (Bonferroni), as the
authors' code does (``0.05 / (2 * 100)`` per threshold for 100 thresholds): ``beta`` is split in half
between the two tests (Algorithm 1 uses ``beta / 2`` each; Corollary 1 joins them by a union bound),
and each half again equally over the ``K`` candidate guess counts, so every single bound is computed
at level ``beta / (2 K)``. The candidate guess counts depend on ``m`` and ``num_thresholds`` only
(never on ``s``), and the guesses at a count are a function of the scores alone, so each of the
``2 K`` tests is valid and their union holds with probability at least ``1 - beta``: ``c_lb`` and
``{c + eps}_lb`` hold *simultaneously* at confidence ``1 - beta``.

Semantics (Section 4.2): ``eps_tilde = max(0, {c + eps}_lb - c_lb)`` is **not** a lower bound on the
target's ``eps``-DP. It reads: "we could not reject that the generator is ``c_lb``-close; if that is
tight, the target cannot be the output of an ``eps_tilde``-DP mechanism". It approaches a lower bound
when the baseline is strong, and models audited with the same data and generator share ``c_lb``, so
``eps_tilde`` compares them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import special, stats

__all__ = [
    "MEANING",
    "PanoramiaBounds",
    "guess_counts",
    "information_warnings",
    "logit_lower_bound",
    "min_correct_guesses",
    "panoramia_bounds",
    "precision_lower_bound",
    "top_k_counts",
]

MEANING = (
    "eps_tilde is NOT a lower bound on the model's epsilon-DP. It means: we could not reject that "
    "the generator is c_lb-close to the data distribution; if that is tight, the model cannot be the "
    "output of an eps_tilde-DP mechanism. It is close to a lower bound only when the baseline is "
    "strong; models audited with the same data and generator share c_lb, so eps_tilde compares them. "
    "c_lb and {c+eps}_lb hold together at confidence 1 - beta (beta split over both tests and over "
    "every recall level tried)."
)


def _check_beta(beta: float, name: str = "beta") -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating, np.integer)):
        raise TypeError(f"`{name}` must be a float in (0, 1), got {beta!r}")
    beta = float(beta)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {beta!r}")
    return beta


def _check_counts(true_positives, guesses) -> tuple[np.ndarray, np.ndarray]:
    tp = np.asarray(true_positives)
    r = np.asarray(guesses)
    for name, arr in (("true_positives", tp), ("guesses", r)):
        if arr.dtype.kind not in "iuf" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError(f"`{name}` must hold non-negative integers, got {arr!r}")
        if np.any(arr < 0):
            raise ValueError(f"`{name}` must hold non-negative integers, got {arr!r}")
    tp, r = np.broadcast_arrays(tp.astype(np.int64), r.astype(np.int64))
    if np.any(tp > r):
        raise ValueError(f"`true_positives` cannot exceed `guesses`, got {tp!r} > {r!r}")
    return tp, r


def precision_lower_bound(*, true_positives, guesses, beta: float):
    """Smallest precision ``p`` not rejected: ``P[Binomial(r, p) >= tp] <= beta`` for all ``p`` below.

    This is the one-sided Clopper-Pearson lower bound ``Beta.ppf(beta, tp, r - tp + 1)`` (0 when
    ``tp = 0``), nudged down if floating-point rounding put it above the exact root.

    Args:
        true_positives: correct guesses ``tp`` (int or array).
        guesses: number of guesses ``r`` (int or array, ``>= tp``).
        beta: level of the test, in ``(0, 1)``.

    Returns:
        A float (or an array, broadcast over the inputs) in ``[0, 1)``.

    Raises:
        ValueError: for negative or non-integer counts, ``tp > r``, or ``beta`` outside ``(0, 1)``.

    Example::

        >>> round(precision_lower_bound(true_positives=90, guesses=100, beta=0.05), 4)
        0.8363
        >>> precision_lower_bound(true_positives=0, guesses=10, beta=0.05)
        0.0
    """
    beta = _check_beta(beta)
    tp, r = _check_counts(true_positives, guesses)
    scalar = tp.ndim == 0
    tp, r = np.atleast_1d(tp), np.atleast_1d(r)
    out = np.zeros(tp.shape, dtype=np.float64)
    pos = tp > 0
    if np.any(pos):
        p = stats.beta.ppf(beta, tp[pos], r[pos] - tp[pos] + 1)
        # Safe side: the tail at the returned p must not exceed beta (it is the largest rejected p).
        for _ in range(60):
            bad = stats.binom.sf(tp[pos] - 1, r[pos], p) > beta
            if not np.any(bad):
                break
            p = np.where(bad, np.nextafter(p, 0.0) - 1e-15 * np.maximum(p, 1e-300), p)
            p = np.maximum(p, 0.0)
        out[pos] = p
    return float(out[0]) if scalar else out


def logit_lower_bound(*, true_positives, guesses, beta: float):
    """Largest ``theta >= 0`` with ``P[Binomial(r, e^theta / (1 + e^theta)) >= tp] <= beta``.

    With ``theta = c`` this is Proposition 1's bound for the baseline; with ``theta = c + eps``,
    Proposition 2's for the MIA. When no ``theta >= 0`` is rejected (precision not significantly
    above 1/2, or no correct guess) it is 0.

    Args:
        true_positives: correct guesses ``tp``.
        guesses: number of guesses ``r``.
        beta: level of this single test, in ``(0, 1)``.

    Returns:
        A float or an array of floats, ``>= 0``.

    Raises:
        ValueError: as :func:`precision_lower_bound`.

    Example::

        >>> round(logit_lower_bound(true_positives=90, guesses=100, beta=0.05), 4)
        1.6308
        >>> logit_lower_bound(true_positives=55, guesses=100, beta=0.05)
        0.0
    """
    p = np.asarray(precision_lower_bound(true_positives=true_positives, guesses=guesses, beta=beta))
    with np.errstate(divide="ignore"):
        theta = np.where(p > 0.5, special.logit(np.clip(p, 0.5, 1.0)), 0.0)
    theta = np.maximum(theta, 0.0)
    return float(theta) if theta.ndim == 0 else theta


def guess_counts(m: int, *, num_thresholds: int = 100) -> np.ndarray:
    """The candidate numbers of top-scored guesses ``k`` (recall levels) tried for ``m`` audit points.

    Geometrically spaced from 1 to ``m`` (dense at low recall, where the bounds usually peak — the
    paper's Section 5 and Carlini et al. 2022), duplicates removed. They depend on ``m`` and
    ``num_thresholds`` only, never on the membership labels, which keeps the union bound valid.

    Args:
        m: number of audit points, ``>= 1``.
        num_thresholds: at most this many distinct counts.

    Returns:
        Sorted int64 array of distinct counts in ``[1, m]``.

    Raises:
        ValueError: for ``m < 1`` or ``num_thresholds < 1``.

    Example::

        >>> guess_counts(10, num_thresholds=4)
        array([ 1,  2,  5, 10])
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"`m` must be a positive int, got {m!r}")
    if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, (int, np.integer)) or num_thresholds < 1:
        raise ValueError(f"`num_thresholds` must be a positive int, got {num_thresholds!r}")
    if num_thresholds == 1:
        return np.array([m], dtype=np.int64)
    return np.unique(np.round(np.geomspace(1, m, num_thresholds)).astype(np.int64))


def top_k_counts(labels, scores, counts) -> tuple[np.ndarray, np.ndarray]:
    """Guesses ``r`` and correct guesses ``tp`` when guessing "member" for scores ``>=`` the k-th largest.

    Ties at the threshold are all guessed (so ``r >= k``); the guesses are a function of the scores
    only.

    Args:
        labels: ``(m,)`` 0/1 membership ``s``.
        scores: ``(m,)`` finite scores, larger = more likely a member.
        counts: candidate ``k`` values in ``[1, m]``.

    Returns:
        ``(r, tp)`` int64 arrays, one entry per ``k``.

    Example::

        >>> top_k_counts([1, 0, 1, 1], [0.9, 0.8, 0.7, 0.1], [1, 2, 4])
        (array([1, 2, 4]), array([1, 1, 3]))
    """
    s = np.asarray(labels)
    t = np.asarray(scores, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    order = np.argsort(-t, kind="stable")
    sorted_t = t[order]
    cum_tp = np.concatenate([[0], np.cumsum(s[order])])
    kth = sorted_t[counts - 1]
    # number of scores >= the k-th largest (all ties included)
    r = np.searchsorted(-sorted_t, -kth, side="right")
    return r.astype(np.int64), cum_tp[r].astype(np.int64)


@dataclass(frozen=True)
class PanoramiaBounds:
    """Result of :func:`panoramia_bounds`.

    Attributes:
        c_lb: Proposition 1 bound from the baseline scores, maximised over recall levels.
        c_plus_epsilon_lb: Proposition 2 bound ``{c + eps}_lb`` from the MIA scores.
        epsilon: ``eps_tilde = max(0, c_plus_epsilon_lb - c_lb)`` (see :data:`MEANING`).
        beta: overall level; the pair holds at confidence ``1 - beta``.
        per_threshold_beta: level of every single test, ``beta / (2 K)``.
        counts: the ``K`` candidate top-k guess counts.
        members: number of members ``sum(s)`` in the audit set.
        baseline_guesses, baseline_true_positives, mia_guesses, mia_true_positives: ``r`` and ``tp``
            per count.
        c_lb_curve, c_plus_epsilon_lb_curve: the bound at each count (each at level
            ``per_threshold_beta``), whose maxima are ``c_lb`` / ``c_plus_epsilon_lb``.
        baseline_best, mia_best: index into ``counts`` of each maximum.
    """

    c_lb: float
    c_plus_epsilon_lb: float
    epsilon: float
    beta: float
    per_threshold_beta: float
    counts: np.ndarray
    members: int
    baseline_guesses: np.ndarray
    baseline_true_positives: np.ndarray
    mia_guesses: np.ndarray
    mia_true_positives: np.ndarray
    c_lb_curve: np.ndarray
    c_plus_epsilon_lb_curve: np.ndarray
    baseline_best: int
    mia_best: int

    @property
    def baseline_recall(self) -> np.ndarray:
        return self.baseline_true_positives / max(self.members, 1)

    @property
    def mia_recall(self) -> np.ndarray:
        return self.mia_true_positives / max(self.members, 1)

    @property
    def baseline_precision(self) -> np.ndarray:
        return self.baseline_true_positives / np.maximum(self.baseline_guesses, 1)

    @property
    def mia_precision(self) -> np.ndarray:
        return self.mia_true_positives / np.maximum(self.mia_guesses, 1)


def _check_scores(name: str, scores, m: int) -> np.ndarray:
    t = np.asarray(scores, dtype=np.float64)
    if t.ndim != 1 or t.shape[0] != m:
        raise ValueError(f"`{name}` must have shape ({m},) like `labels`, got {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError(f"`{name}` must be finite, got {int(np.sum(~np.isfinite(t)))} non-finite values")
    return t


def panoramia_bounds(
    labels: Sequence[int] | np.ndarray,
    baseline_scores: Sequence[float] | np.ndarray,
    mia_scores: Sequence[float] | np.ndarray,
    *,
    beta: float = 0.05,
    num_thresholds: int = 100,
) -> PanoramiaBounds:
    """``c_lb``, ``{c + eps}_lb`` and ``eps_tilde`` of one audit game (Algorithm 1, lines 4–8).

    For each candidate count ``k`` (:func:`guess_counts`) the top-``k`` scores are guessed members;
    each test runs at ``beta / (2 K)`` (see the module docstring), so the two maxima hold together at
    confidence ``1 - beta``.

    Args:
        labels: ``(m,)`` membership ``s`` of the audit points (1 = real member, 0 = generated).
        baseline_scores: ``(m,)`` baseline scores ``t^b`` (larger = more likely a member).
        mia_scores: ``(m,)`` MIA scores ``t^a``.
        beta: overall level, in ``(0, 1)`` (paper: 0.05).
        num_thresholds: number of candidate recall levels ``K`` (paper's code: 100).

    Returns:
        A :class:`PanoramiaBounds`.

    Raises:
        ValueError: for labels other than 0/1, an empty audit set, shapes that differ, non-finite
            scores or ``beta`` outside ``(0, 1)``.

    Example::

        >>> s = [1] * 60 + [0] * 40
        >>> baseline = [0.5] * 100                      # cannot tell members from generated rows
        >>> mia = [1.0] * 55 + [0.0] * 45               # top 55 are all members
        >>> res = panoramia_bounds(s, baseline, mia, beta=0.05, num_thresholds=10)
        >>> res.c_lb, round(res.c_plus_epsilon_lb, 3), round(res.epsilon, 3)
        (0.0, 2.162, 2.162)
    """
    beta = _check_beta(beta)
    s = np.asarray(labels)
    if s.ndim != 1 or s.shape[0] == 0:
        raise ValueError(f"`labels` must be a non-empty 1-d array, got shape {s.shape}")
    if not np.all((s == 0) | (s == 1)):
        raise ValueError(f"`labels` must hold only 0 and 1, got values {np.unique(s)[:5]!r}")
    s = s.astype(np.int64)
    m = s.shape[0]
    tb = _check_scores("baseline_scores", baseline_scores, m)
    ta = _check_scores("mia_scores", mia_scores, m)
    counts = guess_counts(m, num_thresholds=num_thresholds)
    per_beta = beta / (2 * len(counts))
    rb, tpb = top_k_counts(s, tb, counts)
    ra, tpa = top_k_counts(s, ta, counts)
    c_curve = np.asarray(logit_lower_bound(true_positives=tpb, guesses=rb, beta=per_beta))
    a_curve = np.asarray(logit_lower_bound(true_positives=tpa, guesses=ra, beta=per_beta))
    ib, ia = int(np.argmax(c_curve)), int(np.argmax(a_curve))
    c_lb, ca_lb = float(c_curve[ib]), float(a_curve[ia])
    return PanoramiaBounds(
        c_lb=c_lb,
        c_plus_epsilon_lb=ca_lb,
        epsilon=max(0.0, ca_lb - c_lb),
        beta=beta,
        per_threshold_beta=per_beta,
        counts=counts,
        members=int(s.sum()),
        baseline_guesses=rb,
        baseline_true_positives=tpb,
        mia_guesses=ra,
        mia_true_positives=tpa,
        c_lb_curve=c_curve,
        c_plus_epsilon_lb_curve=a_curve,
        baseline_best=ib,
        mia_best=ia,
    )


def min_correct_guesses(per_threshold_beta: float) -> int:
    """The fewest guesses that can give a positive bound at level ``per_threshold_beta``: all of them correct.

    A bound is positive only when the test rejects ``theta = 0`` (precision 1/2): ``r`` guesses, all right,
    have tail ``2^-r``, so at least ``ceil(log2(1 / beta'))`` correct guesses are needed (more when some
    guesses are wrong). With the defaults (``beta = 0.05``, 100 recall levels, ``beta' = 2.5e-4``) that is 12.

    Example::

        >>> min_correct_guesses(0.05 / 200), min_correct_guesses(0.05)
        (12, 5)
    """
    beta = _check_beta(per_threshold_beta, "per_threshold_beta")
    k = int(np.ceil(-np.log2(beta) - 1e-12))
    return max(k, 1)


def information_warnings(bounds: PanoramiaBounds) -> tuple:
    """Why a PANORAMIA result carries no information, if it does not: one sentence per reason.

    The criterion is objective: ``{c + eps}_lb = 0`` means that at no recall level did the MIA's
    correct guesses reach what rejecting ``c + eps = 0`` takes at level ``beta'`` (at least
    :func:`min_correct_guesses` of them, nearly all correct); ``eps_tilde = 0`` then says nothing about
    the model: it is not evidence of privacy. (A positive ``{c + eps}_lb`` that the baseline matches,
    ``eps_tilde = 0`` with ``c_lb > 0``, is information: the MIA did no better than the baseline.) An
    audit set with fewer real members than that number can never give a positive bound, whatever the model.

    Returns:
        A tuple of str (empty when the result carries information).

    Example::

        >>> s = np.array([1, 0] * 3)
        >>> tiny = panoramia_bounds(s, np.zeros(6), s.astype(float), num_thresholds=5)
        >>> print(information_warnings(tiny)[0][:81])
        no information: the audit set of m = 6 points holds 3 real members, fewer than th
        >>> s = np.array([1, 0] * 50)
        >>> blind = panoramia_bounds(s, np.zeros(100), np.zeros(100), num_thresholds=5)  # the MIA sees nothing
        >>> print(information_warnings(blind)[0][:94])
        no information: at no recall level were the MIA's guesses right often enough to reject c + eps
        >>> information_warnings(panoramia_bounds(s, np.zeros(100), np.zeros(100) + s, num_thresholds=5))
        ()
    """
    if bounds.c_plus_epsilon_lb > 0:
        return ()
    need = min_correct_guesses(bounds.per_threshold_beta)
    m = int(bounds.counts[-1])
    if bounds.members < need:
        return (
            f"no information: the audit set of m = {m} points holds {bounds.members} real members, fewer than the "
            f"{need} correct guesses a positive bound needs at the per-test level beta' = "
            f"{bounds.per_threshold_beta:.2g}, so eps_tilde is 0 whatever the model; eps_tilde = 0 is not evidence "
            "of privacy: use more member rows or a larger audit_size",
        )
    tails = stats.binom.sf(bounds.mia_true_positives - 1, bounds.mia_guesses, 0.5)
    best = int(np.argmin(tails))
    return (
        "no information: at no recall level were the MIA's guesses right often enough to reject c + eps = 0 "
        f"(closest: {int(bounds.mia_true_positives[best])} of {int(bounds.mia_guesses[best])} correct, p = "
        f"{float(tails[best]):.2g} against the per-test level beta' = {bounds.per_threshold_beta:.2g}; a positive "
        f"bound needs at least {need} correct guesses, that few only if all are right), so eps_tilde = 0 says nothing "
        f"about the model's leakage and is not evidence of privacy: use more audit points (m = {m} now), a "
        "generator closer to the data, or a stronger MIA (mia_features='calibrated')",
    )

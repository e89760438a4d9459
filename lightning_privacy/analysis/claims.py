"""Does audit evidence contradict a claimed privacy guarantee? A verdict at confidence 1 − α (numpy/scipy only).

A claim is a trade-off curve: for every false-positive rate α the largest true-positive rate any test of "was the
example in the training run" may reach (the in/out game: the add/remove relation). Its sources: a DP-SGD history
(:class:`lightning_privacy.claims.Claim`, from a pessimistic PLD), a pair (ε, δ), whose curve is
:func:`epsilon_delta_tpr_bound` (Kairouz, Oh, Viswanath 2015), or μ-Gaussian DP, :func:`gdp_tpr_bound` (Dong, Roth,
Su 2019). This module takes the curve as a function and the claim's ε at its δ as a number, and decides.

**Membership-attack evidence** (:func:`check_attack_scores`), two kinds with α split between them (``epsilon_share``
of it to the second):

1. *Points of the ROC.* For every FPR point φ of a list fixed in advance, the rule "member iff score > ŝ" with ŝ
   the (k + 1)-th largest non-member score, k = ⌊φ·n⌋ (n non-members) — the lowest threshold that flags at most
   k non-members, chosen from the non-members alone. Its FPR upper limit is the Clopper–Pearson limit of k of n
   (using k, not the observed count, keeps it valid when scores tie) and its TPR lower limit the Clopper–Pearson
   limit of its true positives, each one-sided at level α₁/(2K). The claim is contradicted there when
   TPR_low > bound(FPR_high): either limit missing its target has probability ≤ α₁/(2K), and otherwise the rule's
   true (FPR, TPR) would lie above the claimed curve. FPR points with the same k are one test; Bonferroni over the
   K distinct ones keeps the family-wise error ≤ α₁.
2. *An ε lower bound.* :func:`~lightning_privacy.analysis.estimation.epsilon_lower_bound` with Clopper–Pearson
   limits (a frequentist bound), a threshold chosen on a held-out half, one-sided at α₂, at the claim's δ; the claim
   is contradicted when it exceeds the claim's ε.

**One-run canary evidence** (:func:`check_canaries`, Steinke, Nasr, Jagielski 2023; Mahloujifar, Melis, Chaudhuri
2025): m canaries included with probability 1/2, the guesses of the (k₊, k₋) grid of
:func:`~lightning_privacy.analysis.canary.guess_grid`, Bonferroni over it within each kind:

1. *Binomial (Theorem 3.1)*, valid for any (ε, δ) claim: the ε lower bound at the claim's δ exceeds its ε;
2. *f-DP*: the recursion of Mahloujifar et al. (:func:`~lightning_privacy.analysis.canary.fdp_excess`) with the
   claim's own trade-off curve instead of a Gaussian one. Their argument needs ξ(x) = 1 − f(x) concave and valid in
   both orders of the pair (the flip of a canary goes both ways); the curve is taken in both orders (the reverse
   order is the inverse function), bounded above between grid points by its value at the next one, and replaced by
   the least concave majorant of the two — all of which only weaken the test.
3. *Order statistics* (``independent=True`` only: the scores independent given the bits, one law per side, as for
   white-box gradient canaries): :func:`~lightning_privacy.analysis.canary_fdp.orderstat_claim_test`, the TPR lower
   limit of a threshold at an excluded score's rank against the claim's curve (both orders) at its FPR upper limit.

A claim is **contradicted** when any test rejects it; with α split as above the chance of a false contradiction of a
true claim is at most α (checked by simulation in ``tests/analysis/test_claims.py``).

Example::

    >>> rng = np.random.default_rng(0)
    >>> member = np.r_[np.ones(2000, bool), np.zeros(2000, bool)]
    >>> scores = rng.normal(loc=3.0 * member)  # a 3-GDP mechanism, audited against a 1-GDP claim
    >>> verdict = check_attack_scores(scores, member, tpr_bound=lambda f: gdp_tpr_bound(f, mu=1.0), epsilon=None)
    >>> verdict.verdict, verdict.evidence["kind"]
    ('contradicted', 'tpr_at_fpr')
    >>> check_attack_scores(scores, member, tpr_bound=lambda f: gdp_tpr_bound(f, mu=4.0), epsilon=None).verdict
    'consistent'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import special

from ._checks import expect_real

__all__ = [
    "CLAIM_FPRS",
    "VERDICTS",
    "ClaimVerdict",
    "check_attack_scores",
    "check_canaries",
    "epsilon_delta_tpr_bound",
    "gdp_tpr_bound",
    "symmetric_concave_xi",
    "symmetric_concave_inverse",
]

CLAIM_FPRS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
"""The FPR points at which an attack's ROC is tested against a claim (fixed in advance; Bonferroni over them)."""

VERDICTS = ("consistent", "contradicted")

TprBound = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------------------------------------------- curves
def _fpr_array(fpr: Any) -> np.ndarray:
    arr = np.asarray(fpr, dtype=float)
    if np.any(np.isnan(arr)) or np.any((arr < 0.0) | (arr > 1.0)):
        raise ValueError(f"Expected argument `fpr` to be in [0, 1], but got {fpr!r}.")
    return arr


def _out(arr: np.ndarray) -> Any:
    return float(arr) if arr.ndim == 0 else arr


def epsilon_delta_tpr_bound(fpr: Any, *, epsilon: float, delta: float) -> Any:
    """The TPR bound of an (ε, δ)-DP claim: min{1, e^ε·α + δ, 1 − e^{−ε}(1 − δ − α)} (Kairouz et al. 2015).

    Args:
        fpr: false-positive rate(s) α in [0, 1].
        epsilon: ε ≥ 0 (``inf`` allowed: no bound).
        delta: δ in [0, 1].

    Returns:
        The bound(s) in [α, 1], a float or an array of the shape of ``fpr``.

    Raises:
        TypeError: a non-numeric ε or δ.
        ValueError: ε < 0, δ outside [0, 1], an FPR outside [0, 1].

    Example:
        >>> [round(float(t), 4) for t in epsilon_delta_tpr_bound([0.0, 0.01, 0.5], epsilon=1.0, delta=1e-5)]
        [1e-05, 0.0272, 0.8161]
    """
    eps = expect_real("epsilon", epsilon, low=0.0, high=math.inf)
    d = expect_real("delta", delta, low=0.0, high=1.0)
    a = _fpr_array(fpr)
    if math.isinf(eps):
        return _out(np.ones_like(a))
    out = np.minimum.reduce([np.ones_like(a), math.exp(eps) * a + d, 1.0 - math.exp(-eps) * (1.0 - d - a)])
    return _out(np.clip(out, a, 1.0))


def gdp_tpr_bound(fpr: Any, *, mu: float) -> Any:
    """The TPR bound of a μ-Gaussian-DP claim: Φ(Φ⁻¹(α) + μ) (Dong, Roth, Su 2019).

    Example:
        >>> round(gdp_tpr_bound(0.05, mu=1.0), 4)
        0.2595
    """
    mu = expect_real("mu", mu, low=0.0, high=math.inf)
    a = _fpr_array(fpr)
    return _out(np.clip(special.ndtr(special.ndtri(a) + mu), a, 1.0))


def _curve(tpr_bound: TprBound, x: np.ndarray) -> np.ndarray:
    y = np.asarray(tpr_bound(x), dtype=float).reshape(x.shape)
    if not np.all(np.isfinite(y)):
        raise ValueError("Expected `tpr_bound` to return finite TPR bounds, but it returned NaN or inf.")
    return np.maximum.accumulate(np.clip(y, x, 1.0))


def _upper_hull(x: np.ndarray, y: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The least concave majorant of the points (x, y), as its vertices (x ascending)."""
    order = np.lexsort((-y, x))
    hull: list = []
    for px, py in zip(x[order], y[order]):
        if hull and hull[-1][0] == px:
            continue  # the largest y at this x came first
        while len(hull) >= 2:
            (ax, ay), (bx, by) = hull[-2], hull[-1]
            if (bx - ax) * (py - ay) - (by - ay) * (px - ax) >= 0.0:  # b is not above the chord a–p
                hull.pop()
            else:
                break
        hull.append((px, py))
    hx, hy = (np.array(v) for v in zip(*hull))
    return hx, hy


def symmetric_concave_inverse(tpr_bound: TprBound, *, points: int = 5000) -> Callable[[float], float]:
    """ξ⁻¹ of a concave ξ above a claim's trade-off curve in both orders (for the one-run f-DP test).

    ``tpr_bound`` gives the claim's TPR bound for the order (with, without); the reverse order is its inverse
    (the points (1 − TPR, 1 − FPR)). Each is bounded above between grid points by its value at the next grid point,
    and ξ is the least concave majorant of both: never below the claim's curve in either order, so the test it
    feeds only rejects less.

    Args:
        tpr_bound: vectorised TPR bound of the claim.
        points: grid points per scale (log-spaced from 1e-15 at both ends, and linear), ≥ 10.

    Returns:
        ``inverse(y)``: the smallest x with ξ(x) ≥ y (0 where ξ(0) ≥ y).

    Example:
        >>> inverse = symmetric_concave_inverse(lambda f: gdp_tpr_bound(f, mu=1.0))
        >>> y = gdp_tpr_bound(0.05, mu=1.0)  # a symmetric curve: the inverse is the curve's own, slightly lower
        >>> 0.049 < inverse(y) <= 0.05
        True
    """
    hx, hy = _symmetric_hull(tpr_bound, points)

    def inverse(value: float) -> float:
        return float(np.interp(value, hy, hx, left=0.0, right=1.0))

    return inverse


def symmetric_concave_xi(tpr_bound: TprBound, *, points: int = 5000) -> Callable[[float], float]:
    """ξ itself, of :func:`symmetric_concave_inverse`: a TPR bound at each FPR valid in both orders of the pair.

    Example:
        >>> xi = symmetric_concave_xi(lambda f: gdp_tpr_bound(f, mu=1.0))
        >>> bool(gdp_tpr_bound(0.05, mu=1.0) <= xi(0.05) < gdp_tpr_bound(0.05, mu=1.0) + 1e-3)
        True
    """
    hx, hy = _symmetric_hull(tpr_bound, points)

    def xi(value: float) -> float:
        return float(np.interp(value, hx, hy, left=float(hy[0]), right=1.0))

    return xi


def _symmetric_hull(tpr_bound: TprBound, points: int) -> Tuple[np.ndarray, np.ndarray]:
    if isinstance(points, bool) or not isinstance(points, int) or points < 10:
        raise ValueError(f"Expected argument `points` to be an int >= 10, but got {points!r}.")
    tail = np.logspace(-15, 0, points)  # dense on log scales at both ends: the reverse order reads 1 − x
    x = np.unique(np.concatenate([[0.0, 1.0], tail, 1.0 - tail, np.linspace(0.0, 1.0, points)]))
    y = _curve(tpr_bound, x)
    u, w = (1.0 - y)[::-1], (1.0 - x)[::-1]  # the reverse order, u ascending
    cx = np.concatenate([x[:-1], u[:-1], [1.0]])
    cy = np.concatenate([y[1:], w[1:], [1.0]])  # staircase corners: the value at the next grid point
    hx, hy = _upper_hull(cx, cy)
    top = int(np.argmax(hy >= 1.0))  # keep the rising part: the inverse of a non-decreasing function
    return hx[: top + 1], hy[: top + 1]


# ------------------------------------------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class ClaimVerdict:
    """Whether the evidence contradicts a claim at confidence 1 − α.

    Attributes:
        verdict: ``"contradicted"`` (some test rejects the claim) or ``"consistent"`` (none does).
        alpha: the family-wise error: a true claim is contradicted with probability at most α.
        evidence: the test that decided a contradiction (the one beyond the claim by the largest margin),
            ``None`` when consistent.
        tests: every test run, as dicts: ``kind`` (``"tpr_at_fpr"``, ``"epsilon_lower"``, ``"binomial"``,
            ``"fdp"`` or ``"orderstat"``), ``level`` (its share of α), ``statistic`` and ``bound`` (what was compared: the TPR lower
            limit and the claim's TPR bound at the FPR upper limit; the ε lower bound and the claim's ε; correct
            guesses and the most a claim allows), ``contradicts`` and the counts behind them.
        curve: the trade-off curve the claim was tested on, in words (set by :class:`~lightning_privacy.claims.Claim`:
            a DP-SGD claim's own PLD curve, an (ε, δ) claim's Kairouz et al. curve; never a Gaussian curve the claim
            does not have); ``None`` when the caller gave its own ``tpr_bound``.
    """

    verdict: str
    alpha: float
    evidence: Optional[Dict[str, Any]]
    tests: Tuple[Dict[str, Any], ...] = field(default_factory=tuple)
    curve: Optional[str] = None

    @property
    def contradicted(self) -> bool:
        return self.verdict == "contradicted"

    def sentence(self) -> str:
        """One sentence: the verdict and the evidence that decided it."""
        level = f"{100 * (1 - self.alpha):g}%"
        on = "" if self.curve is None else f"; tested on {self.curve}"
        if not self.contradicted:
            return f"consistent: no test contradicts the claim at confidence {level} ({len(self.tests)} tests{on})"
        e = self.evidence
        if e["kind"] == "tpr_at_fpr":
            what = (
                f"at FPR ≤ {e['fpr_high']:.4g} (upper limit) the attack's TPR is at least {e['tpr_low']:.4f} (lower "
                f"limit) but the claim allows at most {e['bound']:.4f}"
            )
        elif e["kind"] == "orderstat":
            what = (
                f"independent canaries: at FPR ≤ {e['fpr_high']:.4g} (upper limit, threshold at rank {e['rung'] + 1} of "
                f"the {'excluded' if e['tail'] == 'in' else 'included'} scores) the TPR is at least {e['tpr_low']:.4f} "
                f"but the claim allows at most {e['bound']:.4f}"
            )
        elif e["kind"] in ("epsilon_lower", "binomial"):
            what = (
                f"the ε lower bound {e['statistic']:.4g} exceeds the claim's ε {e['bound']:.4g} at δ = {e['delta']:.3g}"
            )
        else:
            what = (
                f"{e['correct']} of {e['guesses']} canary guesses are right but the claim's trade-off allows at most "
                f"{e['bound']:g} at this level"
            )
        return f"contradicted at confidence {level}: {what}" + ("" if self.curve is None else f" ({on[2:]})")

    def to_dict(self) -> Dict[str, Any]:
        """Plain Python values."""
        return {
            "verdict": self.verdict,
            "alpha": self.alpha,
            "evidence": None if self.evidence is None else dict(self.evidence),
            "tests": [dict(t) for t in self.tests],
        }


def _decide(tests: Sequence[Dict[str, Any]], alpha: float) -> ClaimVerdict:
    beyond = [t for t in tests if t["contradicts"]]
    evidence = max(beyond, key=lambda t: t["margin"]) if beyond else None
    return ClaimVerdict("contradicted" if beyond else "consistent", alpha, evidence, tuple(tests))


def _check_alpha(alpha: Any) -> float:
    return expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_claim_numbers(epsilon: Any, delta: Any) -> Tuple[Optional[float], float]:
    eps = None if epsilon is None else expect_real("epsilon", epsilon, low=0.0, high=math.inf)
    return eps, expect_real("delta", delta, low=0.0, high=1.0, high_open=True)


def tpr_point_tests(
    scores: Any, is_member: Any, tpr_bound: TprBound, *, fprs: Sequence[float] = CLAIM_FPRS, alpha: float = 0.05
) -> Tuple[Dict[str, Any], ...]:
    """One test per distinct number of allowed false positives among ``fprs`` (see the module docstring), at α/K.

    Example:
        >>> member = np.r_[np.ones(100, bool), np.zeros(100, bool)]
        >>> tests = tpr_point_tests(np.r_[np.ones(100), np.zeros(100)], member, lambda f: f, fprs=(0.001, 0.1))
        >>> [(t["fp_allowed"], t["tp"], t["contradicts"]) for t in tests]
        [(0, 100, True), (10, 100, True)]
    """
    from .estimation import _check_scores, rate_interval

    alpha = _check_alpha(alpha)
    s, member = _check_scores(scores, is_member)
    pos, neg = int(member.sum()), int((~member).sum())
    if pos == 0 or neg == 0:
        raise ValueError(f"Expected members and non-members, but got {pos} members and {neg} non-members.")
    budgets = sorted(expect_real("fprs", f, low=0.0, high=1.0) for f in fprs)
    if not budgets:
        raise ValueError("Expected at least one FPR point in `fprs`, but got none.")
    allowed: Dict[int, float] = {}
    for f in budgets:
        k = int(math.floor(f * neg + 1e-9))
        if k < neg:
            allowed[k] = f  # the largest budget with this k
    level = alpha / max(len(allowed), 1)
    nonmember = np.sort(s[~member])[::-1]
    members = s[member]
    out = []
    for k, budget in allowed.items():
        cut = nonmember[k]  # the (k + 1)-th largest non-member score: flag scores above it
        tp, fp = int(np.sum(members > cut)), int(np.sum(nonmember > cut))
        tpr_low, _ = rate_interval(tp, pos, alpha=level, method="clopper_pearson")
        _, fpr_high = rate_interval(k, neg, alpha=level, method="clopper_pearson")
        bound = float(np.asarray(tpr_bound(np.array([fpr_high])), dtype=float).reshape(-1)[0])
        out.append(
            {
                "kind": "tpr_at_fpr",
                "level": level,
                "fpr": budget,
                "fp_allowed": k,
                "fpr_high": float(fpr_high),
                "tp": tp,
                "fp": fp,
                "num_members": pos,
                "num_nonmembers": neg,
                "tpr": tp / pos,
                "tpr_low": float(tpr_low),
                "statistic": float(tpr_low),
                "bound": bound,
                "margin": float(tpr_low) - bound,
                "contradicts": bool(tpr_low > bound),
            }
        )
    return tuple(out)


def check_attack_scores(
    scores: Any,
    is_member: Any,
    *,
    tpr_bound: TprBound,
    epsilon: Optional[float],
    delta: float = 0.0,
    alpha: float = 0.05,
    fprs: Sequence[float] = CLAIM_FPRS,
    epsilon_share: float = 0.5,
    seed: int = 0,
) -> ClaimVerdict:
    """The verdict on a claim from a membership attack's scores (members and non-members drawn alike).

    Args:
        scores: one score per audited example, higher = more likely a member.
        is_member: the truth (booleans or 0/1).
        tpr_bound: the claim's TPR bound at an array of FPRs (vectorised).
        epsilon: the claim's ε at ``delta`` (an upper bound on its ε); ``None``: no ε test, all of α to the ROC.
        delta: the claim's δ.
        alpha: family-wise error over all tests, in (0, 1).
        fprs: the FPR points tested (fixed before seeing the scores).
        epsilon_share: the share of α given to the ε test, in (0, 1).
        seed: seed of the ε test's held-out half.

    Returns:
        A :class:`ClaimVerdict`.

    Raises:
        TypeError, ValueError: bad arguments, named.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> member = np.r_[np.ones(1000, bool), np.zeros(1000, bool)]
        >>> scores = rng.normal(loc=4.0 * member)  # 4-GDP: ε = 19.5 at δ = 1e-5
        >>> claim = lambda f: epsilon_delta_tpr_bound(f, epsilon=2.0, delta=1e-5)
        >>> verdict = check_attack_scores(scores, member, tpr_bound=claim, epsilon=2.0, delta=1e-5)
        >>> verdict.verdict, [t["kind"] for t in verdict.tests].count("tpr_at_fpr")
        ('contradicted', 6)
    """
    from .estimation import epsilon_lower_bound

    alpha = _check_alpha(alpha)
    eps, delta = _check_claim_numbers(epsilon, delta)
    share = expect_real("epsilon_share", epsilon_share, low=0.0, high=1.0, low_open=True, high_open=True)
    eps_alpha = alpha * share if eps is not None else 0.0
    tests = list(tpr_point_tests(scores, is_member, tpr_bound, fprs=fprs, alpha=alpha - eps_alpha))
    if eps is not None:
        bound = epsilon_lower_bound(
            scores,
            is_member,
            delta=delta,
            alpha=eps_alpha,
            method="clopper_pearson",
            selection="holdout",
            sided="one",
            seed=seed,
        )
        lower = float(bound.epsilon_lower)
        tests.append(
            {
                "kind": "epsilon_lower",
                "level": eps_alpha,
                "delta": delta,
                "statistic": lower,
                "bound": eps,
                "margin": lower - eps,
                "contradicts": bool(lower > eps),
                "tp": bound.tp,
                "fp": bound.fp,
                "tn": bound.tn,
                "fn": bound.fn,
            }
        )
    return _decide(tests, alpha)


def _max_consistent(m: int, r: int, alpha: float, inverse: Callable[[float], float]) -> int:
    """The most correct guesses out of r that the f-DP test does not reject (the test is monotone in v)."""
    from .canary import fdp_excess

    lo, hi = 0, r  # fdp_excess(v = 0) is never positive
    if fdp_excess(m, r, r, alpha, inverse) <= 0.0:
        return r
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fdp_excess(m, r, mid, alpha, inverse) <= 0.0 else (lo, mid)
    return lo


def check_canaries(
    scores: Any,
    included: Any,
    *,
    epsilon: Optional[float],
    delta: float,
    tpr_bound: Optional[TprBound] = None,
    alpha: float = 0.05,
    seed: int = 0,
    independent: bool = False,
) -> ClaimVerdict:
    """The verdict on a claim from a one-run canary audit (see the module docstring).

    Args:
        scores: one score per canary (higher = looks included).
        included: whether each canary was included (probability 1/2 each, independently); a count no Bernoulli(1/2)
            draw plausibly gives is refused (:func:`~lightning_privacy.analysis.canary.check_inclusion`, exact
            two-sided binomial test at level 1e-6): all True would make a true claim look contradicted.
        epsilon: the claim's ε at ``delta``; ``None`` (or ``inf``): no binomial test.
        delta: the claim's δ, in [0, 1).
        tpr_bound: the claim's TPR bound (order: with, without the canary); ``None``: no f-DP test.
        alpha: family-wise error, split equally between the kinds that run.
        seed: tie-breaking order of the scores.
        independent: the caller vouches that the canaries' scores are independent given their bits, one law for
            the included and one for the excluded (white-box Dirac gradient canaries scored
            ``released_minus_batch`` or ``likelihood_ratio``); adds the order-statistic test of the claim's curve
            (:func:`~lightning_privacy.analysis.canary_fdp.orderstat_claim_test`, needs ``tpr_bound``) as a third
            kind. Not valid for input canaries, which train one model together.

    Returns:
        A :class:`ClaimVerdict` with one ``"binomial"`` and one ``"fdp"`` test (the grid pair beyond the claim by
        the most correct guesses, else the grid pair closest to rejecting), and one ``"orderstat"`` test with
        ``independent=True``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> included = rng.random(1000) < 0.5
        >>> scores = rng.normal(size=1000) + 4.0 * included  # 4-GDP, claimed 1-GDP (ε = 4.38 at δ = 1e-5)
        >>> claim = lambda f: gdp_tpr_bound(f, mu=1.0)
        >>> verdict = check_canaries(scores, included, epsilon=4.3772, delta=1e-5, tpr_bound=claim)
        >>> verdict.verdict, verdict.evidence["kind"]
        ('contradicted', 'fdp')
    """
    from .canary import _check_scores, _Game, canary_audit_from_scores, fdp_excess

    alpha = _check_alpha(alpha)
    eps, delta = _check_claim_numbers(epsilon, delta)
    use_binomial = eps is not None and math.isfinite(eps)
    if not isinstance(independent, bool):
        raise TypeError(f"Expected argument `independent` to be a bool, but got {independent!r}.")
    if independent and tpr_bound is None:
        raise ValueError("Expected a `tpr_bound` with independent=True (the order-statistic test reads its curve).")
    kinds = int(use_binomial) + int(tpr_bound is not None) + int(independent)
    if kinds == 0:
        raise ValueError("Expected a finite `epsilon` or a `tpr_bound` to test, but got neither.")
    each = alpha / kinds
    tests = []
    if use_binomial:
        res = canary_audit_from_scores(
            scores=scores, included=included, delta=delta, alpha=each, method="binomial", seed=seed
        )
        tests.append(
            {
                "kind": "binomial",
                "level": each,
                "delta": delta,
                "statistic": res.epsilon_lower,
                "bound": eps,
                "margin": res.epsilon_lower - eps,
                "contradicts": bool(res.epsilon_lower > eps),
                "guesses": res.num_guesses,
                "correct": res.num_correct,
                "k_plus": res.k_plus,
                "k_minus": res.k_minus,
            }
        )
    if tpr_bound is not None:
        s, inc = _check_scores(scores, included)
        game = _Game(s, inc, np.random.default_rng(int(seed)).permutation(s.size))
        pairs = game.pairs
        level = each / max(len(pairs), 1)
        inverse = symmetric_concave_inverse(tpr_bound)
        rows = []
        for k_plus, k_minus in pairs:
            r, v = game.counts(k_plus, k_minus)
            rows.append((k_plus, k_minus, r, v, v > 0 and fdp_excess(game.n, r, v, level, inverse) > 0.0))
        best = None
        for k_plus, k_minus, r, v, rejects in rows:
            allowed = _max_consistent(game.n, r, level, inverse)
            if best is None or v - allowed > best["margin"]:
                best = {
                    "kind": "fdp",
                    "level": each,
                    "level_per_pair": level,
                    "k_plus": k_plus,
                    "k_minus": k_minus,
                    "guesses": r,
                    "correct": v,
                    "statistic": float(v),
                    "bound": float(allowed),
                    "margin": float(v - allowed),
                    "contradicts": bool(rejects),
                }
        if best is not None:
            tests.append(best)
    if independent:
        from .canary_fdp import orderstat_claim_test

        xi = symmetric_concave_xi(tpr_bound)  # ≥ the curve in both orders: both tails
        tests.append(orderstat_claim_test(scores, included, xi=xi, alpha=each))
    return _decide(tests, alpha)

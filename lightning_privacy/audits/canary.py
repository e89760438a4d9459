"""One-run canary audit from canary scores: both ε lower bounds, their ceilings, a summary and a figure.

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023): m canaries, each included
with probability 1/2, scored after (or during) training; the guesses become a statistically valid lower bound on ε.
The bounds themselves are :mod:`lightning_privacy.analysis.canary`; this module turns scores into the result every
audit returns (``metrics``/``summary``/``figure``/``to_dict``). :class:`~lightning_privacy.CanaryAudit` inserts the
canaries during training and calls :func:`audit_canaries`; a user with scores from elsewhere calls it directly.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> included = rng.random(1000) < 0.5
    >>> scores = rng.normal(size=1000) + 2.0 * included  # a leaky mechanism: included canaries score higher
    >>> result = audit_canaries(scores, included, delta=1e-5, accountant_epsilon=8.0)
    >>> sorted(result.metrics())[:2]
    ['audit/canary_correct', 'audit/canary_correct_fdp']
    >>> 0 < result.epsilon_lower < result.ceiling < 8.0
    True
    >>> audit_canaries(scores, included, delta=1e-5, claim=(0.5, 1e-5)).verdict  # a claim the canaries refute
    'contradicted'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from lightning_privacy import names
from lightning_privacy.analysis._checks import expect_choice, expect_real
from lightning_privacy.analysis.canary import CanaryAuditResult, canary_audit_from_scores, guess_grid, max_epsilon_lower
from lightning_privacy.analysis.canary_fdp import (
    INDEPENDENT_METHODS,
    INDEPENDENT_WEIGHTS,
    SOUND_DEFAULT,
    gauss_mu_lower,
    orderstat_epsilon_lower,
    orderstat_mu_lower,
    tightest_canary_bound,
)
from lightning_privacy.analysis.estimation import score_orientation
from lightning_privacy.audits._common import AuditResult, ClaimChecked, jsonable, warnings_markdown
from lightning_privacy.reporting import ReportSection, claim_rows, result_warnings

__all__ = ["CanaryResult", "audit_canaries"]

CORRECTIONS = ("bonferroni", "split")

#: method -> (bound, guesses, correct, optimistic, ceiling) keys
KEYS = {
    "binomial": (
        names.CANARY_EPSILON_LOWER,
        names.CANARY_GUESSES,
        names.CANARY_CORRECT,
        names.CANARY_EPSILON_OPTIMISTIC,
        names.CANARY_EPSILON_LOWER_MAX,
    ),
    "fdp": (
        names.CANARY_EPSILON_LOWER_FDP,
        names.CANARY_GUESSES_FDP,
        names.CANARY_CORRECT_FDP,
        names.CANARY_EPSILON_OPTIMISTIC_FDP,
        names.CANARY_EPSILON_LOWER_MAX_FDP,
    ),
    "gdp": (
        names.CANARY_EPSILON_GDP_GAUSSIAN_READING,
        names.CANARY_GUESSES_GDP,
        names.CANARY_CORRECT_GDP,
        names.CANARY_EPSILON_OPTIMISTIC_GDP,
        names.CANARY_EPSILON_GDP_GAUSSIAN_READING_MAX,
    ),
}
#: the methods' names in the summary's table and the report (what each reading assumes)
LABELS = {
    "binomial": "binomial (Steinke et al.): any (ε, δ)-DP mechanism",
    "fdp": "f-DP test of the (ε, δ) curve (Mahloujifar et al.): any (ε, δ)-DP mechanism",
    "gdp": "Gaussian reading of the f-DP test: only if the mechanism is μ-GDP",
}
#: uncorrected values: kept in ``values`` and the summary, never logged as if they were bounds
OPTIMISTIC = (names.CANARY_EPSILON_OPTIMISTIC, names.CANARY_EPSILON_OPTIMISTIC_FDP, names.CANARY_EPSILON_OPTIMISTIC_GDP)


REPORT_TITLE = "One-run canary audit"
FIGURE_CAPTION = (
    "Theory vs practice: the accountant's ε (an upper bound) beside the canary audit's lower bounds (and ε*, "
    "PANORAMIA ε̃ when those audits ran; they are not DP bounds)."
)


def report_rows(values: Mapping[str, float], accountant_epsilon: Optional[float], alpha: float) -> List[tuple]:
    """The report's rows for the canary ``values`` (a result's ``values`` and ``metrics()``); "not run" for none.

    The bounds valid for every (ε, δ)-DP mechanism first (the tightest, the headline, leads), then the Gaussian
    readings under names that say so (lower bounds only if the mechanism is μ-GDP)."""
    if not values:
        return [("canary audit", "—", "not run (it runs at the end of fit)")]
    level = f"{100 * (1 - alpha):g}%"
    rows = []
    if accountant_epsilon is not None:
        rows.append(
            ("accountant ε", f"{accountant_epsilon:.4g}", "upper bound the run claims at the audit's δ (theory)")
        )

    def row(key: str, meaning: str) -> None:
        if key in values:
            rows.append((f"`{key}`", f"{values[key]:.4g}", meaning))

    row(
        names.CANARY_EPSILON_LOWER_TIGHTEST,
        f"the headline: the largest of the bounds valid for every (ε, δ)-DP mechanism, each at its share of α fixed "
        f"before the run; {level} confidence",
    )
    row(
        names.CANARY_EPSILON_LOWER,
        f"lower bound on ε with {level} confidence (Steinke et al., binomial), any (ε, δ)-DP mechanism: the run is not "
        "(ε', δ)-DP for any smaller ε' (practice)",
    )
    row(
        names.CANARY_EPSILON_LOWER_FDP,
        f"the same from the f-DP test of the (ε, δ) curve (Mahloujifar et al.), any (ε, δ)-DP mechanism, {level} "
        "confidence",
    )
    row(
        names.CANARY_EPSILON_LOWER_ORDERSTAT,
        f"the same from the order statistics of the scores read through the (ε, δ) curve (independent canaries, any "
        f"(ε, δ)-DP mechanism), {level} confidence",
    )
    if names.CANARY_GUESSES in values:
        rows.append(
            (
                "guesses / correct (binomial)",
                f"{int(values[names.CANARY_GUESSES])} / {int(values[names.CANARY_CORRECT])}",
                "canaries the auditor guessed (in or out) and how many of those guesses were right",
            )
        )
    row(
        names.CANARY_EPSILON_LOWER_MAX,
        "ceiling: the largest binomial bound this many canaries can give (every guess right), whatever the true ε",
    )
    row(
        names.CANARY_EPSILON_GDP_GAUSSIAN_READING,
        f"Gaussian reading of the f-DP test: a lower bound ({level}) only if the mechanism is μ-GDP; it can exceed the "
        "true ε of other mechanisms (Laplace, randomized response)",
    )
    row(
        names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING,
        f"Gaussian reading of the order statistics: a lower bound ({level}) only if the mechanism is μ-GDP "
        "(independent canaries)",
    )
    if names.CANARY_EPSILON_OPTIMISTIC in values:
        rows.append(
            (
                "uncorrected best (binomial)",
                f"{values[names.CANARY_EPSILON_OPTIMISTIC]:.4g}",
                "the best of many tests without correction, as papers report it: NOT a valid bound",
            )
        )
    return rows


@dataclass
class CanaryResult(ClaimChecked, AuditResult):
    """A one-run canary audit: both bounds (binomial, Gaussian f-DP), their ceilings for m, the optimistic values.

    Attributes:
        values: every number under its ``names.CANARY_*`` key (the optimistic ones included).
        details: the per-method :class:`~lightning_privacy.analysis.canary.CanaryAuditResult`.
        kind: what the canaries were (``"gradient"``, ``"input"`` or ``"scores"``).
        num_canaries, num_included, alpha, correction: the game.
        accountant_epsilon: the run's accountant ε at the same δ (upper bound), if known.
        others: other audits' ε values to draw beside (``names.EPSILON_STAR``, ``names.PANORAMIA_EPSILON``).
        warnings: why the bounds may carry no information: scores that look reversed (included canaries
            scoring lower than excluded ones, one-sided Mann-Whitney test at
            :data:`~lightning_privacy.analysis.estimation.REVERSED_LEVEL`).
        claim: the :class:`~lightning_privacy.claims.Claim` tested (add/remove, the canaries' in/out game), if any;
            ``claim_verdict``: its :class:`~lightning_privacy.analysis.claims.ClaimVerdict` at confidence 1 − α
            (binomial ε lower bound at the claim's δ beyond its ε, or the f-DP one-run test of the claim's own
            trade-off curve; α split between them, Bonferroni over the guess grid).
        relation: ``"add_remove"``: the relation of the claim (each canary is in the run or not).
        independent: the canaries' scores are independent given their bits (white-box gradient canaries not scored
            ``"released"``): the order-statistic bound and claim test ran
            (:mod:`~lightning_privacy.analysis.canary_fdp`).
        tightest: the :class:`~lightning_privacy.analysis.canary_fdp.TightestBound`, the headline: the largest of the
            bounds valid for every (ε, δ)-DP mechanism (the f-DP test of the (ε, δ) curve; for independent canaries
            also the order statistics read through that curve, at the fixed shares
            :data:`~lightning_privacy.analysis.canary_fdp.INDEPENDENT_WEIGHTS`) and its test.
        score_bounds: the :class:`~lightning_privacy.analysis.canary_fdp.FdpBound` of ``"orderstat"`` (the (ε, δ)
            reading), ``"orderstat_gaussian"`` and ``"gauss"`` (Gaussian readings; ``"gauss"`` is a model's
            estimate), independent canaries only; never a verdict.
    """

    values: Dict[str, float]
    details: Dict[str, CanaryAuditResult]
    kind: str
    num_canaries: int
    num_included: int
    alpha: float
    correction: str
    accountant_epsilon: Optional[float] = None
    others: Dict[str, float] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()
    claim: Any = None
    claim_verdict: Any = None
    relation: str = "add_remove"
    independent: bool = False
    tightest: Any = None
    score_bounds: Dict[str, Any] = field(default_factory=dict)

    @property
    def epsilon_lower(self) -> float:
        """The binomial (Steinke et al.) lower bound, valid at level α."""
        return self.values[names.CANARY_EPSILON_LOWER]

    @property
    def ceiling(self) -> float:
        """The largest binomial bound m canaries can give (all guesses right)."""
        return self.values[names.CANARY_EPSILON_LOWER_MAX]

    def metrics(self) -> Dict[str, float]:
        """The logged scalars (valid bounds, counts and ceilings, the claim's verdict; not the optimistic values)."""
        out = {k: v for k, v in self.values.items() if k not in OPTIMISTIC}
        if self.claim_verdict is not None:
            out[names.CANARY_CLAIM_CONTRADICTED] = float(self.claim_verdict.contradicted)
        return out

    def summary(self) -> str:
        """The Markdown text: the headline (sound for every (ε, δ)-DP mechanism) first, then the Gaussian readings
        under names that say so, the warnings (if any), the table of the grid methods."""
        eps = self.accountant_epsilon
        v = self.values
        headline = v[names.CANARY_EPSILON_LOWER_TIGHTEST] if self.tightest is None else self.tightest.epsilon_lower
        test = "" if self.tightest is None else f": {self.tightest.method} test"
        readings = [
            f"{what} {v[key]:.3f}"
            for key, what in (
                (names.CANARY_EPSILON_GDP_GAUSSIAN_READING, "f-DP"),
                (names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING, "order statistics"),
            )
            if key in v
        ]
        lines = [  # the first line is what the console shows: the headline number first
            f"Canary audit ({self.kind}, m = {self.num_canaries}): ε ≥ {headline:.3f} (sound for any (ε, δ)-DP "
            f"mechanism{test}); accountant ε "
            + ("n/a (no DP-SGD)" if eps is None else f"≤ {eps:.3f}")
            + (f". Gaussian readings, if the mechanism is μ-GDP: {', '.join(readings)}" if readings else ""),
            "",
        ]
        if self.tightest is not None:
            t = self.tightest
            lines += [
                f"Headline: ε ≥ {t.epsilon_lower:.3f} from the {t.method} test, the largest of the tests valid for "
                f"every (ε, δ)-DP mechanism (α = {t.alpha:g} split before the run: "
                + ", ".join(f"{name} at {t.levels[name]:.3g}" for name in t.methods)
                + f"); binomial at α: ε ≥ {v[names.CANARY_EPSILON_LOWER]:.3f}.",
                "",
            ]
        for name, b in self.score_bounds.items():
            what = {
                "orderstat": "read through the (ε, δ) curve: any (ε, δ)-DP mechanism, independent canaries",
                "orderstat_gaussian": "Gaussian reading: only if μ-GDP, independent canaries",
                "gauss": "Gaussian score model: not a DP bound",
            }[name]
            lines += [f"{name}: μ ≥ {b.mu_lower:.3f}, ε ≥ {b.epsilon_lower:.3f} at δ ({what}).", ""]
        if self.warnings:
            lines += [warnings_markdown(self.warnings), ""]
        lines += [
            "| method | ε lower | guesses / correct | (k₊, k₋) | ceiling for m | uncorrected best |",
            "|---|---|---|---|---|---|",
        ]
        for method, (bound, guesses, correct, optimistic, ceiling) in KEYS.items():
            d = self.details[method]
            lines.append(
                f"| {LABELS[method]} | {v[bound]:.4f} | {int(v[guesses])} / {int(v[correct])} "
                f"| ({d.k_plus}, {d.k_minus}) | {v[ceiling]:.4f} | {v[optimistic]:.4f} |"
            )
        lines.append(
            f"\nα = {self.alpha:g} ({self.correction}), δ = {self.details['binomial'].delta:.3g}, "
            f"{self.num_included} of {self.num_canaries} canaries included. The uncorrected best is the usual paper "
            "number; it is not a valid level-α bound. A Gaussian reading reads a μ as ε through the Gaussian trade-off "
            "curve, which only a Gaussian mechanism has: for others (Laplace, randomized response) it can exceed the "
            "true ε."
        )
        if self.claim_verdict is not None:
            lines.append(
                f"\nClaim tested (add/remove): {self.claim.label}, ε = {self.claim.epsilon:.4g} at δ = "
                f"{self.claim.delta:.3g}. Verdict: {self.claim_verdict.sentence()}."
            )
        return "\n".join(lines)

    def report_section(self, trainer: Any = None) -> ReportSection:
        """The report's section: both bounds and their ceiling, the claim's verdict, warnings first, the figure."""
        rows = report_rows({**self.values, **self.metrics()}, self.accountant_epsilon, self.alpha)
        rows += claim_rows(self, names.CANARY_CLAIM_CONTRADICTED)
        return ReportSection(
            REPORT_TITLE, rows, figures=[(self.figure, FIGURE_CAPTION)], warnings=result_warnings(self)
        )

    def figure(self) -> Any:
        """Theory vs practice: the accountant's ε (upper bound) beside the canary bounds, ε* and PANORAMIA ε̃."""
        from matplotlib.figure import Figure

        v = self.values
        bars = []
        if self.accountant_epsilon is not None:
            bars.append(("accountant ε (upper bound)", self.accountant_epsilon, "C3"))
        if self.claim is not None and math.isfinite(self.claim.epsilon):
            verdict = "" if self.claim_verdict is None else f": {self.claim_verdict.verdict.upper()}"
            color = "red" if self.claim_verdict is not None and self.claim_verdict.contradicted else "C1"
            bars.append((f"claim ε at δ = {self.claim.delta:.3g}{verdict}", self.claim.epsilon, color))
        bars += [
            ("canary ε lower bound (headline: any (ε, δ)-DP)", v[names.CANARY_EPSILON_LOWER_TIGHTEST], "C0"),
            ("canary ε lower bound (binomial)", v[names.CANARY_EPSILON_LOWER], "C9"),
            ("Gaussian reading of the f-DP test (if μ-GDP)", v[names.CANARY_EPSILON_GDP_GAUSSIAN_READING], "C2"),
        ]
        if names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING in v:
            bars.append(
                (
                    "Gaussian reading, order statistics (if μ-GDP)",
                    v[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING],
                    "C6",
                )
            )
        if names.EPSILON_STAR in self.others:
            bars.append(("ε* (Epsilon*, not a DP bound)", self.others[names.EPSILON_STAR], "C4"))
        if names.PANORAMIA_EPSILON in self.others:
            bars.append(("PANORAMIA ε̃ (not a DP bound)", self.others[names.PANORAMIA_EPSILON], "C5"))
        fig = Figure(figsize=(8, 0.6 * len(bars) + 1.8), layout="constrained")
        ax = fig.subplots()
        y = np.arange(len(bars))[::-1]
        heights = [max(value, 0.0) for _, value, _ in bars]
        uppers = sum(1 for label, _, _ in bars if label.startswith(("accountant", "claim")))
        ax.barh(y, heights, color=[c for _, _, c in bars])
        ax.set_yticks(y, [label for label, _, _ in bars])
        for yi, value in zip(y, heights):
            ax.annotate(f"{value:.3g}", (value, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ceiling = self.ceiling
        ax.axvline(
            ceiling, color="grey", linestyle="--", label=f"largest binomial bound m = {self.num_canaries} can give"
        )
        if uppers and max(heights[:uppers]) > 10 * max(heights[uppers:] + [ceiling]):
            ax.set_xscale("symlog", linthresh=1.0)  # a weak guarantee (large ε) would flatten the lower bounds
        ax.set_xlabel("ε (at the audit's δ)")
        ax.set_title(f"Theory vs practice: {self.kind} canaries, α = {self.alpha:g}")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
        return fig

    def to_dict(self) -> Dict[str, Any]:
        return jsonable(
            {
                "kind": self.kind,
                "num_canaries": self.num_canaries,
                "num_included": self.num_included,
                "alpha": self.alpha,
                "correction": self.correction,
                "accountant_epsilon": self.accountant_epsilon,
                "values": self.values,
                "details": {method: d.to_dict() for method, d in self.details.items()},
                "others": self.others,
                "warnings": list(self.warnings),
                "relation": self.relation,
                "independent": self.independent,
                "tightest": None if self.tightest is None else self.tightest.to_dict(),
                "score_bounds": {name: b.to_dict() for name, b in self.score_bounds.items()},
                "claim": None if self.claim is None else self.claim.to_dict(),
                "verdict": self.verdict,
                "evidence": self.evidence,
                "claim_tests": None if self.claim_verdict is None else [dict(t) for t in self.claim_verdict.tests],
            }
        )


def audit_canaries(
    scores: Any,
    included: Any,
    *,
    delta: float,
    alpha: float = 0.05,
    correction: str = "bonferroni",
    seed: int = 0,
    kind: str = "scores",
    accountant_epsilon: Optional[float] = None,
    others: Optional[Mapping[str, float]] = None,
    claim: Any = None,
    claim_tests: str = "both",
    independent: bool = False,
) -> CanaryResult:
    """Both one-run ε lower bounds from canary scores (higher score = "this canary was included").

    Args:
        scores: one score per canary (1-D, finite).
        included: whether each canary was included (1-D bools, same length), drawn independently with probability
            1/2 before training (e.g. ``np.random.default_rng(seed).random(m) < 0.5``); a vector whose count no such
            draw plausibly gives (exact two-sided binomial test at level 1e-6, so an honest draw is essentially never
            refused) raises ``ValueError`` (:func:`~lightning_privacy.analysis.canary.check_inclusion`).
        delta: δ of the (ε, δ) claim being audited, in [0, 1).
        alpha: significance of the bound, in (0, 1).
        correction: ``"bonferroni"`` over the (k₊, k₋) grid fixed by m, or ``"split"`` (choose on half, test on the
            other); the uncorrected best is kept as ``…_optimistic``.
        seed: seed of the split (``correction="split"``).
        kind: a label for the summary and the figure.
        accountant_epsilon: the run's ε upper bound at ``delta``, drawn beside the bounds.
        others: other audits' values to draw (``names.EPSILON_STAR``, ``names.PANORAMIA_EPSILON``).
        claim: a guarantee to test (a :class:`~lightning_privacy.claims.Claim`, a ``PrivacyLedger``,
            ``(noise_multiplier, sample_rate, steps[, delta])`` or ``(epsilon, delta)``); the result's ``verdict``
            says whether the canaries contradict it at confidence 1 − ``alpha``
            (:func:`~lightning_privacy.analysis.claims.check_canaries`).
        claim_tests: ``"both"`` (α split between the binomial (ε, δ) test and the f-DP test of the claim's curve) or
            ``"fdp"`` (all of α on the f-DP test; :meth:`~lightning_privacy.claims.Claim.check_canaries`).
        independent: the caller vouches that the scores are independent given the bits, one law per side (white-box
            Dirac gradient canaries scored ``"released_minus_batch"`` or ``"likelihood_ratio"``; never input
            canaries): adds the order-statistic bound read through the (ε, δ) curve
            (``names.CANARY_EPSILON_LOWER_ORDERSTAT``) to the headline, where it gets 0.1 of α and the f-DP test of
            the (ε, δ) curve 0.9 (:data:`~lightning_privacy.analysis.canary_fdp.INDEPENDENT_WEIGHTS`, fixed before
            any run; without ``independent`` the f-DP test takes all of α), the Gaussian readings
            (``names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING``, the model's estimate ``names.CANARY_EPSILON_GAUSS``)
            and the order-statistic test of the claim's own curve to the claim's verdict with ``claim_tests="both"``
            (α split three ways; ``"fdp"`` keeps all of α on the f-DP test; :mod:`~lightning_privacy.analysis.canary_fdp`).

    The headline (:attr:`CanaryResult.tightest`, ``names.CANARY_EPSILON_LOWER_TIGHTEST``, the summary's first line)
    combines only tests valid for every (ε, δ)-DP mechanism; the Gaussian readings (μ read as ε through the Gaussian
    trade-off curve) are reported beside it under names that say so, never as the headline.

    Raises:
        TypeError, ValueError: on bad arguments (named), from here or from
            :func:`~lightning_privacy.analysis.canary.canary_audit_from_scores`.
    """
    from lightning_privacy.claims import Claim

    expect_choice("correction", correction, CORRECTIONS)
    claim = None if claim is None else Claim.parse(claim)
    delta = expect_real("delta", delta, low=0.0, high=1.0, high_open=True)
    alpha = expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)
    included_arr = np.asarray(included, dtype=bool)
    m = int(included_arr.size)
    tested = m - m // 2 if correction == "split" else m
    per_test = alpha / len(guess_grid(m)) if correction == "bonferroni" else alpha
    values: Dict[str, float] = {}
    details: Dict[str, CanaryAuditResult] = {}
    for method, (bound, guesses, correct, optimistic, ceiling) in KEYS.items():
        res = canary_audit_from_scores(
            scores=scores, included=included, delta=delta, alpha=alpha, method=method, correction=correction, seed=seed
        )
        details[method] = res
        values[bound], values[guesses], values[correct] = res.epsilon_lower, res.num_guesses, res.num_correct
        values[ceiling] = max_epsilon_lower(num_canaries=tested, alpha=per_test, delta=delta, method=method)
        values[optimistic] = res.optimistic
    methods = INDEPENDENT_METHODS if independent else SOUND_DEFAULT
    score_bounds: Dict[str, Any] = {}
    if independent:
        score_bounds["orderstat"] = orderstat_epsilon_lower(scores, included, alpha=alpha, delta=delta)
        values[names.CANARY_EPSILON_LOWER_ORDERSTAT] = score_bounds["orderstat"].epsilon_lower
        score_bounds["orderstat_gaussian"] = orderstat_mu_lower(scores, included, alpha=alpha, delta=delta)
        values[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING] = score_bounds["orderstat_gaussian"].epsilon_lower
        if min(int(included_arr.sum()), m - int(included_arr.sum())) >= 2 and np.ptp(np.asarray(scores)) > 0:
            score_bounds["gauss"] = gauss_mu_lower(scores, included, alpha=alpha, delta=delta)
            values[names.CANARY_EPSILON_GAUSS] = score_bounds["gauss"].epsilon_lower
    tightest = tightest_canary_bound(
        scores=scores,
        included=included,
        delta=delta,
        alpha=alpha,
        methods=methods,
        weights=INDEPENDENT_WEIGHTS if independent else None,  # fixed before the run (Bonferroni); sound methods only
        seed=seed,
    )
    values[names.CANARY_EPSILON_LOWER_TIGHTEST] = tightest.epsilon_lower
    orientation = score_orientation(scores, included_arr)
    found = ()
    if orientation.reversed:
        found = (
            "the canary scores look reversed: included canaries score lower than excluded ones (AUC = "
            f"{orientation.auc:.3f} < 0.5, one-sided test p = {orientation.pvalue:.2g} < {orientation.level:g}), so "
            "the guesses ('included' for the highest scores) are wrong and a bound of 0 says nothing about privacy; "
            "if lower means included (e.g. losses), negate the scores",
        )
    return CanaryResult(
        values={k: float(v) for k, v in values.items()},
        details=details,
        kind=kind,
        num_canaries=m,
        num_included=int(included_arr.sum()),
        alpha=alpha,
        correction=correction,
        accountant_epsilon=None if accountant_epsilon is None else float(accountant_epsilon),
        others={str(k): float(v) for k, v in (others or {}).items()},
        warnings=found,
        claim=claim,
        claim_verdict=None
        if claim is None
        else _verdict(claim, scores, included_arr, alpha, seed, claim_tests, independent),
        independent=bool(independent),
        tightest=tightest,
        score_bounds=score_bounds,
    )


def _verdict(claim: Any, scores: Any, included: np.ndarray, alpha: float, seed: int, tests: str, independent: bool):
    """The claim's verdict: :meth:`Claim.check_canaries`, plus the order-statistic test for independent canaries."""
    if not independent or claim.tpr_bound is None or tests != "both":  # "fdp": all of α on the f-DP test, as before
        return claim.check_canaries(scores, included, alpha=alpha, seed=seed, tests=tests)
    import dataclasses

    from lightning_privacy.analysis.claims import check_canaries

    verdict = check_canaries(
        scores, included, epsilon=claim.epsilon, delta=claim.delta, tpr_bound=claim.tpr_bound, alpha=alpha, seed=seed,
        independent=True,
    )  # fmt: skip
    return dataclasses.replace(verdict, curve=claim.curve)  # the claim's own curve, never a Gaussian one

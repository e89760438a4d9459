"""End-of-training privacy report: everything the privacy callbacks of a Trainer know after ``fit``.

:func:`privacy_report` returns Markdown, one section per privacy callback present in
``trainer.callbacks``, each value with a one-line plain-language meaning; approximate values (closed
forms, estimates) are marked as such. :func:`privacy_report_html` returns the same sections as one
self-contained HTML page with the figures embedded (base64 PNG): β* per epoch with the budget and the
TPR–FPR region, the Epsilon* histograms and fits, the PANORAMIA curves, the privacy profile with its most
exposed rows, the canary audit's theory-vs-practice chart, the membership attack's log–log ROC inside the
accountant's region, β*_AI per epoch and, on log–log axes, the region DP-SGD's accountant allows any membership
attack. :func:`log_privacy_report` writes the Markdown
to TensorBoard as text (``privacy/report``) and, optionally, to a file: ``.html``/``.htm`` gets the page,
any other suffix (``.md``) the Markdown.

The audit sections render the audits' results (:mod:`lightning_privacy.audits`): :func:`audit_report`
gives the same section for a result of a direct call such as ``audit_epsilon_star(model, ...)``. A result's
``warnings`` (why its numbers may carry no information) come first in its section, after any sentence saying that an
attack beat the accountant's bound (``outside``), as quoted
"**Warning:**" paragraphs in the Markdown and highlighted paragraphs on the HTML page.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

import lightning.pytorch as pl

from lightning_privacy import _CALLBACKS, __version__, names

__all__ = ["REPORT_TAG", "audit_report", "figure_png", "log_privacy_report", "privacy_report", "privacy_report_html"]

REPORT_TAG = names.PRIVACY_REPORT
_REPORTED = (
    "DPSGD",
    "BayesSecurityMonitor",
    "AttributeInferenceMonitor",
    "PrivacyBudgetStopping",
    "EpsilonStarAudit",
    "PanoramiaAudit",
    "PrivacyProfileAudit",
    "MembershipAudit",
    "CanaryAudit",
)
HTML_SUFFIXES = (".html", ".htm")


def _of(trainer: pl.Trainer, name: str) -> List[Any]:
    """Callbacks of class ``name`` or a subclass, matched by qualified name (no module is imported)."""
    return [
        c
        for c in trainer.callbacks
        if any((k.__module__, k.__name__) == (_CALLBACKS[name], name) for k in type(c).__mro__)
    ]


def _table(title: str, rows: List[tuple], warnings: Tuple[str, ...] = ()) -> str:
    """A section's heading, its warnings (one quoted "**Warning:**" paragraph each) and its value table."""
    lines = [f"## {title}", ""]
    for warning in warnings:
        lines += [f"> **Warning:** {warning}", ""]
    lines += ["| quantity | value | meaning |", "|---|---|---|"]
    lines += [f"| {q} | {v} | {m} |" for q, v, m in rows]
    return "\n".join(lines)


def _dpsgd(cb: Any) -> List[tuple]:
    sigma = "—" if cb.noise_multiplier is None else f"{cb.noise_multiplier:.4f}"
    rate = getattr(cb, "sample_rate", None)
    return [
        ("noise multiplier σ", sigma, "Gaussian noise of std σ·C is added to every summed batch gradient"),
        ("clipping norm C", f"{cb.max_grad_norm:g}", "each example's gradient is clipped to norm ≤ C"),
        (
            "sample rate p",
            "—" if rate is None else f"{rate:.6g}",
            "each example joins a batch with probability p (Poisson)",
        ),
        ("optimizer steps", str(cb.steps), "DP-SGD steps recorded by the accountant"),
        (
            f"ε at δ = {cb.delta:g} ({cb.accountant_mechanism} accountant)",
            _up(cb.epsilon()),
            "the run is (ε, δ)-DP by the accountant's upper bound; a reference, in ε units",
        ),
        *_seed_rows(cb),
    ]


def _seed_rows(cb: Any) -> List[tuple]:
    """Which of the run's randomness was secret: the guarantee assumes the adversary knows neither the batches nor
    the noise, so a fixed seed is said next to the ε it weakens."""
    settings = cb.privacy_settings() if hasattr(cb, "privacy_settings") else {}
    rows = []
    for key, what in ((names.DP_SAMPLING_SEED, "sampling seed"), (names.DP_NOISE_SEED, "noise seed")):
        kind = settings.get(key)
        if kind is None:
            continue
        note = (
            "known to whoever knows the seed: the guarantee holds only against an adversary who does not"
            if kind.startswith("fixed")
            else "the adversary cannot reproduce it"
        )
        rows.append((what, kind, note))
    return rows


def _down(value: float, digits: int = 4) -> str:
    """A lower bound (β*) shown with ``digits`` decimals, rounded down: the page never shows more security."""
    return f"{math.floor(value * 10**digits) / 10**digits:.{digits}f}" if math.isfinite(value) else f"{value}"


def _up(value: float, digits: Optional[int] = None) -> str:
    """An upper bound (ε, advantage, TPR) rounded up: to ``digits`` decimals, or to 4 significant digits."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.4g}"
    if digits is None:
        scale = 10.0 ** (math.floor(math.log10(abs(value))) - 3)
        return f"{math.ceil(value / scale) * scale:.4g}"
    return f"{math.ceil(value * 10**digits) / 10**digits:.{digits}f}"


def _down_sig(value: float) -> str:
    """A lower end rounded down to 4 significant digits (the counterpart of :func:`_up`'s default)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.4g}"
    scale = 10.0 ** (math.floor(math.log10(abs(value))) - 3)
    return f"{math.floor(value / scale) * scale:.4g}"


def _bayes(cb: Any) -> List[tuple]:
    final = getattr(cb, "final", None)
    if not final:
        return [("β*_MIA", "—", "no DP-SGD step was recorded, nothing to bound")]
    beta = final[names.MIA_BAYES_SECURITY]
    rows = [
        (
            "β*_MIA",
            _down(beta),
            f"safe (pessimistic PLD, exact-or-lower): any membership attacker's accuracy ≤ {_up(100 * (1 - beta / 2), 1)}% "
            "at a uniform prior",
        ),
        (
            "β*_MIA closed form",
            f"{final[names.MIA_BAYES_SECURITY_CLOSED_FORM]:.4f}",
            "approximate (Cor. 7), for comparison; can overstate security",
        ),
        ("membership advantage", _up(final[names.MIA_ADVANTAGE]), "1 − β*: bound on any attacker's TPR − FPR"),
    ]
    for key, fpr in (
        (names.MIA_TPR_BOUND_FPR_0_001, "0.001"),
        (names.MIA_TPR_BOUND_FPR_0_01, "0.01"),
        (names.MIA_TPR_BOUND_FPR_0_1, "0.1"),
    ):
        if key in final:
            rows.append(
                (
                    f"TPR bound at FPR {fpr}",
                    _up(final[key]),
                    f"largest share of members any attacker finds while flagging {float(fpr):.1%} of non-members "
                    "(the mechanism's trade-off curve)",
                )
            )
    if names.APPROXIMATION_ERROR in final:
        rows.append(
            (
                "closed-form error term",
                f"{final[names.APPROXIMATION_ERROR]:.4g}",
                "Prop. 4 worst-case bound; loose (often > 1)",
            )
        )
    return rows


def _ai(cb: Any) -> List[tuple]:
    if cb.max_grad_norm is None:
        return [("β*_AI", "—", "no DP-SGD step was seen, nothing to bound")]
    return [
        (
            f"β*_AI (`{cb.key}`)",
            _down(cb.bayes_security()),
            f"safe (pessimistic PLD over the measured R_t, pair ±R_t/2; exact-or-lower): attribute `{cb.attribute.name}`: any "
            "attacker's error ≥ β* × the error of guessing from the prior alone; data-dependent, may leak membership",
        ),
        (
            f"β*_AI closed form (`{cb.closed_form_key}`)",
            f"{cb.bayes_security_closed_form():.4f}",
            "approximate (Cor. 10), for comparison; can overstate security",
        ),
        ("steps accounted", str(cb.steps), "unmeasured steps count at the worst case R = 2C"),
        ("largest sensitivity R_t", f"{cb.max_sensitivity:.4g}", f"worst case would be 2C = {2 * cb.max_grad_norm:g}"),
    ]


def _stopping(cb: Any) -> List[tuple]:
    threat = cb.threat.upper()
    stopped = "no" if cb.stopped_at_step is None else str(cb.stopped_at_step)
    if cb.max_epsilon is not None:
        delta = "the run's δ" if cb.delta is None else f"δ = {cb.delta:g}"
        budget = (
            f"budget ε ≤ (at {delta})",
            f"{cb.max_epsilon:g}",
            "training stops before the step that would break it",
        )
    else:
        budget = (
            f"budget β*_{threat} ≥",
            f"{cb.min_bayes_security:g}",
            "training stops before the step that would break it",
        )
    decision = (
        "the run's accountant"
        if cb.max_epsilon is not None
        else ("safe β* (pessimistic PLD)" if cb.threat == "mia" else "worst case R = 2C for the next step")
    )
    return [
        budget,
        ("stopped after step", stopped, 'step of the stop ("no": the budget was never reached)'),
        ("decision", decision, "what the stop was decided on; never the approximate closed form"),
    ]


def _epsilon_star_rows(values: Mapping[str, float], fits_rejected: bool = False) -> List[tuple]:
    meaning = {
        names.EPSILON_STAR: "estimate (parametric Normal fits), not a bound; empirical privacy of the loss-threshold attack"
        + ("; NOT RELIABLE here: the KS test rejects the Normal fits (see the warning)" if fits_rejected else ""),
        names.EPSILON_STAR_EMPIRICAL: "estimate from the empirical loss distributions, not a bound",
        names.MIA_EPSILON_LOWER: "lower bound (with confidence) on the ε of any DP guarantee, from the same losses",
    }
    return [(f"`{k}`", f"{v:.4g}", meaning.get(k, "")) for k, v in values.items()] or [("Epsilon*", "—", "not run")]


def _panoramia_rows(values: Mapping[str, float]) -> List[tuple]:
    if not values:
        return [("PANORAMIA", "—", "not run")]
    return [
        (
            "ε̃",
            f"{values[names.PANORAMIA_EPSILON]:.4g}",
            "NOT a lower bound on ε-DP: measured leakage beyond the generator's gap c_lb",
        ),
        (
            "c_lb",
            f"{values[names.PANORAMIA_C_LB]:.4g}",
            "how distinguishable generated rows are from real ones (lower bound)",
        ),
        (
            "{c+ε}_lb",
            f"{values[names.PANORAMIA_C_PLUS_EPSILON_LB]:.4g}",
            "the same for the membership attack on the model",
        ),
    ]


def _profile_rows(values: Mapping[str, float]) -> List[tuple]:
    if not values:
        return [("privacy profile", "—", "not run (or not on this rank)")]
    return [
        (
            "largest row loss",
            f"{values[names.PROFILE_MAX_LOSS]:.4g}",
            "|l| of the most exposed training row (|l|/β without ε)",
        ),
        (
            "recommended ε range",
            f"[{values[names.PROFILE_EPSILON_LOW]:.3g}, {values[names.PROFILE_EPSILON_HIGH]:.3g}]",
            "below: no privacy gain; above: no more loss",
        ),
        ("gradient norm ‖∇J‖", f"{values[names.PROFILE_GRADIENT_NORM]:.3g}", "0 at the optimum the analysis assumes"),
        (
            "approximation bound",
            f"{values[names.PROFILE_APPROXIMATION_BOUND]:.3g}",
            "bound on the relative error of the worst-case neighbours",
        ),
    ]


def _canary_rows(values: Mapping[str, float], accountant_epsilon: Optional[float], alpha: float) -> List[tuple]:
    if not values:
        return [("canary audit", "—", "not run (it runs at the end of fit)")]
    level = f"{100 * (1 - alpha):g}%"
    rows = []
    if accountant_epsilon is not None:
        rows.append(
            ("accountant ε", f"{accountant_epsilon:.4g}", "upper bound the run claims at the audit's δ (theory)")
        )
    rows += [
        (
            f"`{names.CANARY_EPSILON_LOWER}`",
            f"{values[names.CANARY_EPSILON_LOWER]:.4g}",
            f"lower bound on ε with {level} confidence (Steinke et al., binomial): the run is not (ε', δ)-DP for any "
            "smaller ε' (practice)",
        ),
        (
            f"`{names.CANARY_EPSILON_LOWER_GDP}`",
            f"{values[names.CANARY_EPSILON_LOWER_GDP]:.4g}",
            f"the same from the Gaussian f-DP test (Mahloujifar et al.), {level} confidence",
        ),
        (
            "guesses / correct (binomial)",
            f"{int(values[names.CANARY_GUESSES])} / {int(values[names.CANARY_CORRECT])}",
            "canaries the auditor guessed (in or out) and how many of those guesses were right",
        ),
        (
            f"`{names.CANARY_EPSILON_LOWER_MAX}`",
            f"{values[names.CANARY_EPSILON_LOWER_MAX]:.4g}",
            "ceiling: the largest bound this many canaries can give (every guess right), whatever the true ε",
        ),
    ]
    if names.CANARY_EPSILON_OPTIMISTIC in values:
        rows.append(
            (
                "uncorrected best (binomial)",
                f"{values[names.CANARY_EPSILON_OPTIMISTIC]:.4g}",
                "the best of many tests without correction, as papers report it: NOT a valid bound",
            )
        )
    return rows


def _claim_rows(result: Any, key: str) -> List[tuple]:
    """The claim a result tested (add/remove, the in/out game) and its verdict; no rows without a claim."""
    verdict = getattr(result, "claim_verdict", None)
    if verdict is None:
        return []
    claim = result.claim
    epsilon = "no finite ε" if not math.isfinite(claim.epsilon) else f"ε = {_up(claim.epsilon)}"
    return [
        (
            "claim tested",
            claim.label,
            f"the guarantee checked, in the in/out game (add/remove relation): {epsilon} at δ = {claim.delta:.3g} "
            "and its trade-off curve (TPR bound at every FPR)",
        ),
        (f"`{key}`", str(int(verdict.contradicted)), verdict.sentence() + " (multiple comparisons accounted for)"),
    ]


def _canary(cb: Any) -> List[tuple]:
    rows = _canary_rows(getattr(cb, "results", {}), getattr(cb, "accountant_epsilon", None), cb.alpha)
    return rows + _claim_rows(getattr(cb, "result", None), names.CANARY_CLAIM_CONTRADICTED)


def _epsilon_star(cb: Any) -> List[tuple]:
    result = getattr(cb, "result", None)
    return _epsilon_star_rows(cb.results, fits_rejected=result is not None and result.fits_rejected)


def _panoramia(cb: Any) -> List[tuple]:
    return _panoramia_rows(cb.result.metrics() if cb.result is not None else cb.last_values)


def _profile(cb: Any) -> List[tuple]:
    return _profile_rows(cb.result.metrics() if cb.result is not None else {})


_ATTACKS = {
    "rmia": "RMIA (Zarifzadeh et al. 2024): likelihood ratio against reference models, compared with population rows",
    "lira": "LiRA (Carlini et al. 2022): Gaussian likelihood ratio of the model's confidence against reference models",
    "loss": "the LOSS attack: the model's loss alone (low = member); the reference-free baseline",
}


def _membership_rows(result: Any, references: Any = None) -> List[tuple]:
    """Rows of a :class:`~lightning_privacy.audits.membership.MembershipAuditResult` (and its references)."""
    # AUC, TPR and the ε lower bound measure what an attack achieved: shown rounded down they would understate the
    # leakage, so, like the accountant's upper bounds, they are rounded UP at the digits shown. A Clopper–Pearson
    # interval is widened (low end down, high end up) so that it still covers what was computed.
    attack = result.attack
    refs = f", {result.num_references} reference model(s)" if result.num_references else ""
    members, nonmembers = int(result.is_member.sum()), int((~result.is_member).sum())
    rows = [
        ("attack", f"{attack.upper()} ({result.variant}{refs})", _ATTACKS.get(attack, "")),
        ("members / non-members", f"{members} / {nonmembers}", "audited training rows / rows the model never saw"),
        (
            f"`{names.membership_key(attack, 'auc')}`",
            _up(result.auc),
            "empirical: area under the attack's ROC curve (0.5 = chance), rounded up; not a bound",
        ),
    ]
    for j, point in enumerate(result.tpr):
        meaning = (
            f"empirical: share of members the attack finds while flagging ≤ {point.fpr:.1%} of non-members "
            f"(achieved FPR {point.achieved_fpr:.4g}), rounded up; in brackets its "
            f"{100 * (1 - point.alpha):g}% Clopper–Pearson interval"
        )
        if result.ledger_tpr_bounds is not None:
            meaning += (
                f"; the accountant allows at most {_up(result.ledger_tpr_bounds[j])} here (at the FPR's upper limit; "
                f"{result.relation.replace('_', '/')} relation: the in/out game)"
            )
        rows.append(
            (
                f"`{names.membership_key(attack, f'tpr_at_fpr_{point.fpr:g}')}`",
                f"{_up(point.tpr)} [{_down_sig(point.tpr_low)}, {_up(point.tpr_high)}]",
                meaning,
            )
        )
    epsilon = result.epsilon
    rows.append(
        (
            f"`{names.membership_key(attack, 'epsilon_lower')}`",
            _up(float(epsilon["epsilon_lower"])),
            f"lower bound ({100 * (1 - epsilon['alpha']):g}% Bayesian interval, holdout threshold) on the ε of any "
            f"(ε, δ = {result.delta:.3g})-DP guarantee, from the attack's scores; rounded up like the attack's numbers",
        )
    )
    if result.gamma is not None:
        rows.append(("RMIA γ / offline a", f"{result.gamma:g} / {result.offline_a:.3f}", "the attack's settings"))
    rows += _claim_rows(result, names.membership_key(attack, "claim_contradicted"))
    if references is not None and len(references):
        where = f", cached in `{references.cache_dir}`" if references.cache_dir else ""
        rows.append(
            (
                "reference models",
                f"{len(references)} ({references.trained} trained by this run{where})",
                "trained like the target on random halves of the population (rows neither member nor non-member)",
            )
        )
    return rows


def _membership(cb: Any) -> List[tuple]:
    if cb.result is None:
        return [("membership attack", "—", "not run (it runs at the end of fit)")]
    return _membership_rows(cb.result, getattr(cb, "references", None))


def _result_warnings(result: Any) -> Tuple[str, ...]:
    """An attack point beyond the accountant's bound (``outside``) first, then the result's ``warnings``."""
    return (*getattr(result, "outside", ()), *getattr(result, "warnings", ()))


_AUDIT_SECTIONS = {  # result class name -> (title, rows of the result)
    "EpsilonStarResult": ("Epsilon* audit", lambda r: _epsilon_star_rows(r.metrics(), r.fits_rejected)),
    "PanoramiaAuditResult": ("PANORAMIA audit", lambda r: _panoramia_rows(r.metrics())),
    "PrivacyProfileResult": ("Privacy profile audit", lambda r: _profile_rows(r.metrics())),
    "MembershipAuditResult": ("Membership attack (RMIA/LiRA/LOSS)", _membership_rows),
}


def audit_report(result: Any) -> str:
    """The report's Markdown section for one audit result (e.g. of a direct ``audit_epsilon_star`` call).

    The result's ``warnings`` (e.g. Normal fits the KS test rejects) come first, under the heading.

    Raises:
        TypeError: for anything but a result of :mod:`lightning_privacy.audits`.

    Example::

        >>> import numpy as np
        >>> from lightning_privacy.audits import audit_epsilon_star_from_losses
        >>> rng = np.random.default_rng(0)
        >>> result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)
        >>> lines = audit_report(result).splitlines()
        >>> print(lines[0], lines[2][:55], sep="\\n")  # Gamma losses: the KS test rejects the Normal fits
        ## Epsilon* audit
        > **Warning:** the Normal fits of Epsilon* are rejected
        >>> lines[6].split(" | ")[:2]
        ['| `audit/epsilon_star`', '4.122']
    """
    for klass in type(result).__mro__:
        if klass.__name__ in _AUDIT_SECTIONS and klass.__module__.startswith("lightning_privacy.audits"):
            title, rows = _AUDIT_SECTIONS[klass.__name__]
            return _table(title, rows(result), _result_warnings(result))
    raise TypeError(f"`result` must be a result of lightning_privacy.audits, got {type(result).__name__}")


_SECTIONS = {
    "DPSGD": ("DP-SGD", _dpsgd),
    "BayesSecurityMonitor": ("Bayes security against membership inference", _bayes),
    "AttributeInferenceMonitor": ("Bayes security against attribute inference", _ai),
    "PrivacyBudgetStopping": ("Budget stopping", _stopping),
    "EpsilonStarAudit": ("Epsilon* audit", _epsilon_star),
    "PanoramiaAudit": ("PANORAMIA audit", _panoramia),
    "PrivacyProfileAudit": ("Privacy profile audit", _profile),
    "MembershipAudit": ("Membership attack (RMIA/LiRA/LOSS)", _membership),
    "CanaryAudit": ("One-run canary audit", _canary),
}


# --- beyond the value rows: extra tables and figures ---------------------------------------------
@dataclass
class _Extra:
    """A table beside a section's value rows: a caption (Markdown inline), column names, cells."""

    caption: str
    header: List[str]
    cells: List[List[str]]


@dataclass
class _Section:
    """One callback's part of the report; ``figures`` are drawn only for the HTML page."""

    title: str
    rows: List[tuple]
    extras: List[_Extra] = field(default_factory=list)
    figures: List[Tuple[Callable[[], Any], str]] = field(default_factory=list)  # (draw, caption)
    warnings: Tuple[str, ...] = ()  # the audit result's: why its numbers may carry no information


def _budget(trainer: pl.Trainer, threat: str) -> Optional[float]:
    """A ``min_bayes_security`` budget against ``threat`` (``"mia"`` or ``"ai"``), as the figures draw it."""
    return next(
        (
            cb.min_bayes_security
            for cb in trainer.callbacks
            if getattr(cb, "threat", None) == threat and getattr(cb, "min_bayes_security", None) is not None
        ),
        None,
    )


_REGION_CAPTION = (
    "The region DP-SGD's accountant allows every membership attack (its trade-off curve for the relation of β*, "
    "named in the legend), on log–log axes: the low-FPR corner where attacks are judged; dots: the TPR bounds at FPR "
    "0.001, 0.01 and 0.1."
)


def _profile_top_rows(result: Any) -> List[_Extra]:
    top = result.top_rows
    if not top:
        return []
    columns = [k for k in top[0] if k not in ("row", "loss")]
    unit = "|l(x, y_i, M)|" if result.epsilon is not None else "|l(x, y_i, M)|/β (no ε given)"
    cells = [
        [str(rank), str(row["row"]), f"{row['loss']:.4g}", *(f"{row[c]:.4g}" for c in columns)]
        for rank, row in enumerate(top, 1)
    ]
    return [
        _Extra(
            f"Most exposed training rows (loss = {unit}), most exposed first", ["rank", "row", "loss", *columns], cells
        )
    ]


def _extras_and_figures(name: str, cb: Any, trainer: pl.Trainer, section: _Section) -> None:
    """Fill ``section``'s extra tables and (lazy) figures for callback ``cb`` of class ``name``."""
    if name == "BayesSecurityMonitor" and getattr(cb, "final", None):
        from lightning_privacy.callbacks._plots import bayes_security_figure

        budget = _budget(trainer, "mia")
        section.figures.append(
            (
                lambda: bayes_security_figure(cb.epochs, cb.final, ledger=cb.ledger, budget=budget),
                "Left: β*_MIA after each epoch (safe value and the approximate closed form"
                + ("" if budget is None else f"; dotted: the budget β* ≥ {budget:g}")
                + "). Right: the TPR–FPR region every membership attack's ROC curve lies in.",
            )
        )
        if cb.ledger is not None and cb.ledger.steps:
            from lightning_privacy.callbacks._plots import membership_region_figure

            section.figures.append((lambda: membership_region_figure(cb.ledger), _REGION_CAPTION))
    if name == "DPSGD" and cb.ledger.steps and not _of(trainer, "BayesSecurityMonitor"):
        from lightning_privacy.callbacks._plots import membership_region_figure

        section.figures.append((lambda: membership_region_figure(cb.ledger), _REGION_CAPTION))
    if name == "AttributeInferenceMonitor" and getattr(cb, "epochs", None):
        from lightning_privacy.callbacks._plots import attribute_inference_figure

        budget = _budget(trainer, "ai")
        section.figures.append(
            (
                lambda: attribute_inference_figure(
                    cb.epochs, attribute=getattr(cb.attribute, "name", str(cb.attribute)), budget=budget
                ),
                "β*_AI after each epoch: the safe value (pessimistic PLD over the measured R_t) and the approximate "
                "closed form (Cor. 10), which can overstate security"
                + ("" if budget is None else f"; dotted: the budget β*_AI ≥ {budget:g}")
                + ".",
            )
        )
    result = getattr(cb, "result", None)
    if result is None:
        return
    if name == "EpsilonStarAudit":
        section.figures.append(
            (
                result.figure,
                "Epsilon*: histograms of the transformed losses φ of members (training) and non-members with their "
                "Normal fits; the dashed line is the threshold that maximises the ratio.",
            )
        )
    elif name == "PanoramiaAudit":
        section.figures.append(
            (
                result.figure,
                "PANORAMIA: precision–recall of the baseline (generated vs real) and of the membership attack, and "
                "both lower bounds c_lb and {c+ε}_lb over recall.",
            )
        )
    elif name == "PrivacyProfileAudit":
        section.extras.extend(_profile_top_rows(result))
        section.figures.append(
            (
                result.figure,
                "Privacy profile: the typical profile of row losses by rank for several ε, and per rank across ε "
                "with the ε range worth trying.",
            )
        )
    elif name == "MembershipAudit":
        section.figures.append(
            (
                result.figure,
                f"Membership attack ({result.attack.upper()}): the ROC curve on log–log axes with the TPR at FPR ≤ "
                "0.001/0.01/0.1 and their Clopper–Pearson intervals"
                + (
                    "; shaded: the region DP-SGD's accountant allows (its trade-off curve for the in/out game, "
                    "add/remove relation)"
                    + ("; dashed: the claimed guarantee's curve." if result.claim is not None else ".")
                    if result.region is not None
                    else " (no DP-SGD ledger: no region)"
                    + ("; dashed: the claimed guarantee's curve (add/remove)." if result.claim is not None else ".")
                ),
            )
        )
    elif name == "CanaryAudit":
        from lightning_privacy.callbacks.canary_audit import _other_audits, theory_vs_practice_figure

        section.figures.append(
            (
                lambda: theory_vs_practice_figure(cb, _other_audits(trainer)),
                "Theory vs practice: the accountant's ε (an upper bound) beside the canary audit's lower bounds"
                " (and ε*, PANORAMIA ε̃ when those audits ran; they are not DP bounds).",
            )
        )


def _sections(trainer: pl.Trainer) -> List[_Section]:
    sections = []
    for name in _REPORTED:
        title, rows = _SECTIONS[name]
        for cb in _of(trainer, name):
            section = _Section(title, rows(cb), warnings=_result_warnings(getattr(cb, "result", None)))
            _extras_and_figures(name, cb, trainer, section)
            sections.append(section)
    if not sections:
        raise ValueError(
            f"No privacy callback in trainer.callbacks: add one of {', '.join(_REPORTED)} to get a report."
        )
    return sections


def _header(trainer: pl.Trainer) -> str:
    return f"After {trainer.current_epoch} epoch(s), global step {trainer.global_step}."


def _markdown(section: _Section) -> str:
    parts = [_table(section.title, section.rows, section.warnings)]
    for extra in section.extras:
        lines = [f"**{extra.caption}**", "", "| " + " | ".join(extra.header) + " |", "|---" * len(extra.header) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in extra.cells]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def privacy_report(trainer: pl.Trainer) -> str:
    """A Markdown report of the privacy callbacks in ``trainer.callbacks`` (call after ``fit``).

    Raises:
        ValueError: if the trainer has none of the privacy callbacks.

    Example::

        >>> import lightning.pytorch as pl
        >>> privacy_report(pl.Trainer(logger=False, enable_progress_bar=False))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: No privacy callback in trainer.callbacks: add one of DPSGD, BayesSecurityMonitor, ...
    """
    parts = [_markdown(section) for section in _sections(trainer)]
    return "\n\n".join([f"# Privacy report\n\n{_header(trainer)}", *parts]) + "\n"


# --- HTML ----------------------------------------------------------------------------------------
_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d2330;
       background: #f6f7f9; margin: 0; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { margin: 0 0 4px; font-size: 28px; }
h2 { margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid #e3e6ec; font-size: 20px; }
p.meta, footer { color: #5b6474; margin: 0 0 12px; }
nav ol { margin: 6px 0 0; padding-left: 22px; columns: 2; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 14px; }
th, td { border: 1px solid #dde1e8; padding: 6px 10px; text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; }
td.value { font-variant-numeric: tabular-nums; white-space: nowrap; font-weight: 600; }
td.meaning { color: #3c4454; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 6px 0; }
code { font: 13px ui-monospace, "DejaVu Sans Mono", monospace; background: #f1f3f6; padding: 1px 4px;
       border-radius: 3px; }
figure { margin: 10px 0 18px; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6ec; }
figcaption { color: #5b6474; font-size: 13px; margin-top: 4px; }
p.warning { background: #fff4e5; border-left: 4px solid #d9822b; padding: 8px 12px; margin: 8px 0 12px; }
footer { margin-top: 36px; font-size: 13px; }
"""


def _inline(text: str) -> str:
    """Markdown-ish cell text as HTML: escaped, with `code` spans kept as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(text)))


def _slug(title: str, used: set) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
    slug, n = base, 1
    while slug in used:
        n += 1
        slug = f"{base}-{n}"
    used.add(slug)
    return slug


def figure_png(figure: Any, *, dpi: int = 110) -> bytes:
    """A ``matplotlib.figure.Figure`` as PNG bytes (no pyplot: the user's backend is left alone).

    Example::

        >>> from matplotlib.figure import Figure
        >>> figure_png(Figure(figsize=(1, 1)))[:8]
        b'\\x89PNG\\r\\n\\x1a\\n'
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _html_figure(draw: Callable[[], Any], caption: str) -> str:
    try:
        png = figure_png(draw())
    except (ValueError, RuntimeError) as err:  # e.g. no parametric fit to draw
        return f'<p class="meta">Figure not drawn: {html.escape(str(err))}</p>'
    data = base64.b64encode(png).decode("ascii")
    alt = html.escape(caption, quote=True)
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _html_table(header: List[str], rows: List[List[str]], caption: str = "", classes: Tuple[str, ...] = ()) -> str:
    head = "".join(f"<th>{_inline(h)}</th>" for h in header)
    body = []
    for cells in rows:
        tds = "".join(
            f'<td class="{classes[i]}">{_inline(c)}</td>'
            if i < len(classes) and classes[i]
            else f"<td>{_inline(c)}</td>"
            for i, c in enumerate(cells)
        )
        body.append(f"<tr>{tds}</tr>")
    cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def privacy_report_html(trainer: pl.Trainer) -> str:
    """The report as one self-contained HTML page: every section's table, extra tables and figures (base64 PNG).

    The page needs nothing else (no script, no stylesheet, no network); open it in any browser or attach it to
    a review. Text is escaped with :func:`html.escape`.

    Raises:
        ValueError: if the trainer has none of the privacy callbacks.

    Example::

        >>> import lightning.pytorch as pl
        >>> privacy_report_html(pl.Trainer(logger=False, enable_progress_bar=False))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: No privacy callback in trainer.callbacks: add one of DPSGD, BayesSecurityMonitor, ...
    """
    sections = _sections(trainer)
    used: set = set()
    slugs = [_slug(s.title, used) for s in sections]
    toc = "".join(f'<li><a href="#{slug}">{html.escape(s.title)}</a></li>' for s, slug in zip(sections, slugs))
    body = []
    for section, slug in zip(sections, slugs):
        parts = [f'<section id="{slug}"><h2>{html.escape(section.title)}</h2>']
        parts += [f'<p class="warning"><strong>Warning:</strong> {_inline(w)}</p>' for w in section.warnings]
        parts.append(
            _html_table(
                ["quantity", "value", "meaning"], [list(r) for r in section.rows], classes=("", "value", "meaning")
            )
        )
        for extra in section.extras:
            parts.append(_html_table(extra.header, extra.cells, caption=extra.caption))
        parts += [_html_figure(draw, caption) for draw, caption in section.figures]
        parts.append("</section>")
        body.append("\n".join(parts))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Privacy report</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            "<main>",
            "<h1>Privacy report</h1>",
            f'<p class="meta">{html.escape(_header(trainer))}</p>',
            f"<nav><strong>Sections</strong><ol>{toc}</ol></nav>",
            *body,
            f"<footer>Written by lightning-privacy {html.escape(__version__)} on {when}. Values marked approximate "
            "or estimate are not bounds; lower and upper bounds say so in their meaning.</footer>",
            "</main>",
            "</body>",
            "</html>",
        ]
    )


def log_privacy_report(trainer: pl.Trainer, path: Optional[Union[str, Path]] = None) -> str:
    """:func:`privacy_report` as TensorBoard text ``privacy/report`` (rank 0), and to ``path`` if given.

    The suffix of ``path`` picks the format: ``.html``/``.htm`` writes :func:`privacy_report_html` (one
    self-contained page with the figures), anything else (``.md``) the Markdown. Only global rank 0 writes.

    Returns:
        The Markdown report (what TensorBoard gets), on every rank.
    """
    from lightning_privacy.callbacks._audit_utils import log_text

    text = privacy_report(trainer)
    log_text(trainer, REPORT_TAG, text)
    if path is not None and trainer.is_global_zero:
        path = Path(path)
        page = privacy_report_html(trainer) if path.suffix.lower() in HTML_SUFFIXES else text
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    return text

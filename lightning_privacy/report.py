"""End-of-training privacy report: everything the privacy callbacks of a Trainer know after ``fit``.

:func:`privacy_report` returns Markdown, one section per privacy callback present in
``trainer.callbacks``, each value with a one-line plain-language meaning; approximate values (closed
forms, estimates) are marked as such. :func:`log_privacy_report` also writes it to TensorBoard as text
(``privacy/report``) and, optionally, to a ``.md`` file.

The audit sections render the audits' results (:mod:`lightning_privacy.audits`): :func:`audit_report`
gives the same section for a result of a direct call such as ``audit_epsilon_star(model, ...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Union

import lightning.pytorch as pl

from lightning_privacy import _CALLBACKS, names

__all__ = ["REPORT_TAG", "audit_report", "log_privacy_report", "privacy_report"]

REPORT_TAG = names.PRIVACY_REPORT
_REPORTED = (
    "DPSGD",
    "BayesSecurityMonitor",
    "AttributeInferenceMonitor",
    "PrivacyBudgetStopping",
    "EpsilonStarAudit",
    "PanoramiaAudit",
    "PrivacyProfileAudit",
)


def _of(trainer: pl.Trainer, name: str) -> List[Any]:
    """Callbacks of class ``name`` or a subclass, matched by qualified name (no module is imported)."""
    return [
        c
        for c in trainer.callbacks
        if any((k.__module__, k.__name__) == (_CALLBACKS[name], name) for k in type(c).__mro__)
    ]


def _table(title: str, rows: List[tuple]) -> str:
    lines = [f"## {title}", "", "| quantity | value | meaning |", "|---|---|---|"]
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
            f"{cb.epsilon():.4g}",
            "the run is (ε, δ)-DP by the accountant's upper bound; a reference, in ε units",
        ),
    ]


def _bayes(cb: Any) -> List[tuple]:
    final = getattr(cb, "final", None)
    if not final:
        return [("β*_MIA", "—", "no DP-SGD step was recorded, nothing to bound")]
    beta = final[names.MIA_BAYES_SECURITY]
    rows = [
        (
            "β*_MIA",
            f"{beta:.4f}",
            f"safe (pessimistic PLD, exact-or-lower): any membership attacker's accuracy ≤ {100 * (1 - beta / 2):.1f}% "
            "at a uniform prior",
        ),
        (
            "β*_MIA closed form",
            f"{final[names.MIA_BAYES_SECURITY_CLOSED_FORM]:.4f}",
            "approximate (Cor. 7), for comparison; can overstate security",
        ),
        ("membership advantage", f"{final[names.MIA_ADVANTAGE]:.4f}", "1 − β*: bound on any attacker's TPR − FPR"),
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
                    f"{final[key]:.4f}",
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
            f"{cb.bayes_security():.4f}",
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


def _epsilon_star_rows(values: Mapping[str, float]) -> List[tuple]:
    meaning = {
        names.EPSILON_STAR: "estimate (parametric Normal fits), not a bound; empirical privacy of the loss-threshold attack",
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


def _epsilon_star(cb: Any) -> List[tuple]:
    return _epsilon_star_rows(cb.results)


def _panoramia(cb: Any) -> List[tuple]:
    return _panoramia_rows(cb.result.metrics() if cb.result is not None else cb.last_values)


def _profile(cb: Any) -> List[tuple]:
    return _profile_rows(cb.result.metrics() if cb.result is not None else {})


_AUDIT_SECTIONS = {  # result class name -> (title, rows from .metrics())
    "EpsilonStarResult": ("Epsilon* audit", _epsilon_star_rows),
    "PanoramiaAuditResult": ("PANORAMIA audit", _panoramia_rows),
    "PrivacyProfileResult": ("Privacy profile audit", _profile_rows),
}


def audit_report(result: Any) -> str:
    """The report's Markdown section for one audit result (e.g. of a direct ``audit_epsilon_star`` call).

    Raises:
        TypeError: for anything but a result of :mod:`lightning_privacy.audits`.

    Example::

        >>> import numpy as np
        >>> from lightning_privacy.audits import audit_epsilon_star_from_losses
        >>> rng = np.random.default_rng(0)
        >>> result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)
        >>> print(audit_report(result).splitlines()[0])
        ## Epsilon* audit
        >>> audit_report(result).splitlines()[4].split(" | ")[:2]
        ['| `audit/epsilon_star`', '4.122']
    """
    for klass in type(result).__mro__:
        if klass.__name__ in _AUDIT_SECTIONS and klass.__module__.startswith("lightning_privacy.audits"):
            title, rows = _AUDIT_SECTIONS[klass.__name__]
            return _table(title, rows(result.metrics()))
    raise TypeError(f"`result` must be a result of lightning_privacy.audits, got {type(result).__name__}")


_SECTIONS = {
    "DPSGD": ("DP-SGD", _dpsgd),
    "BayesSecurityMonitor": ("Bayes security against membership inference", _bayes),
    "AttributeInferenceMonitor": ("Bayes security against attribute inference", _ai),
    "PrivacyBudgetStopping": ("Budget stopping", _stopping),
    "EpsilonStarAudit": ("Epsilon* audit", _epsilon_star),
    "PanoramiaAudit": ("PANORAMIA audit", _panoramia),
    "PrivacyProfileAudit": ("Privacy profile audit", _profile),
}


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
    parts = []
    for name in _REPORTED:
        title, rows = _SECTIONS[name]
        for cb in _of(trainer, name):
            parts.append(_table(title, rows(cb)))
    if not parts:
        raise ValueError(
            f"No privacy callback in trainer.callbacks: add one of {', '.join(_REPORTED)} to get a report."
        )
    header = f"# Privacy report\n\nAfter {trainer.current_epoch} epoch(s), global step {trainer.global_step}."
    return "\n\n".join([header, *parts]) + "\n"


def log_privacy_report(trainer: pl.Trainer, path: Optional[Union[str, Path]] = None) -> str:
    """:func:`privacy_report`, written as TensorBoard text ``privacy/report`` (rank 0) and to ``path`` if given."""
    from lightning_privacy.callbacks._audit_utils import log_text

    text = privacy_report(trainer)
    log_text(trainer, REPORT_TAG, text)
    if path is not None and trainer.is_global_zero:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    return text

"""The report sections of DP-SGD, the two Bayes-security monitors and the budget stopper.

Each callback's ``report_section(trainer)`` calls its function here (:mod:`lightning_privacy.reporting`); the audit
callbacks' sections come from their results (:mod:`lightning_privacy.audits`). The rows read the callback's values
only; the Trainer is read for what other callbacks add: a budget to draw, whether the monitor draws the region.
"""

from __future__ import annotations

from typing import Any, List, Optional

from lightning_privacy import names
from lightning_privacy.dpsgd import users
from lightning_privacy.reporting import ReportSection, down, up

__all__ = ["ai_section", "bayes_section", "dpsgd_section", "stopping_section"]

REGION_CAPTION = (
    "The region DP-SGD's accountant allows every membership attack (its trade-off curve for the relation of β*, "
    "named in the legend), on log–log axes: the low-FPR corner where attacks are judged; dots: the TPR bounds at FPR "
    "0.001, 0.01 and 0.1."
)


def budget(trainer: Any, threat: str) -> Optional[float]:
    """A ``min_bayes_security`` budget against ``threat`` (``"mia"`` or ``"ai"``), as the figures draw it."""
    return next(
        (
            cb.min_bayes_security
            for cb in trainer.callbacks
            if getattr(cb, "threat", None) == threat and getattr(cb, "min_bayes_security", None) is not None
        ),
        None,
    )


def _region(ledger: Any) -> tuple:
    from lightning_privacy.figures import membership_region_figure

    return (lambda: membership_region_figure(ledger), REGION_CAPTION)


# --- DP-SGD ---------------------------------------------------------------------------------------
def dpsgd_section(cb: Any, trainer: Any) -> ReportSection:
    """σ, C, p, the steps, the accountant's ε and which randomness was secret; the region figure when no
    :class:`~lightning_privacy.BayesSecurityMonitor` draws it."""
    sigma = "—" if cb.noise_multiplier is None else f"{cb.noise_multiplier:.4f}"
    rate = getattr(cb, "sample_rate", None)
    rows = [
        ("noise multiplier σ", sigma, "Gaussian noise of std σ·C is added to every summed batch gradient"),
        ("clipping norm C", f"{cb.max_grad_norm:g}", "each example's gradient is clipped to norm ≤ C"),
        _mode_row(cb),
        _exactness_row(cb),
        _neighbour_row(cb),
        (
            "sample rate p",
            "—" if rate is None else f"{rate:.6g}",
            "each example joins a batch with probability p (Poisson); " + _rate_note(cb),
        ),
        (
            "divisor of the noised sum",
            "—" if getattr(cb, "expected_batch_size", None) is None else f"{cb.expected_batch_size:g}",
            "each step applies (clipped sum + noise) / this public constant (the loader's batch size or "
            "`expected_batch_size`), never computed from the private dataset size",
        ),
        ("optimizer steps", str(cb.steps), "DP-SGD steps recorded by the accountant"),
        (
            f"ε at δ = {cb.delta:g}",
            up(cb.epsilon()),
            f"the run is (ε, δ)-DP, add or remove one {getattr(cb.ledger, 'unit', 'example')}: {cb.ledger.epsilon_label}",
        ),
        *users.report_rows(cb),
        *_seed_rows(cb.privacy_settings() if hasattr(cb, "privacy_settings") else {}),
    ]
    section = ReportSection("DP-SGD", rows)
    if cb.ledger.steps and not any(getattr(c, "draws_mia_region", False) for c in trainer.callbacks):
        section.figures.append(_region(cb.ledger))
    return section


_HOW = {
    "hooks": "Opacus' per-layer hooks compute each example's gradient (checked against autograd on the first steps)",
    "ghost": "ghost clipping: each example's norm layer by layer, then a backward pass of the clipped losses",
    "functional": "each example's whole gradient by torch.func on that example alone, however its parameters are used",
}


def _mode_row(cb: Any) -> tuple:
    """How each example's gradient was computed, and why this way where ``grad_sample_mode="auto"`` chose it."""
    mode = getattr(cb, "grad_sample_mode", None) or "—"
    note = _HOW.get(mode, "")
    if getattr(cb, "grad_sample_mode_argument", None) == "auto":
        reason = getattr(cb, "grad_sample_mode_reason", None)
        switched = getattr(cb, "grad_sample_mode_switch", None)
        if switched is not None:  # (dpsgd.auto: the hooks disagreed on a step, which functional mode redid)
            mode, note = f"{mode} (auto, from step {switched.step})", f"{note}; auto {switched.sentence()}"
        else:
            mode, note = f"{mode} (auto)", f"{note}; chosen because {reason}" if reason else note
    return ("per-example gradients", mode, note)


def _exactness_row(cb: Any) -> tuple:
    """What the exactness check compared: the self-checked first steps, and the sampled later steps."""
    record = getattr(cb, "exactness", None)
    if record is None or (not record.steps and not record.later_steps):
        return ("exactness check", "not run", getattr(record, "reference", "") or "")
    value = f"{record.steps} first + {record.later_steps} sampled later steps"
    note = (
        f"{record.reference}; later: a share {record.later_rate:g} of the steps, a few examples each against their "
        f"gradients computed alone ({record.later_examples} examples); largest mismatch "
        f"{record.max_relative_error:.1e} of an example's gradient norm"
    )
    if record.later_not_comparable:
        note += f"; {record.later_not_comparable} sampled steps not comparable (the forward pass stayed random)"
    return ("exactness check", value, note)


def _neighbour_row(cb: Any) -> tuple:
    """What the neighbour check (the DP premise: one example moves the clipped sum by at most C) compared."""
    record = getattr(cb, "neighbours", None)
    if record is None or not record.steps:
        return ("neighbour check", "not run", getattr(record, "reason", "") or "")
    return (
        "neighbour check",
        f"{record.steps} steps, largest ‖S − S₋ᵢ‖ = {record.max_ratio:.3f}·C",
        f"on the first steps and a share {record.rate:g} of the later ones, {record.removed} examples removed one at "
        "a time (the batch re-collated by the train loader's collate_fn): each moved the pre-noise clipped sum by at "
        "most C, the premise of DP-SGD's guarantee",
    )


def _rate_note(cb: Any) -> str:
    """What p treats as public: nothing about the data when given, else the number of batches per epoch."""
    if getattr(cb, "sample_rate_argument", None) is not None:
        return "given as DPSGD(sample_rate=...), independent of the dataset size"
    if "drop_last" in str(getattr(cb, "sample_rate_origin", None) or ""):
        return (
            "p = 1/len(train loader) = 1/⌊N/batch size⌋ (the loader's drop_last=True), so the number of batches per "
            "epoch is treated as public (the ε covers add/remove neighbours with the same number of batches; "
            "DPSGD(sample_rate=...) fixes p without it)"
        )
    return (
        "p = 1/len(train loader), so the number of batches per epoch is treated as public (the ε covers add/remove "
        "neighbours with the same number of batches; DPSGD(sample_rate=...) fixes p without it)"
    )


def _seed_rows(settings: dict) -> List[tuple]:
    """Which of the run's randomness was secret: the guarantee assumes the adversary knows neither the batches nor
    the noise, so a fixed seed is said next to the ε it weakens."""
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


# --- Bayes security against membership inference ---------------------------------------------------
def bayes_section(cb: Any, trainer: Any) -> ReportSection:
    """β*_MIA (safe and closed form), the advantage, the TPR bounds; the per-epoch and region figures."""
    title = "Bayes security against membership inference"
    final = getattr(cb, "final", None)
    if not final:
        return ReportSection(title, [("β*_MIA", "—", "no DP-SGD step was recorded, nothing to bound")])
    section = ReportSection(title, _bayes_rows(final))
    from lightning_privacy.figures import bayes_security_figure

    limit = budget(trainer, "mia")
    section.figures.append(
        (
            lambda: bayes_security_figure(cb.epochs, cb.final, ledger=cb.ledger, budget=limit),
            "Left: β*_MIA after each epoch (safe value and the approximate closed form"
            + ("" if limit is None else f"; dotted: the budget β* ≥ {limit:g}")
            + "). Right: the TPR–FPR region every membership attack's ROC curve lies in.",
        )
    )
    if cb.ledger is not None and cb.ledger.steps:
        section.figures.append(_region(cb.ledger))
    return section


def _bayes_rows(final: dict) -> List[tuple]:
    beta = final[names.MIA_BAYES_SECURITY]
    rows = [
        (
            "β*_MIA",
            down(beta),
            f"safe (pessimistic PLD, exact-or-lower): any membership attacker's accuracy ≤ {up(100 * (1 - beta / 2), 1)}% "
            "at a uniform prior",
        ),
        (
            "β*_MIA closed form",
            f"{final[names.MIA_BAYES_SECURITY_CLOSED_FORM]:.4f}",
            "approximate (Cor. 7), for comparison; can overstate security",
        ),
        ("membership advantage", up(final[names.MIA_ADVANTAGE]), "1 − β*: bound on any attacker's TPR − FPR"),
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
                    up(final[key]),
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


# --- Bayes security against attribute inference ----------------------------------------------------
def ai_section(cb: Any, trainer: Any) -> ReportSection:
    """β*_AI (safe and closed form), the steps and the largest sensitivity; the per-epoch figure."""
    section = ReportSection("Bayes security against attribute inference", _ai_rows(cb))
    if getattr(cb, "epochs", None):
        from lightning_privacy.figures import attribute_inference_figure

        limit = budget(trainer, "ai")
        section.figures.append(
            (
                lambda: attribute_inference_figure(
                    cb.epochs, attribute=getattr(cb.attribute, "name", str(cb.attribute)), budget=limit
                ),
                "β*_AI after each epoch: the safe value (pessimistic PLD over the measured R_t) and the approximate "
                "closed form (Cor. 10), which can overstate security"
                + ("" if limit is None else f"; dotted: the budget β*_AI ≥ {limit:g}")
                + ".",
            )
        )
    return section


def _ai_rows(cb: Any) -> List[tuple]:
    if cb.max_grad_norm is None:
        return [("β*_AI", "—", "no DP-SGD step was seen, nothing to bound")]
    return [
        (
            f"β*_AI (`{cb.key}`)",
            down(cb.bayes_security()),
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


# --- budget stopping --------------------------------------------------------------------------------
def stopping_section(cb: Any) -> ReportSection:
    """The budget, the step of the stop and what the stop was decided on."""
    threat = cb.threat.upper()
    stopped = "no" if cb.stopped_at_step is None else str(cb.stopped_at_step)
    if cb.max_epsilon is not None:
        delta = "the run's δ" if cb.delta is None else f"δ = {cb.delta:g}"
        limit = (
            f"budget ε ≤ (at {delta})",
            f"{cb.max_epsilon:g}",
            "training stops before the step that would break it",
        )
    else:
        limit = (
            f"budget β*_{threat} ≥",
            f"{cb.min_bayes_security:g}",
            "training stops before the step that would break it",
        )
    decision = (
        "the run's accountant"
        if cb.max_epsilon is not None
        else ("safe β* (pessimistic PLD)" if cb.threat == "mia" else "worst case R = 2C for the next step")
    )
    rows = [
        limit,
        ("stopped after step", stopped, 'step of the stop ("no": the budget was never reached)'),
        ("decision", decision, "what the stop was decided on; never the approximate closed form"),
    ]
    return ReportSection("Budget stopping", rows)

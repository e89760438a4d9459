"""The report's section of a membership attack (:class:`~lightning_privacy.audits.membership.MembershipAuditResult`).

AUC, TPR and the ε lower bound measure what an attack achieved: shown rounded down they would understate the leakage,
so, like the accountant's upper bounds, they are rounded UP at the digits shown. A Clopper–Pearson interval is widened
(low end down, high end up) so that it still covers what was computed.
"""

from __future__ import annotations

from typing import Any, List

from lightning_privacy import names
from lightning_privacy.reporting import ReportSection, claim_rows, down_sig, result_warnings, up

__all__ = ["REPORT_TITLE", "membership_section", "report_rows"]

REPORT_TITLE = "Membership attack (RMIA/LiRA/LOSS)"
ATTACKS = {
    "rmia": "RMIA (Zarifzadeh et al. 2024): likelihood ratio against reference models, compared with population rows",
    "lira": "LiRA (Carlini et al. 2022): Gaussian likelihood ratio of the model's confidence against reference models",
    "loss": "the LOSS attack: the model's loss alone (low = member); the reference-free baseline",
    "ezmia": "EZ-MIA (Ilić et al. 2026): at the tokens a fine-tuned LM predicts wrongly, the share of upward shifts "
    "of the true token's probability relative to its base model; no reference training",
}


def report_rows(result: Any, references: Any = None) -> List[tuple]:
    """Rows of a :class:`~lightning_privacy.audits.membership.MembershipAuditResult` (and its references)."""
    attack = result.attack
    refs = f", {result.num_references} reference model(s)" if result.num_references else ""
    members, nonmembers = int(result.is_member.sum()), int((~result.is_member).sum())
    rows = [
        ("attack", f"{attack.upper()} ({result.variant}{refs})", ATTACKS.get(attack, "")),
        ("members / non-members", f"{members} / {nonmembers}", "audited training rows / rows the model never saw"),
        (
            f"`{names.membership_key(attack, 'auc')}`",
            up(result.auc),
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
                f"; the accountant allows at most {up(result.ledger_tpr_bounds[j])} here (at the FPR's upper limit; "
                f"{result.relation.replace('_', '/')} relation: the in/out game)"
            )
        rows.append(
            (
                f"`{names.membership_key(attack, f'tpr_at_fpr_{point.fpr:g}')}`",
                f"{up(point.tpr)} [{down_sig(point.tpr_low)}, {up(point.tpr_high)}]",
                meaning,
            )
        )
    epsilon = result.epsilon
    rows.append(
        (
            f"`{names.membership_key(attack, 'epsilon_lower')}`",
            up(float(epsilon["epsilon_lower"])),
            f"lower bound ({100 * (1 - epsilon['alpha']):g}% Bayesian interval, holdout threshold) on the ε of any "
            f"(ε, δ = {result.delta:.3g})-DP guarantee, from the attack's scores; rounded up like the attack's numbers",
        )
    )
    if result.gamma is not None:
        rows.append(("RMIA γ / offline a", f"{result.gamma:g} / {result.offline_a:.3f}", "the attack's settings"))
    rows += claim_rows(result, names.membership_key(attack, "claim_contradicted"))
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


def figure_caption(result: Any) -> str:
    """The caption of the result's ROC figure."""
    return (
        f"Membership attack ({result.attack.upper()}): the ROC curve on log–log axes with the TPR at FPR ≤ "
        "0.001/0.01/0.1 and their Clopper–Pearson intervals"
        + (
            "; shaded: the region DP-SGD's accountant allows (its trade-off curve for the in/out game, "
            "add/remove relation)" + ("; dashed: the claimed guarantee's curve." if result.claim is not None else ".")
            if result.region is not None
            else " (no DP-SGD ledger: no region)"
            + ("; dashed: the claimed guarantee's curve (add/remove)." if result.claim is not None else ".")
        )
    )


def membership_section(result: Any, references: Any = None) -> ReportSection:
    """The section: the attack's rows (and the reference models'), warnings first, the ROC figure."""
    return ReportSection(
        REPORT_TITLE,
        report_rows(result, references),
        figures=[(lambda: result.figure(), figure_caption(result))],
        warnings=result_warnings(result),
    )

"""What a statement checks of the audits it prints, beside the DPSGD state (:mod:`~lightning_privacy.statement.consistency`).

- Each audit state's ``digest`` (saved by :class:`~lightning_privacy.CanaryAudit`, :class:`~lightning_privacy.MembershipAudit`
  and :class:`~lightning_privacy.PanoramiaAudit` beside their results, as DPSGD does beside its state) against the
  one its contents give now: an audit value edited after saving is a problem, as a DPSGD field would be.
- Every empirical ε lower bound the audits hold (the canary audit's sound bounds, the membership attacks' bounds)
  against the certified ε of the run's ledger at the audit's δ: a lower bound that holds with confidence 1 − α and
  lies above the accountant's upper bound contradicts the guarantee (a bug in training or accounting, or an edited
  checkpoint), and the statement then states none.
- Audits that only a DP-SGD run makes (gradient canaries, inserted into DPSGD's clipped sums) in a checkpoint whose
  DPSGD state is missing or has lost its privacy history.

Example::

    >>> from lightning_privacy import names
    >>> audit = {"audit": "CanaryAudit", "values": {names.CANARY_EPSILON_LOWER: 4.48}}
    >>> problems = audit_problems({}, [audit], epsilon=lambda delta: 4.0, run_delta=1e-5)
    >>> print(problems[0])
    CanaryAudit's empirical ε lower bound `audit/canary_epsilon_lower` = 4.48 (δ = 1e-05) exceeds the certified
    ε = 4 at that δ: the audit contradicts the guarantee (a lower bound at confidence 1 − α above the accountant's
    upper bound means the training, the accounting or this checkpoint is wrong)
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional

from lightning_privacy import names
from lightning_privacy.statement import fields as f

__all__ = ["LOWER_BOUND_KEYS", "audit_problems", "orphan_problems"]

#: the audit values that are ε lower bounds valid for any (ε, δ)-DP mechanism at the audit's confidence: one above
#: the certified ε contradicts it (Gaussian readings and estimates — Epsilon*, PANORAMIA — are not among them)
LOWER_BOUND_KEYS = (
    names.CANARY_EPSILON_LOWER,
    names.CANARY_EPSILON_LOWER_TIGHTEST,
    names.MIA_EPSILON_LOWER,
    *(names.membership_key(attack, "epsilon_lower") for attack in ("rmia", "lira", "loss", "ezmia")),
)
#: the allowance for rounding between a saved bound and the ledger's ε (far below any audit's resolution)
TOLERANCE = 1e-9


def audit_problems(
    callbacks: Mapping[str, Any],
    audits: List[dict],
    *,
    epsilon: Optional[Callable[[float], float]],
    run_delta: Optional[float],
) -> List[str]:
    """The problems of the audits a statement prints (see the module docstring).

    Args:
        callbacks: the checkpoint's callback states (their digests are checked).
        audits: the statement's audit entries (``audit``, ``values``; ``delta`` where the audit recorded its δ).
        epsilon: the certified ε of the run's ledger at a δ; ``None`` without a (consistent) DPSGD state.
        run_delta: the run's δ, used for an audit that did not record its own.
    """
    from lightning_privacy.checkpoints import dpsgd_state_digest

    problems: List[str] = []
    for key, state in callbacks.items():
        if not isinstance(state, Mapping) or str(key).startswith("DPSGD") or "digest" not in state:
            continue
        if not any(isinstance(state.get(part), Mapping) for part in ("results", "last")):
            continue
        now = dpsgd_state_digest(state)
        if now != state["digest"]:
            problems.append(
                f"the {str(key).partition('{')[0]} state's `digest` is {str(state['digest'])[:19]}… but its contents "
                f"give {now[:19]}…: the audit's results were changed after the audit saved them"
            )
    if epsilon is None:
        return problems
    for audit in audits:
        delta = audit.get("delta") or run_delta
        if delta is None:
            continue
        certified = None
        for key in LOWER_BOUND_KEYS:
            bound = audit["values"].get(key)
            if bound is None:
                continue
            certified = float(epsilon(float(delta))) if certified is None else certified
            if bound > certified + TOLERANCE:
                problems.append(
                    f"{audit['audit']}'s empirical ε lower bound `{key}` = {bound:.4g} (δ = {delta:g}) exceeds the "
                    f"certified ε = {certified:.4g} at that δ: the audit contradicts the guarantee (a lower bound at "
                    "confidence 1 − α above the accountant's upper bound means the training, the accounting or this "
                    "checkpoint is wrong)"
                )
    return problems


def orphan_problems(callbacks: Mapping[str, Any], *, has_dpsgd_state: bool) -> List[str]:
    """Without a readable DPSGD state: a DPSGD key whose privacy history is gone, or gradient canaries (which only
    DPSGD inserts) whose run's privacy history is missing."""
    if has_dpsgd_state:
        return []
    problems = [
        f"the checkpoint holds DPSGD's state under {f.shown(key, 60)} without its privacy history (`ledger`): the "
        "run's ε is unknown, and every audit of the run is read against nothing"
        for key, state in callbacks.items()
        if str(key).startswith("DPSGD{") and isinstance(state, Mapping)
    ]
    for key, state in callbacks.items():
        if str(key).startswith("CanaryAudit") and isinstance(state, Mapping) and state.get("kind") == "gradient":
            problems.append(
                "the checkpoint holds a CanaryAudit of gradient canaries, which only DPSGD's clipped sums carry, but "
                "no DPSGD state with a privacy history: the DP run it audited is missing"
            )
    return problems

"""What a checkpoint records beside DP-SGD for a statement: a PrivacyBudgetStopping's budget, and the audits' values
and verdicts (from their saved states, or from the running callbacks of a Trainer)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Optional

from lightning_privacy import names
from lightning_privacy.statement import fields as f

__all__ = ["audits", "budget"]

# audit values a statement lists: the scalars of the audit/ keys, without values that are no valid bound
_AUDIT_KEYS = tuple(key for key in names.ALL_KEYS if key.startswith("audit/") and names.KEY_DOCS[key][2] != names.MEDIA)
_NOT_BOUNDS = (
    names.CANARY_EPSILON_OPTIMISTIC,
    names.CANARY_EPSILON_OPTIMISTIC_FDP,
    names.CANARY_EPSILON_OPTIMISTIC_GDP,
)
_VERDICT_KEYS = tuple(key for key in _AUDIT_KEYS if key.endswith("_claim_contradicted"))


def budget(callbacks: Mapping[str, Any]) -> Optional[dict]:
    """A PrivacyBudgetStopping's budget and where it stopped (its state key records the budget)."""
    for key, state in callbacks.items():
        if isinstance(state, Mapping) and set(state) == {"stopped_at_step"}:
            arguments = f.state_key_arguments(str(key))
            what = f"PrivacyBudgetStopping state {f.shown(key, 40)}:"
            limits = {
                k: f.number(k, arguments.get(k), what=what)
                for k in ("min_bayes_security", "max_epsilon")
                if arguments.get(k) is not None
            }
            if not limits:
                continue
            return {
                **limits,
                # of an ε budget; None: the run's δ (or a β* budget)
                "delta": f.number("delta", arguments.get("delta"), high=1.0, optional=True, what=what),
                "threat": f.text("threat", arguments.get("threat", "mia"), optional=False, what=what),
                "stopped_at_step": f.whole("stopped_at_step", state["stopped_at_step"], what=what),
            }
    return None


def audits(callbacks: Mapping[str, Any], live: Mapping[str, Any]) -> List[dict]:
    """One entry per audit whose values the source holds: the saved states, then running callbacks without one."""
    wanted = [key for key in _AUDIT_KEYS if key not in _NOT_BOUNDS]
    entries = []
    for key, state in callbacks.items():
        if not isinstance(state, Mapping):
            continue
        values = None
        for part in ("results", "last"):
            if isinstance(state.get(part), Mapping):
                values = values or f.audit_values(str(key), state[part], wanted) or None
        if values is not None:
            entry = _audit_entry(str(key).partition("{")[0], values, live.get(key))
            entry["delta"] = f.number(
                "delta", state.get("delta"), high=1.0, optional=True, what=f"audit state {f.shown(key, 40)}:"
            )
            entries.append(entry)
    for key, callback in live.items():
        if key in callbacks:
            continue
        values = _live_values(str(key), getattr(callback, "results", None), wanted)
        result = getattr(callback, "result", None)
        if values is None and callable(getattr(result, "metrics", None)):
            values = _live_values(str(key), result.metrics(), wanted)
        if values is not None:
            entry = _audit_entry(type(callback).__name__, values, callback)
            entry["delta"] = _live_delta(callback)
            entries.append(entry)
    return entries


def _live_delta(callback: Any) -> Optional[float]:
    """The δ a running audit used (its result's, else its argument's; ``None``: the run's)."""
    result = getattr(callback, "result", None)
    delta = getattr(result, "delta", None)
    if delta is None:
        delta = getattr(callback, "delta", None)
    return None if delta is None else float(delta)


def _live_values(key: str, values: Any, wanted: List[str]) -> Optional[Dict[str, Any]]:
    return (f.audit_values(key, values, wanted) or None) if isinstance(values, Mapping) else None


def _audit_entry(name: str, values: Dict[str, Any], callback: Any) -> dict:
    attack = next((a for a in ("rmia", "lira", "loss") if names.membership_key(a, "auc") in values), None)
    verdict_key = next((k for k in _VERDICT_KEYS if k in values), None)
    contradicted = None if verdict_key is None else values[verdict_key]  # (None: not finite, no verdict)
    verdict = None if contradicted is None else ("contradicted" if contradicted else "consistent")
    result = getattr(callback, "result", None) if callback is not None else None
    claim = None
    if verdict is not None and getattr(result, "claim_verdict", None) is not None:
        found = getattr(result, "claim", None)
        claim = found.to_dict() if callable(getattr(found, "to_dict", None)) else None
    alpha = getattr(callback, "alpha", None) if callback is not None else None
    return {
        "audit": name if attack is None else f"{name} ({attack})",
        "values": values,
        "verdict": verdict,
        "claim": copy.deepcopy(claim),
        "confidence": None if alpha is None or verdict is None else 1.0 - float(alpha),
    }

"""What a statement checks before it states a guarantee: the DPSGD state agrees with itself and with the checkpoint.

ε, β*_MIA and the TPR bounds are computed from the privacy ledger's history of (σ, q, steps) segments; the statement
also prints σ, q and C from the DPSGD state's own fields. :func:`check_consistency` compares them:

- σ and q of the state with the last segment of the ledger's history (the values the last step was taken at);
- σ and C of the state with those its state key records (``DPSGD{'noise_multiplier': …, 'max_grad_norm': …}``,
  written from DPSGD's arguments; σ is ``None`` there when it was planned);
- the state's accountant with the ledger's;
- the ledger's steps with the checkpoint's ``global_step`` (Lightning's count of optimizer steps, which DPSGD's
  self-check compares with the ledger at every epoch end): fewer ledger steps than optimizer steps mean steps
  that ε does not count, an inconsistency (a Trainer reused for another module, or that stepped before DPSGD joined
  it, looks the same and is refused too); more are legitimate — the same module fitted again by a new Trainer with
  the same DPSGD, whose ``global_step`` restarted while the ledger composed every fit — and noted;
- the digest DPSGD saved beside its state (:func:`~lightning_privacy.checkpoints.dpsgd_state_digest`) with the one
  the state's contents give now.

The ledger itself refuses chunks that are not the steps of its history when it loads. None of this detects a state
rewritten consistently — σ, the history, the chunks, the key and the digest edited together: the digest is not a
signature, anyone who edits the state can recompute it.

Example::

    >>> from lightning_privacy.statement.fields import dpsgd_fields
    >>> state = {"accountant": "pld", "max_grad_norm": 1.0, "noise_multiplier": 2.0,
    ...          "ledger": {"accountant": "pld", "history": [[1.5, 0.01, 100]]}}
    >>> found = check_consistency(dpsgd_fields(state), state, key="DPSGD{}", global_step=100)
    >>> found["status"]
    'inconsistent'
    >>> print(found["problems"][0])
    `noise_multiplier` is 2 in the DPSGD state but 1.5 in the last segment of the ledger's history (the σ ε is
    computed from)
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from lightning_privacy.statement.fields import DPFields, key_fields

__all__ = ["CONSISTENT", "INCONSISTENT", "check_consistency"]

CONSISTENT, INCONSISTENT = "consistent", "inconsistent"


def _differs(a: Optional[float], b: Optional[float]) -> bool:
    return a is not None and b is not None and float(a) != float(b)


def _unit_problems(fields: DPFields, state: Mapping[str, Any]) -> List[str]:
    """The privacy unit the state records against the unit and group size its ledger accounts: a person-level
    statement over a ledger of rows (or the reverse) would state a guarantee nobody computed."""
    unit = fields.privacy_unit or {"unit": "example"}
    ledger = state.get("ledger") if isinstance(state.get("ledger"), Mapping) else {}
    person = unit.get("unit") == "user"
    groups = int(unit.get("max_examples_per_user") or 1) if person and not unit.get("user_sampling") else 1
    accounted = (ledger.get("unit", "example") == "person", int(ledger.get("group_size", 1)))
    if accounted == (person, groups):
        return []
    return [
        f"the DPSGD state protects one {'person' if person else 'row'}"
        f"{f' of {groups} rows sampled one by one' if groups > 1 else ''}, but its ledger accounts one "
        f"{'person' if accounted[0] else 'row'}{f' of {accounted[1]} rows' if accounted[1] > 1 else ''}: the ε it "
        "states is not the unit's"
    ]


def check_consistency(
    fields: DPFields,
    state: Mapping[str, Any],
    *,
    key: str,
    global_step: Optional[int],
    key_arguments: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The statement's ``consistency`` entry for a DPSGD state (see the module docstring).

    Args:
        fields: the state's checked fields (:func:`~lightning_privacy.statement.fields.dpsgd_fields`).
        state: the state as saved (for its digest).
        key: the state's key in the checkpoint's callbacks.
        global_step: the checkpoint's (or the Trainer's) ``global_step``; ``None``: not recorded, not compared.
        key_arguments: the arguments the key records (parsed from ``key``).

    Returns:
        ``{"status": "consistent" | "inconsistent", "problems": [...], "notes": [...], "digest": ...}``: each problem
        names both values; ``digest`` is ``"verified"``, ``"mismatch"`` or ``"not recorded"``.

    Raises:
        ValueError: a malformed σ or C in the state key (one line naming it).
    """
    problems: List[str] = []
    notes: List[str] = []
    last = fields.history[-1] if fields.history else None
    if last is not None:
        for name, own, used, symbol in (
            ("noise_multiplier", fields.noise_multiplier, last[0], "σ"),
            ("sample_rate", fields.sample_rate, last[1], "q"),
        ):
            if _differs(own, used):
                problems.append(
                    f"`{name}` is {own:g} in the DPSGD state but {used:g} in the last segment of the ledger's "
                    f"history (the {symbol} ε is computed from)"
                )
    recorded = key_fields(key, key_arguments or {})
    for name, own in (("noise_multiplier", fields.noise_multiplier), ("max_grad_norm", fields.max_grad_norm)):
        if _differs(own, recorded.get(name)):
            problems.append(
                f"`{name}` is {own:g} in the DPSGD state but {recorded[name]:g} in its state key (DPSGD's argument)"
            )
    if fields.accountant != fields.ledger_accountant:
        problems.append(
            f"`accountant` is {fields.accountant!r} in the DPSGD state but {fields.ledger_accountant!r} in its ledger"
        )
    problems += _unit_problems(fields, state)
    steps = fields.steps
    rounded = (fields.precision or {}).get("rounded_steps") or 0
    if rounded > steps:
        problems.append(
            f"`precision.rounded_steps` is {rounded} in the DPSGD state but the ledger records {steps} step(s): more "
            "steps bounded only up to 16-bit rounding than steps taken"
        )
    if global_step is not None and steps < global_step:
        problems.append(
            f"the ledger records {steps} DP-SGD step(s) but the checkpoint's global_step is {global_step}: "
            f"{global_step - steps} optimizer step(s) are not in the history ε is computed from (or the Trainer took "
            "them for another module, or before DPSGD joined it: fit with a Trainer of its own)"
        )
    elif global_step is not None and steps > global_step:
        notes.append(
            f"The ledger records {steps} DP-SGD steps, the checkpoint's global_step {global_step}: the module was "
            "fitted before by another Trainer with the same DPSGD (its global_step restarted; ε composes every "
            "fit's steps)."
        )
    digest = "not recorded"
    if fields.digest is not None:
        from lightning_privacy.checkpoints import dpsgd_state_digest

        now = dpsgd_state_digest(state)
        digest = "verified" if now == fields.digest else "mismatch"
        if digest == "mismatch":
            problems.append(
                f"the DPSGD state's `digest` is {fields.digest[:19]}… but its contents give {now[:19]}…: the state "
                "was changed after DPSGD saved it"
            )
    return {"status": INCONSISTENT if problems else CONSISTENT, "problems": problems, "notes": notes, "digest": digest}

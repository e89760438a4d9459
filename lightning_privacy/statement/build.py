"""A statement's values from a checkpoint (or a Trainer): the fields checked, the state's consistency, the guarantee
of the ledger, the budget and the audits (:func:`privacy_statement`)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any, Dict, List, Mapping, Optional, Tuple

from lightning_privacy import __version__
from lightning_privacy.statement import fields as f
from lightning_privacy.statement.audit_checks import audit_problems, orphan_problems
from lightning_privacy.statement.consistency import CONSISTENT, INCONSISTENT, check_consistency
from lightning_privacy.statement.document import PrivacyStatement
from lightning_privacy.statement.reading import read_checkpoint
from lightning_privacy.statement.records import audits, budget
from lightning_privacy.statement.sentences import approximations, not_covered, summary

__all__ = ["privacy_statement"]


def privacy_statement(source: Any) -> PrivacyStatement:
    """The privacy statement of a checkpoint file, a checkpoint's contents, or a Trainer after ``fit``.

    Before it states a guarantee the statement checks what it reads: every field it uses has the right type and a
    finite value in range, and the DPSGD state agrees with its ledger, its key and the checkpoint's ``global_step``
    (:mod:`lightning_privacy.statement.consistency`). A state that disagrees gives a statement with
    ``consistency["status"] == "inconsistent"``, ``differentially_private`` false and no guarantee.

    Args:
        source: a path to a Lightning checkpoint (``str`` or ``os.PathLike``), the dict ``torch.load`` returns for
            one, or a ``lightning.pytorch.Trainer`` (its callbacks' states, as a checkpoint would save them, plus what
            only the running callbacks know: the claims the audits tested, ``secure_mode``, the strategy).

    Returns:
        A :class:`~lightning_privacy.statement.PrivacyStatement`.

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a file that is no checkpoint, one with several DPSGD states or a DPSGD state that does not load,
            or a malformed field (the wrong type, not finite, out of range): one line naming the path, the field
            and its value.
        TypeError: ``source`` of another type.

    Example::

        >>> privacy_statement({"state_dict": {}}).differentially_private
        False
        >>> state = {"accountant": "pld", "max_grad_norm": [1.0], "ledger": {"accountant": "pld", "history": []}}
        >>> privacy_statement({"callbacks": {"DPSGD{}": state}})
        Traceback (most recent call last):
        ...
        ValueError: the checkpoint: DPSGD state field `max_grad_norm` is [1.0]: expected a finite number > 0
        >>> privacy_statement(42)
        Traceback (most recent call last):
        ...
        TypeError: `source` must be a checkpoint path, a checkpoint dict or a Trainer, got 42
    """
    if isinstance(source, (str, os.PathLike)):
        return PrivacyStatement(_build(read_checkpoint(source), {"kind": "checkpoint", "path": os.fspath(source)}))
    if isinstance(source, Mapping):
        return PrivacyStatement(_build(source, {"kind": "checkpoint dict", "path": None}))
    if hasattr(source, "callbacks") and hasattr(source, "global_step") and hasattr(source, "strategy"):
        checkpoint, live = _trainer_checkpoint(source)
        return PrivacyStatement(_build(checkpoint, {"kind": "trainer", "path": None}, live=live, trainer=source))
    raise TypeError(f"`source` must be a checkpoint path, a checkpoint dict or a Trainer, got {source!r}")


def _trainer_checkpoint(trainer: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """What a checkpoint of ``trainer`` would hold of its callbacks (their non-empty states), and the callbacks."""
    states: Dict[str, Any] = {}
    live: Dict[str, Any] = {}
    for callback in trainer.callbacks:
        key = callback.state_key
        live[key] = callback
        state = callback.state_dict()
        if state:
            states[key] = state
    checkpoint = {
        "callbacks": states,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pytorch-lightning_version": _installed("lightning"),
    }
    return checkpoint, live


def _finite(value: Any) -> Optional[float]:
    """A float for JSON, or ``None`` where it is not finite (JSON has no infinity)."""
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def _installed(package: str) -> Optional[str]:
    """The installed version of ``package`` (read from its metadata: importing Lightning takes seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _versions(lightning: Optional[str]) -> Dict[str, Any]:
    import torch

    return {
        "computed_with": {
            "lightning_privacy": __version__,
            "torch": str(torch.__version__),
            "opacus": _installed("opacus"),
            "lightning": _installed("lightning"),
            "python": platform.python_version(),
        },
        "checkpoint_saved_with": {"lightning": lightning},
    }


def _seed_kind(value: Any, secure: Optional[bool]) -> str:
    if secure:
        return "secure"
    return "fixed" if value is not None else "secret"


def _build(checkpoint: Mapping[str, Any], source: Dict[str, Any], *, live: Any = None, trainer: Any = None) -> dict:
    from lightning_privacy.checkpoints import dpsgd_state

    live = live or {}
    callbacks = checkpoint.get("callbacks")
    callbacks = callbacks if isinstance(callbacks, Mapping) else {}
    where = f"checkpoint {source['path']!r}" if source.get("path") else "the checkpoint"
    try:
        saved = f.source_fields(checkpoint)
        state = dpsgd_state(checkpoint)
        key = next((k for k, v in callbacks.items() if v is state), None) if state is not None else None
        source.update(
            epoch=saved["epoch"],
            global_step=saved["global_step"],
            lightning_checkpoint="state_dict" in checkpoint or "callbacks" in checkpoint,
        )
        mechanism = guarantee = consistency = ledger = None
        notes: List[str] = []
        if state is not None:
            mechanism, guarantee, notes, consistency, ledger = _dp_sgd(
                checkpoint, state, str(key or ""), live.get(key), trainer, saved["global_step"]
            )
        found_audits = audits(callbacks, live)
        found_budget = budget(callbacks)
        consistency, guarantee = _audits_checked(
            consistency, guarantee, callbacks, found_audits, ledger, mechanism, has_state=state is not None
        )
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    data = {
        "format": f.FORMAT,
        "format_version": f.FORMAT_VERSION,
        "source": source,
        "differentially_private": (
            mechanism is not None and mechanism["steps"] > 0 and consistency["status"] == CONSISTENT
        ),
        "consistency": consistency,
        "summary": "",
        "mechanism": mechanism,
        "guarantee": guarantee,
        "budget": found_budget,
        "audits": found_audits,
        "versions": _versions(saved["lightning"]),
        "not_covered": [],
        "approximations": [],
    }
    data["summary"] = summary(data)
    data["not_covered"] = not_covered(data, notes, live=bool(live))
    data["approximations"] = approximations(data)
    return data


def _audits_checked(
    consistency: Optional[dict],
    guarantee: Optional[dict],
    callbacks: Mapping[str, Any],
    found: List[dict],
    ledger: Any,
    mechanism: Optional[dict],
    *,
    has_state: bool,
) -> Tuple[Optional[dict], Optional[dict]]:
    """The consistency entry with the audits' problems (:mod:`~lightning_privacy.statement.audit_checks`): a problem
    makes the statement inconsistent (no guarantee stated), as one of the DPSGD state does."""
    problems = orphan_problems(callbacks, has_dpsgd_state=has_state)
    problems += audit_problems(
        callbacks,
        found,
        epsilon=None if ledger is None else ledger.epsilon,
        run_delta=None if mechanism is None else mechanism["delta"],
    )
    if not problems:
        return consistency, guarantee
    consistency = dict(consistency or {"status": CONSISTENT, "problems": [], "notes": [], "digest": "not recorded"})
    consistency.update(status=INCONSISTENT, problems=[*consistency["problems"], *problems], audit_problems=problems)
    return consistency, None


def _dp_sgd(
    checkpoint: Mapping[str, Any],
    state: Mapping[str, Any],
    key: str,
    callback: Any,
    trainer: Any,
    global_step: Optional[int],
) -> Tuple[dict, Optional[dict], List[str], dict, Any]:
    """The mechanism, the guarantee (``None`` for an inconsistent state), notes, consistency and the ledger (``None``
    for an inconsistent state) of a DPSGD state."""
    from lightning_privacy.checkpoints import privacy_ledger

    fields = f.dpsgd_fields(state)
    arguments = f.state_key_arguments(key)
    consistency = check_consistency(fields, state, key=key, global_step=global_step, key_arguments=arguments)
    notes: List[str] = []
    delta = fields.delta
    if delta is None:
        delta = f.DEFAULT_DELTA
        notes.append(f"The DPSGD state does not record its δ (saved by an older version): δ = {delta:g} is assumed.")
    history = fields.history
    sigma, rate = fields.noise_multiplier, fields.sample_rate
    if history:
        sigma = history[-1][0] if sigma is None else sigma
        rate = history[-1][1] if rate is None else rate
    secure = getattr(callback, "secure_mode", None) if callback is not None else fields.secure_mode
    strategy, world_size = fields.strategy, fields.world_size  # (recorded since 0.3.0)
    if trainer is not None:
        strategy, world_size = type(trainer.strategy).__name__, int(trainer.world_size)
    mechanism = {
        "name": "DP-SGD",
        "noise_multiplier": sigma,
        "sample_rate": rate,
        "sample_rate_given": fields.sample_rate_given,
        "sample_rate_origin": fields.sample_rate_origin,
        "steps": fields.steps,
        "max_grad_norm": fields.max_grad_norm,
        "expected_batch_size": fields.expected_batch_size,
        "delta": float(delta),
        "accountant": fields.ledger_accountant,
        "relation": fields.relation,
        "history": [[s, p, t] for s, p, t in history],
        "dataset_size": fields.dataset_size,
        "sampling_seed": _seed_kind(fields.sampling_seed, secure),
        "noise_seed": _seed_kind(fields.noise_seed, secure),
        "secure_mode": secure,
        "grad_sample_mode": fields.grad_sample_mode,
        "grad_sample_mode_switch": fields.grad_sample_mode_switch,
        "privacy_unit": fields.privacy_unit or {"unit": "example"},
        "clipping": fields.clipping or {"rule": "fixed"},
        "precision": fields.precision,
        "loss_reduction": fields.loss_reduction,
        "strategy": strategy,
        "world_size": world_size,
        "fixed_modules": fields.fixed_modules,
        "planned_for": f.planned(arguments, key) or None,
    }
    if consistency["status"] != CONSISTENT:
        return mechanism, None, notes, consistency, None
    ledger = privacy_ledger(checkpoint, delta=float(delta))
    bounds = {
        relation: {
            f"fpr_{fpr:g}": float(b) for fpr, b in zip(f.FPRS, ledger.tpr_bounds(list(f.FPRS), relation=relation))
        }
        for relation in f.RELATIONS
        if getattr(ledger, "group_size", 1) == 1 or relation == "add_remove"  # (a person's k rows: add/remove only)
    }
    beta = float(ledger.bayes_security())
    guarantee = {
        "epsilon": _finite(ledger.epsilon()),
        "delta": float(delta),
        "epsilon_relation": "add_remove",
        "bayes_security": beta,
        "bayes_security_relation": ledger.relation,
        "advantage": 1.0 - beta,
        "tpr_bounds": bounds,
        "bayes_security_closed_form": float(ledger.bayes_security_closed_form()),
    }
    unit = fields.privacy_unit or {}
    if unit.get("unit") == "user":  # a person's ε, and beside it the same run's ε for one row
        from lightning_privacy.dpsgd.users import row_epsilon

        record = row_epsilon(ledger.history, user_sampling=bool(unit.get("user_sampling")), delta=float(delta))
        guarantee["row_epsilon"] = _finite(record)
    return mechanism, guarantee, notes, consistency, ledger

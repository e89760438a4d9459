"""AttributeInferenceMonitor's set-up checks: an attribute by name, and candidates that fit the data.

Kept apart from the monitor so that it stays about its bookkeeping; the rule that decides whether
candidates fit lives in :mod:`lightning_privacy.functional.attributes` (torch only, no Trainer).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import DPOptimizer

from lightning_privacy import names
from lightning_privacy.attributes import SensitiveAttribute, check_candidates, observed_values
from lightning_privacy.dpsgd.run import accountant_history, dp_optimizers, history_steps
from lightning_privacy.functional.attribute_sensitivity import BACKENDS, METHODS

__all__ = ["CandidateCheck", "check_monitor_arguments", "look_up_attribute"]

#: the candidate check stops (cannot tell) after this many rows without a verdict
CHECK_MAX_ROWS = 4096


def check_monitor_arguments(
    attribute: Any,
    method: Any,
    values: Any,
    publish: Any,
    check_candidates: Any,
    chunk_size: Any,
    backend: Any,
    key: Any,
    loss_fn: Any,
    batch_to_inputs_targets: Any,
) -> None:
    """AttributeInferenceMonitor's arguments: a ``MisconfigurationException`` naming the first bad one."""
    if not isinstance(attribute, SensitiveAttribute) and not (isinstance(attribute, str) and attribute):
        raise MisconfigurationException(
            f"`attribute` must be a SensitiveAttribute or the name of one (for the datamodule's "
            f"`sensitive_attribute(name)`), got {attribute!r}"
        )
    if method not in METHODS:
        raise MisconfigurationException(f"`method` can be {' or '.join(METHODS)}, got {method!r}")
    if (isinstance(values, str) and values not in ("all", "extremes")) or not isinstance(values, Iterable):
        raise MisconfigurationException(f"`values` can be 'all', 'extremes' or a sequence, got {values!r}")
    for name, flag in (("publish", publish), ("check_candidates", check_candidates)):
        if not isinstance(flag, bool):
            raise MisconfigurationException(f"`{name}` must be a bool, got {flag!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise MisconfigurationException(f"`chunk_size` must be a positive int or None, got {chunk_size!r}")
    if backend not in BACKENDS:
        raise MisconfigurationException(f"`backend` can be {', '.join(BACKENDS)}, got {backend!r}")
    if not isinstance(key, str) or not key:
        raise MisconfigurationException(f"`key` must be a non-empty string, got {key!r}")
    for name, fn in (("loss_fn", loss_fn), ("batch_to_inputs_targets", batch_to_inputs_targets)):
        if fn is not None and not callable(fn):
            raise MisconfigurationException(f"`{name}` must be callable, got {fn!r}")


def look_up_attribute(trainer: pl.Trainer, name: str) -> SensitiveAttribute:
    """The attribute ``name`` from the trainer's datamodule's ``sensitive_attribute(name)``.

    Raises:
        MisconfigurationException: naming the attribute, when there is no datamodule, it has no
            ``sensitive_attribute`` method, the method fails or returns something else.
    """
    datamodule = trainer.datamodule
    where = (
        f"AttributeInferenceMonitor(attribute={name!r}) looks the name up with the datamodule's "
        f"`sensitive_attribute({name!r})`"
    )
    instead = "or give `attribute` a SensitiveAttribute"
    if datamodule is None:
        raise MisconfigurationException(
            f"{where}, but the trainer has no datamodule: pass `datamodule=` to `trainer.fit`, {instead}."
        )
    method = getattr(datamodule, "sensitive_attribute", None)
    if not callable(method):
        raise MisconfigurationException(
            f"{where}, but {type(datamodule).__name__} has no such method: add `sensitive_attribute(name)` "
            f"returning a SensitiveAttribute, {instead}."
        )
    try:
        found = method(name)
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise MisconfigurationException(f"{where}, which failed: {err}") from err
    if not isinstance(found, SensitiveAttribute):
        raise MisconfigurationException(f"{where}, which returned {found!r}, not a SensitiveAttribute.")
    return found


def _fix(attribute: SensitiveAttribute) -> str:
    look_up = (
        f"take the attribute from the datamodule, `datamodule.sensitive_attribute({attribute.name!r})` "
        f"(`attribute: {attribute.name}` in a LightningCLI config), or "
    )
    if attribute.kind == "numeric":
        return (
            "The candidates must be written on the model's input scale. Fix: " + look_up + "give "
            "SensitiveAttribute.numeric the column's own encoding as `encode=` (e.g. standardisation)."
        )
    return "Fix: " + look_up + "give SensitiveAttribute.one_hot the group's one-hot input columns as `columns=`."


class CandidateCheck:
    """Compares an attribute's candidates with the first batches, until a verdict (then :attr:`done`).

    Numeric columns may need several small batches before the rule decides. Under DDP every rank
    checks its own batches and the ranks decide together (a failure on one rank raises on all), so that
    no rank goes on to the monitor's collective alone.
    """

    def __init__(self, attribute: SensitiveAttribute, enabled: bool = True) -> None:
        self.attribute = attribute
        self.done = not enabled
        self._seen: Optional[torch.Tensor] = None

    def update(self, trainer: pl.Trainer, inputs: Any) -> None:
        """Add a batch's inputs; raise ``MisconfigurationException`` if the candidates do not fit."""
        observed = observed_values(self.attribute, inputs)
        if observed is None:  # custom attribute: what `substitute` writes cannot be compared
            self.done = True
            return
        seen = observed if self._seen is None else torch.cat([self._seen, observed])
        try:
            verdict, error = check_candidates(self.attribute, seen), None
        except ValueError as err:
            verdict, error = False, err
        if trainer.strategy.reduce_boolean_decision(error is not None, all=False):
            what = error or f"on another process, the candidates of attribute {self.attribute.name!r} do not fit."
            raise MisconfigurationException(
                f"AttributeInferenceMonitor: {what} {_fix(self.attribute)} "
                "Pass `check_candidates=False` only if these candidates are deliberate."
            )
        decided = verdict is not None or seen.shape[0] >= CHECK_MAX_ROWS
        self.done = trainer.strategy.reduce_boolean_decision(decided, all=True)
        self._seen = None if self.done else seen


def default_batch_to_inputs_targets(batch: Any) -> Tuple[Any, Any]:
    """``(inputs, targets)`` from an ``(x, y)`` batch."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise MisconfigurationException(
        f"AttributeInferenceMonitor expects (inputs, targets) batches, got {type(batch).__name__}; pass "
        "`batch_to_inputs_targets=lambda batch: (inputs, targets)`."
    )


def select_values(attribute: SensitiveAttribute, values: Any) -> SensitiveAttribute:
    """``attribute`` restricted to the monitor's ``values`` (``"all"``, ``"extremes"`` or a subset)."""
    try:
        return attribute.select(values)
    except (TypeError, ValueError) as err:
        raise MisconfigurationException(
            f"`values`={values!r} does not fit attribute {attribute.name!r}: {err}"
        ) from err


def set_flat_max_grad_norm(ledger: Any, value: Any) -> None:
    """Give the monitor's ledger the optimizer's C (one flat clipping norm; a changed C is an error)."""
    if isinstance(value, (list, tuple)):
        raise MisconfigurationException(
            "AttributeInferenceMonitor supports flat clipping only (one max_grad_norm), not per-layer."
        )
    try:
        ledger.set_max_grad_norm(float(value))
    except ValueError as err:
        raise RuntimeError(str(err)) from err


def align_with_accountant(ledger: Any, trainer: pl.Trainer, accountant: Any, pending: Optional[float]) -> None:
    """Bring the monitor's ledger to the accountant's steps: new steps get ``pending`` (the last one's R_t) or the
    worst case 2C (:meth:`~lightning_privacy.attribute_ledger.AttributeLedger.align`); C from the DP optimizer."""
    history = accountant_history(trainer, accountant)
    if history_steps(history) == ledger.steps:
        return  # no step was taken (e.g. skipped by the optimizer)
    if ledger.max_grad_norm is None and history_steps(history) > ledger.steps:
        optimizers = dp_optimizers(trainer)
        if not optimizers:
            raise MisconfigurationException(
                "The accountant recorded steps but no Opacus DPOptimizer gives max_grad_norm."
            )
        set_flat_max_grad_norm(ledger, optimizers[0].max_grad_norm)
    ledger.align(history, pending)


def require_dp_optimizer(optimizer: Any) -> None:
    """The monitor measures DP-SGD steps only: the optimizer must be Opacus' ``DPOptimizer``."""
    if not isinstance(optimizer, DPOptimizer):
        raise MisconfigurationException(
            f"AttributeInferenceMonitor needs Opacus DP-SGD (a DPOptimizer), got {type(optimizer).__name__}; add "
            "lightning_privacy.DPSGD(...) to the callbacks."
        )


def warn_unpublished() -> None:
    """The monitor's once-per-instance warning that β*_AI can leak membership (without ``publish=True``)."""
    rank_zero_warn(
        f"AttributeInferenceMonitor: {names.AI_BAYES_SECURITY} is data-dependent; publishing it can leak the "
        "MEMBERSHIP of training records (Cherubin et al. 2024, Section 5.3). Per-step R_t is not logged; "
        "keep the logs private where membership inference matters (publish=True to opt in)."
    )

"""Helpers shared by post-training audit callbacks.

- Writing: audits run in ``on_fit_end`` where ``self.log`` is forbidden, so scalars go to
  ``logger.log_metrics`` of every logger in ``trainer.loggers``, and histograms / figures / text to TensorBoard,
  MLflow, Weights & Biases and CSV loggers (:mod:`lightning_privacy.loggers`), on global rank 0 only.
- Reading: deterministic, sharded passes over a dataset (each rank gets every ``world_size``-th example,
  no padding or duplicates; :func:`lightning_privacy.audits._common.sequential_loader`), and the
  training / validation data of a running Trainer.
- Running: :func:`skip_audit` (``fast_dev_run``), :func:`show_progress`, and :class:`ScheduledAudit`, the fit-end
  / every-n-epochs schedule of an audit callback (:func:`check_every_n_epochs` checks its argument).

The audits themselves are plain functions in :mod:`lightning_privacy.audits`; the callbacks only choose
the data, call them and log the results with these helpers.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import names
from lightning_privacy.audits._common import refuse_mapping_batches, sequential_loader
from lightning_privacy.loggers import log_figure, log_histogram, log_text, shows_figures
from lightning_privacy.reporting import ReportSection

__all__ = [
    "publish_summary",
    "ScheduledAudit",
    "announce_skip",
    "check_every_n_epochs",
    "log_figure",
    "log_histogram",
    "log_scalars",
    "log_text",
    "other_epsilons",
    "member_loader",
    "misconfiguration",
    "population_loader",
    "refuse_member_mappings",
    "section",
    "sharded_loader",
    "show_progress",
    "shows_figures",
    "skip_audit",
]


# --- writing ----------------------------------------------------------------------------------
def other_epsilons(trainer: pl.Trainer) -> Dict[str, float]:
    """ε* and PANORAMIA ε̃ of this fit, from the audit callbacks' attributes or ``trainer.callback_metrics``."""
    found: Dict[str, float] = {}
    for key in (names.EPSILON_STAR, names.PANORAMIA_EPSILON):
        for cb in trainer.callbacks:
            for attr in ("results", "last_values"):
                values = getattr(cb, attr, None)
                if isinstance(values, dict) and key in values:
                    found[key] = float(values[key])
        if key not in found and key in trainer.callback_metrics:
            found[key] = float(trainer.callback_metrics[key])
    return found


@contextlib.contextmanager
def misconfiguration() -> Iterator[None]:
    """A ``ValueError`` of the Trainer-free machinery (a setting the user can fix) as Lightning's exception."""
    try:
        yield
    except ValueError as err:
        raise MisconfigurationException(str(err)) from None


def section(result: Any, title: str, rows: List[tuple]) -> ReportSection:
    """An audit callback's report section: its ``rows``, with the last result's warnings, tables and figures."""
    if result is None:
        return ReportSection(title, rows)
    return dataclasses.replace(result.report_section(), rows=rows)


def _step(trainer: pl.Trainer, step: Optional[int]) -> int:
    return int(trainer.global_step if step is None else step)


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
    """``logger.log_metrics(metrics, step)`` for every logger, on global rank 0; then ``logger.save()``."""
    if not trainer.is_global_zero or not metrics:
        return
    values = {key: float(value) for key, value in metrics.items()}
    for logger in trainer.loggers:
        logger.log_metrics(values, step=_step(trainer, step))
        logger.save()


# --- reading ----------------------------------------------------------------------------------
def publish_summary(trainer: pl.Trainer, who: str, tag: str, text: str, warnings: Iterable[str] = ()) -> None:
    """An audit's Markdown summary as text on every logger (``tag``), its first line (the headline) on the console,
    and each warning as one ``"<who>: <warning>"``."""
    log_text(trainer, tag, text)
    rank_zero_info(text.splitlines()[0])
    for warning in warnings:
        rank_zero_warn(f"{who}: {warning}", stacklevel=5)  # attributed to the callback's hook, not to this helper


def sharded_loader(loader: Iterable, *, rank: int = 0, world_size: int = 1) -> Iterable:
    """:func:`~lightning_privacy.audits._common.sequential_loader`, failing as a misconfiguration.

    Raises:
        MisconfigurationException: if several processes share an iterable that is not a DataLoader
            over a map-style dataset.
    """
    try:
        return sequential_loader(loader, rank=rank, world_size=world_size)
    except ValueError as err:
        raise MisconfigurationException(str(err)) from err


def _first(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        return loaders[0] if loaders else None
    if isinstance(loaders, Mapping):
        return next(iter(loaders.values()), None)
    return loaders


def member_loader(trainer: pl.Trainer, given: Optional[Iterable] = None) -> Iterable:
    """The training data for an audit, in a fixed order, this rank's share.

    ``given``, else the datamodule's ``member_dataloader()``, else the dataset behind the Trainer's train
    loader (a DP-SGD Poisson loader is replaced by a plain sequential pass over its dataset), else the
    dataset behind the datamodule's ``train_dataloader()``.
    """
    source = given
    if source is None and callable(getattr(trainer.datamodule, "member_dataloader", None)):
        source = trainer.datamodule.member_dataloader()
    if source is None:
        source = _first(trainer.train_dataloader)
    if source is None and trainer.datamodule is not None:  # e.g. the train loop never ran
        source = _first(trainer.datamodule.train_dataloader())
    if source is None:
        raise MisconfigurationException("No training data to audit: pass `member_dataloader`")
    return sharded_loader(source, rank=trainer.global_rank, world_size=trainer.world_size)


def population_loader(trainer: pl.Trainer, given: Optional[Iterable] = None) -> Iterable:
    """Non-member (population) data for an audit: ``given``, else the validation data, this rank's share."""
    source = given
    if source is None:
        source = _first(trainer.val_dataloaders)
    if source is None and trainer.datamodule is not None:
        try:
            source = _first(trainer.datamodule.val_dataloader())
        except NotImplementedError:  # pragma: no cover - hook not overridden
            source = None
    if source is None:
        raise MisconfigurationException(
            "No non-member data to audit: pass `population_dataloader` or give the Trainer validation data"
        )
    return sharded_loader(source, rank=trainer.global_rank, world_size=trainer.world_size)


def refuse_member_mappings(
    trainer: pl.Trainer, given: Optional[Iterable], *, forward_fn: Any, signal_fn: Any, who: str
) -> None:
    """Refuse member batches that are mappings (a language model's) without ``signal_fn`` or ``forward_fn``, from
    their first batch: called in ``on_train_start``, so the sentence comes before training, not after it (and after
    any reference training) at the audit. Nothing is read with a ``forward_fn`` or ``signal_fn``.

    Raises:
        MisconfigurationException: ``"<who>: the batches are mappings ..."``, naming ``signal_fn=causal_lm_signal``.
    """
    if forward_fn is not None or signal_fn is not None or skip_audit(trainer):
        return
    try:
        members = member_loader(trainer, given)
    except MisconfigurationException:
        return  # no training data found: the audit names what is missing
    try:
        refuse_mapping_batches(members)
    except ValueError as err:
        raise MisconfigurationException(f"{who}: {err}") from None


# --- running ----------------------------------------------------------------------------------
def skip_audit(trainer: pl.Trainer) -> bool:
    """Whether post-training audits skip this run: under ``fast_dev_run`` (as Lightning's checkpointing does)."""
    return bool(getattr(trainer, "fast_dev_run", False))


def refuse_sharded(trainer: pl.Trainer, who: str) -> None:
    """Refuse an audit that copies the model or runs it on rank 0 alone, under FSDP2 (ModelParallelStrategy).

    A sharded module cannot be deep-copied, and a forward pass on one rank waits forever for the others' shards.
    """
    from lightning.pytorch.strategies import ModelParallelStrategy

    if type(trainer.strategy) is ModelParallelStrategy:
        raise MisconfigurationException(
            f"{who} runs the model on global rank 0 alone (and copies it), which a module sharded by "
            "ModelParallelStrategy (FSDP2) cannot do. Save a checkpoint and audit it after training: "
            "`lightning-privacy audit ... --checkpoint last.ckpt` or the lightning_privacy.audits functions."
        )


def announce_skip(trainer: pl.Trainer, who: str) -> None:
    """The one info line a skipped audit prints (call once, e.g. in ``setup``)."""
    if skip_audit(trainer):
        rank_zero_info(f"{who}: skipped under `fast_dev_run` (an audit of a one-batch run would mean nothing).")


def show_progress(trainer: pl.Trainer) -> bool:
    """Show a long audit's progress bar (stderr): on global rank 0 when the Trainer shows its own."""
    return bool(trainer.is_global_zero and trainer.progress_bar_callback is not None)


def check_every_n_epochs(value: Any) -> Optional[int]:
    """``every_n_epochs`` of an audit callback: a positive int, or ``None`` for the fit-end audit only."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise MisconfigurationException(f"`every_n_epochs` must be a positive int or None, got {value!r}")
    return value


class ScheduledAudit(Callback):
    """An audit callback's schedule: after every ``every_n_epochs``-th training epoch (if set) and at fit end, at most
    once per training step (the fit-end audit is skipped when the last epoch's already measured this model), never
    under ``fast_dev_run``. Subclasses set ``every_n_epochs`` and ``_audited_step`` and define ``audit``."""

    every_n_epochs: Optional[int] = None
    _audited_step: Optional[int] = None

    def audit(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Dict[str, float]:  # pragma: no cover
        raise NotImplementedError

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if skip_audit(trainer):
            return
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.audit(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if skip_audit(trainer) or self._audited_step == trainer.global_step:
            return  # fast_dev_run, or the last epoch's audit already measured this very model
        self.audit(trainer, pl_module)


def sealed(state: Dict[str, Any], **more: Any) -> Dict[str, Any]:
    """An audit's saved state (``state`` and ``more``) with its ``digest`` (:func:`~lightning_privacy.checkpoints.dpsgd_state_digest` of the
    rest), which :func:`~lightning_privacy.statement.privacy_statement` recomputes: a value edited after saving shows
    (a check against accidents, not a signature, as DPSGD's)."""
    from lightning_privacy.checkpoints import dpsgd_state_digest

    state = {**state, **more}
    return {**state, "digest": dpsgd_state_digest(state)}

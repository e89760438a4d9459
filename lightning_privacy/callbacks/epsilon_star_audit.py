"""``EpsilonStarAudit``: Epsilon* of the trained model, at fit end and optionally every n epochs."""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Iterable, Optional, Set

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import EpsilonStarDetails
from lightning_privacy.audits._common import unshard
from lightning_privacy.audits.epsilon_star import (
    REPORT_TITLE,
    EpsilonStarResult,
    audit_epsilon_star_from_losses,
    fit_warnings,
    report_rows,
    summary_text,
    transformed_fit_figure,
)
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.dpsgd.run import find_dpsgd
from lightning_privacy.functional.membership_loss import membership_losses_from_loader
from lightning_privacy.metrics.epsilon_star import EpsilonStar

__all__ = ["EpsilonStarAudit", "transformed_fit_figure"]

MEMBER_LOSSES_TAG = names.EPSILON_STAR_MEMBER_LOSSES
NONMEMBER_LOSSES_TAG = names.EPSILON_STAR_NONMEMBER_LOSSES
FIGURE_TAG = names.EPSILON_STAR_FIGURE
SUMMARY_TAG = names.EPSILON_STAR_SUMMARY


class EpsilonStarAudit(audit.ScheduledAudit):
    """Epsilon* (Negoescu et al. 2023) of the model being trained, from its per-example losses.

    Members are the training data in a fixed order — ``member_dataloader`` if given, else the
    datamodule's ``member_dataloader()``, else the dataset behind the train loader (never the DP-SGD
    Poisson loader itself); non-members are ``population_dataloader``, else the validation data. Under
    DDP each rank scores every ``world_size``-th example and the losses are gathered by the
    :class:`~lightning_privacy.metrics.epsilon_star.EpsilonStar` metric (collective: every rank
    computes). Rank 0 writes through ``trainer.loggers`` at ``trainer.global_step``:

    - ``audit/epsilon_star`` (parametric) and ``audit/epsilon_star_empirical``;
    - ``audit/mia_epsilon_lower``: the ``MembershipEpsilon`` lower bound (Bayesian interval, holdout
      threshold selection) of the same losses used as a threshold attack (score = -loss);
    - to the loggers' media: histograms of both loss sets, a figure of the transformed losses with their Normal
      fits, and a text summary with the fits, the maximising threshold and the KS p-values, led by the
      result's ``warnings`` (e.g. fits the KS test rejects: ε* is then flagged as not reliable), which are
      also issued as warnings, each once per fit (an audit every epoch repeats a warning with other numbers: the
      loggers' summaries and the report keep every audit's). The table goes to the loggers and the privacy report;
      the console gets one line per audit.

    The audit itself is :func:`lightning_privacy.audits.audit_epsilon_star_from_losses` (the same as
    :func:`lightning_privacy.audits.audit_epsilon_star` on the same model and loaders): this callback
    picks the data, gathers the losses across processes (in dataset order) and logs the result. It runs
    at most once per training step (the fit-end audit is skipped when the last epoch was just audited)
    and not at all under ``fast_dev_run``.

    Works with or without DP-SGD. To audit a saved checkpoint use
    ``lightning-privacy audit epsilon-star --checkpoint ...``.

    Args:
        delta: delta of Epsilon*, in ``(0, 0.5)``; ``None`` = ``1 / (n ln n)`` with ``n`` the number of
            member examples.
        member_dataloader: member data (default: the training data, see above).
        population_dataloader: non-member data (default: the validation data).
        every_n_epochs: also audit after every ``n``-th training epoch; ``None`` = only at fit end.
        forward_fn: ``forward_fn(pl_module, batch) -> (logits, target)``; default ``pl_module(batch[0]),
            batch[1]``.
        signal_fn: ``signal_fn(pl_module, batch) -> losses`` (one per example, low = member-like) instead of
            ``forward_fn``, e.g. :data:`~lightning_privacy.functional.sequence_loss.causal_lm_signal` for a language
            model. Member batches that are mappings (``{"input_ids": ..., "attention_mask": ...}``) without either are
            refused at ``on_train_start``, naming ``signal_fn=causal_lm_signal``.
        log_histograms, log_figure: write the loss histograms / the figure to the figure loggers (:mod:`lightning_privacy.loggers`).
        mia_alpha: significance of the ``MembershipEpsilon`` interval.

    Attributes:
        result: the last :class:`~lightning_privacy.audits.epsilon_star.EpsilonStarResult` (every rank).
        results: the last values written, by key (same on every rank).
        details: the last parametric and empirical
            :class:`~lightning_privacy.analysis.epsilon_star.EpsilonStarDetails`, by method.

    Raises:
        MisconfigurationException: for ``delta`` outside ``(0, 0.5)``, ``every_n_epochs`` not a positive
            int, no member / non-member data, or mapping batches without ``signal_fn`` or ``forward_fn``.

    Example::

        >>> audit = EpsilonStarAudit(every_n_epochs=5)
        >>> trainer = pl.Trainer(callbacks=[audit])  # doctest: +SKIP
        >>> EpsilonStarAudit(delta=0.5)
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `delta` must be in the open interval (0, 0.5), got 0.5
    """

    #: Metric columns this callback adds to the run's HPARAMS session (see ``callbacks/_hparams.py``).
    hparams_metric_keys = (names.EPSILON_STAR,)
    report_order = 50

    def __init__(
        self,
        *,
        delta: Optional[float] = None,
        member_dataloader: Optional[Iterable] = None,
        population_dataloader: Optional[Iterable] = None,
        every_n_epochs: Optional[int] = None,
        forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
        log_histograms: bool = True,
        log_figure: bool = True,
        mia_alpha: float = 0.05,
        signal_fn: Optional[Callable[[Any, Any], Any]] = None,
    ) -> None:
        if delta is not None and (
            isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < delta < 0.5
        ):
            raise MisconfigurationException(f"`delta` must be in the open interval (0, 0.5), got {delta!r}")
        if not 0.0 < mia_alpha < 1.0:
            raise MisconfigurationException(f"`mia_alpha` must be in (0, 1), got {mia_alpha!r}")
        self.delta = None if delta is None else float(delta)
        self.member_dataloader = member_dataloader
        self.population_dataloader = population_dataloader
        self.every_n_epochs = audit.check_every_n_epochs(every_n_epochs)
        self.forward_fn, self.signal_fn = forward_fn, signal_fn
        self.log_histograms = log_histograms
        self.log_figure = log_figure
        self.mia_alpha = mia_alpha
        self.results: Dict[str, float] = {}
        self.details: Dict[str, EpsilonStarDetails] = {}
        self.result: Optional[EpsilonStarResult] = None
        self._audited_step: Optional[int] = None
        self._warned: Set[str] = set()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._warned = set()  # each warning once per fit
            audit.announce_skip(trainer, type(self).__name__)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        audit.refuse_member_mappings(
            trainer,
            self.member_dataloader,
            forward_fn=self.forward_fn,
            signal_fn=self.signal_fn,
            who="EpsilonStarAudit",
        )

    def audit(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Dict[str, float]:
        """Score both sets, compute Epsilon* (collective: call on every rank), write from rank 0."""
        members_in = audit.member_loader(trainer, self.member_dataloader)
        population_in = audit.population_loader(trainer, self.population_dataloader)
        fns = {"forward_fn": self.forward_fn, "signal_fn": self.signal_fn}
        member_losses = membership_losses_from_loader(pl_module, members_in, **fns)
        nonmember_losses = membership_losses_from_loader(pl_module, population_in, **fns)
        members, nonmembers = _gather(trainer, member_losses, nonmember_losses)
        try:
            dpsgd = find_dpsgd(trainer)
            result = audit_epsilon_star_from_losses(
                members,
                nonmembers,
                delta=self.delta,
                mia_alpha=self.mia_alpha,
                warn=False,
                ledger=None if dpsgd is None else dpsgd.ledger,
            )
        except ValueError as err:
            raise MisconfigurationException(str(err)) from err
        for note in (*result.notes, *result.warnings):
            kind = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", note)  # the same warning with other numbers
            if kind not in self._warned:
                self._warned.add(kind)
                rank_zero_warn(f"EpsilonStarAudit: {note}")
        self.result, self.results, self.details = result, result.metrics(), dict(result.details)
        self._audited_step = trainer.global_step
        self._write(trainer, result)
        return self.results

    def _write(self, trainer: pl.Trainer, result: EpsilonStarResult) -> None:
        if not trainer.is_global_zero:
            return
        audit.log_scalars(trainer, self.results)
        if self.log_histograms:
            audit.log_histogram(trainer, MEMBER_LOSSES_TAG, result.member_losses)
            audit.log_histogram(trainer, NONMEMBER_LOSSES_TAG, result.nonmember_losses)
        if self.log_figure and "parametric" in result.details and audit.shows_figures(trainer):
            audit.log_figure(trainer, FIGURE_TAG, result.figure())
        audit.log_text(trainer, SUMMARY_TAG, self.summary())
        values = ", ".join(f"{key} = {value:.4g}" for key, value in self.results.items())
        flag = " (Normal fits rejected: the parametric value is not reliable)" if result.fits_rejected else ""
        rank_zero_info(
            f"EpsilonStarAudit at step {trainer.global_step}: {values}{flag}; the table is the loggers' text "
            f"`{SUMMARY_TAG}` and the privacy report's section."
        )

    def report_section(self, trainer: Any = None) -> Any:
        """The report's section (:mod:`lightning_privacy.reporting`): the values, the last audit's warnings, figure."""
        rows = report_rows(self.results, fits_rejected=self.result is not None and self.result.fits_rejected)
        return audit.section(self.result, REPORT_TITLE, rows)

    def summary(self) -> str:
        """A markdown table of the last audit, its warnings first (e.g. Normal fits that the KS test rejects)."""
        if self.result is not None:
            return self.result.summary()
        found = self.result.warnings if self.result is not None else fit_warnings(self.details)
        return summary_text(self.results, self.details, found)


def _gather(trainer: pl.Trainer, member_losses: torch.Tensor, nonmember_losses: torch.Tensor) -> tuple:
    """Every rank's losses, in dataset order, as float64 arrays (collective: every rank calls it)."""
    local = torch.cat([member_losses, nonmember_losses]).double()
    is_member = torch.cat(
        [torch.ones_like(member_losses, dtype=torch.bool), torch.zeros_like(nonmember_losses, dtype=torch.bool)]
    )
    metric = EpsilonStar()
    metric.update(local, is_member)  # every rank updates, even with an empty shard
    members, nonmembers = metric.gathered_losses()
    world_size = trainer.world_size
    return unshard(members.numpy(), world_size), unshard(nonmembers.numpy(), world_size)

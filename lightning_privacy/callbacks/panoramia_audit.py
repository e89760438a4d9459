"""``PanoramiaAudit``: PANORAMIA privacy measurement at fit end, with generated non-members.

Kazmi et al., "PANORAMIA: Privacy Auditing of Machine Learning Models without Retraining" (NeurIPS
2024). The audit is :func:`lightning_privacy.audits.audit_panoramia` (pipeline
:func:`lightning_privacy.functional.panoramia.panoramia_audit`, bounds
:mod:`lightning_privacy.analysis.panoramia`); this file only picks the member data and logs.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.audits.panoramia import (
    REPORT_TITLE,
    PanoramiaAuditResult,
    audit_panoramia,
    panoramia_figure,
    report_rows,
)
from lightning_privacy.callbacks import _audit_utils as audit

__all__ = ["PanoramiaAudit", "panoramia_figure"]

FIGURE_TAG = names.PANORAMIA_FIGURE
SUMMARY_TAG = names.PANORAMIA_SUMMARY


class PanoramiaAudit(Callback):
    """Run PANORAMIA on the trained model at fit end and log ``audit/panoramia_*``.

    The auditor holds a subset of the training data (``member_fraction`` of it), no non-members and
    no retraining: non-members are generated. Logged on global rank 0 through ``trainer.loggers``:
    ``audit/panoramia_epsilon`` (``eps_tilde``), ``audit/panoramia_c_lb``,
    ``audit/panoramia_c_plus_epsilon_lb``; to the loggers also a figure (precision–recall of
    baseline vs MIA, and the bounds over recall) and a text block stating what ``eps_tilde`` means
    (not a lower bound on ε-DP) and listing the rows the baseline finds most obviously real. A result
    that carries no information (``{c+ε}_lb = 0``: too few correct guesses at every recall level) is
    flagged: its warnings lead the text block and are issued as warnings.

    Member data: ``members`` (a table with ``encode``, or ``(x, y)`` arrays), else the datamodule's
    raw ``train_table`` encoded with its ``to_dataset`` (e.g.
    :class:`~lightning_privacy.data.AdultDataModule`), else the training data as ``(x, y)`` arrays
    (image-shaped inputs only, with the default :class:`~lightning_privacy.generators.DigitsGenerator`,
    unless a ``generator`` is given).

    The audit runs on global rank 0 (other ranks skip it), shows its phases on a progress bar when the
    Trainer shows one, and is skipped under ``fast_dev_run``.

    Args:
        members: member rows the auditor holds (optional, see above).
        encode: rows -> ``(x, y)`` tensors for the model (required with table ``members``).
        generator: a ``fit``/``sample`` generator (default: chosen by the pipeline for the data kind).
        member_fraction: share of the member rows the auditor uses, in ``(0, 1]`` (a seeded subset).
        audit_size, generator_size: ``m`` and ``|D_G|`` (default: a third of the members each).
        beta: confidence level of the pair of bounds, in ``(0, 1)``.
        num_thresholds: recall levels tried.
        helper_epochs: epochs of the helper model on synthetic data.
        classifier: ``"auto"``, ``"hgb"`` or ``"torch"``.
        top_rows: most-obviously-real rows listed in the text block.
        mia_features: ``"target_loss"`` (the paper's MIA: x + target loss) or ``"calibrated"`` (also the
            helper's loss as a reference; stronger on Adult, see ``docs/reproductions/panoramia.md``).
        seed: seed of the whole audit.

    Attributes:
        result: the last :class:`~lightning_privacy.audits.panoramia.PanoramiaAuditResult` (rank 0).

    Raises:
        MisconfigurationException: for a bad argument (at construction) or missing member data.

    Example::

        >>> audit = PanoramiaAudit(member_fraction=0.5, audit_size=3000, seed=1)
        >>> audit.state_key
        "PanoramiaAudit{'member_fraction': 0.5, 'audit_size': 3000, 'seed': 1}"
        >>> trainer = pl.Trainer(callbacks=[audit], max_epochs=10)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=AdultDataModule())  # doctest: +SKIP
    """

    report_order = 60  # the report's sections: DP-SGD first, then monitors, then audits

    def __init__(
        self,
        *,
        members: Any = None,
        encode: Optional[Callable] = None,
        generator: Any = None,
        member_fraction: float = 1.0,
        audit_size: Optional[int] = None,
        generator_size: Optional[int] = None,
        beta: float = 0.05,
        num_thresholds: int = 100,
        helper_epochs: int = 10,
        classifier: str = "auto",
        top_rows: int = 10,
        mia_features: str = "target_loss",
        seed: int = 0,
    ) -> None:
        if (
            isinstance(member_fraction, bool)
            or not isinstance(member_fraction, (int, float))
            or not 0 < member_fraction <= 1
        ):
            raise MisconfigurationException(f"`member_fraction` must be in (0, 1], got {member_fraction!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1:
            raise MisconfigurationException(f"`beta` must be in (0, 1), got {beta!r}")
        if classifier not in ("auto", "hgb", "torch"):
            raise MisconfigurationException(f"`classifier` must be 'auto', 'hgb' or 'torch', got {classifier!r}")
        if mia_features not in ("target_loss", "calibrated"):
            raise MisconfigurationException(
                f"`mia_features` must be 'target_loss' or 'calibrated', got {mia_features!r}"
            )
        for name, value, low in (
            ("num_thresholds", num_thresholds, 1),
            ("helper_epochs", helper_epochs, 1),
            ("top_rows", top_rows, 0),
            ("audit_size", audit_size, 20),
            ("generator_size", generator_size, 20),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise MisconfigurationException(f"`{name}` must be an int >= {low}, got {value!r}")
        if generator is not None and not (hasattr(generator, "fit") and hasattr(generator, "sample")):
            raise MisconfigurationException(
                f"`generator` must have fit(data) and sample(n), got {type(generator).__name__}"
            )
        self.members, self.encode, self.generator = members, encode, generator
        self.member_fraction = float(member_fraction)
        self.audit_size, self.generator_size = audit_size, generator_size
        self.beta, self.num_thresholds, self.helper_epochs = float(beta), num_thresholds, helper_epochs
        self.classifier, self.top_rows, self.seed = classifier, top_rows, seed
        self.mia_features = mia_features
        self.result: Optional[PanoramiaAuditResult] = None
        self._last: Dict[str, float] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(
            member_fraction=self.member_fraction, audit_size=self.audit_size, seed=self.seed
        )

    def _member_data(self, trainer: pl.Trainer) -> tuple:
        if self.members is not None:
            return self.members, self.encode
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "train_table") and callable(getattr(dm, "to_dataset", None)):
            return dm.train_table, (self.encode or (lambda rows: dm.to_dataset(rows).tensors))
        return audit.member_loader(trainer), self.encode  # (x, y) batches: read by the audit

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            audit.refuse_sharded(trainer, type(self).__name__)
            audit.announce_skip(trainer, type(self).__name__)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or audit.skip_audit(trainer):
            return
        members, encode = self._member_data(trainer)
        try:
            result = audit_panoramia(
                pl_module,
                members,
                encode=encode,
                generator=self.generator,
                member_fraction=self.member_fraction,
                audit_size=self.audit_size,
                generator_size=self.generator_size,
                beta=self.beta,
                num_thresholds=self.num_thresholds,
                classifier=self.classifier,
                helper_epochs=self.helper_epochs,
                top_rows=self.top_rows,
                seed=self.seed,
                mia_features=self.mia_features,
                progress=audit.show_progress(trainer),
            )
        except (ValueError, TypeError) as err:
            raise MisconfigurationException(f"PanoramiaAudit: {err}") from err
        self.result = result
        self._last = result.metrics()
        audit.log_scalars(trainer, self._last)
        if audit.shows_figures(trainer):
            audit.log_figure(trainer, FIGURE_TAG, result.figure())
        # the summary is led by the result's warnings, if it carries no information
        audit.publish_summary(trainer, "PanoramiaAudit", SUMMARY_TAG, result.summary(), result.warnings)

    def report_section(self, trainer: Any = None) -> Any:
        """The report's section (:mod:`lightning_privacy.reporting`): ε̃, c_lb, {c+ε}_lb, the warnings, the figure."""
        rows = report_rows(self.result.metrics() if self.result is not None else self.last_values)
        return audit.section(self.result, REPORT_TITLE, rows)

    @property
    def last_values(self) -> Dict[str, float]:
        """The last audit's logged scalars (ε̃, c_lb, {c+ε}_lb); kept in the callback's state."""
        return dict(self._last)

    @override
    def state_dict(self) -> Dict[str, Any]:
        return audit.sealed({"version": 1, "last": dict(self._last)})  # its digest: the statement tells an edit

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._last = {str(k): float(v) for k, v in state_dict.get("last", {}).items()}

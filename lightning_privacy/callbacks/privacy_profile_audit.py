"""Post-training data-resolved privacy profile (LeBlond et al., 2023) of a logistic-regression head."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.analysis import privacy_profile as pp
from lightning_privacy.audits.privacy_profile import (
    REPORT_TITLE,
    PrivacyProfileResult,
    audit_privacy_profile,
    report_rows,
    transition_figure,
)
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.callbacks.output_perturbation import OutputPerturbation, check_linear_head_model

__all__ = ["PrivacyProfileAudit", "transition_figure"]


class PrivacyProfileAudit(Callback):
    """At fit end: which training rows the trained logistic-regression head exposes, and which ε is worth trying.

    From the trained head ``A(x)`` (the weights before :class:`OutputPerturbation` noise, if that callback
    runs) and the released model point ``M`` (the final weights), the audit

    1. gathers the head's inputs for every training row in a fixed order and their per-row logistic
       gradients in one vectorised pass;
    2. checks that ``A(x)`` is the optimum of ``(1/n) Σ l + (Λ/2)‖f‖²`` — ``‖∇J‖/Λ`` bounds the distance
       to it — and warns when that distance exceeds ``convergence_tolerance`` times the median neighbour
       shift ``‖A_wc(y_i) − A(x)‖`` (the sphere bound assumes the optimum); it also warns on rows with
       norm > 1 (then ``β = nΛε/2`` is not the calibrated noise rate);
    3. computes the worst-case neighbours ``A_wc(y_i)``, the losses ``|l(x, y_i, M)|`` and their ranking,
       and the transition analysis over ε (:mod:`lightning_privacy.analysis.privacy_profile`);
    4. logs (global rank 0, every logger; images, histograms and text on TensorBoard, MLflow, W&B and CSV) the maximum loss,
       the recommended ε range, the gradient norm and the approximation bound as scalars, a histogram of
       ``|l|``, a table of the ``top_k`` most exposed rows with their features, and the figure.

    The audit itself is :func:`lightning_privacy.audits.audit_privacy_profile`; this callback finds the
    rows, ``A(x)`` and ε, calls it on global rank 0 (other ranks skip), warns with its notes and logs
    the result. It shows its stages on a progress bar when the Trainer shows one, and is skipped under
    ``fast_dev_run``.

    Without an ε (no ``epsilon`` and no :class:`OutputPerturbation`), losses are reported as ``|l|/β``
    (distance differences); the ranking does not depend on ε. Usable on the last linear layer
    (``out_features=1, bias=False``) of a deeper network over *frozen* features: that is an
    approximation — the analysis treats the features as fixed data and ignores how removing a row would
    change the layers below.

    Args:
        regularization: ``Λ`` (default: ``pl_module.regularization``).
        epsilon: ε to express losses in (default: the :class:`OutputPerturbation` ε, else none).
        layer: the head (see :func:`resolve_linear_head`); ``None`` means ``pl_module.linear``.
        dataloader: training rows in a fixed order (default: ``datamodule.member_dataloader()`` if any,
            else the training dataset unshuffled).
        top_k: rows in the exposure table.
        feature_names: column names for the table.
        row_features: ``(n, k)`` values to show in the table instead of the head inputs (e.g. raw columns).
        epsilons, quantiles, num_samples, seed: passed to :func:`transition_analysis`.
        convergence_tolerance: see step 2.

    Attributes:
        result: the last :class:`~lightning_privacy.audits.privacy_profile.PrivacyProfileResult`.
        profile, transition, gradient_norm, approximation_bound, top_rows: its parts (computed on global
            rank 0 only; other ranks skip the audit).

    Raises:
        MisconfigurationException: at ``setup`` for an unsupported model or bad arguments.

    Example::

        >>> audit = PrivacyProfileAudit(top_k=5)
        >>> trainer = pl.Trainer(callbacks=[OutputPerturbation(epsilon=1.0), audit])  # doctest: +SKIP
        >>> trainer.fit(LogisticRegressionModule(6), full_batch_loader)  # doctest: +SKIP
        >>> audit.transition.recommended_range  # doctest: +SKIP
    """

    report_order = 70  # the report's sections: DP-SGD first, then monitors, then audits

    def __init__(
        self,
        *,
        regularization: float | None = None,
        epsilon: float | None = None,
        layer=None,
        dataloader: Iterable | None = None,
        top_k: int = 10,
        feature_names: Sequence[str] | None = None,
        row_features: np.ndarray | None = None,
        epsilons: Sequence[float] | None = None,
        quantiles: Sequence[float] = (0.5, 0.9, 0.99, 1.0),
        num_samples: int = 128,
        convergence_tolerance: float = 1e-2,
        seed: int = 0,
    ) -> None:
        for name, value in (("regularization", regularization), ("epsilon", epsilon)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise MisconfigurationException(f"`{name}` must be a number > 0 or None, got {value!r}")
        for name, value in (("top_k", top_k), ("num_samples", num_samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MisconfigurationException(f"`{name}` must be a positive int, got {value!r}")
        if not isinstance(convergence_tolerance, (int, float)) or not convergence_tolerance > 0:
            raise MisconfigurationException(f"`convergence_tolerance` must be > 0, got {convergence_tolerance!r}")
        self.regularization, self.epsilon, self.layer = regularization, epsilon, layer
        self.dataloader, self.top_k, self.feature_names = dataloader, top_k, feature_names
        self.row_features = None if row_features is None else np.asarray(row_features)
        self.epsilons, self.quantiles, self.num_samples = epsilons, tuple(quantiles), num_samples
        self.convergence_tolerance, self.seed = float(convergence_tolerance), seed
        self.profile: pp.PrivacyProfile | None = None
        self.transition: pp.TransitionAnalysis | None = None
        self.typical_profiles: list[pp.TypicalProfile] = []
        self.gradient_norm: float | None = None
        self.approximation_bound: float | None = None
        self.top_rows: list[dict] = []
        self.result: PrivacyProfileResult | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        audit.refuse_sharded(trainer, type(self).__name__)
        check_linear_head_model(pl_module, self.layer, self.regularization, "PrivacyProfileAudit")
        audit.announce_skip(trainer, type(self).__name__)

    def _rows(self, trainer: pl.Trainer) -> Iterable:
        """Every training row in a fixed order (all of them: the audit runs on global rank 0 only)."""
        source = self.dataloader
        if source is None and callable(getattr(trainer.datamodule, "member_dataloader", None)):
            source = trainer.datamodule.member_dataloader()
        if source is None:
            loaders = trainer.train_dataloader
            source = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        if source is None:
            raise MisconfigurationException("PrivacyProfileAudit cannot find the training rows: pass `dataloader`")
        return audit.sharded_loader(source, rank=0, world_size=1)  # plain sequential pass (no Poisson sampler)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank != 0 or audit.skip_audit(trainer):
            return
        perturbation = next((cb for cb in trainer.callbacks if isinstance(cb, OutputPerturbation)), None)
        base = perturbation.base_weights if perturbation is not None else None
        epsilon = self.epsilon if self.epsilon is not None else getattr(perturbation, "epsilon", None)
        self.run(
            pl_module, self._rows(trainer), base_weights=base, epsilon=epsilon, progress=audit.show_progress(trainer)
        )
        self._log(trainer)

    def run(
        self, model, rows: Iterable, *, base_weights=None, epsilon: float | None = None, progress: bool | None = False
    ) -> pp.PrivacyProfile:
        """The audit on ``model`` and ``rows`` (usable without a trainer, e.g. on a loaded checkpoint).

        ``base_weights`` is ``A(x)`` if the head's current weights are a noised release ``M``. The same as
        :func:`lightning_privacy.audits.audit_privacy_profile` with this callback's settings.
        """
        result = audit_privacy_profile(
            model,
            rows,
            regularization=self.regularization,
            epsilon=epsilon,
            base_weights=base_weights,
            layer=self.layer,
            top_k=self.top_k,
            feature_names=self.feature_names,
            row_features=self.row_features,
            epsilons=self.epsilons,
            quantiles=self.quantiles,
            num_samples=self.num_samples,
            convergence_tolerance=self.convergence_tolerance,
            seed=self.seed,
            progress=progress,
            warn=False,
        )
        for note in result.notes:
            rank_zero_warn(f"PrivacyProfileAudit: {note}")
        self.result = result
        self.profile, self.transition, self.typical_profiles = (
            result.profile,
            result.transition,
            result.typical_profiles,
        )
        self.gradient_norm, self.approximation_bound = result.gradient_norm, result.approximation_bound
        self.top_rows = result.top_rows
        return self.profile

    def report_section(self, trainer: Any = None) -> Any:
        """The report's section (:mod:`lightning_privacy.reporting`): the metrics, the most exposed rows, the figure."""
        return audit.section(self.result, REPORT_TITLE, report_rows(self.result.metrics() if self.result else {}))

    def _log(self, trainer: pl.Trainer) -> None:
        result = self.result
        assert result is not None
        audit.log_scalars(trainer, result.metrics())
        audit.log_histogram(trainer, names.PROFILE_LOSSES, result.profile.losses)
        audit.log_text(trainer, names.PROFILE_TOP_ROWS, result.summary())
        audit.log_figure(trainer, names.PROFILE_FIGURE, result.figure())

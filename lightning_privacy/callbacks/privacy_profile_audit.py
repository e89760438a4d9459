"""Post-training data-resolved privacy profile (LeBlond et al., 2023) of a logistic-regression head."""

from __future__ import annotations

from typing import Iterable, Sequence

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.analysis import privacy_profile as pp
from lightning_privacy.callbacks._audit_utils import log_figure, log_histogram, log_scalars, log_text, sharded_loader
from lightning_privacy.callbacks.output_perturbation import (
    OutputPerturbation,
    check_linear_head_model,
    module_regularization,
)
from lightning_privacy.functional.privacy_profile import (
    linear_head_inputs,
    logistic_per_example_gradients,
    resolve_linear_head,
)


def transition_figure(transition: pp.TransitionAnalysis, profiles: Sequence[pp.TypicalProfile], epsilon=None):
    """Paper Figs. 5-6: the typical profile ``mean|l|/β`` by rank for several ε, and per rank across ε."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for profile in profiles:
        ranks = np.linspace(0, 1, profile.losses.size)
        left.plot(ranks, profile.losses / profile.beta, label=f"ε = {profile.epsilon:.3g}")
    left.set(xlabel="rank (fraction of rows, most exposed right)", ylabel="mean |l| / β", yscale="log")
    left.set_title("Typical privacy profile")
    left.legend(fontsize=8)
    for q, curve, lo, hi in zip(
        transition.quantiles, transition.curves, transition.low_plateau, transition.high_plateau
    ):
        (line,) = right.plot(transition.epsilons, curve, label=f"rank quantile {q:g}")
        right.hlines([lo, hi], transition.epsilons[0], transition.epsilons[-1], colors=line.get_color(), linestyles=":")
    right.axvspan(transition.epsilon_low, transition.epsilon_high, alpha=0.15, label="ε range worth trying")
    if epsilon is not None:
        right.axvline(epsilon, color="black", linestyle="--", label=f"this model, ε = {epsilon:g}")
    right.set(xlabel="ε", ylabel="mean |l| / β", xscale="log", yscale="log")
    right.set_title("Low plateau → transition → high plateau")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    4. logs (global rank 0, every logger; images, histograms and text on TensorBoard) the maximum loss,
       the recommended ε range, the gradient norm and the approximation bound as scalars, a histogram of
       ``|l|``, a table of the ``top_k`` most exposed rows with their features, and the figure.

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
        profile, transition, gradient_norm, approximation_bound, top_rows: the last results (computed
            on global rank 0 only; other ranks skip the audit).

    Raises:
        MisconfigurationException: at ``setup`` for an unsupported model or bad arguments.

    Example::

        >>> audit = PrivacyProfileAudit(top_k=5)
        >>> trainer = pl.Trainer(callbacks=[OutputPerturbation(epsilon=1.0), audit])  # doctest: +SKIP
        >>> trainer.fit(LogisticRegressionModule(6), full_batch_loader)  # doctest: +SKIP
        >>> audit.transition.recommended_range  # doctest: +SKIP
    """

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

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_linear_head_model(pl_module, self.layer, self.regularization, "PrivacyProfileAudit")

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
        return sharded_loader(source, rank=0, world_size=1)  # plain sequential pass (no Poisson sampler)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank != 0:
            return
        perturbation = next((cb for cb in trainer.callbacks if isinstance(cb, OutputPerturbation)), None)
        base = perturbation.base_weights if perturbation is not None else None
        epsilon = self.epsilon if self.epsilon is not None else getattr(perturbation, "epsilon", None)
        self.run(pl_module, self._rows(trainer), base_weights=base, epsilon=epsilon)
        self._log(trainer, epsilon)

    def run(self, model, rows: Iterable, *, base_weights=None, epsilon: float | None = None) -> pp.PrivacyProfile:
        """The audit on ``model`` and ``rows`` (usable without a trainer, e.g. on a loaded checkpoint).

        ``base_weights`` is ``A(x)`` if the head's current weights are a noised release ``M``.
        """
        head = resolve_linear_head(model, self.layer)
        lam = module_regularization(model, self.regularization)
        features, labels = linear_head_inputs(model, head, rows)
        released = head.weight.detach()[0].cpu().double()
        base = released if base_weights is None else released.new_tensor(np.asarray(base_weights))
        gradients = logistic_per_example_gradients(base, features, labels).numpy()
        x, a, m = features.numpy(), base.numpy(), released.numpy()
        n = x.shape[0]
        self.gradient_norm = float(np.linalg.norm(gradients.mean(axis=0) + lam * a))
        neighbours = pp.worst_case_neighbours(a, gradients, regularization=lam)
        shift = float(np.median(np.linalg.norm(neighbours - a, axis=1)))
        if self.gradient_norm / lam > self.convergence_tolerance * shift:
            rank_zero_warn(
                f"PrivacyProfileAudit: the model is not at the optimum of the regularised objective: ‖∇J‖ = "
                f"{self.gradient_norm:.3g}, so ‖A − A(x)‖ may reach {self.gradient_norm / lam:.3g}, more than "
                f"{self.convergence_tolerance:g} × the median neighbour shift {shift:.3g}. The sphere bound "
                "assumes the exact minimiser: train to convergence (full-batch L-BFGS) before trusting the profile."
            )
        norm = float(np.linalg.norm(x, axis=1).max())
        if norm > 1.0 + 1e-9:
            rank_zero_warn(
                f"PrivacyProfileAudit: a row has norm {norm:.3g} > 1, so β = nΛε/2 is not the calibrated noise "
                "rate (scale rows into the unit ball); the ranking is still valid."
            )
        self.approximation_bound = pp.worst_case_relative_error_bound(x, regularization=lam)
        beta = 1.0 if epsilon is None else pp.noise_scale(epsilon=epsilon, dataset_size=n, regularization=lam)
        self.profile = pp.privacy_profile(a, neighbours, m, beta=beta)
        self.transition = pp.transition_analysis(
            a,
            neighbours,
            dataset_size=n,
            regularization=lam,
            epsilons=self.epsilons,
            quantiles=self.quantiles,
            num_samples=self.num_samples,
            seed=self.seed,
        )
        shown = np.geomspace(self.transition.epsilons[0], self.transition.epsilons[-1], 5)
        self.typical_profiles = [
            pp.typical_profile(
                a,
                neighbours,
                epsilon=e,
                dataset_size=n,
                regularization=lam,
                num_samples=min(self.num_samples, 64),
                seed=self.seed,
            )
            for e in shown
        ]
        values = x if self.row_features is None else self.row_features
        columns = self.feature_names or [f"x{j}" for j in range(values.shape[1])]
        index, losses = self.profile.most_exposed(min(self.top_k, n))
        self.top_rows = [
            {"row": int(i), "loss": float(loss), **{c: float(v) for c, v in zip(columns, values[i])}}
            for i, loss in zip(index, losses)
        ]
        return self.profile

    def _log(self, trainer: pl.Trainer, epsilon: float | None) -> None:
        assert self.profile is not None and self.transition is not None
        metrics = {
            names.PROFILE_MAX_LOSS: float(self.profile.losses[-1]),
            names.PROFILE_EPSILON_LOW: self.transition.epsilon_low,
            names.PROFILE_EPSILON_HIGH: self.transition.epsilon_high,
            names.PROFILE_GRADIENT_NORM: float(self.gradient_norm),
            names.PROFILE_APPROXIMATION_BOUND: float(self.approximation_bound),
        }
        unit = "|l(x, y_i, M)|" if epsilon is not None else "|l(x, y_i, M)|/β (no ε given)"
        columns = [k for k in self.top_rows[0] if k not in ("row", "loss")]
        lines = ["| rank | row | loss | " + " | ".join(columns) + " |", "|---" * (3 + len(columns)) + "|"]
        for r, row in enumerate(self.top_rows, 1):
            cells = " | ".join(f"{row[c]:.4g}" for c in columns)
            lines.append(f"| {r} | {row['row']} | {row['loss']:.4g} | {cells} |")
        text = (
            f"Most exposed training rows (loss = {unit}):\n\n"
            + "\n".join(lines)
            + f"\n\nRecommended ε range: [{self.transition.epsilon_low:.3g}, {self.transition.epsilon_high:.3g}]"
        )
        log_scalars(trainer, metrics)
        log_histogram(trainer, names.PROFILE_LOSSES, self.profile.losses)
        log_text(trainer, names.PROFILE_TOP_ROWS, text)
        log_figure(trainer, names.PROFILE_FIGURE, transition_figure(self.transition, self.typical_profiles, epsilon))

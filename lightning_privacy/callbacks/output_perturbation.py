"""ε-DP output perturbation for L2-regularised logistic regression (Chaudhuri et al., 2011)."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy.analysis.privacy_profile import noise_scale, sample_output_noise
from lightning_privacy.functional.privacy_profile import resolve_linear_head


def _positive_or_none(name: str, value, integer: bool = False, optional: bool = True):
    if value is None and optional:
        return None
    kind = int if integer else (int, float)
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, kind)
        or not math.isfinite(value)
        or value <= 0
    ):
        expected = ("a positive int" if integer else "a finite number > 0") + (" or None" if optional else "")
        raise MisconfigurationException(f"`{name}` must be {expected}, got {value!r}")
    return value


def training_set_size(trainer: pl.Trainer) -> int:
    """Rows in the training set (the dataset behind ``trainer.train_dataloader``, all ranks together)."""
    loader = trainer.train_dataloader
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise MisconfigurationException(
            "cannot tell the training-set size from `trainer.train_dataloader`; pass `dataset_size`"
        ) from None


def module_regularization(pl_module: pl.LightningModule, regularization: float | None) -> float:
    """``Λ``: the argument if given, else the module's ``regularization`` attribute."""
    if regularization is not None:
        return float(regularization)
    value = getattr(pl_module, "regularization", None)
    if value is None:
        raise MisconfigurationException(
            f"{type(pl_module).__name__} has no `regularization` attribute: pass `regularization` (Λ)"
        )
    return float(value)


def check_linear_head_model(pl_module: pl.LightningModule, layer: Any, regularization: float | None, who: str) -> None:
    """Fail in ``setup`` (naming ``who``) when the model has no supported linear head or no Λ."""
    try:
        resolve_linear_head(pl_module, layer)
    except ValueError as err:
        raise MisconfigurationException(f"{who} does not support this model: {err}") from err
    module_regularization(pl_module, regularization)


class OutputPerturbation(Callback):
    """Release ``A(x) + b`` with ``b`` ∝ ``exp(−β‖b‖)``, ``β = nΛε/2``: ε-DP output perturbation.

    When training ends (``on_train_end``, before any ``on_fit_end`` audit) the callback adds the noise
    to the binary linear head (:func:`~lightning_privacy.functional.privacy_profile.resolve_linear_head`).
    The guarantee (Chaudhuri, Monteleoni and Sarwate, 2011, Alg. 1; sensitivity ``2/(nΛ)``) holds when
    the head is the exact minimiser of ``(1/n) Σ l + (Λ/2)‖f‖²`` for a 1-Lipschitz loss and rows with
    ``‖x_i‖ ≤ 1`` — train :class:`~lightning_privacy.models.LogisticRegressionModule` to convergence and
    check it with :class:`~lightning_privacy.PrivacyProfileAudit`. The noise is drawn on rank 0 and
    broadcast. Checkpoints saved *during* training hold the un-noised weights: release only the weights
    after ``fit``. The un-noised ``base_weights`` are kept in memory for the audit and are never written
    to a checkpoint.

    Args:
        epsilon: ε > 0.
        regularization: ``Λ`` (default: the module's ``regularization`` attribute).
        dataset_size: ``n`` (default: the size of the training dataset).
        layer: which linear layer (see ``resolve_linear_head``); ``None`` means ``pl_module.linear``.
        seed: seed for the noise (``None``: fresh OS entropy — use that for a real release).

    Attributes:
        base_weights: ``A(x)`` before the noise (numpy), after fit.
        noise: the added ``b`` (numpy).
        beta: the ``β`` used.

    Raises:
        MisconfigurationException: for a non-positive ε/Λ/n, or a model without a supported head.

    Example::

        >>> from lightning_privacy.models import LogisticRegressionModule
        >>> cb = OutputPerturbation(epsilon=1.0, seed=0)
        >>> trainer = pl.Trainer(max_epochs=3, callbacks=[cb], logger=False)  # doctest: +SKIP
        >>> trainer.fit(LogisticRegressionModule(6), train_loader)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        epsilon: float,
        regularization: float | None = None,
        dataset_size: int | None = None,
        layer=None,
        seed: int | None = None,
    ) -> None:
        self.epsilon = float(_positive_or_none("epsilon", epsilon, optional=False))
        self.regularization = _positive_or_none("regularization", regularization)
        self.dataset_size = _positive_or_none("dataset_size", dataset_size, integer=True)
        self.layer = layer
        self.seed = seed
        self.base_weights: np.ndarray | None = None
        self.noise: np.ndarray | None = None
        self.beta: float | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_linear_head_model(pl_module, self.layer, self.regularization, "OutputPerturbation")
        if any(isinstance(cb, ModelCheckpoint) for cb in trainer.callbacks):
            rank_zero_warn(
                "OutputPerturbation: checkpoints saved during training hold the weights *before* the noise, "
                "which are not private; release only the model after `fit` (e.g. `trainer.save_checkpoint`)."
            )

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        head = resolve_linear_head(pl_module, self.layer)
        lam = module_regularization(pl_module, self.regularization)
        n = self.dataset_size if self.dataset_size is not None else training_set_size(trainer)
        self.beta = noise_scale(epsilon=self.epsilon, dataset_size=n, regularization=lam)
        noise = None
        if trainer.global_rank == 0:
            noise = torch.from_numpy(sample_output_noise(head.in_features, beta=self.beta, seed=self.seed))
        noise = trainer.strategy.broadcast(noise, src=0)
        with torch.no_grad():
            self.base_weights = head.weight.detach()[0].cpu().to(torch.float64).numpy().copy()
            head.weight[0] += noise.to(head.weight.device, head.weight.dtype)
        self.noise = noise.numpy()

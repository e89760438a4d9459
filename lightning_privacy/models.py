"""Small reference models used by the demo, examples and benchmarks."""

from __future__ import annotations

from typing import Sequence

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F


class TabularMLP(pl.LightningModule):
    """A plain MLP classifier for tabular data (e.g. Adult), trained with SGD or Adam.

    Nothing in it knows about privacy: DP-SGD is added from outside by the
    :class:`~lightning_privacy.DPSGD` callback. Logs ``train_loss``, ``val_loss``, ``val_acc`` and
    ``test_acc``.

    Args:
        num_features: input width.
        hidden: widths of the hidden layers (ReLU between them).
        num_classes: number of output logits.
        lr: learning rate.
        optimizer: ``"sgd"`` or ``"adam"``.
        dropout: dropout probability after each hidden layer (0 disables it).

    Example::

        >>> model = TabularMLP(104, hidden=(64,))
        >>> model(torch.zeros(3, 104)).shape
        torch.Size([3, 2])
    """

    def __init__(
        self,
        num_features: int,
        hidden: Sequence[int] = (64, 32),
        num_classes: int = 2,
        lr: float = 0.1,
        optimizer: str = "sgd",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"`optimizer` must be 'sgd' or 'adam', got {optimizer!r}")
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width = num_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{prefix}_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{prefix}_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class LogisticRegressionModule(pl.LightningModule):
    """Binary L2-regularised logistic regression ``f·x`` (no intercept), as in LeBlond et al. (2023).

    Minimises ``J(f) = (1/n) Σ ln(1 + exp(−y_i f·x_i)) + (Λ/2)‖f‖²`` (labels 0/1 stand for −1/+1): the
    penalty is added to the loss, which is the same as weight decay ``Λ`` in SGD. The paper's analysis
    (:mod:`lightning_privacy.analysis.privacy_profile`) and output perturbation
    (:class:`~lightning_privacy.OutputPerturbation`) assume the exact minimiser and rows with
    ``‖x_i‖ ≤ 1`` (scale them with :class:`~lightning_privacy.analysis.privacy_profile.UnitBallScaler`);
    ``check_unit_ball`` raises on a batch that breaks the latter. Parameters are float64 so the
    optimum can be reached to ~1e-12.

    The default optimiser is full-batch L-BFGS (strong-Wolfe line search): give the trainer one batch
    holding every training row and a few epochs; each step runs up to ``max_iter`` L-BFGS iterations.
    ``"sgd"`` and ``"adam"`` work with mini-batches but rarely reach the optimum
    (:class:`~lightning_privacy.PrivacyProfileAudit` then warns).

    Args:
        num_features: input width ``d``.
        regularization: ``Λ > 0``.
        optimizer: ``"lbfgs"``, ``"sgd"`` or ``"adam"``.
        lr: learning rate (1.0 suits L-BFGS).
        max_iter: L-BFGS iterations per step.
        check_unit_ball: raise if a training row has norm > 1.

    Example::

        >>> model = LogisticRegressionModule(3, regularization=0.5)
        >>> model(torch.zeros(4, 3)).shape, model.weights.dtype
        (torch.Size([4]), torch.float64)
    """

    def __init__(
        self,
        num_features: int,
        regularization: float = 1.0,
        optimizer: str = "lbfgs",
        lr: float = 1.0,
        max_iter: int = 100,
        check_unit_ball: bool = True,
    ) -> None:
        super().__init__()
        if optimizer not in ("lbfgs", "sgd", "adam"):
            raise ValueError(f"`optimizer` must be 'lbfgs', 'sgd' or 'adam', got {optimizer!r}")
        if isinstance(regularization, bool) or not isinstance(regularization, (int, float)) or not regularization > 0:
            raise ValueError(f"`regularization` must be a number > 0, got {regularization!r}")
        if not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"`num_features` must be a positive int, got {num_features!r}")
        self.save_hyperparameters()
        self.regularization = float(regularization)
        self.linear = nn.Linear(num_features, 1, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.linear.weight)

    @property
    def weights(self) -> torch.Tensor:
        """The weight vector ``f`` (a detached 1-D view)."""
        return self.linear.weight.detach()[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``f·x``, shape ``(batch,)``."""
        return self.linear(x.to(torch.float64)).squeeze(-1)

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``J(f)`` on the batch ``(x, y)``."""
        data_loss = F.binary_cross_entropy_with_logits(self(x), y.to(torch.float64))
        return data_loss + 0.5 * self.regularization * self.linear.weight.pow(2).sum()

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.hparams.check_unit_ball:
            norm = float(x.detach().to(torch.float64).norm(dim=1).max())
            if norm > 1.0 + 1e-9:
                raise ValueError(
                    f"training rows must satisfy ‖x_i‖ <= 1 (the privacy analysis needs it), got a row of norm "
                    f"{norm:.4g}; scale the features with UnitBallScaler or pass check_unit_ball=False"
                )
        loss = self.objective(x, y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{prefix}_loss", F.binary_cross_entropy_with_logits(logits, y.to(torch.float64)), sync_dist=True)
        self.log(f"{prefix}_acc", ((logits > 0).long() == y).float().mean(), prog_bar=True, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        if self.hparams.optimizer == "lbfgs":
            return torch.optim.LBFGS(
                self.parameters(),
                lr=self.hparams.lr,
                max_iter=self.hparams.max_iter,
                tolerance_grad=1e-13,
                tolerance_change=0.0,
                history_size=20,
                line_search_fn="strong_wolfe",
            )
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

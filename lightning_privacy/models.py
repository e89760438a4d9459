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

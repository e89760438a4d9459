"""Small models beyond the MLP (CNN + GroupNorm, attention, LSTM, frozen backbone) and their data, for DPSGD tests.

Every module's ``training_step`` returns the per-example losses (shape ``[B]``), which both of DPSGD's
``grad_sample_mode`` values accept; validation logs ``val_loss``. Inputs are built on the module's device.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from opacus.layers import DPLSTM, DPMultiheadAttention
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB, LENGTH = 12, 6


class PerExampleLoss(pl.LightningModule):
    """``training_step`` returns one loss per example; ``val_loss`` is their mean."""

    def __init__(self, lr: float = 0.5) -> None:
        super().__init__()
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        if losses.numel():
            self.log("train_loss", losses.mean())
        return losses

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class ImageCNN(PerExampleLoss):
    """Two convolutions with GroupNorm on 1×8×8 images, 10 classes."""

    def __init__(self, lr: float = 0.5) -> None:
        super().__init__(lr)
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x))


class FrozenBackbone(ImageCNN):
    """:class:`ImageCNN` whose convolutional backbone is frozen (as if pretrained): only the head trains."""

    def __init__(self, lr: float = 0.5) -> None:
        super().__init__(lr)
        self.features.requires_grad_(False)


class TokenTransformer(PerExampleLoss):
    """Embedding + DPMultiheadAttention + LayerNorm + feed-forward block over token sequences, 2 classes."""

    def __init__(self, lr: float = 0.5, width: int = 16) -> None:
        super().__init__(lr)
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(LENGTH, width)
        self.attention = DPMultiheadAttention(width, 2, batch_first=True)
        self.norm1 = nn.LayerNorm(width)
        self.feed_forward = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.norm2 = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens):
        # one row of positions per example (Opacus' per-example hooks need the batch dimension), contiguous
        # (opacus 1.6.0's ghost norm for Embedding calls .view on its input, which fails on an expanded tensor)
        positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
        h = self.embed(tokens) + self.position(positions)
        h = self.norm1(h + self.attention(h, h, h, need_weights=False)[0])
        h = self.norm2(h + self.feed_forward(h))
        return self.head(h.mean(dim=1))


class TokenLSTM(PerExampleLoss):
    """Embedding + Opacus' DPLSTM + Linear on the last state, 2 classes."""

    def __init__(self, lr: float = 0.5, width: int = 16) -> None:
        super().__init__(lr)
        self.embed = nn.Embedding(VOCAB, width)
        self.lstm = DPLSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def digit_datasets(n_train: int = 256, n_val: int = 128, dtype: torch.dtype = torch.float32):
    """scikit-learn's bundled 8×8 digits scaled to [0, 1], as ``(train, val)`` TensorDatasets ``[N, 1, 8, 8]``."""
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = torch.as_tensor(digits.images[order] / 16.0, dtype=dtype)[:, None]
    y = torch.as_tensor(digits.target[order], dtype=torch.long)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(
        x[n_train : n_train + n_val], y[n_train : n_train + n_val]
    )


def token_datasets(n_train: int = 256, n_val: int = 128, seed: int = 0):
    """Random token sequences ``[N, LENGTH]``; the label says whether token 1 occurs more often than token 2."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n_train + n_val, LENGTH), generator=g)
    y = ((x == 1).sum(1) > (x == 2).sum(1)).long()
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def loaders(datasets, batch_size: int = 32):
    train, val = datasets
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=64)

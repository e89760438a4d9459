"""The models the DP-SGD benchmarks train (``dpsgd_memory.py``, ``dpsgd_overhead.py``): one definition for both.

Imported inside the measuring process (``from _models import ...``; the scripts' folder is on ``sys.path`` when they
run), so the parent process that only launches measurements does not load torch.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from opacus.layers import DPMultiheadAttention
from torch import nn
from torch.nn import functional as F

QUIET = dict(
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)  # the Trainer settings of every measurement: nothing but the training itself


class Block(nn.Module):
    """DPMultiheadAttention + LayerNorm + a feed-forward of width 4 × ``width``, post-norm."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attention = DPMultiheadAttention(width, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.feed_forward = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h):
        h = self.norm1(h + self.attention(h, h, h, need_weights=False)[0])
        return self.norm2(h + self.feed_forward(h))


class Transformer(nn.Module):
    """Token and position embeddings, ``blocks`` blocks, mean pooling, a linear head (position ids batch-first)."""

    def __init__(self, vocab=8000, length=32, width=512, heads=8, blocks=2, classes=2) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
        return self.head(self.blocks(self.embed(tokens) + self.position(positions)).mean(1))


def wide_mlp() -> nn.Sequential:
    """1024 → 2048 → 2048 → 2048 → 10 (10.5 M parameters)."""
    return nn.Sequential(
        nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
        nn.Linear(2048, 10),
    )  # fmt: skip


def small_cnn() -> nn.Sequential:
    """Two 3×3 convolutions with GroupNorm on 1×16×16 images, 10 classes (0.01 M parameters)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )  # fmt: skip


class Classifier(pl.LightningModule):
    """``net`` trained with SGD on cross-entropy; the same module with or without DPSGD (per-example losses too)."""

    def __init__(self, net: nn.Module, lr: float) -> None:
        super().__init__()
        self.net, self.lr = net, lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        losses = F.cross_entropy(self.net(batch[0]), batch[1], reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

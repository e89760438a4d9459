"""The models the DP-SGD benchmarks train (``dpsgd_memory.py``, ``dpsgd_overhead.py``): one definition for both.

Imported inside the measuring process (``from _models import ...``; the scripts' folder is on ``sys.path`` when they
run), so the parent process that only launches measurements does not load torch.
"""

from __future__ import annotations

import torch
from opacus.layers import DPMultiheadAttention
from torch import nn


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

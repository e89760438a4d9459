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


class TinyGPT2(nn.Module):
    """A GPT-2 (transformers, eager attention) of 2 blocks, width 128, vocabulary 4,000: its ``lm_head`` is tied to
    ``wte`` (full fine-tuning; ``tied=False``: a head of its own, which ghost clipping takes), or frozen with LoRA
    adapters (rank 8) on ``c_attn`` (``lora``). Returns the logits."""

    def __init__(self, lora: bool = False, tied: bool = True) -> None:
        super().__init__()
        import warnings

        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=4000,
            n_positions=64,
            n_embd=128,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=tied,
        )
        config._attn_implementation = "eager"
        model = GPT2LMHeadModel(config)
        if lora:
            from peft import LoraConfig, get_peft_model

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"],
                                                         fan_in_fan_out=True, lora_dropout=0.0))  # fmt: skip
        self.model = model

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
        return self.model(input_ids=tokens, position_ids=positions).logits


class Classifier(pl.LightningModule):
    """``net`` trained with SGD on cross-entropy; the same module with or without DPSGD (per-example losses too)."""

    def __init__(self, net: nn.Module, lr: float) -> None:
        super().__init__()
        self.net, self.lr = net, lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        out = self.net(batch[0])
        if out.ndim == 3:  # a language model's logits: one loss per sequence (mean over its next-token targets)
            from lightning_privacy.functional.sequence_loss import causal_lm_losses

            losses = causal_lm_losses(out, batch[1])
        else:
            losses = F.cross_entropy(out, batch[1], reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)

"""Tiny Hugging Face causal LMs (GPT-2, Llama) as LightningModules, LoRA or full, for DP-SGD's exactness tests and
``benchmarks/clipping_exactness.py`` (random weights: no download; dropout off so a per-example reference replays
the training forward exactly)."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from lightning_privacy.functional.sequence_loss import causal_lm_signal

VOCAB, LENGTH, PAD = 32, 12, 0


class PaddedSequences(Dataset):
    """``n`` random token sequences of random length, right-padded with ``PAD`` and masked, as a tokenizer gives."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
        lengths = torch.randint(4, LENGTH + 1, (n,), generator=g)
        self.mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
        self.ids[self.mask == 0] = PAD

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


def hugging_face_model(kind: str) -> torch.nn.Module:
    """A one-layer GPT-2 (its output layer tied to the token embedding) or Llama (``padding_idx`` on its embedding)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel(config)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=LENGTH, pad_token_id=PAD,
    )  # fmt: skip
    return LlamaForCausalLM(config)


class TinyCausalLM(pl.LightningModule):
    """``kind`` ("gpt2" or "llama") fine-tuned with LoRA adapters (``lora``) or in full, on per-sequence losses.

    ``rows_seen`` lists the batch size of every ``training_step`` call (an empty batch must never reach it).
    """

    def __init__(self, kind: str = "llama", lora: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.kind, self.lora = kind, lora
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = hugging_face_model(kind)
            if lora:
                from peft import LoraConfig, get_peft_model

                targets = ["c_attn"] if kind == "gpt2" else ["q_proj", "v_proj"]
                config = LoraConfig(
                    r=4, lora_alpha=8, target_modules=targets, fan_in_fan_out=kind == "gpt2", lora_dropout=0.0
                )
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # peft's notes on Conv1D's fan_in_fan_out
                    model = get_peft_model(model, config)
        self.model = model
        self.rows_seen: list = []

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(input_ids.shape[0], 1)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits

    def training_step(self, batch, batch_idx):
        self.rows_seen.append(int(batch["input_ids"].shape[0]))
        losses = causal_lm_signal(self, batch)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.01)

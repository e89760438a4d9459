"""Tied parameters (GPT-2's ``lm_head.weight`` is ``wte.weight``) under ghost clipping: one sentence naming them and
the two fixes, instead of Opacus' words mid-forward; hooks mode and a frozen tied embedding train."""

from __future__ import annotations

import re

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.functional.sequence_loss import causal_lm_losses

V, T = 16, 8


class TiedLM(pl.LightningModule):
    """Token embedding → linear → output layer that reuses the embedding matrix (weight tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.mix = torch.nn.Embedding(V, 12), torch.nn.Linear(12, 12)
        self.lm_head = torch.nn.Linear(12, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        losses = causal_lm_losses(self.lm_head(torch.tanh(self.mix(self.wte(ids)))), ids)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def _fit(model: pl.LightningModule, mode: str) -> None:
    data = DataLoader(TensorDataset(torch.randint(0, V, (64, T), generator=torch.Generator().manual_seed(0))), 16)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode)
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[dpsgd],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    assert dpsgd.steps > 0


def test_ghost_mode_refuses_tied_parameters_in_one_sentence_naming_them_and_the_fixes():
    with pytest.raises(MisconfigurationException) as err:
        _fit(TiedLM(), "ghost")
    message = str(err.value)
    assert "`wte.weight` is `lm_head.weight`" in message
    assert "grad_sample_mode='hooks'" in message and "freeze the tied parameter" in message
    assert not re.search(r"[.!?] [A-Z]", message) and message.endswith(".")  # one sentence
    assert "Parameter tying is not supported" not in message


def test_hooks_mode_trains_tied_parameters_and_ghost_trains_with_the_tied_embedding_frozen():
    torch.manual_seed(0)
    model = TiedLM()
    before = model.wte.weight.detach().clone()
    _fit(model, "hooks")
    assert model.lm_head.weight is model.wte.weight and not torch.equal(model.wte.weight, before)
    frozen = TiedLM()
    frozen.wte.weight.requires_grad_(False)
    mix = frozen.mix.weight.detach().clone()
    _fit(frozen, "ghost")
    assert not torch.equal(frozen.mix.weight, mix)

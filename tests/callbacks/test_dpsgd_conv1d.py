"""Hugging Face's ``Conv1D`` (GPT-2's layers) with DPSGD's own samplers (issue 60 item 1): the per-example gradient
in hooks mode, the norm in ghost mode without per-example weights, and book-keeping's one backward pass — each
clipped sum against a float64 per-example loop; ``auto`` trains an untied GPT-2 in hooks mode."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import samplers
from lightning_privacy.functional.sequence_loss import causal_lm_losses
from tests.callbacks._stock_models import _rows
from tests.callbacks.test_dpsgd_functional import FirstStep
from tests.callbacks.test_stock_models import TOLERANCE, C, reference
from tests.test_bookkeeping import count_book_kept_sums

pytest.importorskip("transformers")

V, T = 24, 8


class UntiedGPT2(pl.LightningModule):
    """A GPT-2 whose head is its own (untied: ghost clipping takes it), one row of position ids per example (Opacus'
    hooks see the batch on the position embedding), each sequence's mean next-token loss."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=V, n_positions=T, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)  # fmt: skip
        self.model = GPT2LMHeadModel(config)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        positions = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
        losses = causal_lm_losses(self.model(input_ids=ids, position_ids=positions).logits, ids)  # (float64 stays)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(mode, monkeypatch):
    calls = count_book_kept_sums(monkeypatch)
    torch.manual_seed(0)
    model = UntiedGPT2().double()
    ids = torch.randint(0, V, (48, T), generator=torch.Generator().manual_seed(0))
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, sampling_seed=0, grad_sample_mode=mode)
    first = FirstStep(dpsgd)
    trainer = pl.Trainer(max_epochs=1, callbacks=[dpsgd, first], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(TensorDataset(ids), batch_size=8))
    return model, dpsgd, first, calls["sums"], trainer.global_step


@pytest.mark.parametrize("mode", ["hooks", "ghost", "auto"])
def test_gpt2_s_conv1d_layers_are_clipped_exactly_and_ghost_mode_takes_one_backward_pass(mode, monkeypatch):
    model, dpsgd, first, sums, steps = _fit(mode, monkeypatch)
    assert dpsgd.grad_sample_mode == ("hooks" if mode == "auto" else mode)  # (auto: nothing for it to distrust)
    expected = reference(model, first.state, _rows(first.batch))
    assert set(first.sums) == set(expected)
    scale = max(float(v.abs().max()) for v in expected.values())
    assert max(float((first.sums[n] - expected[n]).abs().max()) for n in expected) / scale < TOLERANCE
    # ghost: the norms from the layers' inputs and output gradients, the sum by book-keeping (no second pass)
    assert (sums >= steps - 1) if mode == "ghost" else sums == 0


def test_the_conv1d_samplers_are_installed_per_fit_not_in_opacus_registries():
    from opacus.grad_sample import GradSampleModule
    from transformers.pytorch_utils import Conv1D

    assert samplers.hugging_face_conv1d() is Conv1D and Conv1D not in GradSampleModule.GRAD_SAMPLERS

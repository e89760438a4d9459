"""Stock models train first time under the default ``DPSGD()`` (issue 57 item 8), exactly.

The reference is independent of the engine: a float64 copy of the module at the first step's start, ``training_step``
on each example alone (torchtext's batch split by its offsets and collated alone), its whole gradient by
``torch.autograd.grad`` clipped to C, summed; DPSGD's own clipped sum is read before the noise
(``register_before_noise_hook``). Which mode ``auto`` ends in, and why, is printed by
``benchmarks/clipping_exactness.py``; here only that it trains exactly and side effects happen once per step.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import functional
from tests.callbacks._stock_models import PADDED, STOCK
from tests.callbacks.test_dpsgd_functional import FirstStep

pytest.importorskip("transformers")

C = 0.5
TOLERANCE = 1e-9  # float64 end to end, relative to the sum's largest entry


def reference(module, state, examples):
    """Σᵢ clip(∇ℓᵢ, C) over ``examples`` (batches of one) on ``module`` with ``state`` (float64, no logging)."""
    module.load_state_dict(state)
    module.log = module.log_dict = lambda *args, **kwargs: None
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for _, p in named]
    for one in examples:
        with functional.logging_suppressed(module):
            loss = functional.example_loss(module.training_step(one, 0))
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(p) for g, (_, p) in zip(grads, named)]
        factor = min(1.0, C / (float(torch.sqrt(sum(g.pow(2).sum() for g in grads))) + 1e-6))
        total = [t + factor * g for t, g in zip(total, grads)]
    return {n: t for (n, _), t in zip(named, total)}


def _fit(name):
    make, loader, arguments, split = STOCK[name]
    torch.manual_seed(0)
    model = make().double()
    data = loader(48)
    if isinstance(data.dataset, TensorDataset):  # (float64 inputs for the float64 model)
        data.dataset.tensors = tuple(t.double() if t.is_floating_point() else t for t in data.dataset.tensors)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, sampling_seed=0, **arguments)
    first = FirstStep(dpsgd)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[dpsgd, first], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (vmap's fallbacks for attention kernels: performance, not correctness)
        trainer.fit(model, data)
    return model, dpsgd, first, split, trainer


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STOCK))
def test_a_stock_model_trains_exactly_first_time_under_the_default_dpsgd(name):
    model, dpsgd, first, split, trainer = _fit(name)
    assert dpsgd.grad_sample_mode_argument == "auto" and dpsgd.steps == trainer.global_step > 0
    expected = reference(model, first.state, split(first.batch))
    assert set(first.sums) == set(expected)
    scale = max(float(v.abs().max()) for v in expected.values())
    assert scale > 1e-4
    difference = max(float((first.sums[n] - expected[n]).abs().max()) for n in expected)
    assert difference / scale < TOLERANCE, (name, dpsgd.grad_sample_mode, dpsgd.grad_sample_mode_reason)
    if name == "metric":  # side effects once per step: the epoch's kept outputs hold each example once
        assert len(model.epoch_rows) == 2 and model.epoch_rows == model.batch_rows
        assert "train_acc" in trainer.callback_metrics


@pytest.mark.slow
def test_hugging_face_gradient_checkpointing_goes_through_vmap():
    """GPT-2 with ``gradient_checkpointing_enable()``: checkpointing (and the input-grad hook it registers) is off
    inside the per-example passes, so the examples go through vmap (not one at a time) and the step is exact; the
    module's own checkpointing is on again after (issue 57 item 6; guards ``_compat.hugging_face_input_grad_hooks_off``)."""
    from tests.callbacks import _stock_models

    class Checkpointed(_stock_models.GPT2):
        def __init__(self):
            super().__init__()
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    STOCK["gpt2_checkpointed"] = (Checkpointed, *STOCK["gpt2"][1:])
    try:
        model, dpsgd, first, split, _ = _fit("gpt2_checkpointed")
    finally:
        del STOCK["gpt2_checkpointed"]
    assert dpsgd.grad_sample_mode == "functional" and dpsgd.exactness.reference.endswith("(vmap)")
    assert model.model.transformer.gradient_checkpointing is True
    expected = reference(model, first.state, split(first.batch))
    scale = max(float(v.abs().max()) for v in expected.values())
    assert max(float((first.sums[n] - expected[n]).abs().max()) for n in expected) / scale < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PADDED))
def test_a_stock_causal_lm_with_a_padding_mask_goes_through_vmap(name):
    """A stock GPT-2 or Llama (SDPA attention, the default) given an ``attention_mask`` with padding: Hugging Face's
    test whether SDPA may skip the mask reads the mask's values, which vmap cannot; inside the per-example passes the
    explicit mask is built instead (``_compat.hugging_face_sdpa_mask_vmappable``), so the examples go through vmap,
    not one at a time, and the step is exact (issue 60 item 2)."""
    STOCK[name] = PADDED[name]
    try:
        model, dpsgd, first, split, _ = _fit(name)
    finally:
        del STOCK[name]
    assert dpsgd.grad_sample_mode == "functional" and dpsgd.exactness.reference.endswith("(vmap)")
    expected = reference(model, first.state, split(first.batch))
    scale = max(float(v.abs().max()) for v in expected.values())
    assert max(float((first.sums[n] - expected[n]).abs().max()) for n in expected) / scale < TOLERANCE

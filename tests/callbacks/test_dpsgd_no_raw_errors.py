"""No raw framework error from the models of issue 48's Why (item 5): each trains exactly in some mode or is refused
before its first step (or, for a parameter unfrozen mid-fit, at that step) in a sentence naming the module and the fix.

Measured before: ``spectral_norm`` (Opacus' "trainable layer with buffers"; functional mode trained 18 % off), ``nn.Bilinear``
in hooks/ghost mode (TypeError inside forward), reentrant ``torch.utils.checkpoint`` (torch's "incompatible with .grad()"
in every mode), non-reentrant checkpointing in ghost mode (Opacus' "Parameter tying is not supported"), a layer unfrozen
mid-fit (Opacus' ValueError)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from tests.callbacks import test_dpsgd_functional as fx

C = fx.C


def _fit(model, mode, steps=3, callbacks=(), **kwargs):
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0, noise_seed=1, **kwargs)
    trainer = pl.Trainer(max_steps=steps, callbacks=[dp, *callbacks], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(model, DataLoader(fx._data(), batch_size=16))
    return dp, trainer


class SpectralNorm(fx.MLP):
    def __init__(self):
        super().__init__()
        self.hidden = nn.utils.spectral_norm(nn.Linear(fx.D, fx.D))


class ParametrizedSpectralNorm(fx.MLP):
    def __init__(self):
        super().__init__()
        self.hidden = nn.utils.parametrizations.spectral_norm(nn.Linear(fx.D, fx.D))


class Scaled(nn.Linear):
    """A custom trainable layer holding a (constant) buffer."""

    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return super().forward(x) * self.scale


class Buffered(fx.MLP):
    def __init__(self):
        super().__init__()
        self.hidden = Scaled(fx.D, fx.D)


class Reentrant(fx.MLP):
    def forward(self, ids):
        h = torch.utils.checkpoint.checkpoint(
            lambda e: torch.tanh(self.hidden(e)), self.embed(ids).mean(1), use_reentrant=True
        )
        return self.head(h)


@pytest.mark.parametrize("make", [SpectralNorm, ParametrizedSpectralNorm], ids=["hook", "parametrization"])
@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional", "auto"])
def test_spectral_norm_is_refused_before_the_first_step_in_every_mode(make, mode):
    dp = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode)
    with pytest.raises(MisconfigurationException, match="spectral_norm updates its power-iteration vectors") as err:
        pl.Trainer(max_steps=1, callbacks=[dp], logger=False, enable_progress_bar=False,
                   enable_model_summary=False).fit(make().double(), DataLoader(fx._data(), batch_size=16))  # fmt: skip
    assert "hidden" in str(err.value) and dp.steps == 0


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize(
    ("make", "named"), [(fx.Bilinear, "takes 2"), (Buffered, "`scale`")], ids=["bilinear", "buffer"]
)
def test_what_opacus_hooks_cannot_run_is_refused_pointing_at_functional_mode(mode, make, named):
    with pytest.raises(MisconfigurationException, match="grad_sample_mode='functional'") as err:
        _fit(make().double(), mode)
    assert named in str(err.value)


@pytest.mark.parametrize("make", [fx.Bilinear, Buffered, Reentrant], ids=["bilinear", "buffer", "reentrant"])
def test_functional_mode_trains_them_exactly(make):
    """(Reentrant checkpointing: vmap cannot run it, and ``torch.autograd.grad`` refuses it; each example goes by its
    own ``.backward()``.) The reference: each example alone by ``.backward()`` on a float64 twin, clipped, summed."""
    torch.manual_seed(0)
    model = make().double()
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode="functional", sampling_seed=0)
    first = fx.FirstStep(dp)
    fx._trainer([dp, first], max_steps=2).fit(model, DataLoader(fx._data(), batch_size=16))
    twin = make().double()
    twin.load_state_dict(first.state)
    named = [(n, p) for n, p in twin.named_parameters() if p.requires_grad]
    total = {n: torch.zeros_like(p) for n, p in named}
    ids, y = first.batch
    for i in range(len(ids)):
        twin.zero_grad(set_to_none=True)
        fx.functional.example_loss(twin.training_step((ids[i : i + 1], y[i : i + 1]), 0)).backward()
        grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in named}
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))
        for n, g in grads.items():
            total[n] += min(1.0, C / (norm + 1e-6)) * g
    scale = max(float(t.abs().max()) for t in total.values())
    assert scale > 1e-3
    assert max(float((first.sums[n] - total[n]).abs().max()) for n in total) / scale < 1e-10


def test_auto_trains_a_trainable_layer_with_a_buffer_in_functional_mode():
    dp, trainer = _fit(Buffered().double(), "auto")
    assert dp.grad_sample_mode == "functional" and "holding buffers" in dp.grad_sample_mode_reason
    assert trainer.global_step == 3


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_reentrant_checkpointing_is_refused_in_one_sentence_in_hooks_and_ghost_mode(mode):
    with pytest.raises(MisconfigurationException, match="reentrant `torch.utils.checkpoint`") as err:
        _fit(Reentrant().double(), mode)
    assert "use_reentrant=False" in str(err.value) and "functional" in str(err.value)


def test_non_reentrant_checkpointing_in_ghost_mode_is_refused_naming_checkpointing():
    with pytest.raises(MisconfigurationException, match="gradient checkpointing") as err:
        _fit(fx.Checkpointed().double(), "ghost")
    assert "`hidden`" in str(err.value) and "functional" in str(err.value)
    with pytest.raises(MisconfigurationException, match="torch.utils.checkpoint"):
        _fit(fx.Checkpointed().double(), "hooks")


class Unfreeze(Callback):
    """Unfreezes (or freezes) ``embed`` at the third step, as a fine-tuning scheduler would."""

    def __init__(self, trainable):
        self.trainable = trainable

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 2:
            pl_module.embed.weight.requires_grad_(self.trainable)


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional"])
@pytest.mark.parametrize("trainable", [True, False], ids=["unfrozen", "frozen"])
def test_a_parameter_unfrozen_or_frozen_mid_fit_is_refused_at_that_step_naming_it(mode, trainable):
    model = fx.MLP().double()
    model.embed.weight.requires_grad_(not trainable)
    before = model.embed.weight.detach().clone()
    with pytest.raises(MisconfigurationException, match="parameter `embed.weight` became") as err:
        _fit(model, mode, steps=6, callbacks=[Unfreeze(trainable)])
    assert ("trainable" if trainable else "frozen") in str(err.value) and "at global step 2" in str(err.value)
    if trainable:  # nothing of it was updated outside DP-SGD
        assert torch.equal(model.embed.weight.detach(), before)

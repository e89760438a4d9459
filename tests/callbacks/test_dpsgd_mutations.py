"""One-line bugs in DPSGD from issue 47's mutation run (item 5), each pinned by a fast test here.

- the exactness check's tolerances made 100× looser (``exactness.py``'s ``rtol · max(…)``, the sum invariant's
  floors, ``install.py``'s float32 ``rtol``): a parameter whose gradient bypasses Opacus' hooks by 3 % is refused;
- an empty Poisson batch's loss ``· 0.0`` → ``· 1.0``, or the batch reaching ``training_step`` (``backward.py``): an
  empty step's update is the noise alone, and ``training_step`` never sees a batch of zero rows;
- FSDP2's placeholder row's loss not multiplied by zero (``backward.py``): a rank whose batch is empty adds an exactly
  zero gradient;
- ``trained is not pl_module`` flipped (``install.py``): a refit of the same module composes with what it spent, and
  the callback reused on another module starts that module at ε = 0;
- ``noise_steps_left > 0`` flipped in ``at_train_end`` (``self_checks.py``): a fit shorter than the noise test still
  tests its noise, at its end.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import exactness
from lightning_privacy.dpsgd.noise import NoiseSource

D = 6


class _Module(pl.LightningModule):
    """A small MLP whose ``training_step`` returns both the reduced and the per-example losses."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(D, 8), nn.Linear(8, 2)
        self.rows_seen = []  # the batch sizes training_step was called with

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.rows_seen.append(int(x.shape[0]))
        losses = F.cross_entropy(self(x), y, reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


class SlightBypass(_Module):
    """``lin.weight`` used again outside its layer, ``alpha · F.linear(x, lin.weight)``: each example's true gradient
    of ``lin.weight`` is ``(1 + alpha)`` times what Opacus' hooks see, so ``alpha / (1 + alpha)`` of it (2.9 % at
    ``alpha = 0.03``) bypasses clipping."""

    def __init__(self, alpha=0.03, reduced=None):
        super().__init__()
        self.alpha, self.reduced = alpha, reduced

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x) + self.alpha * F.linear(x, self.lin.weight)))

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        if self.reduced is None:
            return out
        losses = out["per_example_loss"]
        return losses.mean() if self.reduced == "mean" else losses.sum()  # hooks mode: the sum invariant


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    return TensorDataset(x, (x[:, 0] + 0.5 * x[:, 1] > 0).long())


def _trainer(callbacks, **kwargs):
    defaults = dict(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0,
    )  # fmt: skip
    return pl.Trainer(callbacks=callbacks, **{**defaults, **kwargs})


# (grad_sample_mode, what training_step returns, loss_reduction): the three comparisons the check makes
CHECKS = [
    ("hooks", None, "mean"),  # per-example losses: per-example gradients against autograd's
    ("ghost", None, "mean"),  # ghost clipping's per-example norms against autograd's
    ("hooks", "mean", "mean"),  # a reduced loss: the sum invariant
    ("hooks", "sum", "sum"),
]


@pytest.mark.parametrize(("mode", "reduced", "reduction"), CHECKS)
def test_a_gradient_bypassing_the_hooks_by_three_per_cent_is_refused_before_the_first_step(mode, reduced, reduction):
    torch.manual_seed(0)
    model = SlightBypass(alpha=0.03, reduced=reduced)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dpsgd = DPSGD(
        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, loss_reduction=reduction, sampling_seed=0
    )
    with pytest.raises(MisconfigurationException, match=r"exactness check.*`lin\.weight`"):
        _trainer([dpsgd]).fit(model, DataLoader(_data(), batch_size=16))
    assert dpsgd.steps == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing was trained through it


@pytest.mark.parametrize(("mode", "reduced", "reduction"), CHECKS)
def test_the_same_model_without_the_bypass_passes_the_check_at_float32_rounding(mode, reduced, reduction):
    torch.manual_seed(0)
    dpsgd = DPSGD(
        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, loss_reduction=reduction, sampling_seed=0
    )
    _trainer([dpsgd]).fit(SlightBypass(alpha=0.0, reduced=reduced), DataLoader(_data(), batch_size=16))
    assert dpsgd.steps == 4 and dpsgd.exactness.steps == 2
    assert dpsgd.exactness.max_relative_error < 1e-5


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_the_sum_invariant_refuses_one_examples_three_per_cent_bypass_in_a_cancelling_batch(reduction):
    """Near an optimum the examples' gradients cancel in the batch's; one example's gradient of a parameter that is
    used outside its layer by that example alone (a rare token's tied embedding row) is 3 % bigger than the hooks'.
    The check's floors (float32 rounding of the sum: 1e-6 of the examples' gradient norms, ÷ the batch under "mean")
    stay far below that; 100 times looser, they would hide it in a batch of 512."""
    batch = 512
    g = torch.Generator().manual_seed(1)
    samples = torch.randn(batch, 40, generator=g, dtype=torch.float64)
    samples = samples / samples.norm(dim=1, keepdim=True)  # each example's gradient: norm 1 ...
    samples = samples - samples.mean(0)  # ... and they cancel in the batch
    divisor = batch if reduction == "mean" else 1
    param = nn.Parameter(torch.zeros(40, dtype=torch.float64))
    names = {id(param): "embed.weight"}
    param.grad = samples.sum(0) / divisor  # what autograd gives when nothing bypasses the hooks
    exactness.check_summed_gradients([param], [samples], names, loss_reduction=reduction, rtol=1e-3)
    bypass = 0.03 * samples[0]  # example 0's gradient, 3 % of it unseen by the hooks
    param.grad = (samples.sum(0) + bypass) / divisor
    with pytest.raises(MisconfigurationException, match=r"`embed\.weight` that DP-SGD clips sum to a gradient"):
        exactness.check_summed_gradients([param], [samples], names, loss_reduction=reduction, rtol=1e-3)


# --- empty Poisson batches --------------------------------------------------------------------------------------
class _Steps(Callback):
    """Each step's batch size, clipped sum before the noise and gradient after the DP optimizer's step."""

    def __init__(self, dpsgd):
        self.rows, self.summed, self.grads, self.divisors = [], [], [], []
        dpsgd.register_before_noise_hook(
            lambda opt: self.summed.append([opt.summed(p).detach().clone() for p in opt.params])
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rows.append(int(batch[0].shape[0]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        optimizer = trainer.optimizers[0]
        self.grads.append([p.grad.detach().clone() for p in optimizer.params])
        self.divisors.append(float(optimizer.expected_batch_size * optimizer.accumulated_iterations))


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional"])
def test_an_empty_poisson_batch_updates_the_model_by_the_noise_alone(mode):
    sigma, c, seed = 0.7, 0.5, 11
    torch.manual_seed(0)
    model = _Module()
    # (exactness_rate=0: hooks mode's first steps would also run training_step on examples alone, as functional's do)
    dpsgd = DPSGD(
        noise_multiplier=sigma, max_grad_norm=c, grad_sample_mode=mode, sampling_seed=3, noise_seed=seed,
        exactness_rate=0.0,
    )  # fmt: skip
    steps = _Steps(dpsgd)
    _trainer([dpsgd, steps], max_epochs=3).fit(model, DataLoader(_data(n=8), batch_size=1))  # q = 1/8
    empty = [t for t, rows in enumerate(steps.rows) if rows == 0]
    assert len(steps.rows) == dpsgd.steps == 24 and len(empty) >= 3 and max(steps.rows) > 0
    assert min(model.rows_seen) > 0  # an empty batch never reaches training_step ...
    if mode != "functional":  # (... which functional mode also calls on single examples)
        assert model.rows_seen == [rows for rows in steps.rows if rows]
    params = [p for p in model.parameters() if p.requires_grad]
    for t in empty:
        assert all(torch.count_nonzero(s) == 0 for s in steps.summed[t]), t  # no example, no gradient: exactly 0
        generator = NoiseSource(seed).generator(t)  # the noise of step t, drawn as the DP optimizer draws it
        for p, grad in zip(params, steps.grads[t]):
            noise = torch.empty(p.shape, dtype=p.dtype).normal_(0, sigma * c, generator=generator)
            torch.testing.assert_close(grad, noise / steps.divisors[t], rtol=1e-6, atol=0)


# --- a DPSGD reused: the same module, another module -------------------------------------------------------------
def test_a_refit_of_the_same_module_composes_with_its_spending_and_another_module_starts_at_zero():
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, sampling_seed=0)
    model = _Module()
    loader = DataLoader(_data(n=64), batch_size=16)  # q = 1/4, 4 steps per epoch
    _trainer([dpsgd], max_epochs=2).fit(model, loader)
    first = dpsgd.ledger.epsilon()
    assert dpsgd.ledger.history == [(1.0, 0.25, 8)] and first > 0
    _trainer([dpsgd], max_epochs=2).fit(model, loader)  # the same model trained on: its privacy loss adds up
    assert dpsgd.ledger.history == [(1.0, 0.25, 16)]
    assert dpsgd.ledger.epsilon() > first * 1.2
    _trainer([dpsgd], max_epochs=2).fit(_Module(), loader)  # another model: none of the first one's spending
    assert dpsgd.ledger.history == [(1.0, 0.25, 8)]
    assert dpsgd.ledger.epsilon() == pytest.approx(first, rel=1e-9)


# --- a fit shorter than the noise test ---------------------------------------------------------------------------
class _Noise(Callback):
    """Scales the noise the DP optimizer adds (placed before DPSGD: its self-check still expects σ = 1)."""

    def __init__(self, factor):
        self.factor = factor

    def on_train_start(self, trainer, pl_module):
        trainer.optimizers[0].noise_multiplier = self.factor


def _one_step_fit(factor):
    torch.manual_seed(0)
    model = _Module()  # 74 parameters: the χ² test waits for 256 coordinates, 4 steps
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, sampling_seed=0, noise_seed=0)
    _trainer([_Noise(factor), dpsgd], max_steps=1).fit(model, DataLoader(_data(), batch_size=16))
    return dpsgd


@pytest.mark.parametrize("factor", [0.0, 0.3, 3.0])
def test_a_fit_shorter_than_the_noise_test_tests_its_noise_at_its_end(factor):
    with pytest.raises(MisconfigurationException, match=r"over 74 coordinates \(1 step\).*not noised as configured"):
        _one_step_fit(factor)


def test_a_fit_shorter_than_the_noise_test_with_the_right_noise_is_tested_and_passes():
    dpsgd = _one_step_fit(1.0)
    assert dpsgd.steps == 1
    assert dpsgd._checks.noise.done and dpsgd._checks.noise.count == 74  # one step's noise, tested at the end


# --- FSDP2: a rank whose Poisson batch is empty -------------------------------------------------------------------
class _Hooks:
    """Stands in for Opacus' FSDP2 ghost-clipping hooks: the trainable parameters, and whether the hooks are on."""

    def __init__(self, params):
        self.trainable_parameters, self.on, self.switched = params, True, []

    def disable_hooks(self):
        self.on = False
        self.switched.append("off")

    def enable_hooks(self):
        self.on = True
        self.switched.append("on")


def test_an_fsdp2_rank_whose_batch_is_empty_adds_an_exactly_zero_gradient_from_its_placeholder_row():
    """Under FSDP2 a rank with an empty batch runs its module on the placeholder row (every rank joins the module's
    collectives) with its loss multiplied by zero and the hooks off: its gradient is exactly zero, it adds no example.
    (On one process: the sharded path of :class:`PerExampleBackward` without the collectives; the two-process run is
    ``test_dpsgd_language_models.py::test_under_fsdp2_an_empty_rank_adds_nothing_and_empty_batches_never_reach_the_model``.)
    """
    from lightning_privacy.dpsgd.backward import PerExampleBackward

    torch.manual_seed(0)
    model = _Module()
    params = [p for p in model.parameters() if p.requires_grad]
    hooks = _Hooks(params)
    backward = PerExampleBackward(model, mode="ghost", loss_reduction="mean", hooks=hooks, sharded=True)
    try:
        x, y = _data(n=1).tensors  # the placeholder row: the dataset's first example
        backward.start_batch(empty=True)
        assert not hooks.on  # the placeholder row runs without Opacus' hooks
        out = model.training_step((x, y), 0)
        assert float(out["loss"].detach().sum()) > 0.1  # a real loss, whose gradient is far from zero ...
        model.backward(out["loss"])
        for p in params:  # ... multiplied by zero: exactly zero
            assert p.grad is not None and torch.count_nonzero(p.grad) == 0
        assert backward.last_rows == 0 and backward.last_norms.numel() == 0  # no example in this step
        assert hooks.on and hooks.switched == ["off", "on"]
    finally:
        backward.remove()

"""DPSGD(grad_sample_mode="auto"), the default, verifies Opacus' hooks and switches to functional mode on a disagreement.

The switch is tested against independent computations: the switch step's clipped sum against a float64 loop over the
examples (each example's ``training_step`` alone, its whole gradient clipped), and the whole switched fit against a
fit in functional mode from the start with the same seeds (the same batches and noise: the same model, to rounding).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, names
from lightning_privacy.dpsgd.optimizers import _DPOptimizer, _GhostDPOptimizer, to_clipped_sum
from tests.callbacks.test_dpsgd_functional import (
    MLP,
    TOLERANCE,
    C,
    FirstStep,
    Mixing,
    _data,
    _trainer,
    fit_and_compare,
    loop_clipped_sum,
)


class Reused(MLP):
    """The hidden layer's weight also used by ``F.linear`` outside its layer: Opacus' hooks miss that use (nothing in
    the module's structure shows it)."""

    def forward(self, ids):
        e = self.embed(ids).mean(1)
        h = torch.tanh(self.hidden(e) + 0.5 * F.linear(e, self.hidden.weight))
        return self.head(h)


class ReusedLater(MLP):
    """The same reuse, from the fit's 5th optimizer step on (an auxiliary path after warm-up)."""

    def forward(self, ids):
        e = self.embed(ids).mean(1)
        h = self.hidden(e)
        if self.trainer.global_step >= 4:
            h = h + 0.5 * F.linear(e, self.hidden.weight)
        return self.head(torch.tanh(h))


class MixingReduced(Mixing):
    """``h - h.mean(0)`` with a reduced loss: per-example gradients that are wrong but sum right."""

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.cross_entropy(self(ids), y)


def _fit(make, mode, epochs=2, **kwargs):
    torch.manual_seed(0)
    model = make().double()
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0, noise_seed=1, **kwargs)
    trainer = _trainer([dpsgd], max_epochs=epochs)
    trainer.fit(model, DataLoader(_data(), batch_size=16))
    return dpsgd, model, trainer


def test_auto_is_the_default():
    assert DPSGD(noise_multiplier=1.0).grad_sample_mode_argument == "auto"


def test_a_reuse_the_hooks_miss_switches_at_the_first_step_and_that_step_is_the_exact_clipped_sum():
    with pytest.warns(UserWarning, match=r"switched from Opacus' hooks to functional mode at step 0"):
        dpsgd, difference, _ = fit_and_compare(Reused, mode="auto")
    assert difference < TOLERANCE  # the step the hooks got wrong, redone before its noise: the loop's sum
    assert dpsgd.grad_sample_mode == "functional"
    switched = dpsgd.grad_sample_mode_switch
    assert switched.step == 0 and "hidden.weight" in switched.reason
    assert dpsgd.grad_sample_mode_reason.startswith("switched from hooks at step 0: ")
    # what hooks mode alone does with it: refuses, naming auto
    with pytest.raises(MisconfigurationException, match=r"'auto'"):
        fit_and_compare(Reused, mode="hooks")


def test_a_reuse_that_starts_later_switches_at_a_sampled_step_and_trains_as_functional_mode_would():
    with pytest.warns(UserWarning, match=r"switched from Opacus' hooks to functional mode at step 4"):
        auto, auto_model, trainer = _fit(ReusedLater, "auto", exactness_rate=1.0)
    assert auto.grad_sample_mode_switch.step == 4  # the first step the reuse ran
    functional, functional_model, _ = _fit(ReusedLater, "functional", exactness_rate=1.0)
    assert auto.steps == functional.steps == trainer.global_step > 5
    for (name, a), (_, b) in zip(auto_model.named_parameters(), functional_model.named_parameters()):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9), name  # the same batches, noise and clipped sums
    # the loggers get the switch step, the report and the checkpoint say it
    assert trainer.callback_metrics[names.DP_AUTO_SWITCH_STEP].item() == 4.0
    from lightning_privacy.report import privacy_report

    row = re.search(r"^\| per-example gradients \| ([^|]+) \| ([^|]+) \|", privacy_report(trainer), flags=re.M)
    assert row and row.group(1).strip() == "functional (auto, from step 4)"
    assert "switched from hooks at step 4" in row.group(2)
    assert auto.state_dict()["grad_sample_mode_switch"]["step"] == 4
    # the hooks' steps before the switch were exact: the same reuse-free model trains alike in both modes
    assert auto.exactness.steps >= 1 and auto.exactness.max_relative_error < 1e-6


def test_without_a_disagreement_auto_is_hooks_mode_step_for_step():
    auto, auto_model, _ = _fit(MLP, "auto")
    hooks, hooks_model, _ = _fit(MLP, "hooks")
    assert auto.grad_sample_mode == "hooks" and auto.grad_sample_mode_switch is None
    for a, b in zip(auto_model.parameters(), hooks_model.parameters()):
        assert torch.equal(a, b)


def test_examples_mixed_under_a_reduced_loss_are_refused_before_any_step_in_hooks_and_in_auto():
    for mode in ("hooks", "auto"):
        torch.manual_seed(0)
        model = MixingReduced().double()
        before = [p.detach().clone() for p in model.parameters()]
        trainer = _trainer([DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0)])
        with pytest.raises(MisconfigurationException, match=r"mix|mixed") as err:
            trainer.fit(model, DataLoader(_data(), batch_size=16))
        assert trainer.global_step == 0, mode
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), mode
        assert "h - h.mean(0)" in str(err.value)


def test_a_resumed_fit_that_had_switched_starts_in_functional_mode(tmp_path):
    dpsgd, model, trainer = _fit(Reused, "auto", epochs=1)
    path = tmp_path / "switched.ckpt"
    trainer.save_checkpoint(path)
    again = DPSGD(noise_multiplier=1.0, max_grad_norm=C, sampling_seed=0, noise_seed=1)
    resumed = _trainer([again], max_epochs=2)
    resumed.fit(Reused().double(), DataLoader(_data(), batch_size=16), ckpt_path=path)
    assert again.grad_sample_mode == "functional"
    assert again.grad_sample_mode_reason.startswith("the run this fit resumes switched from hooks at step 0")
    assert again.grad_sample_mode_switch.step == 0 and again.steps > dpsgd.steps


def test_the_statement_says_the_switch(tmp_path):
    from lightning_privacy.statement import privacy_statement

    _, _, trainer = _fit(Reused, "auto", epochs=1)
    path = tmp_path / "switched.ckpt"
    trainer.save_checkpoint(path)
    statement = privacy_statement(str(path))
    assert statement.to_dict()["mechanism"]["grad_sample_mode_switch"]["step"] == 0
    assert statement.to_dict()["mechanism"]["grad_sample_mode"] == "functional"
    assert "grad_sample_mode='auto' switched from hooks at step 0" in statement.to_markdown()


def test_the_optimizer_becomes_the_clipped_sum_one_in_place():
    opt = _DPOptimizer(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1),
        noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4,
    )  # fmt: skip
    from lightning_privacy.dpsgd.noise import NoiseSource

    opt.before_noise_hooks, opt.noise_source, opt.noise_step = [], NoiseSource(0), lambda: 0
    to_clipped_sum(opt)
    assert type(opt) is _GhostDPOptimizer and opt.noise_multiplier == 1.0 and opt.max_grad_norm == 1.0
    p = opt.params[0]
    p.grad = torch.tensor([3.0, 4.0])  # a clipped sum, taken as it is
    opt.noise_multiplier = 0.0
    opt.step()
    assert torch.allclose(p.detach(), torch.tensor([-0.075, -0.1]))  # lr · sum / expected batch size


def test_first_step_loop_reference_helper_is_independent_of_mode():
    # (guards the reference the tests above use: the loop's clipped sum of one example is that example's clipped
    # gradient, whatever the mode)
    torch.manual_seed(0)
    make = MLP
    state = {k: v.double() for k, v in make().state_dict().items()}
    batch = tuple(t[:1] for t in _data().tensors)
    total = loop_clipped_sum(make, state, batch, C)
    norm = torch.sqrt(sum(t.pow(2).sum() for t in total.values()))
    assert float(norm) <= C + 1e-9
    assert FirstStep is not None

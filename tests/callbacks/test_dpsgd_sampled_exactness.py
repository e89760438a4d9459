"""The exactness check covers the run (issue 48, item 3): sampled later steps compare a few examples' clipped
gradients with each example's gradient computed alone, in every mode and with a reduced loss; a disagreement stops the
fit before that step's noised update, naming the likely cause.

The models here train exactly on the first two (self-checked) steps and go wrong later, or are wrong in a way the first
steps' sum invariant cannot see (per-example gradients that sum right)."""

from __future__ import annotations

import re

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import sampled_exactness

D = 6


class _Base(pl.LightningModule):
    def __init__(self, reduced: bool = False):
        super().__init__()
        self.reduced = reduced
        self.calls = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        return losses.mean() if self.reduced else {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class LateReuse(_Base):
    """From its fifth step on, ``lin.weight`` is also used through ``F.linear`` (an auxiliary path after warm-up)."""

    def __init__(self, reduced=False):
        super().__init__(reduced)
        self.lin, self.head, self.drop = nn.Linear(D, D), nn.Linear(D, 2), nn.Dropout(0.2)

    def forward(self, x):
        h = self.drop(torch.tanh(self.lin(x)))
        if self.training and self.trainer.global_step >= 4:
            h = h + torch.tanh(F.linear(h, self.lin.weight))
        return self.head(h)


class Clean(_Base):
    """Exact in every mode, with dropout: the sampled checks must never stop it."""

    def __init__(self, reduced=False):
        super().__init__(reduced)
        self.lin, self.head, self.drop = nn.Linear(D, 16), nn.Linear(16, 2), nn.Dropout(0.3)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.lin(x))))


class MixesLater(_Base):
    """From its fifth step on, the hidden features are centred over the batch (``h - h.mean(0)``): the examples' losses
    then depend on each other; with a reduced loss the per-example gradients still sum to the batch gradient."""

    def __init__(self, reduced=True):
        super().__init__(reduced)
        self.lin, self.head = nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if self.training and self.trainer.global_step >= 4:
            h = h - h.mean(0, keepdim=True)
        return self.head(h)


def _fit(model, mode, rate, steps=12, callbacks=()):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, D, generator=g), torch.randint(0, 2, (256,), generator=g))
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, exactness_rate=rate,
               sampling_seed=3, noise_seed=4)  # fmt: skip
    trainer = pl.Trainer(max_steps=steps, callbacks=[dp, *callbacks], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    torch.manual_seed(0)
    trainer.fit(model, DataLoader(data, batch_size=32))
    return dp, trainer


class _Steps(Callback):
    def __init__(self):
        self.updates = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.updates = trainer.global_step + 1  # (DPSGD's pre-noise check runs inside the step that follows)


@pytest.mark.parametrize(
    ("mode", "reduced"), [("hooks", False), ("hooks", True), ("ghost", False)], ids=["hooks", "hooks-reduced", "ghost"]
)
def test_a_weight_reused_after_warm_up_is_caught_on_a_sampled_later_step(mode, reduced):
    steps = _Steps()
    with pytest.raises(MisconfigurationException, match="a sampled later step") as err:
        _fit(LateReuse(reduced), mode, rate=1.0, callbacks=[steps])
    message = str(err.value)
    assert "`lin.weight`" in message and "used outside its layer" in message and "functional" in message
    assert "stopped before this step's noised update" in message
    # the first unchecked later step with the reuse (global step 4) stops: nothing noised went through it
    assert steps.updates == 5


def test_without_the_sampled_checks_the_late_reuse_trains_unnoticed():
    dp, trainer = _fit(LateReuse(), "hooks", rate=0.0)
    assert trainer.global_step == 12 and dp.exactness.later_steps == 0 and dp.exactness.steps == 2


def test_per_example_gradients_that_sum_right_are_caught_with_a_reduced_loss():
    """Hooks mode, a reduced loss: the sum invariant (the first steps') holds for a batch-centred layer, the
    per-example gradients are wrong; the sampled check names the mixing."""
    with pytest.raises(MisconfigurationException, match="a sampled later step") as err:
        _fit(MixesLater(reduced=True), "hooks", rate=1.0)
    assert "`lin.weight`" in str(err.value) or "`lin.bias`" in str(err.value)
    with pytest.raises(MisconfigurationException, match="examples are mixed in the batch"):
        _fit(MixesLater(reduced=False), "hooks", rate=1.0)


def test_functional_mode_compares_the_losses_alone_on_sampled_steps():
    with pytest.raises(MisconfigurationException, match="mixes examples in its forward pass on this step"):
        _fit(MixesLater(reduced=False), "functional", rate=1.0)


@pytest.mark.parametrize(
    ("mode", "reduced"),
    [("hooks", False), ("hooks", True), ("ghost", False), ("functional", False)],
    ids=["hooks", "hooks-reduced", "ghost", "functional"],
)
def test_an_exact_model_with_dropout_is_never_stopped_and_every_later_step_is_compared(mode, reduced):
    dp, trainer = _fit(Clean(reduced), mode, rate=1.0)
    record = dp.exactness
    assert trainer.global_step == 12
    assert record.later_steps == 10 and record.later_not_comparable == 0 and record.later_rate == 1.0
    assert record.later_examples == 10 * sampled_exactness.EXAMPLES  # (batches of ~32 rows)
    assert record.max_relative_error < 1e-5
    assert all(m.p == 0.3 for m in trainer.lightning_module.modules() if isinstance(m, nn.Dropout))  # restored


def test_the_rate_draws_about_that_share_of_the_later_steps():
    dp, _ = _fit(Clean(), "hooks", rate=0.25, steps=82)
    assert 8 <= dp.exactness.later_steps <= 32  # Binomial(80, 0.25): mean 20, ±3.5 standard deviations


def test_a_forward_pass_still_random_with_dropout_off_is_not_compared():
    class FunctionalDropout(Clean):
        def forward(self, x):
            return self.head(F.dropout(torch.tanh(self.lin(x)), 0.3, self.training))

    dp, trainer = _fit(FunctionalDropout(), "hooks", rate=1.0, steps=6)
    assert trainer.global_step == 6 and dp.exactness.later_steps == 0 and dp.exactness.later_not_comparable == 4


@pytest.mark.parametrize("rate", [-0.1, 1.5, "high", True])
def test_a_bad_rate_is_refused_naming_it(rate):
    with pytest.raises(MisconfigurationException, match=r"exactness_rate="):
        DPSGD(noise_multiplier=1.0, exactness_rate=rate)


def test_the_report_says_what_the_exactness_check_compared():
    dp, trainer = _fit(Clean(), "ghost", rate=1.0, steps=6)
    rows = {name: (value, note) for name, value, note in dp.report_section(trainer).rows}
    value, note = rows["exactness check"]
    assert value == "2 first + 4 sampled later steps" and "(16 examples)" in note and "a share 1 of the steps" in note


# --- what the sampled check draws: its own generators, every example of the batch, a few per cent caught ------------
def test_the_step_draws_leave_torch_s_global_generator_alone_and_do_not_follow_it():
    """Which steps are checked comes from the check's own generator: the user's random stream (dropout, data order)
    is untouched by it, and every DDP rank draws the same steps whatever each one did with torch's generator."""
    from lightning_privacy.dpsgd.exactness import ExactnessRecord

    def draws(seed):
        module = Clean()
        check = sampled_exactness.SampledExactness(module, rate=0.3, rtol=1e-3, names={}, record=ExactnessRecord())
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        steps = [check.start_step(first_steps=False) for _ in range(200)]
        rows = [check._rows(32).tolist() for _ in range(20)]
        check.end_step()
        assert torch.equal(torch.get_rng_state(), before)  # (not one number taken from the user's stream)
        return steps, rows

    steps, rows = draws(0)
    assert (steps, rows) == draws(12345)
    assert 30 <= sum(steps) <= 90  # Binomial(200, 0.3): mean 60, ±5 standard deviations
    assert all(len(r) == sampled_exactness.EXAMPLES and r == sorted(set(r)) for r in rows)
    assert len({tuple(r) for r in rows}) > 10 and max(max(r) for r in rows) > 24  # drawn from the whole batch


class LateNudge(_Base):
    """From its fifth step on, 3 % of ``head.weight``'s gradient flows through ``F.linear`` outside the layer (the
    forward value is unchanged): each example's true gradient of ``head.weight`` is 1.03 times what the hooks see."""

    def __init__(self, reduced=False):
        super().__init__(reduced)
        self.lin, self.head = nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        out = self.head(h)
        if self.training and self.trainer.global_step >= 4:
            bypass = F.linear(h, self.head.weight)
            out = out + 0.03 * (bypass - bypass.detach())
        return out


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_a_late_bypass_of_three_per_cent_of_a_gradient_is_caught(mode):
    steps = _Steps()
    with pytest.raises(MisconfigurationException, match="a sampled later step") as err:
        _fit(LateNudge(), mode, rate=1.0, callbacks=[steps])
    message = str(err.value)
    assert "`head.weight`" in message and "used outside its layer" in message
    assert steps.updates == 5  # the first step with the bypass (global step 4) stops
    relative = float(re.search(r"; ([0-9.]+)% of the example's gradient norm", message).group(1))
    assert 1.0 < relative < 4.0  # (a few per cent of the example's whole gradient)


class LateScale(_Base):
    """From its fifth step on, each loss in a batch of several is 1.03 times the example's loss alone."""

    def __init__(self):
        super().__init__(False)
        self.lin, self.head = nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        if self.trainer.global_step >= 4 and x.shape[0] > 1:
            losses = 1.03 * losses
        return {"loss": losses.mean(), "per_example_loss": losses}


def test_functional_mode_catches_losses_three_per_cent_off_on_a_sampled_step():
    steps = _Steps()
    with pytest.raises(MisconfigurationException, match="mixes examples in its forward pass on this step"):
        _fit(LateScale(), "functional", rate=1.0, callbacks=[steps])
    assert steps.updates == 5


class LateReuseBeyondTheFirstRows(_Base):
    """From its fifth step on, ``lin.weight`` is reused through ``F.linear`` for the second half of a batch's rows
    only (never for the first rows, nor for an example alone)."""

    def __init__(self):
        super().__init__(False)
        self.lin, self.head = nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if self.training and self.trainer.global_step >= 4 and x.shape[0] > 1:
            later = (torch.arange(x.shape[0]) >= x.shape[0] // 2).to(h.dtype)[:, None]
            h = h + later * torch.tanh(F.linear(h, self.lin.weight))
        return self.head(h)


def test_a_bypass_that_only_reaches_rows_beyond_the_first_is_caught():
    """The compared examples are drawn from the whole batch, not its first rows."""
    steps = _Steps()
    with pytest.raises(MisconfigurationException, match="a sampled later step") as err:
        _fit(LateReuseBeyondTheFirstRows(), "hooks", rate=1.0, steps=12, callbacks=[steps])
    assert "`lin.weight`" in str(err.value) or "`lin.bias`" in str(err.value)
    example = int(re.search(r"for example (\d+) ", str(err.value)).group(1))
    assert example >= sampled_exactness.EXAMPLES and 5 <= steps.updates <= 12

"""The exactness check covers the run (issue 48, item 3): sampled later steps compare a few examples' clipped
gradients with each example's gradient computed alone, in every mode and with a reduced loss; a disagreement stops the
fit before that step's noised update, naming the likely cause.

The models here train exactly on the first two (self-checked) steps and go wrong later, or are wrong in a way the first
steps' sum invariant cannot see (per-example gradients that sum right)."""

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

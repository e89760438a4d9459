"""Common Lightning patterns in every mode (issue 57 item 4): each trains — exactly, in ``auto`` (the default) and
functional mode — or is refused before its first step in a sentence naming the fix; no raw framework error.

Measured before: an input-gradient penalty (``torch.autograd.grad`` in ``training_step``) crashed every mode raw
(Opacus' "pop from empty list", torch's "does not require grad" from the no-grad loss check), ``nn.Embedding(sparse=True)``
crashed every mode ("reshape is not implemented for sparse tensors"), ``logits.squeeze()`` with BCE was refused in
hooks mode by the examples-alone check although hooks train it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from tests.callbacks import test_dpsgd_functional as fx
from tests.callbacks.test_dpsgd_no_raw_errors import _fit


class Penalty(fx.MLP):
    """An input-gradient penalty on the embedded input, by ``torch.autograd.grad(..., create_graph=True)``."""

    def training_step(self, batch, batch_idx):
        ids, y = batch
        e = self.embed(ids).mean(1)
        losses = F.cross_entropy(self.head(torch.tanh(self.hidden(e))), y, reduction="none")
        (g,) = torch.autograd.grad(losses.sum(), e, create_graph=True)
        return losses + 0.1 * g.pow(2).sum(1)


class Sparse(fx.MLP):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(fx.V, fx.D, sparse=True)


class Squeeze(fx.MLP):
    """``logits.squeeze()`` with BCE: a batch of one gives a logit of shape [] against a target of shape [1]."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(fx.D, 1)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.binary_cross_entropy_with_logits(self(ids).squeeze(), y.double())


PATTERNS = {
    "penalty": Penalty,
    "sparse": Sparse,
    "classic_function": fx.ClassicFunction,
    "parameter_in_training_step": fx.StepParameter,
    "squeeze": Squeeze,
    "item": fx.Item,
}
#: what an explicit mode may refuse (in a sentence); everything else trains
REFUSED = {
    ("penalty", "hooks"), ("penalty", "ghost"), ("sparse", "hooks"), ("sparse", "ghost"),
    ("parameter_in_training_step", "hooks"), ("parameter_in_training_step", "ghost"), ("squeeze", "ghost"),
    ("squeeze", "functional"),
}  # fmt: skip


@pytest.mark.parametrize("mode", ["auto", "hooks", "ghost", "functional"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_a_pattern_trains_or_is_refused_in_a_sentence_in_every_mode(name, mode):
    torch.manual_seed(0)
    model = PATTERNS[name]().double()
    before = [p.detach().clone() for p in model.parameters()]
    if (name, mode) in REFUSED:
        with pytest.raises(MisconfigurationException) as err:
            _fit(model, mode)
        assert "grad_sample_mode='auto'" in str(err.value) or "'functional'" in str(err.value) or mode == "functional"
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # before its first step
        return
    with pytest.warns() if name == "squeeze" and mode != "ghost" else _nothing():
        dp, trainer = _fit(model, mode)
    assert trainer.global_step == 3 and dp.steps == 3


@pytest.mark.parametrize("name", ["penalty", "sparse", "classic_function", "parameter_in_training_step", "item"])
def test_auto_trains_each_exactly(name):
    dpsgd, difference, _ = fx.fit_and_compare(PATTERNS[name], mode="auto")
    assert difference < fx.TOLERANCE, (dpsgd.grad_sample_mode, dpsgd.grad_sample_mode_reason)


def test_squeeze_trains_in_auto_as_in_hooks_mode_with_the_examples_alone_check_said_off():
    runs = {}
    for mode in ("auto", "hooks"):
        torch.manual_seed(0)
        model = Squeeze().double()
        with pytest.warns(UserWarning, match=r"exactness check on examples alone is off .*squeeze"):
            dp, _ = _fit(model, mode)
        runs[mode] = (dp, model)
    assert runs["auto"][0].grad_sample_mode == "hooks" and runs["auto"][0].exactness.later_rate == 0.0
    for a, b in zip(runs["auto"][1].parameters(), runs["hooks"][1].parameters()):
        assert torch.equal(a, b)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

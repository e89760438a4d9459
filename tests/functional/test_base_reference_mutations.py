"""The base model is scored in eval mode (issue 47, item 5: ``module.eval()`` → ``module.train()`` in
``base_reference._eval`` let dropout make EZ-MIA's and Ref's scores noisy): a base with dropout, handed over in train
mode, scores each sequence as in eval mode, the same on every call, and is left in the mode it came in."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_privacy.functional.base_reference import (
    BaseLossDifferenceSignal,
    ErrorZoneSignal,
    base_loss_difference,
    error_zone_scores,
)

V = 13


class DropoutLM(nn.Module):
    """A tiny causal LM with heavy dropout between its embedding and its head."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.drop, self.head = nn.Embedding(V, 16), nn.Dropout(0.5), nn.Linear(16, V)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.drop(self.embed(input_ids)))


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (6, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[3:, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("signal", ["ez-mia", "ref"])
def test_a_base_with_dropout_handed_over_in_train_mode_is_scored_in_eval_mode(signal):
    batch = _batch()
    model, base = DropoutLM(1).eval(), DropoutLM(2).train()
    with torch.no_grad():
        logits = model(batch["input_ids"])
        base.eval()
        base_logits = base(batch["input_ids"])  # the base's logits without dropout
        base.train()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if signal == "ez-mia":
        fn, expected = ErrorZoneSignal(base_model=base), -error_zone_scores(logits, base_logits, ids, mask)
    else:
        fn, expected = BaseLossDifferenceSignal(base_model=base), -base_loss_difference(logits, base_logits, ids, mask)
    torch.manual_seed(3)
    first = fn(model, batch)
    torch.manual_seed(4)  # another dropout draw, were dropout on
    second = fn(model, batch)
    torch.testing.assert_close(first, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(second, expected, rtol=1e-6, atol=1e-7)
    assert base.training and base.drop.training  # given back in its own mode
    assert expected.std() > 0  # (the sequences score differently: the comparison says something)

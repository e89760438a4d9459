"""The neighbour check (issue 57): removing one example moves DPSGD's pre-noise clipped sum by at most C, tested on the
batch re-collated by the train loader's own collate_fn — the DP premise itself, in every mode.

Models that break it while every per-example gradient is computed exactly: a loss averaged over the batch's padded
length (the longest row sets everyone's padding; the issue measured 1.72·C in every mode) and a buffer written from the
batch in ``forward`` and used in the output. Each is stopped before its first noised update (no step in the ledger,
weights untouched); correct models pass with the largest ratio ≤ 1 recorded for the report, and the check draws its
steps from its own generator (torch's global random stream untouched).
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd.neighbours import NeighbourCheck

V, D, C = 11, 8, 1.0
MODES = ("hooks", "ghost", "functional")


class Sequences(Dataset):
    """Token sequences and a label, unpadded (the collate pads each batch to its longest): lengths 2–6, and 30–40 for
    rows 9, 40 and 50 — row 9 is the one long row of the first Poisson batch at ``sampling_seed=0`` (rows 9, 11, 16, …,
    63 of 64 at q = 1/4), so it alone sets that batch's padded length."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        long = torch.zeros(n, dtype=torch.bool)
        long[[9, 40, 50]] = True
        lengths = torch.where(long, torch.randint(30, 41, (n,), generator=g), torch.randint(2, 7, (n,), generator=g))
        self.rows = [
            (torch.randint(1, V, (int(k),), generator=g), int(torch.randint(0, 2, (), generator=g))) for k in lengths
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]


def pad(rows):
    """Pads to the batch's longest row (0 = padding)."""
    longest = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, (row, _) in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, torch.tensor([y for _, y in rows])


class Tagger(pl.LightningModule):
    """Per-token logits; each example's loss is its tokens' cross-entropy summed and divided by ``length``."""

    def __init__(self, padded_length: bool) -> None:
        super().__init__()
        self.padded_length = padded_length
        self.embed, self.head = nn.Embedding(V, D), nn.Linear(D, 2)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        mask = (ids > 0).float()
        tokens = F.cross_entropy(
            self.head(self.embed(ids)).transpose(1, 2), y[:, None].expand_as(ids), reduction="none"
        )
        length = ids.shape[1] if self.padded_length else mask.sum(1)  # the bug: the batch's padded length
        return (tokens * mask).sum(1) / length

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RunningCentre(pl.LightningModule):
    """A buffer written from the batch in ``forward`` and used in the output (a hand-rolled running mean)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(V, D), nn.Linear(D, 2)
        self.register_buffer("centre", torch.zeros(D))

    def training_step(self, batch, batch_idx):
        ids, y = batch
        h = self.embed(ids).mean(1)
        self.centre.mul_(0.5).add_(0.5 * h.detach().mean(0))
        return F.cross_entropy(self.head(10.0 * (h - self.centre)), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(model, mode, *, max_epochs=1, **kwargs):
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0, **kwargs)
    trainer = pl.Trainer(
        max_epochs=max_epochs, callbacks=[dpsgd], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(model, DataLoader(Sequences(), batch_size=16, collate_fn=pad))
    return dpsgd


@pytest.mark.parametrize("mode", MODES)
def test_a_loss_over_the_padded_length_is_stopped_before_its_first_noised_update(mode):
    from lightning_privacy.dpsgd.sampling import global_rows

    first = global_rows(0, 0, 64, 0.25).tolist()
    assert 9 in first and 40 not in first and 50 not in first  # (the data's premise: one long row in step 0)
    torch.manual_seed(0)  # (the weights: not those the tests before it left the global stream at)
    model = Tagger(padded_length=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0)
    trainer = pl.Trainer(max_epochs=1, callbacks=[dpsgd], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    with pytest.raises(
        MisconfigurationException, match=r"removing one example \(row \d+ of this step's batch"
    ) as error:
        trainer.fit(model, DataLoader(Sequences(), batch_size=16, collate_fn=pad))
    message = str(error.value)
    ratio = float(message.split("moved the step's clipped sum by ")[1].split("·C")[0])
    assert ratio > 1.05 and "padded length" in message and "stops before this step's noised update" in message
    assert dpsgd.steps == 0 and trainer.global_step == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("mode", MODES)
def test_the_same_loss_over_each_example_s_own_length_trains_and_records_the_ratio(mode):
    dpsgd = _fit(Tagger(padded_length=False), mode, neighbour_rate=1.0)
    record = dpsgd.neighbours
    assert dpsgd.steps == 4 and record.steps == 4 and record.removed >= 4
    assert 0.5 < record.max_ratio <= 1.0 + 1e-4  # clipped to C: removing one example moves the sum by (about) C


@pytest.mark.parametrize("mode", MODES)
def test_a_buffer_written_from_the_batch_is_stopped_before_its_first_noised_update(mode):
    model = RunningCentre()
    weights = {k: v.clone() for k, v in model.state_dict().items() if k != "centre"}
    with pytest.raises(MisconfigurationException, match=r"removing one example .* a buffer written from the batch"):
        _fit(model, mode)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items() if k != "centre")


def test_the_check_runs_on_the_first_steps_and_a_share_of_the_later_ones_from_its_own_generator():
    torch.manual_seed(123)
    layer = nn.Linear(1, 1)
    state = torch.get_rng_state()
    check = NeighbourCheck(layer, max_grad_norm=1.0, dataset=[], collate=torch.stack, rate=0.25)
    due = [check.due() for _ in range(400)]
    assert torch.equal(torch.get_rng_state(), state)  # the user's random stream untouched
    assert due[:2] == [True, True] and 0.15 < sum(due[2:]) / 398 < 0.35
    again = NeighbourCheck(nn.Linear(1, 1), max_grad_norm=1.0, dataset=[], collate=torch.stack, rate=0.25)
    assert [again.due() for _ in range(400)] == due  # the same steps on every rank
    none = NeighbourCheck(nn.Linear(1, 1), max_grad_norm=1.0, dataset=[], collate=torch.stack, rate=0.0)
    assert [none.due() for _ in range(10)] == [True, True] + [False] * 8


def test_a_bad_rate_is_named():
    with pytest.raises(MisconfigurationException, match=r"DPSGD\(neighbour_rate=1\.5\): expected a share"):
        DPSGD(noise_multiplier=1.0, neighbour_rate=1.5)


def test_in_hooks_mode_the_check_runs_under_vmap():
    """Opacus' full backward hooks wrap the module in torch's BackwardHookFunction, which vmap cannot run; the check
    sets them aside (``_compat.backward_hooks_detached``), so its passes are vmapped, not one example at a time, and
    the hooks are back, in order, for the step."""
    from lightning_privacy.dpsgd import neighbours

    seen = []
    original = neighbours.NeighbourCheck.run

    def run(self, indices, step):
        hooks = {name: len(m._backward_hooks) for name, m in self.module.named_modules()}
        out = original(self, indices, step)
        seen.append(
            (self.engine.fallback, hooks == {n: len(m._backward_hooks) for n, m in self.module.named_modules()})
        )
        return out

    neighbours.NeighbourCheck.run = run
    try:
        dpsgd = _fit(Tagger(padded_length=False), "hooks")
    finally:
        neighbours.NeighbourCheck.run = original
    assert seen == [(None, True), (None, True)] and dpsgd.steps == 4

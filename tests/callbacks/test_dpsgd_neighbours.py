"""The released update does not depend on the private dataset size: a dataset and its neighbour with one row fewer.

The distinguisher of issue 47 (Opacus #819): one DP step of a model whose gradients are all zero (SGD, lr 1) releases
``−noise / divisor``. Opacus' ``make_private`` divides by ``int(N · q)`` with ``q = 1 / len(loader)``: 64 for
N = 640 at batch 64 and 63 for N − 1 = 639 (same q), so the update's scale differs by 64/63 ≈ 1.016 and one step
of many weights tells the two apart with certainty, whatever ε says. DPSGD divides by a public constant (the loader's
``batch_size`` or ``DPSGD(expected_batch_size=...)``): with a fixed noise seed the two updates are identical, in
hooks and ghost mode (book-keeping's one pass and the two-pass fallback) and under DDP. ``DPSGD(sample_rate=q)``
keeps q itself fixed where N crosses a multiple of the batch size (``1 / len(loader)`` changes there).
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import ghost_mode as backward_module  # (where ghost mode builds its book-keeping)
from tests._launch import run_ddp
from tests.callbacks._tiny import trainer

D_IN, D_OUT = 400, 50  # 20,050 weights: one step resolves a 1.6 % scale difference at many standard errors


class ZeroGradients(pl.LightningModule):
    """Per-example losses whose gradients are exactly zero: the step releases the noise alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(D_IN, D_OUT)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return (self.layer(x) * 0.0).sum(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def _loader(rows: int, batch_size: int) -> DataLoader:
    x = torch.randn(rows, D_IN, generator=torch.Generator().manual_seed(rows))
    return DataLoader(TensorDataset(x), batch_size=batch_size)


def released_update(rows: int, batch_size: int, *, devices: int = 1, root=None, **dp_kwargs):
    """The flattened weight change of one DP step on ``rows`` rows (fixed seeds: the same noise for every N)."""
    model = ZeroGradients()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, sampling_seed=3, noise_seed=4, **dp_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([dp], root, max_steps=1, max_epochs=None, **({"strategy": "ddp", "devices": devices,
                    "use_distributed_sampler": False} if devices > 1 else {}))  # fmt: skip
        t.fit(model, train_dataloaders=_loader(rows, batch_size))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return after - before, dp


class _NoBookKeeping(backward_module.BookKeeping):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.supported = False


# N a multiple of the batch size (N·q = batch, (N − 1)·q just below it), and N·q an integer with N not a multiple.
BOUNDARY = [(640, 64), (500, 50), (649, 64)]


@pytest.mark.parametrize("mode", ["hooks", "ghost", "ghost-two-passes"])
@pytest.mark.parametrize(("rows", "batch_size"), BOUNDARY)
def test_update_is_the_same_on_neighbouring_dataset_sizes(rows, batch_size, mode, monkeypatch):
    if mode == "ghost-two-passes":  # no book-keeping: ghost clipping's second backward pass forms the sum
        monkeypatch.setattr(backward_module, "BookKeeping", _NoBookKeeping)
    kwargs = {"grad_sample_mode": "ghost" if mode.startswith("ghost") else "hooks"}
    big, dp_big = released_update(rows, batch_size, **kwargs)
    small, dp_small = released_update(rows - 1, batch_size, **kwargs)
    assert dp_big.sample_rate == dp_small.sample_rate  # (the same number of batches: q = 1/len(loader) agrees)
    assert dp_big.expected_batch_size == dp_small.expected_batch_size == batch_size
    assert float(big.std()) > 0.5 / batch_size  # the noise is there (σC/batch per weight)
    ratio = float(big.std() / small.std())
    assert ratio == 1.0 and torch.equal(big, small), f"update scales differ by {ratio:.6f} between N and N − 1"


def test_a_given_sample_rate_does_not_change_where_n_crosses_a_multiple_of_the_batch():
    # 641 rows at batch 64: 11 batches (q = 1/11); 640 rows: 10 (q = 1/10). DPSGD(sample_rate=...) fixes q.
    a, dp_a = released_update(641, 64, sample_rate=0.1)
    b, dp_b = released_update(640, 64, sample_rate=0.1)
    assert dp_a.sample_rate == dp_b.sample_rate == 0.1
    assert torch.equal(a, b)
    assert dp_a.state_dict()["sample_rate_given"] is True
    assert dp_a.privacy_settings()["dp/sample_rate_source"] == "argument"
    _, default = released_update(641, 64)
    assert default.sample_rate == pytest.approx(1 / 11)  # the default: 1/len(loader), the number of batches public
    assert default.privacy_settings()["dp/sample_rate_source"] == "1/len(train loader)"


def test_an_explicit_divisor_is_used_and_saved():
    update, dp = released_update(640, 64, expected_batch_size=128)
    reference, _ = released_update(640, 64)
    torch.testing.assert_close(update * 2, reference, rtol=1e-5, atol=1e-7)  # (float32 weights)
    assert dp.state_dict()["expected_batch_size"] == 128.0
    assert dp.privacy_settings()["dp/expected_batch_size"] == 128.0


def test_a_loader_without_batch_size_needs_an_explicit_divisor(tmp_path):
    from opacus.data_loader import DPDataLoader

    loader = DPDataLoader.from_data_loader(_loader(640, 64))
    dp = DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0)
    t = trainer([dp], tmp_path, max_steps=1, max_epochs=None)
    with warnings.catch_warnings(), pytest.raises(MisconfigurationException, match=r"expected_batch_size=\.\.\."):
        warnings.simplefilter("ignore")
        t.fit(ZeroGradients(), train_dataloaders=loader)


@pytest.mark.parametrize(
    ("name", "value"), [("sample_rate", 0.0), ("sample_rate", 1.5), ("sample_rate", True), ("expected_batch_size", -1)]
)
def test_bad_arguments_are_named(name, value):
    with pytest.raises(MisconfigurationException, match=f"`{name}`.*{value!r}"):
        DPSGD(noise_multiplier=1.0, **{name: value})


def _ddp_worker(root, rows, batch_size):
    torch.set_num_threads(1)
    update, dp = released_update(rows, batch_size, devices=2, root=root)
    return {"update": update, "divisor": dp.expected_batch_size}


@pytest.mark.slow
def test_update_is_the_same_on_neighbouring_dataset_sizes_under_ddp(tmp_path):
    target = "tests.callbacks.test_dpsgd_neighbours:_ddp_worker"
    big = run_ddp(target, tmp_path / "n", root=str(tmp_path / "n"), rows=640, batch_size=64)
    small = run_ddp(target, tmp_path / "m", root=str(tmp_path / "m"), rows=639, batch_size=64)
    for a, b in zip(big, small):
        assert a["divisor"] == b["divisor"] == 64
        assert float(a["update"].std()) > 0.5 / 64
        assert torch.equal(a["update"], b["update"])
    assert torch.equal(big[0]["update"], big[1]["update"])  # the ranks apply one update

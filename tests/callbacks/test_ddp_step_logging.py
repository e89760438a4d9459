"""Under DDP a rank whose Poisson batch is empty skips ``training_step``, so a per-step ``self.log(..., sync_dist=True)``
(an all-reduce at the call) would leave the other ranks waiting: DPSGD refuses it in one sentence; an epoch-level
synced log and an unsynced per-step log train (issue 47's desynchronised collectives, the user's side)."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from tests._launch import run_ddp
from tests.callbacks._tiny import trainer


class Logs(pl.LightningModule):
    def __init__(self, how: str):
        super().__init__()
        self.how, self.layer = how, torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        if self.how == "per_step_synced":
            self.log("train_loss", loss, sync_dist=True)
        elif self.how == "epoch_synced":
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        else:
            self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _worker(root, how):
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    dp = DPSGD(noise_multiplier=1.0, sampling_seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([dp], root, max_epochs=1, strategy="ddp", devices=2, use_distributed_sampler=False)
        t.fit(Logs(how), train_dataloaders=DataLoader(data, batch_size=4))  # ~2 rows per rank per step
    return {"steps": t.global_step}


@pytest.mark.slow
def test_per_step_synced_log_is_refused_under_ddp(tmp_path):
    with pytest.raises(AssertionError, match=r"self.log\('train_loss', ..., sync_dist=True\)` in training_step"):
        run_ddp("tests.callbacks.test_ddp_step_logging:_worker", tmp_path, root=str(tmp_path), how="per_step_synced")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["epoch_synced", "unsynced"])
def test_other_logs_train_under_ddp(tmp_path, how):
    ranks = run_ddp("tests.callbacks.test_ddp_step_logging:_worker", tmp_path, root=str(tmp_path), how=how)
    assert [r["steps"] for r in ranks] == [16, 16]

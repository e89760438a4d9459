"""DDP(2) adds the noise of one step once: the update's noise has standard deviation σ·C, not √2·σ·C.

Each rank clips its share of the Poisson batch; rank 0 alone adds N(0, σ²C²) and the DP optimizer all-reduces the
noised sums. Noise drawn on every rank would add up to variance 2σ²C² in the update while the ledger accounts for σ:
the privacy would hold, but the model would carry √2 times the noise it was paid for — and the same slip the other way
(noise on no rank) would be a privacy failure. The noise is read back from the update itself: the gradient every rank
applies, times the mean reduction's divisor, minus the batch's clipped sum (the ranks' sums, all-reduced here).
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from lightning_privacy import DPSGD
from tests._launch import run_ddp
from tests.callbacks._tiny import TinyDataModule, tiny_module, trainer

SIGMA, C = 1.5, 0.7


class AppliedNoise(Callback):
    """Every step: the noise in the gradient the optimizer applied (after the ranks' all-reduce), in units of σ·C."""

    def __init__(self, dpsgd: DPSGD) -> None:
        dpsgd.register_before_noise_hook(self._before)
        self.noise, self._sums, self._optimizer = [], None, None

    def _before(self, optimizer) -> None:
        self._optimizer = optimizer
        self._sums = torch.cat([optimizer.summed(p).detach().flatten() for p in optimizer.params]).double()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        opt = self._optimizer
        batch_sum = self._sums.clone()
        dist.all_reduce(batch_sum)  # the clipped sum of the whole Poisson batch (every rank's share)
        scale = opt.expected_batch_size * opt.world_size if opt.loss_reduction == "mean" else 1
        applied = torch.cat([p.grad.detach().flatten() for p in opt.params]).double() * scale
        self.noise.append((applied - batch_sum) / (SIGMA * C))


def _worker(root):
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    dpsgd = DPSGD(noise_multiplier=SIGMA, max_grad_norm=C, sampling_seed=1, noise_seed=2)
    capture = AppliedNoise(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([dpsgd, capture], root, max_epochs=1, strategy="ddp", devices=2, use_distributed_sampler=False)
        t.fit(tiny_module(), datamodule=TinyDataModule())
    return {"rank": t.global_rank, "steps": t.global_step, "noise": torch.cat(capture.noise)}


@pytest.mark.slow
def test_a_ddp_step_is_noised_once(tmp_path):
    from scipy.stats import chi2

    ranks = run_ddp("tests.callbacks.test_ddp_noise:_worker", tmp_path, root=str(tmp_path))
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["steps"] == ranks[1]["steps"] == 8
    noise = ranks[0]["noise"]
    torch.testing.assert_close(ranks[1]["noise"], noise)  # one update, applied alike on both ranks
    n = noise.numel()
    assert n == 8 * 178  # 8 steps × the MLP's 178 coordinates
    # Σ z² ~ χ²(n) for unit-variance noise; two-sided at 1e-6. Noise on both ranks gives Σ z² ≈ 2n, far outside.
    low, high = chi2.ppf(5e-7, n), chi2.isf(5e-7, n)
    assert low < float(noise.pow(2).sum()) < high

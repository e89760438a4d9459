"""Epoch time: our DPSGD + BayesSecurityMonitor vs a plain Opacus DP-SGD set-up written by hand.

Both train the same Adult MLP (104-64-32-2, batch 256, σ = 1.7, C = 1) with Poisson sampling,
per-sample clipping and noise. The reference is the usual hand-made Opacus-in-Lightning code: the
module returns a ``DPDataLoader`` from ``train_dataloader``, attaches ``GradSampleHooks`` and wraps its
optimizer in a ``DPOptimizer`` with an RDP accountant in ``configure_optimizers``. Ours is an unchanged
module plus ``DPSGD`` and ``BayesSecurityMonitor`` (logging every ``privacy/*`` and ``dp/*`` key each
epoch). A third set-up adds ``DPSGD(log_clipping=True)`` (per-sample gradient norms of 64 examples every step, clip
fraction, median and a histogram every epoch). Runs alternate, and the median time per epoch over the
repetitions is compared (goals: ours ≤ 1.02 × hand-made; clipping telemetry ≤ 1.02 × ours).

    python benchmarks/monitor_overhead.py [--epochs 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning.pytorch as pl
import torch
from opacus.accountants import RDPAccountant
from opacus.data_loader import DPDataLoader
from opacus.grad_sample import GradSampleHooks
from opacus.optimizers import DPOptimizer

from lightning_privacy import DPSGD, BayesSecurityMonitor
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP

SIGMA, CLIP, LR = 1.7, 1.0, 0.5


class HandMadeOpacus(TabularMLP):
    """The reference: Opacus wired into the LightningModule by hand."""

    def __init__(self, datamodule: AdultDataModule):
        super().__init__(datamodule.num_features, hidden=(64, 32), lr=LR)
        self.datamodule = datamodule
        self.accountant = RDPAccountant()

    def train_dataloader(self):
        return DPDataLoader.from_data_loader(self.datamodule.train_dataloader())

    def configure_optimizers(self):
        self.hooks = GradSampleHooks(self)
        loader = self.datamodule.train_dataloader()
        sample_rate = 1 / len(loader)
        opt = DPOptimizer(
            torch.optim.SGD(self.parameters(), lr=LR),
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            expected_batch_size=int(len(loader.dataset) * sample_rate),
        )
        opt.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate=sample_rate))
        return opt


class EpochTimer(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.per_epoch = (time.perf_counter() - self.start) / trainer.current_epoch


def run(kind: str, datamodule: AdultDataModule, epochs: int) -> float:
    timer = EpochTimer()
    if kind == "reference":
        model, callbacks = HandMadeOpacus(datamodule), [timer]
        fit_kwargs = {}
    else:
        model = TabularMLP(datamodule.num_features, hidden=(64, 32), lr=LR)
        dpsgd = DPSGD(noise_multiplier=SIGMA, max_grad_norm=CLIP, log_clipping=kind == "clipping")
        callbacks = [dpsgd, BayesSecurityMonitor(), timer]
        fit_kwargs = {"train_dataloaders": datamodule.train_dataloader()}
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, **fit_kwargs)
    return timer.per_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    datamodule = AdultDataModule(batch_size=256)
    datamodule.setup("fit")
    times = {"reference": [], "ours": [], "clipping": []}
    run("ours", datamodule, 1)  # warm-up (imports, first dp_accounting call)
    for _ in range(args.repeats):
        for kind in times:
            pl.seed_everything(0, verbose=False)
            times[kind].append(run(kind, datamodule, args.epochs))
    ref, ours = statistics.median(times["reference"]), statistics.median(times["ours"])
    clipping = statistics.median(times["clipping"])
    print(f"\nAdult MLP, {args.epochs} epochs x {args.repeats} alternating repeats, 1 torch thread, median s/epoch")
    print(f"{'set-up':<44}{'s/epoch':>10}")
    print(f"{'hand-made Opacus in a LightningModule':<44}{ref:>10.3f}")
    print(f"{'DPSGD + BayesSecurityMonitor (callbacks)':<44}{ours:>10.3f}")
    print(f"{'DPSGD(log_clipping=True) + monitor':<44}{clipping:>10.3f}")
    print(f"{'ratio ours / hand-made (goal <= 1.02)':<44}{ours / ref:>10.3f}")
    print(f"{'ratio clipping telemetry / ours (goal <= 1.02)':<44}{clipping / ours:>10.3f}")


if __name__ == "__main__":
    main()

"""DP-SGD under FSDP2 on Adult: ``ModelParallelStrategy``, ghost clipping, validation and checkpoints, launched by torchrun.

FSDP2 shards every layer's parameters over the data-parallel ranks. What DP-SGD needs from the script:

- ``ModelParallelStrategy(data_parallel_size=W, tensor_parallel_size=1)`` and ``Trainer(use_distributed_sampler=False)``
  (DPSGD's Poisson sampling gives each rank its share of one global batch per step);
- ``configure_model`` applies ``fully_shard`` over ``self.device_mesh["data_parallel"]`` (Lightning's convention),
  each trainable layer first, then the network;
- ``DPSGD(grad_sample_mode="ghost")`` with the default mean reduction: ``training_step`` returns one loss per example
  (ghost clipping weights each by its clipping coefficient); log their mean.

Every rank clips its examples, FSDP averages the clipped sums, and every rank adds noise of standard deviation σC/W to
its own shard, from its own secret stream. Checkpoints are saved as FSDP2 shards (a folder per checkpoint); the
privacy ledger is in each. The script prints, on rank 0, the steps taken and the accountant's ε and checks that the
ledger counted each optimizer step once.

Run:  OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 examples/fsdp2.py [--epochs 2] [--logdir lightning_logs]
      (CPU and gloo here; on GPUs the same script with ``accelerator="gpu"``)
"""

from __future__ import annotations

import argparse
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_privacy import DPSGD, BayesSecurityMonitor
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP


class ShardedMLP(TabularMLP):
    """The package's Adult MLP, sharded by FSDP2 and returning one loss per example (what ghost clipping takes)."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if any(p.requires_grad for p in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        if losses.numel():  # a rank's share of a Poisson batch can be empty
            self.log("train_loss", losses.mean())
        return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="training epochs (default: %(default)s)")
    parser.add_argument("--noise-multiplier", type=float, default=1.0, help="σ (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=512, help="expected global batch (default: %(default)s)")
    parser.add_argument("--logdir", default="lightning_logs", help="checkpoints (default: %(default)s)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)  # the same initial weights on every rank (the noise has its own secret seed)

    dpsgd = DPSGD(noise_multiplier=args.noise_multiplier, max_grad_norm=1.0, grad_sample_mode="ghost")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        use_distributed_sampler=False,
        max_epochs=args.epochs,
        callbacks=[
            dpsgd,
            BayesSecurityMonitor(),
            ModelCheckpoint(dirpath=args.logdir, monitor="val_loss", save_last=True),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = ShardedMLP(104, hidden=(64, 32), lr=0.5)
    trainer.fit(model, datamodule=AdultDataModule(batch_size=args.batch_size))
    if dpsgd.steps != trainer.global_step:
        raise SystemExit(f"the ledger counted {dpsgd.steps} steps for {trainer.global_step} optimizer steps")
    if trainer.is_global_zero:
        print(
            f"FSDP2 on {trainer.world_size} ranks: {trainer.global_step} optimizer steps, ledger {dpsgd.steps} steps, "
            f"val_acc {float(trainer.callback_metrics['val_acc']):.3f}, ε = {dpsgd.epsilon():.3f} at δ = {dpsgd.delta:g}"
        )


if __name__ == "__main__":
    main()

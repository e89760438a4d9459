"""End-to-end DP-SGD on Adult: planned noise, β*_MIA every epoch, budget stopping, early stopping, checkpoints.

An unchanged ``TabularMLP`` (104-64-32-2) is trained on the bundled UCI Adult data with

- ``DPSGD(target_bayes_security=--target, epochs=--epochs)``: Opacus DP-SGD, σ planned so that β*_MIA
  is still ≥ the target after ``--epochs`` epochs;
- ``BayesSecurityMonitor``: logs ``privacy/mia_bayes_security`` (β*_MIA) and ``dp/*`` every epoch;
- ``PrivacyBudgetStopping(min_bayes_security=--target)``: stops before the step that would break it;
- Lightning's own ``EarlyStopping`` on ``privacy/mia_bayes_security`` (``divergence_threshold`` at the
  target: a second, independent guard on the same key);
- Lightning's ``ModelCheckpoint`` keeping the best model by validation accuracy.

The trainer is allowed one epoch more than planned, so the budget stopper ends the run. A table of
(epoch, validation accuracy, β*_MIA) is printed from ``trainer.callback_metrics``, then the checkpoint
path; audit it with ``python examples/audit_checkpoint.py --checkpoint PATH``.

Run:  OMP_NUM_THREADS=1 python examples/adult_dpsgd.py [--epochs 5] [--target 0.9] [--logdir lightning_logs]
      tensorboard --logdir lightning_logs
"""

from __future__ import annotations

import argparse
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP


class EpochTable(Callback):
    """Collects (epoch, val acc, β*_MIA) from ``trainer.callback_metrics`` at the end of every epoch.

    Put it after the ``BayesSecurityMonitor`` so this epoch's β*_MIA has been logged already.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = trainer.callback_metrics
        self.rows.append(
            (trainer.current_epoch + 1, float(metrics["val_acc"]), float(metrics[names.MIA_BAYES_SECURITY]))
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="epochs the noise is planned for (default: %(default)s)")
    parser.add_argument("--target", type=float, default=0.9, help="β*_MIA budget in (0, 1) (default: %(default)s)")
    parser.add_argument(
        "--logdir", default="lightning_logs", help="TensorBoard logs and checkpoints (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs < 1 or not 0 < args.target < 1:
        parser.error("--epochs must be >= 1 and --target in (0, 1)")
    warnings.filterwarnings(
        "ignore", ".*LeafSpec.*|.*does not have many workers.*|.*Secure RNG.*|.*Full backward hook.*"
    )
    torch.set_num_threads(1)  # a tiny MLP: one thread is as fast and avoids OpenMP spin-waiting on a busy CPU
    pl.seed_everything(args.seed, verbose=False)

    dm = AdultDataModule(batch_size=256, seed=args.seed)
    dm.setup("fit")
    model = TabularMLP(dm.num_features, hidden=(64, 32), lr=0.5)
    dpsgd = DPSGD(target_bayes_security=args.target, epochs=args.epochs, max_grad_norm=1.0)
    monitor = BayesSecurityMonitor()
    budget = PrivacyBudgetStopping(min_bayes_security=args.target)
    table = EpochTable()
    early = EarlyStopping(monitor=names.MIA_BAYES_SECURITY, mode="max", divergence_threshold=args.target, patience=1000)
    logger = TensorBoardLogger(args.logdir, name="adult_dpsgd")
    checkpoint = ModelCheckpoint(
        dirpath=f"{logger.log_dir}/checkpoints",
        monitor="val_acc",
        mode="max",
        filename="best-{epoch}-{val_acc:.4f}",
        save_last=True,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs + 1,
        callbacks=[dpsgd, monitor, budget, table, early, checkpoint],
        logger=logger,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)

    print(
        f"\nDP-SGD on Adult: σ = {dpsgd.noise_multiplier:.4f} planned for β*_MIA ≥ {args.target} after "
        f"{args.epochs} epochs (sample rate {dpsgd.sample_rate:.5f})"
    )
    print(f"{'epoch':>5}  {'val acc':>7}  {'β*_MIA':>7}")
    for epoch, acc, beta in table.rows:
        print(f"{epoch:>5}  {acc:>7.4f}  {beta:>7.4f}")
    stopped = budget.stopped_at_step
    print(f"stopped by the budget after step {stopped}" if stopped is not None else "budget not reached")
    print(
        f"final β*_MIA exact (PLD): {monitor.final[names.MIA_BAYES_SECURITY_EXACT]:.4f}, "
        f"accountant ε at δ = {dpsgd.delta:g}: {dpsgd.epsilon():.3f}"
    )
    print(f"best checkpoint (val_acc {float(checkpoint.best_model_score):.4f}): {checkpoint.best_model_path}")
    print(f"last checkpoint: {checkpoint.last_model_path}")
    print(f"TensorBoard logs: {logger.log_dir}")


if __name__ == "__main__":
    main()

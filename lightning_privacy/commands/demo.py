"""``lightning-privacy demo``: DP-SGD on Adult with per-epoch Bayes security and budget stopping.

An MLP (104-64-32-2) is trained on the bundled UCI Adult data with three callbacks:
``DPSGD(target_bayes_security=..., epochs=...)`` plans the noise for the target, the
``BayesSecurityMonitor`` logs β*_MIA every epoch, and ``PrivacyBudgetStopping`` stops before the step
that would break the budget (the trainer is allowed one epoch more than planned to show it). Runs in
about a minute on a 2-core CPU; TensorBoard logs go to ``--logdir``, the privacy report
(:mod:`lightning_privacy.report`) to ``privacy_report.md`` in the run's log folder, and beside it
``privacy_report.html``: one self-contained page with the figures (β* per epoch with the budget, the
TPR–FPR region), to open in a browser or attach to a review. The trained model is saved as ``final.ckpt`` in the same
folder, with DPSGD's ledger: ``lightning-privacy statement`` prints its privacy statement for release.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

NAME = "demo"
HELP = "Train an MLP on Adult with DP-SGD, Bayes-security monitoring and budget stopping; print a summary."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=float, default=0.9, help="β*_MIA budget in (0, 1) (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs the noise is planned for (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256, help="expected batch size (default: %(default)s)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--logdir", default="runs", help="TensorBoard log folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="show progress bars")


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.target < 1:
        raise SystemExit(f"error: `--target` must be in (0, 1), got {args.target}")
    for flag in ("epochs", "batch_size"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: `--{flag.replace('_', '-')}` must be >= 1, got {getattr(args, flag)}")
    for flag in ("max_grad_norm", "lr"):
        if not getattr(args, flag) > 0:
            raise SystemExit(f"error: `--{flag.replace('_', '-')}` must be > 0, got {getattr(args, flag)}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.models import TabularMLP
    from lightning_privacy.report import log_privacy_report, privacy_report_html

    # The MLP is tiny: one thread is as fast, and avoids OpenMP oversubscription on a busy machine.
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    datamodule = AdultDataModule(batch_size=args.batch_size, seed=args.seed)
    datamodule.setup("fit")
    model = TabularMLP(datamodule.num_features, hidden=(64, 32), lr=args.lr)
    dpsgd = DPSGD(target_bayes_security=args.target, epochs=args.epochs, max_grad_norm=args.max_grad_norm)
    monitor = BayesSecurityMonitor()
    stopper = PrivacyBudgetStopping(min_bayes_security=args.target)
    logger = TensorBoardLogger(args.logdir, name="demo")
    trainer = pl.Trainer(
        max_epochs=args.epochs + 1,
        callbacks=[dpsgd, monitor, stopper],
        logger=logger,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        enable_progress_bar=args.progress,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        # The Trainer runs one epoch past the plan on purpose, for PrivacyBudgetStopping to stop it: DPSGD's warning
        # that max_epochs exceeds the planned epochs is about this set-up, not the user's. Lightning 2.6 under torch
        # 2.13 warns of torch's LeafSpec at every fit: not ours either.
        warnings.filterwarnings("ignore", message=r"Trainer\(max_epochs=\d+\) exceeds the planned epochs=")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        trainer.fit(model, datamodule=datamodule)
    checkpoint = Path(logger.log_dir) / "final.ckpt"  # the trained model with DPSGD's ledger: its privacy statement
    trainer.save_checkpoint(checkpoint)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        test_acc = float(trainer.test(model, datamodule=datamodule, verbose=False)[0]["test_acc"])
    elapsed = time.perf_counter() - start

    final = monitor.final
    closed = monitor.final_closed_form
    accountant, kind = dpsgd.ledger.epsilon_label.split(", ", 1)  # e.g. "PLD (add/remove)", "certified upper bound"
    rows = [
        ("test accuracy", f"{test_acc:.4f}"),
        ("noise multiplier σ (planned)", f"{dpsgd.noise_multiplier:.4f}"),
        ("sample rate p / steps", f"{dpsgd.sample_rate:.5f} / {dpsgd.steps}"),
        ("β*_MIA (exact, safe: pessimistic PLD)", f"{final[names.MIA_BAYES_SECURITY]:.4f}"),
        ("β*_MIA closed form (Cor. 7, approx.)", f"{closed:.4f}"),
        ("membership advantage (1 − β*)", f"{final[names.MIA_ADVANTAGE]:.4f}"),
        (
            "TPR bound at FPR 0.001 / 0.01 / 0.1",
            f"{final[names.MIA_TPR_BOUND_FPR_0_001]:.4f} / {final[names.MIA_TPR_BOUND_FPR_0_01]:.4f} / "
            f"{final[names.MIA_TPR_BOUND_FPR_0_1]:.4f}",
        ),
        (f"ε at δ = {dpsgd.delta:g}, {accountant}", f"{dpsgd.epsilon():.3f}  ({kind})"),
        ("stopped by budget after step", str(stopper.stopped_at_step) if stopper.stopped_at_step is not None else "no"),
        ("wall time", f"{elapsed:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nlightning-privacy demo — Adult MLP, DP-SGD planned for β*_MIA ≥ {args.target} after {args.epochs} epochs")
    print("-" * (width + 22))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("-" * (width + 22))
    report_path = Path(logger.log_dir) / "privacy_report.md"
    log_privacy_report(trainer, report_path)
    page_path = report_path.with_suffix(".html")  # the same report as one page (TensorBoard has the text once)
    page_path.write_text(privacy_report_html(trainer), encoding="utf-8")
    print(f"Privacy report:   {report_path}")
    print(f"... as one page:  {page_path}  (figures embedded; open it in a browser)")
    print(f"Checkpoint:       {checkpoint}")
    print(f"Its statement:    lightning-privacy statement {checkpoint}")
    print(f"TensorBoard logs: {logger.log_dir}")
    print(f"Open them with:   tensorboard --logdir {args.logdir}")
    return 0

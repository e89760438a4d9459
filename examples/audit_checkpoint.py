"""Audit a saved Adult checkpoint without retraining: Epsilon* and PANORAMIA through the CLI's entry points.

Either trains a ``TabularMLP`` on the bundled UCI Adult training rows and saves a checkpoint (the
PANORAMIA section's target: 104-150-100-50-10-2, Adam, lr 5e-4, batch 64), or takes one with
``--checkpoint``. The checkpoint is then audited twice, in-process through
``lightning_privacy.cli.main`` — exactly what these shell commands do:

    lightning-privacy audit epsilon-star --checkpoint model.ckpt --json
    lightning-privacy audit panoramia --checkpoint model.ckpt --output panoramia.json

Both audits take members = the ``AdultDataModule`` training rows of the split the model was trained
on (default ``val_fraction=0.1``; ``--split-seed`` must match training). Epsilon* uses the validation
rows as non-members; PANORAMIA generates its non-members. Neither retrains the target.

The commands are thin: the audits are plain functions. The script also calls one directly, as in a
notebook, and shows that it gives the command's numbers::

    from lightning_privacy.audits import audit_epsilon_star
    result = audit_epsilon_star(model, dm.member_dataloader(), dm.val_dataloader())
    result.metrics(), result.summary(), result.figure(), result.to_dict()

Run:  OMP_NUM_THREADS=1 python examples/audit_checkpoint.py [--epochs 10] [--logdir lightning_logs]
      OMP_NUM_THREADS=1 python examples/audit_checkpoint.py --checkpoint path/to/model.ckpt
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import warnings
from pathlib import Path

import torch

from lightning_privacy import cli, names


def train(args: argparse.Namespace) -> str:
    """Train the target and save ``<logdir>/audit_checkpoint/model.ckpt``; return its path."""
    import lightning.pytorch as pl

    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.models import TabularMLP

    pl.seed_everything(args.seed, verbose=False)
    dm = AdultDataModule(batch_size=64, seed=args.split_seed)  # val_fraction 0.1: the audits' default split
    dm.setup("fit")
    model = TabularMLP(dm.num_features, hidden=(150, 100, 50, 10), lr=5e-4, optimizer="adam")
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        default_root_dir=args.logdir,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    path = Path(args.logdir) / "audit_checkpoint" / "model.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(path)
    print(
        f"trained {args.epochs} epoch(s): val acc {float(trainer.callback_metrics['val_acc']):.4f}; checkpoint: {path}"
    )
    return str(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="audit this TabularMLP checkpoint instead of training one")
    parser.add_argument(
        "--epochs", type=int, default=10, help="training epochs when no --checkpoint (default: %(default)s)"
    )
    parser.add_argument(
        "--logdir", default="lightning_logs", help="where the checkpoint and audit files go (default: %(default)s)"
    )
    parser.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="seed of the Adult train/val split used in training (default: %(default)s)",
    )
    parser.add_argument(
        "--helper-epochs", type=int, default=10, help="PANORAMIA helper-model epochs (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", ".*LeafSpec.*|.*does not have many workers.*|.*val_dataloader.*")
    torch.set_num_threads(1)  # small models: one thread is as fast and avoids OpenMP spin-waiting on a busy CPU

    checkpoint = args.checkpoint or train(args)
    out_dir = Path(args.logdir) / "audit_checkpoint"
    out_dir.mkdir(parents=True, exist_ok=True)

    split = ["--split-seed", str(args.split_seed)]
    command = ["audit", "epsilon-star", "--checkpoint", checkpoint, "--json", *split]
    print(f"\n$ lightning-privacy {' '.join(command)}")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):  # --json: one JSON object, parsed below
        code = cli.main(command)
    if code != 0:
        raise SystemExit(f"audit epsilon-star failed with exit code {code}")
    eps_star = json.loads(buffer.getvalue())
    print(f"{names.EPSILON_STAR:<28} {eps_star[names.EPSILON_STAR]:.4f}")
    print(f"{names.EPSILON_STAR_EMPIRICAL:<28} {eps_star[names.EPSILON_STAR_EMPIRICAL]:.4f}")
    if names.MIA_EPSILON_LOWER in eps_star:
        print(f"{names.MIA_EPSILON_LOWER:<28} {eps_star[names.MIA_EPSILON_LOWER]:.4f}")
    print(
        f"{'members / non-members':<28} {eps_star['num_members']} / {eps_star['num_nonmembers']} "
        f"({eps_star['nonmembers']} rows), δ = {eps_star['delta']:.3g}"
    )

    # the same audit as a plain function call on the loaded model and Adult's loaders
    from lightning_privacy.audits import audit_epsilon_star
    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.models import TabularMLP

    model = TabularMLP.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    dm = AdultDataModule(batch_size=1024, seed=args.split_seed)
    dm.setup("fit")
    result = audit_epsilon_star(model, dm.member_dataloader(), dm.val_dataloader())
    same = all(result.metrics()[key] == eps_star[key] for key in result.metrics())
    print("\n>>> audit_epsilon_star(model, dm.member_dataloader(), dm.val_dataloader()).metrics()")
    print(f"{names.EPSILON_STAR:<28} {result.epsilon_star:.4f}   (the command's numbers, exactly: {same})")
    result.figure().savefig(out_dir / "epsilon_star.png", dpi=110)

    report = out_dir / "panoramia.json"
    figure = out_dir / "panoramia.png"
    command = [
        "audit",
        "panoramia",
        "--checkpoint",
        checkpoint,
        "--output",
        str(report),
        "--figure",
        str(figure),
        "--helper-epochs",
        str(args.helper_epochs),
        "--seed",
        str(args.seed),
        *split,
    ]
    print(f"\n$ lightning-privacy {' '.join(command)}")
    code = cli.main(command)  # prints PANORAMIA's own report
    if code != 0:
        raise SystemExit(f"audit panoramia failed with exit code {code}")
    panoramia = json.loads(report.read_text(encoding="utf-8"))

    print("\nSummary (same checkpoint, no retraining)")
    print(
        f"  Epsilon*   parametric ε* = {eps_star[names.EPSILON_STAR]:.4f}   empirical = {eps_star[names.EPSILON_STAR_EMPIRICAL]:.4f}"
    )
    print(
        f"  PANORAMIA  ε̃ = {panoramia['epsilon']:.4f}   c_lb = {panoramia['c_lb']:.4f}   "
        f"{{c+ε}}_lb = {panoramia['c_plus_epsilon_lb']:.4f}   (β = {panoramia['beta']:g}; ε̃ is not a DP lower bound)"
    )
    print(f"  checkpoint: {checkpoint}")
    print(f"  PANORAMIA report: {report}   figure: {figure}   Epsilon* figure: {out_dir / 'epsilon_star.png'}")


if __name__ == "__main__":
    main()

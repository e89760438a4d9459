"""What ``DPSGD(fix_modules=True)`` makes of a BatchNorm MLP on Adult (issue 57 item 5).

DP-SGD cannot train BatchNorm (it mixes the batch's examples), so ``fix_modules`` replaces it. Opacus' fixer gives
``GroupNorm(min(32, C), C)``, which on ``[batch, C]`` features (C ≤ 32) normalises each feature on its own: every
output is its bias and the layer erases its input (meta-pytorch/opacus#567). DPSGD now gives ``BatchNorm1d`` one group,
``GroupNorm(1, C)``: each example's features normalised together. Three models, the same DP-SGD recipe (σ = 1,
C = 1, Poisson p = 256/N, SGD lr 0.5, ``--epochs`` epochs), test accuracy, ``--seeds`` seeds:

- the MLP 104-32-32-2 without normalisation;
- the same MLP with ``BatchNorm1d(32)`` after each hidden layer, fixed by DPSGD (GroupNorm(1, 32));
- the same, fixed by Opacus' fixer (GroupNorm(32, 32)), what ``fix_modules`` did before.

    OMP_NUM_THREADS=1 python benchmarks/fix_modules_batchnorm.py > benchmarks/results/fix_modules_batchnorm.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
import warnings

import lightning.pytorch as pl
import torch
from opacus.validators import ModuleValidator
from torch import nn

from lightning_privacy import DPSGD
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP

HIDDEN = (32, 32)


class NormMLP(TabularMLP):
    """TabularMLP with ``BatchNorm1d`` after each hidden Linear (before its ReLU)."""

    def __init__(self, num_features: int, opacus_fix: bool = False) -> None:
        super().__init__(num_features, hidden=HIDDEN, lr=0.5)
        layers, width = [], num_features
        for h in HIDDEN:
            norm = nn.BatchNorm1d(h)
            layers += [nn.Linear(width, h), ModuleValidator.fix(norm) if opacus_fix else norm, nn.ReLU()]
            width = h
        self.net = nn.Sequential(*layers, nn.Linear(width, 2))


def run(kind: str, seed: int, epochs: int) -> float:
    pl.seed_everything(seed, verbose=False)
    dm = AdultDataModule(batch_size=256, seed=seed)
    dm.setup("fit")
    model = {
        "no normalisation": lambda: TabularMLP(dm.num_features, hidden=HIDDEN, lr=0.5),
        "BatchNorm1d, DPSGD's fix: GroupNorm(1, 32)": lambda: NormMLP(dm.num_features),
        "BatchNorm1d, Opacus' fix: GroupNorm(32, 32)": lambda: NormMLP(dm.num_features, opacus_fix=True),
    }[kind]()
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, fix_modules=True, sampling_seed=seed, noise_seed=seed)
    trainer = pl.Trainer(
        max_epochs=epochs, callbacks=[dpsgd], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
        return float(trainer.test(model, datamodule=dm, verbose=False)[0]["test_acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    kinds = (
        "no normalisation",
        "BatchNorm1d, DPSGD's fix: GroupNorm(1, 32)",
        "BatchNorm1d, Opacus' fix: GroupNorm(32, 32)",
    )
    rows = []
    for kind in kinds:
        accuracies = [run(kind, seed, args.epochs) for seed in range(args.seeds)]
        cells = ", ".join(f"{a:.3f}" for a in accuracies)
        rows.append(f"| {kind} | {statistics.mean(accuracies):.3f} | {cells} |")
    dm = AdultDataModule(batch_size=256)
    dm.setup("test")
    labels = dm.test_dataset.tensors[1]
    majority = max(float((labels == c).float().mean()) for c in (0, 1))
    print(
        f"Test accuracy on Adult under DP-SGD (σ = 1, C = 1, batch 256, SGD lr 0.5, {args.epochs} epochs; MLP "
        f"104-32-32-2), {args.seeds} seeds. The majority class alone is {majority:.3f}.\n"
    )
    print("| model | mean test accuracy | per seed |")
    print("|---|---|---|")
    print("\n".join(rows))
    print(
        f"\n<!-- written by benchmarks/fix_modules_batchnorm.py in {(time.perf_counter() - started) / 60:.1f} min, "
        f"{datetime.date.today()}, torch {torch.__version__} -->"
    )


if __name__ == "__main__":
    main()

"""Epsilon* on Adult (Negoescu et al. 2023, Section 4): privacy-utility of training strategies.

Strategies, each with several seeds (model initialisation):

- non-DP: a TabularMLP trained 1, 5, 10 and 20 epochs (one 20-epoch run per seed, audited after
  epochs 1, 5, 10, 20 — the same models as separate runs, since nothing depends on the total length);
- DP-SGD (the ``DPSGD`` callback) for ``--dp-epochs`` epochs at a few noise multipliers;
- an over-fitted model: a wide MLP trained with Adam on a small training subset to ~100% train accuracy.

Members = the training rows (a fixed-order pass), non-members = the ``adult.test`` rows (the paper's
population set), delta = 1 / (n ln n). Utility = AUROC on the non-members. Epsilon* comes from the
``EpsilonStarAudit`` callback (parametric and empirical) with ``audit/mia_epsilon_lower`` beside it.
Prints a markdown table and saves the privacy-utility figure with its Pareto frontier.

    python benchmarks/epsilon_star_adult.py [--seeds 3] [--figure benchmarks/epsilon_star_adult_pareto.png]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections import defaultdict

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from sklearn.metrics import roc_auc_score
from torch.utils.data import DataLoader, Subset

from lightning_privacy import names
from lightning_privacy.callbacks.dpsgd import DPSGD
from lightning_privacy.callbacks.epsilon_star_audit import EpsilonStarAudit
from lightning_privacy.data.datamodule import AdultDataModule
from lightning_privacy.models import TabularMLP

EPOCHS = (1, 5, 10, 20)


@torch.no_grad()
def population_auroc(model: torch.nn.Module, loader) -> float:
    model.eval()
    scores, labels = [], []
    for x, y in loader:
        scores.append(torch.softmax(model(x), dim=-1)[:, 1])
        labels.append(y)
    return float(roc_auc_score(torch.cat(labels).numpy(), torch.cat(scores).numpy()))


class AuditAt(Callback):
    """Run an EpsilonStarAudit after the given epochs and record (epoch, results, AUROC, DP epsilon)."""

    def __init__(self, audit: EpsilonStarAudit, epochs, population, dpsgd=None, train_loader=None) -> None:
        self.audit, self.epochs, self.population, self.dpsgd = audit, set(epochs), population, dpsgd
        self.train_loader = train_loader
        self.records = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch + 1
        if epoch in self.epochs:
            results = dict(self.audit.audit(trainer, pl_module))
            results["auroc"] = population_auroc(pl_module, self.population)
            results["dp_epsilon"] = (
                self.dpsgd.epsilon(self.audit.details["parametric"].delta) if self.dpsgd else float("nan")
            )
            if self.train_loader is not None:
                results["train_acc"] = accuracy(pl_module, self.train_loader)
            results["epoch"] = epoch
            self.records.append(results)
            pl_module.train()


@torch.no_grad()
def accuracy(model, loader) -> float:
    model.eval()
    hits = total = 0
    for x, y in loader:
        hits += int((model(x).argmax(-1) == y).sum())
        total += len(y)
    return hits / total


def _trainer(epochs: int, callbacks) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )


def run(seeds: int, noise_multipliers, dp_epochs: int, overfit_rows: int, overfit_epochs: int, epochs=EPOCHS) -> dict:
    dm = AdultDataModule(batch_size=256)
    dm.setup("fit")
    members, population = dm.member_dataloader(), dm.test_dataloader()
    records = defaultdict(list)
    for seed in range(seeds):
        pl.seed_everything(seed, verbose=False)
        audit = EpsilonStarAudit(member_dataloader=members, population_dataloader=population, log_figure=False)
        at = AuditAt(audit, epochs, population)
        _trainer(max(epochs), [at]).fit(TabularMLP(dm.num_features, hidden=(64,), lr=0.1), datamodule=dm)
        for r in at.records:
            records[f"non-DP, {r['epoch']} epoch{'s' if r['epoch'] > 1 else ''}"].append(r)
        for sigma in noise_multipliers:
            pl.seed_everything(seed, verbose=False)
            dpsgd = DPSGD(noise_multiplier=sigma, max_grad_norm=1.0)
            audit = EpsilonStarAudit(member_dataloader=members, population_dataloader=population, log_figure=False)
            at = AuditAt(audit, [dp_epochs], population, dpsgd=dpsgd)
            _trainer(dp_epochs, [dpsgd, at]).fit(TabularMLP(dm.num_features, hidden=(64,), lr=0.1), datamodule=dm)
            records[f"DP-SGD σ={sigma}, C=1, {dp_epochs} epochs"].extend(at.records)
        # over-fitted: wide MLP, small training subset, Adam until ~100% train accuracy
        pl.seed_everything(seed, verbose=False)
        rows = np.random.default_rng(seed).choice(len(dm.train_dataset), overfit_rows, replace=False)
        subset = Subset(dm.train_dataset, rows.tolist())
        train = DataLoader(subset, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(seed))
        fixed = DataLoader(subset, batch_size=1024)
        audit = EpsilonStarAudit(member_dataloader=fixed, population_dataloader=population, log_figure=False)
        at = AuditAt(audit, [overfit_epochs], population, train_loader=fixed)
        model = TabularMLP(dm.num_features, hidden=(512, 512), lr=1e-3, optimizer="adam")
        _trainer(overfit_epochs, [at]).fit(model, train_dataloaders=train)
        records[f"over-fitted: 512x512 MLP, {overfit_rows} rows, {overfit_epochs} epochs"].extend(at.records)
    return records


def pareto(points):
    """Indices of points not dominated (lower epsilon* and higher AUROC is better)."""
    keep = []
    for i, (e, a) in enumerate(points):
        if not any((e2 <= e and a2 >= a) and (e2 < e or a2 > a) for j, (e2, a2) in enumerate(points) if j != i):
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def figure(summary, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    labels = [s for s in summary if not s.startswith("over-fitted")]
    points = [(summary[s]["eps"].mean(), summary[s]["auroc"].mean()) for s in labels]
    for s, (e, a) in zip(labels, points):
        eps, auc = summary[s]["eps"], summary[s]["auroc"]
        ax.errorbar(
            e,
            a,
            xerr=[[e - eps.min()], [eps.max() - e]],
            yerr=[[a - auc.min()], [auc.max() - a]],
            fmt="o" if s.startswith("non-DP") else "s",
            capsize=3,
            label=s,
        )
    front = pareto(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "k--", alpha=0.6, label="Pareto frontier")
    ax.set_xlabel("Epsilon* (parametric; mean, min-max over seeds)")
    ax.set_ylabel("AUROC on non-members (adult.test)")
    ax.set_title("Adult: privacy-utility of training strategies")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise-multipliers", type=float, nargs="+", default=[0.7, 1.0, 2.0, 8.0])
    parser.add_argument("--epochs", type=int, nargs="+", default=list(EPOCHS), help="non-DP audit epochs")
    parser.add_argument("--dp-epochs", type=int, default=10)
    parser.add_argument("--overfit-rows", type=int, default=500)
    parser.add_argument("--overfit-epochs", type=int, default=200)
    parser.add_argument("--figure", default="benchmarks/epsilon_star_adult_pareto.png")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    records = run(
        args.seeds, args.noise_multipliers, args.dp_epochs, args.overfit_rows, args.overfit_epochs, args.epochs
    )
    summary = {}
    print(
        "| strategy | seeds | Epsilon* parametric | Epsilon* empirical | audit/mia_epsilon_lower | AUROC (population) | DP-SGD ε (RDP, same δ) |"
    )
    print("|---|---|---|---|---|---|---|")
    for strategy, rs in records.items():
        col = lambda key: np.array([r.get(key, np.nan) for r in rs], dtype=float)  # noqa: E731
        summary[strategy] = {"eps": col(names.EPSILON_STAR), "auroc": col("auroc")}
        fmt = lambda a: f"{np.nanmean(a):.3f} ± {np.nanstd(a, ddof=1):.3f}" if np.isfinite(a).any() else "—"  # noqa: E731
        dp = col("dp_epsilon")
        extra = f" (train acc {np.mean(col('train_acc')):.3f})" if "train_acc" in rs[0] else ""
        print(
            f"| {strategy}{extra} | {len(rs)} | {fmt(col(names.EPSILON_STAR))} | {fmt(col(names.EPSILON_STAR_EMPIRICAL))} | "
            f"{fmt(col(names.MIA_EPSILON_LOWER))} | {fmt(col('auroc'))} | {fmt(dp) if np.isfinite(dp).any() else '—'} |"
        )
    delta = 1.0 / (27146 * np.log(27146))
    print(
        f"\ndelta = 1/(n ln n) = {delta:.3g} (n = 27,146 training rows; over-fitted: n = {args.overfit_rows}); "
        f"non-members: adult.test (15,060 rows); total time {time.perf_counter() - start:.0f} s"
    )
    if args.figure:
        figure(summary, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()

"""What the neighbour check costs (issue 57: goal ≤ 3 % of training time at the default rate).

The check (``lightning_privacy.dpsgd.neighbours``) re-collates a checked step's batch twice or three times and computes
the clipped sums with the functional engine. Its cost per checked step is measured as the difference between a fit that
checks every step (``neighbour_rate=1``) and one that checks only the first two (``neighbour_rate=0``), over the same
steps; the share of a run's time at the default rate is then (2 + rate·(T − 2))·t_check / (T·t_step) for a run of T
steps. Two models, hooks mode: the Adult MLP (104-64-32-2, batch 256) and a small token classifier on padded sequences
(embedding 64, two linear layers, batch 64, lengths 8–64). Median of ``--repeats`` timings on one thread.

    OMP_NUM_THREADS=1 python benchmarks/neighbour_check_cost.py > benchmarks/results/neighbour_check_cost.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd.neighbours import DEFAULT_RATE
from lightning_privacy.models import TabularMLP

STEPS = 60
RUNS = (1_000, 10_000)  # run lengths T the share is given for


class Tokens(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.hidden, self.head = nn.Embedding(500, 64), nn.Linear(64, 64), nn.Linear(64, 2)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        mask = (ids > 0).float()[..., None]
        h = (self.embed(ids) * mask).sum(1) / mask.sum(1)
        return F.cross_entropy(self.head(torch.tanh(self.hidden(h))), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _tokens():
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(64 * 20):
        length = int(torch.randint(8, 65, (), generator=g))
        rows.append((torch.randint(1, 500, (length,), generator=g), int(torch.randint(0, 2, (), generator=g))))

    def pad(batch):
        longest = max(len(ids) for ids, _ in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        for i, (row, _) in enumerate(batch):
            ids[i, : len(row)] = row
        return ids, torch.tensor([y for _, y in batch])

    return Tokens, DataLoader(rows, batch_size=64, collate_fn=pad)


def _adult():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256 * 20, 104, generator=g)
    return (lambda: TabularMLP(104, hidden=(64, 32), lr=0.5)), DataLoader(
        TensorDataset(x, (x[:, 0] > 0).long()), batch_size=256
    )


def fit_seconds(make, loader, rate: float) -> float:
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0, neighbour_rate=rate, exactness_rate=0.0)
    trainer = pl.Trainer(
        max_steps=STEPS, callbacks=[dpsgd], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        trainer.fit(make(), loader)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = []
    for name, (make, loader) in (("Adult MLP, batch 256", _adult()), ("token classifier, batch 64", _tokens())):
        base = statistics.median(fit_seconds(make, loader, 0.0) for _ in range(args.repeats))
        every = statistics.median(fit_seconds(make, loader, 1.0) for _ in range(args.repeats))
        step = base / STEPS
        check = max(0.0, (every - base) / (STEPS - 2))
        shares = [(2 + DEFAULT_RATE * (t - 2)) * check / (t * step) for t in RUNS]
        lines.append(
            f"| {name} | {1000 * step:.1f} | {1000 * check:.1f} | {check / step:.1f}× | "
            + " | ".join(f"{100 * s:.2f} %" for s in shares)
            + " |"
        )
    print(
        f"The neighbour check's cost (hooks mode, {STEPS} steps per fit, median of {args.repeats}; one thread): a "
        f"step, a checked step's extra time, and the share of a run's time at the default rate {DEFAULT_RATE} (the first "
        "two steps always checked). Goal (issue 57): ≤ 3 %.\n"
    )
    print(
        "| model | ms per step | ms per check | check ÷ step | " + " | ".join(f"share, T = {t:,}" for t in RUNS) + " |"
    )
    print("|---|---|---|---|" + "---|" * len(RUNS))
    print("\n".join(lines))
    print(
        f"\n<!-- written by benchmarks/neighbour_check_cost.py, {datetime.date.today()}, torch {torch.__version__} -->"
    )


if __name__ == "__main__":
    main()

"""Input canaries optimised by metagradient descent against the wrong-label rows they start from, on the Adult MLP.

Issue 50, item 2 ("input-space canaries optimised where cheap; measure each"). Boglioni, Liu, Ilyas, Wu (arXiv
2507.15836) optimise black-box canaries through an unrolled non-private training run and report audits up to 2×
tighter on DP image classifiers. Here: :func:`lightning_privacy.audits.canary_design.optimize_input_canaries` on the
Adult MLP 104-64-32-2 with m = 1,000 canaries, δ = 1e-5, α = 0.05, in two training recipes:

- ``sgd``: the recipe of ``benchmarks/canary_audit.py`` (plain SGD, lr 0.5, batch ⌈n/10⌉, 30 epochs), whose input
  canaries give 0 under DP-SGD at every σ there, and without DP-SGD too;
- ``adam``: the recipe that memorises there (Adam, lr 3e-3, batch 256), 10 epochs.

For each recipe and seed: one design whose proxy is that recipe without clipping or noise (the same MLP, Poisson
batches at the recipe's rate, its optimiser, learning rate and number of steps; ``--meta-steps`` Adam steps on the
inputs, kept within the data's per-feature range), then for each setting (no DP-SGD, and DP-SGD with C = 1 at each
``--sigmas``) two fits: ``CanaryAudit("input", examples=design.initial)`` (the wrong-label rows the design starts
from: the default canaries) and ``examples=design.examples`` (the optimised ones), the same seed, so the same
canaries are included. Reported per fit: both ε lower bounds (binomial, Gaussian f-DP) and the AUC of the score
between included and excluded canaries (a diagnostic: 0.5 is chance).

    python benchmarks/input_canary_design.py [--recipes sgd adam] [--seeds 0 1] [--sigmas 0.5 2]
        [--meta-steps 60] [--meta-lr 0.3] [--rows FILE]
    python benchmarks/input_canary_design.py --report FILE [FILE ...]   # the Markdown from rows of several processes

The committed results: ``--seeds 0 --rows A`` and ``--seeds 1 --rows B`` in two processes, then ``--report A B``.

About 25 minutes per seed on one core (a design 4–6 minutes per recipe, each fit 10–150 s).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from datetime import date
from pathlib import Path
from typing import Dict, List, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from scipy.stats import mannwhitneyu

from lightning_privacy import DPSGD, CanaryAudit, names
from lightning_privacy.audits.canary_design import optimize_input_canaries
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP

DELTA, ALPHA, CLIP, M, N_TRAIN = 1e-5, 0.05, 1.0, 1000, 27146
HIDDEN = (64, 32)
RECIPES = {  # batch size, optimiser, learning rate, epochs
    "sgd": {"batch": -(-N_TRAIN // 10), "optimizer": "sgd", "lr": 0.5, "epochs": 30},
    "adam": {"batch": 256, "optimizer": "adam", "lr": 3e-3, "epochs": 10},
}


def auc(scores: np.ndarray, included: np.ndarray) -> float:
    """P(an included canary's score > an excluded one's), ties halved (Mann–Whitney U ÷ pairs)."""
    stat = mannwhitneyu(scores[included], scores[~included]).statistic
    return float(stat / (included.sum() * (~included).sum()))


def fit(dm: AdultDataModule, recipe: dict, seed: int, sigma: Optional[float], examples) -> Dict[str, float]:
    """One fit with one input CanaryAudit: its bounds, the AUC and the accountant's ε."""
    pl.seed_everything(seed, verbose=False)
    audit = CanaryAudit("input", seed=seed, alpha=ALPHA, examples=examples, delta=DELTA)
    callbacks: List[pl.Callback] = [audit]
    dp = None
    if sigma is not None:
        dp = DPSGD(noise_multiplier=sigma, max_grad_norm=CLIP, delta=DELTA)
        callbacks.insert(0, dp)
    trainer = pl.Trainer(
        max_epochs=recipe["epochs"], callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, accelerator="cpu",
    )  # fmt: skip
    model = TabularMLP(dm.num_features, hidden=HIDDEN, lr=recipe["lr"], optimizer=recipe["optimizer"])
    trainer.fit(model, datamodule=dm)
    return {
        "accountant": None if dp is None else float(dp.epsilon(DELTA)),
        "binomial": audit.results[names.CANARY_EPSILON_LOWER],
        "gdp": audit.results[names.CANARY_EPSILON_GDP_GAUSSIAN_READING],
        "auc": auc(audit.scores, audit.included),
    }


def run_seed(name: str, seed: int, sigmas: List[float], meta_steps: int, meta_lr: float, m: int, emit) -> None:
    recipe = RECIPES[name]
    dm = AdultDataModule(batch_size=recipe["batch"])
    dm.setup("fit")
    n = len(dm.train_dataset)
    started = time.perf_counter()
    design = optimize_input_canaries(
        TabularMLP(dm.num_features, hidden=HIDDEN).net, dm.train_dataset, m, sample_rate=recipe["batch"] / n,
        steps=recipe["epochs"] * -(-n // recipe["batch"]), lr=recipe["lr"], optimizer=recipe["optimizer"],
        meta_steps=meta_steps, meta_lr=meta_lr, seed=seed,
    )  # fmt: skip
    gaps = design.objective
    tail = gaps[-max(1, len(gaps) // 5) :]
    emit({"recipe": name, "seed": seed, "kind": "design", "wall": time.perf_counter() - started, "first": gaps[0],
          "last fifth": statistics.mean(tail)})  # fmt: skip
    for sigma in [None, *sigmas]:
        for kind, examples in (("default", design.initial), ("optimised", design.examples)):
            since = time.perf_counter()
            row = fit(dm, recipe, seed, sigma, examples)
            emit(
                {"recipe": name, "seed": seed, "kind": kind, "sigma": sigma, "wall": time.perf_counter() - since, **row}
            )


def _cell(values: List[float], digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def report(rows: List[dict], meta: dict) -> str:
    seeds = sorted({r["seed"] for r in rows})
    out = [
        "",
        f"Input canaries on the Adult MLP 104-64-32-2, m = {meta['m']}, δ = {DELTA}, α = {ALPHA}, DP-SGD with C = "
        f"{CLIP}: the wrong-label training rows a design starts from (the default canaries) against the same rows after "
        f"{meta['meta steps']} metagradient steps (`optimize_input_canaries`, Adam lr {meta['meta lr']}; proxy: the "
        "recipe without clipping or noise). Each cell: median [min, max] over seeds "
        f"{', '.join(map(str, seeds))}; each seed one design per recipe and, per row, one fit with each canary set (the "
        "same canaries included).",
        "",
        "| recipe | DP-SGD σ | accountant ε | default binomial | default gdp | default AUC | optimised binomial | "
        "optimised gdp | optimised AUC |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name in [r for r in RECIPES if any(row["recipe"] == r for row in rows)]:
        recipe = RECIPES[name]
        label = f"{name}: lr {recipe['lr']:g}, batch {recipe['batch']}, {recipe['epochs']} epochs"
        designs = [r for r in rows if r["recipe"] == name and r["kind"] == "design"]
        fits = [r for r in rows if r["recipe"] == name and r["kind"] != "design"]
        for sigma in sorted({r["sigma"] for r in fits}, key=lambda s: -1 if s is None else s):
            cells = []
            for kind in ("default", "optimised"):
                mine = [r for r in fits if r["sigma"] == sigma and r["kind"] == kind]
                cells += [_cell([r["binomial"] for r in mine]), _cell([r["gdp"] for r in mine]),
                          _cell([r["auc"] for r in mine], 3)]  # fmt: skip
            eps = [r["accountant"] for r in fits if r["sigma"] == sigma and r["kind"] == "default" and r["accountant"]]
            row = [label, "none" if sigma is None else f"{sigma:g}", _cell(eps) if eps else "—", *cells]
            out.append("| " + " | ".join(row) + " |")
        notes.append(
            f"- {name}: objective (the proxy's excluded canaries' mean membership loss minus the included ones'; higher "
            f"= told apart better) at the first meta-step {_cell([d['first'] for d in designs], 3)}, mean of the last "
            f"fifth {_cell([d['last fifth'] for d in designs], 3)}; one design {_cell([d['wall'] / 60 for d in designs], 1)} "
            "min"
        )
    minutes = sum(r["wall"] for r in rows) / 60
    out += ["", "Designs:", "", *notes, ""]
    out.append(
        f"<!-- written by benchmarks/input_canary_design.py in {minutes:.1f} min (summed over processes), {date.today()}, "
        f"{platform.machine()}, torch {torch.__version__}, 1 thread -->"
    )
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--meta-steps", type=int, default=60)
    parser.add_argument("--meta-lr", type=float, default=0.3)
    parser.add_argument("--canaries", type=int, default=M)
    parser.add_argument("--rows", help="also append every row to this JSON-lines file")
    parser.add_argument("--report", nargs="+", help="print the Markdown from these JSON-lines files; run nothing")
    args = parser.parse_args(argv)
    if args.report:
        rows = [json.loads(line) for path in args.report for line in Path(path).read_text().splitlines() if line]
        print(report(rows, rows[0]))
        return
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rows: List[dict] = []
    meta = {"m": args.canaries, "meta steps": args.meta_steps, "meta lr": args.meta_lr}

    def emit(row: dict) -> None:
        row.update(meta)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.rows:
            with open(args.rows, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    for name in args.recipes:
        for seed in args.seeds:
            run_seed(name, seed, args.sigmas, args.meta_steps, args.meta_lr, args.canaries, emit)
    print(report(rows, meta))


if __name__ == "__main__":
    main()

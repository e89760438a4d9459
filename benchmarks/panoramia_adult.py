"""PANORAMIA on Adult: the paper's tabular reproduction (Kazmi et al. 2024, Tables 2-4) on this CPU.

Targets (all ``TabularMLP(104, hidden=(150, 100, 50, 10), lr=5e-4, optimizer="adam")`` on the 27,146
AdultDataModule training rows): 10 and 100 epochs without privacy (the paper's MLP_E10 / MLP_E100),
and DP-SGD models (``DPSGD`` callback, 10 epochs, expected batch 256, clipping 1.0) at a few ε
(δ = 1e-5, RDP accountant). Each is audited

- with generated non-members (PANORAMIA: members = the training rows, a third each for D_G,
  D_in^tr and D_in^te; ``FilteredGenerator(TabularGenerator())``), and
- with real non-members (the paper's RM;RN comparison: the held-out validation + test rows are the
  non-members, so c = 0 by construction; m = 6,000, 6,000 training rows per class).

Prints one markdown table (mean and min–max over ``--seeds`` audit seeds) plus wall and CPU seconds
per audit and the load average. Trained targets are cached in ``--cache-dir``.

    python benchmarks/panoramia_adult.py                  # full table (about 10-20 min on 2 cores)
    python benchmarks/panoramia_adult.py --quick          # E10 only, one seed
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from lightning_privacy.data import AdultDataModule
from lightning_privacy.functional.panoramia import panoramia_audit
from lightning_privacy.generators import BayesNetGenerator, FilteredGenerator, HeldOutRows, TabularGenerator, _data
from lightning_privacy.models import TabularMLP

HIDDEN = (150, 100, 50, 10)
PAPER = {  # Table 4 of the paper (tabular): c_lb, {c+eps}_lb, eps_tilde, and the comparisons it reports
    "MLP_E10": (2.37, 2.47, 0.10, "O(1) 0.00"),
    "MLP_E100": (2.37, 2.71, 0.34, "O(1) 0.23; half-data target: 1.25/1.62/0.37, RM;RN 0.64"),
}


def _make_model() -> TabularMLP:
    return TabularMLP(104, hidden=HIDDEN, lr=5e-4, optimizer="adam")


def train_target(name: str, *, epochs: int, batch_size: int, dp_epsilon: float | None, cache: Path) -> dict:
    import lightning.pytorch as pl

    path = cache / f"{name}.pt"
    dm = AdultDataModule(batch_size=batch_size, seed=0)
    dm.setup("fit")
    model = _make_model()
    info: dict = {"epochs": epochs}
    if path.exists():
        saved = torch.load(path, weights_only=False)
        model.load_state_dict(saved["state"])
        info.update(saved["info"])
    else:
        torch.manual_seed(0)
        model = _make_model()
        callbacks = []
        if dp_epsilon is not None:
            from opacus.accountants.utils import get_noise_multiplier

            from lightning_privacy.callbacks.dpsgd import DPSGD

            sample_rate = 1 / math.ceil(len(dm.train_dataset) / batch_size)
            sigma = get_noise_multiplier(
                target_epsilon=dp_epsilon, target_delta=1e-5, sample_rate=sample_rate, epochs=epochs, accountant="rdp"
            )
            dp = DPSGD(noise_multiplier=sigma, max_grad_norm=1.0, delta=1e-5)
            callbacks.append(dp)
        start = time.perf_counter()
        trainer = pl.Trainer(
            max_epochs=epochs,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            deterministic=True,
        )
        trainer.fit(model, datamodule=dm)
        info["train_seconds"] = time.perf_counter() - start
        if dp_epsilon is not None:
            info["sigma"] = float(sigma)
            info["dp_epsilon"] = float(dp.accountant.get_epsilon(1e-5))
        torch.save({"state": model.state_dict(), "info": info}, path)
    model.eval()
    with torch.no_grad():
        for split, ds in (("train_acc", dm.train_dataset), ("test_acc", dm.test_dataset)):
            x, y = ds.tensors
            info[split] = float((model(x).argmax(1) == y).float().mean())
    return {"model": model, "dm": dm, **info}


def audit(
    target: dict,
    *,
    seed: int,
    real_nonmembers: bool,
    generator: str = "cart",
    mia_features: str = "target_loss",
    sdv_epochs: int = 10,
) -> dict:
    dm, model = target["dm"], target["model"]
    encode = lambda rows: dm.to_dataset(rows).tensors  # noqa: E731
    start, cpu = time.perf_counter(), time.process_time()
    if real_nonmembers:
        pool = _data.concat(dm.val_table, dm.test_table)
        m = n_train = 6000
        res = panoramia_audit(
            model,
            dm.train_table,
            encode=encode,
            generator=HeldOutRows(pool, seed=seed),
            audit_size=m,
            generator_size=len(dm.train_table) - m - n_train,
            helper_size=n_train,
            seed=seed,
        )
    else:
        if generator.startswith("sdv-"):  # optional: pip install sdv
            from lightning_privacy.generators import SDVGenerator

            kind = {"sdv-gaussian-copula": "gaussian_copula", "sdv-ctgan": "ctgan"}[generator]
            base = SDVGenerator(kind, seed=seed, **({"epochs": sdv_epochs} if kind == "ctgan" else {}))
        else:
            base = TabularGenerator(seed=seed) if generator == "cart" else BayesNetGenerator(seed=seed)
        gen = FilteredGenerator(base, seed=seed)
        res = panoramia_audit(model, dm.train_table, encode=encode, generator=gen, seed=seed, mia_features=mia_features)
    return {
        "c_lb": res.c_lb,
        "c_eps": res.c_plus_epsilon_lb,
        "eps": res.epsilon,
        "wall": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "m": res.sizes["audit"],
        "result": res,
    }


def _fmt(values: list) -> str:
    v = np.asarray(values)
    if len(v) == 0:
        return "–"
    return f"{v.mean():.2f}" if len(v) == 1 else f"{v.mean():.2f} ({v.min():.2f}–{v.max():.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="audit seeds per model")
    parser.add_argument("--dp-epsilons", type=float, nargs="*", default=[1.0, 3.0, 10.0])
    parser.add_argument("--quick", action="store_true", help="MLP_E10 only, one seed")
    parser.add_argument("--cache-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "lp_panoramia_adult"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads for target training")
    parser.add_argument(
        "--generator",
        choices=["cart", "bayesnet", "sdv-gaussian-copula", "sdv-ctgan"],
        default="cart",
        help="TabularGenerator (sequential CART, default), BayesNetGenerator (MST-like), or SDV's "
        "GaussianCopula / CTGAN (optional: pip install sdv)",
    )
    parser.add_argument("--sdv-epochs", type=int, default=10, help="CTGAN training epochs (sdv-ctgan)")
    parser.add_argument("--mia-features", choices=["target_loss", "calibrated"], default="target_loss")
    parser.add_argument("--no-real", action="store_true", help="skip the real-non-member (RM;RN) audits")
    parser.add_argument("--figure", default=None, help="save MLP_E100's curves (first seed) to this image file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    specs = [("MLP_E10", 10, 64, None), ("MLP_E100", 100, 64, None)]
    specs += [(f"DP_eps{e:g}", 10, 256, e) for e in args.dp_epsilons]
    seeds = list(range(args.seeds))
    if args.quick:
        specs, seeds = specs[:1], [0]
    rows = []
    for name, epochs, batch, dp_eps in specs:
        target = train_target(name, epochs=epochs, batch_size=batch, dp_epsilon=dp_eps, cache=cache)
        gen = [
            audit(
                target,
                seed=s,
                real_nonmembers=False,
                generator=args.generator,
                mia_features=args.mia_features,
                sdv_epochs=args.sdv_epochs,
            )
            for s in seeds
        ]
        real = [] if args.no_real else [audit(target, seed=s, real_nonmembers=True) for s in seeds]
        rows.append((name, target, gen, real))
        if args.figure and name == "MLP_E100":
            from lightning_privacy.callbacks.panoramia_audit import panoramia_figure

            panoramia_figure(gen[0]["result"]).savefig(args.figure, dpi=110)
        top = gen[0]["result"]
        print(
            f"{name}: trained in {target.get('train_seconds', float('nan')):.0f} s; "
            f"train acc {target['train_acc']:.3f}, test acc {target['test_acc']:.3f}; "
            f"audit {np.mean([g['wall'] for g in gen]):.0f} s wall / {np.mean([g['cpu'] for g in gen]):.0f} s CPU; "
            f"filter kept {top.acceptance_rate:.3f}; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    print()
    print(
        "| model | train / test acc | c_lb | {c+ε}_lb | ε̃ | RM;RN c_lb | RM;RN {c+ε}_lb (= ε, c = 0) | "
        "paper c_lb / {c+ε}_lb / ε̃ | audit wall / CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, target, gen, real in rows:
        label = (
            name if "dp_epsilon" not in target else f"{name} (σ={target['sigma']:.2f}, ε={target['dp_epsilon']:.2f})"
        )
        paper = PAPER.get(name)
        paper_txt = f"{paper[0]} / {paper[1]} / {paper[2]} ({paper[3]})" if paper else "ε̃ = 0 at small ε (images)"
        print(
            f"| {label} | {target['train_acc']:.3f} / {target['test_acc']:.3f} | {_fmt([g['c_lb'] for g in gen])} | "
            f"{_fmt([g['c_eps'] for g in gen])} | {_fmt([g['eps'] for g in gen])} | {_fmt([r['c_lb'] for r in real])} | "
            f"{_fmt([r['c_eps'] for r in real])} | {paper_txt} | "
            f"{np.mean([g['wall'] for g in gen]):.0f} / {np.mean([g['cpu'] for g in gen]):.0f} |"
        )
    print(
        f"\nm = {rows[0][2][0]['m']} audit points (generated), 6000 (RM;RN); beta = 0.05; generator {args.generator}; "
        f"MIA features {args.mia_features}; {len(seeds)} audit seed(s); torch threads {args.threads} (training), 1 (audit); "
        f"load average at the end {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()

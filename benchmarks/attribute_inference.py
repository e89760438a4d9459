"""Cost of tracking the attribute sensitivity R_t (Cherubin et al. 2024, Algorithm 4, Section 5.4).

Adult MLP (TabularMLP, 104-64-32-2, 8,866 parameters), sensitive attribute ``age`` with |A| = 73
candidate values (17..89), one Poisson-sized batch of 256 real training rows, C = 1. Times per step:

(a) a plain DP-SGD step (Opacus ``make_private``: per-sample gradients by hooks, clipping, noise, SGD step);
(b) exact R_t (diameter), (c) approximate R_t (centre bound), (d) extremes (17 and 89 only) — ours,
    with the default backend (``auto``: Gram matrices from activations for this all-Linear model) and
    with the general ``torch.func`` backend;
(e) a naive reference written here: per example, one Opacus backward pass over its |A| copies, clipping,
    and the diameter by a Python double loop over all pairs.

Ratios printed: exact ÷ (|A| × DP-SGD step) — the cost of computing |A|·B per-sample gradients and
their diameters relative to |A| ordinary DP-SGD steps (goal ≤ 1) — and naive ÷ ours (goal ≥ 20×).

Usage::

    python benchmarks/attribute_inference.py            # ~1-2 min on one core
    python benchmarks/attribute_inference.py --naive-examples 32   # time the naive loop on fewer rows, scaled
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import warnings

import torch
from opacus import GradSampleModule, PrivacyEngine
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_privacy.data.datamodule import AdultDataModule
from lightning_privacy.functional.attribute_sensitivity import attribute_sensitivity
from lightning_privacy.models import TabularMLP

warnings.filterwarnings("ignore", message=".*Secure RNG.*")
warnings.filterwarnings("ignore", message=".*Full backward hook.*")


def timed(fn, repeats: int) -> tuple:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def naive_exact(model, x, y, attribute, max_grad_norm, examples: int) -> float:
    """Reference: one Opacus backward pass per example over its |A| copies; pairs by a Python double loop."""
    gsm = GradSampleModule(model)
    best = 0.0
    for i in range(examples):
        copies = attribute.expand(x[i : i + 1])[0]  # (|A|, features)
        gsm.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(copies), y[i].repeat(len(copies))).backward()
        flat = torch.cat([p.grad_sample.reshape(len(copies), -1) for p in gsm.parameters()], dim=1) * len(copies)
        for p in gsm.parameters():
            p.grad_sample = None
        norms = flat.norm(dim=1, keepdim=True)
        clipped = flat * (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        points = list(clipped)
        for a, b in itertools.combinations(points, 2):
            best = max(best, float(torch.linalg.vector_norm(a - b)))
    gsm._close()
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--naive-examples", type=int, default=None, help="time the naive loop on this many rows and scale"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dm = AdultDataModule(batch_size=args.batch_size)
    dm.setup("fit")
    age = dm.sensitive_attribute("age", values=range(17, 90))  # |A| = 73 as in the paper
    x, y = (t[: args.batch_size] for t in dm.train_dataset.tensors)
    model = TabularMLP(dm.num_features)
    k, c = age.size, 1.0

    # (a) plain DP-SGD step through Opacus
    dp_model = TabularMLP(dm.num_features)
    dp_model.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(dp_model.parameters(), lr=0.1)
    loader = DataLoader(dm.train_dataset, batch_size=args.batch_size)
    gsm, dp_opt, _ = PrivacyEngine().make_private(
        module=dp_model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=c
    )

    def dp_step():
        dp_opt.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(x), y).backward()
        dp_opt.step()

    t_dp, _ = timed(dp_step, args.repeats * 4)

    rows = []
    results = {}
    for label, method, values in (
        ("exact", "exact", "all"),
        ("approximate", "approximate", "all"),
        ("extremes", "exact", "extremes"),
    ):
        for backend in ("auto", "func"):
            fn = lambda: attribute_sensitivity(
                model,
                x,
                y,
                attribute=age,
                max_grad_norm=c,
                method=method,  # noqa: E731
                values=values,
                backend=backend,
            )
            t, r = timed(fn, args.repeats)
            results[(label, backend)] = (t, r)

    n_naive = args.naive_examples or args.batch_size
    start = time.perf_counter()
    r_naive = naive_exact(model, x, y, age, c, n_naive)
    t_naive = (time.perf_counter() - start) * args.batch_size / n_naive
    if n_naive == args.batch_size:
        assert abs(r_naive - results[("exact", "auto")][1]) <= 1e-4 * max(r_naive, 1e-12), (
            r_naive,
            results[("exact", "auto")][1],
        )

    print(
        f"Adult MLP ({sum(p.numel() for p in model.parameters())} parameters), |A| = {k}, batch {args.batch_size}, "
        f"{torch.get_num_threads()} thread(s), median of {args.repeats} runs\n"
    )
    print("| step | time per step | × DP-SGD step | R_t |")
    print("|---|---:|---:|---:|")
    print(f"| (a) plain DP-SGD step (Opacus) | {t_dp * 1e3:.1f} ms | 1.0 | |")
    names = {"exact": "(b) exact", "approximate": "(c) approximate", "extremes": "(d) extremes"}
    for (label, backend), (t, r) in results.items():
        rows.append((label, backend, t))
        engine = "auto = Linear Gram" if backend == "auto" else "torch.func"
        print(f"| {names[label]} [{engine}] | {t * 1e3:.1f} ms | {t / t_dp:.1f} | {r:.4f} |")
    scaled = "" if n_naive == args.batch_size else f" (timed on {n_naive} rows, scaled)"
    print(f"| (e) naive loop{scaled} | {t_naive * 1e3:.0f} ms | {t_naive / t_dp:.0f} | {r_naive:.4f} |")
    print()
    for backend in ("auto", "func"):
        t_exact = results[("exact", backend)][0]
        print(f"exact ÷ (|A| × DP-SGD step) [{backend}]: {t_exact / (k * t_dp):.3f}   (goal ≤ 1.0)")
    for (label, backend), (t, _) in results.items():
        print(f"naive ÷ {label} [{backend}]: {t_naive / t:.0f}×   (goal ≥ 20×)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

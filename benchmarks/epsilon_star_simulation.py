"""Appendix B of Negoescu et al. (2023): Epsilon* from empirical CDFs vs parametric fits, on Gamma losses.

Member (training) losses ~ Gamma(k=2, theta=5), population losses ~ Gamma(2 + d, 5), d in {0, 1, 2, 3},
n in {10^3, 10^4, 10^5} losses per set, 10 repetitions. The true Epsilon* comes from the true Gamma CDFs
(supremum over thresholds with both rates in (delta, 1 - delta)); delta = 1 / (n ln n) as in the paper.
Also times one call on 10^6 + 10^6 losses. With ``--output`` the published table (the true Epsilon* with its value
restricted to the empirical estimator's rate range in brackets) and the timing are written with the command that
produced them: ``benchmarks/results/epsilon_star_simulation.md``, embedded in the docs by ``benchmarks/sync_results.py``.

    python benchmarks/epsilon_star_simulation.py --output benchmarks/results/epsilon_star_simulation.md
    python benchmarks/epsilon_star_simulation.py [--reps 10]
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star, epsilon_star_from_distributions

K, THETA = 2.0, 5.0


def simulate(reps: int, distances=(0, 1, 2, 3), sizes=(1_000, 10_000, 100_000), seed: int = 0) -> list:
    rows = []
    for d in distances:
        for n in sizes:
            delta = default_delta(n)
            truth = epsilon_star_from_distributions(
                stats.gamma(K, scale=THETA), stats.gamma(K + d, scale=THETA), delta=delta
            )
            truth_001 = epsilon_star_from_distributions(
                stats.gamma(K, scale=THETA), stats.gamma(K + d, scale=THETA), delta=0.001
            )
            emp, par = [], []
            for rep in range(reps):
                rng = np.random.default_rng([seed, d, n, rep])
                members = rng.gamma(K, THETA, n)
                population = rng.gamma(K + d, THETA, n)
                emp.append(epsilon_star(members, population, delta=delta, method="empirical"))
                par.append(epsilon_star(members, population, delta=delta, method="parametric"))
            rows.append(
                dict(d=d, n=n, delta=delta, truth=truth, truth_001=truth_001, emp=np.array(emp), par=np.array(par))
            )
    return rows


def timing(n: int = 1_000_000, repeats: int = 3) -> dict:
    rng = np.random.default_rng(1)
    members, population = rng.gamma(K, THETA, n), rng.gamma(K + 1, THETA, n)
    out = {}
    for method in ("parametric", "empirical"):
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            epsilon_star(members, population, delta=default_delta(n), method=method)
            best = min(best, time.perf_counter() - start)
        out[method] = best
    return out


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def published(rows: list, t: dict, reps: int, seconds: float, command: str) -> str:
    """The page's table: true ε* (its value with rates in (0.001, 0.999)), both estimates, their errors; the timing."""
    lines = [
        "| d | n | true ε* (rates in (0.001, 0.999)) | empirical | parametric | \\|emp − true\\| | \\|par − true\\| |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        truth = "0" if r["truth"] == 0 and r["truth_001"] == 0 else f"{r['truth']:.3f} ({r['truth_001']:.3f})"
        n = f"10{str(round(np.log10(r['n']))).translate(_SUPERSCRIPT)}"
        lines.append(
            f"| {r['d']} | {n} | {truth} | {r['emp'].mean():.3f} ± {r['emp'].std(ddof=1):.3f} | "
            f"{r['par'].mean():.3f} ± {r['par'].std(ddof=1):.3f} | {abs(r['emp'].mean() - r['truth']):.3f} | "
            f"{abs(r['par'].mean() - r['truth']):.3f} |"
        )
    lines += [
        "",
        f"Mean ± sd over {reps} repetitions; δ = 1/(n ln n). On 10⁶ + 10⁶ losses, one call takes "
        f"{t['parametric']:.2f} s (parametric) and {t['empirical']:.2f} s (empirical), best of 3. Written by "
        f"`{command}` in {seconds:.0f} s (numpy {np.__version__}, Python {platform.python_version()}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--output", default=None, help="write the published Markdown table to this file (benchmarks/results/...md)"
    )
    args = parser.parse_args()
    start = time.perf_counter()
    rows = simulate(args.reps)
    print(
        "| d | n | delta | true eps* (delta) | true eps* (rates in (0.001, 0.999)) | empirical (mean ± sd) | parametric (mean ± sd) | |emp − true| | |par − true| |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['d']} | {r['n']:.0e} | {r['delta']:.2g} | {r['truth']:.3f} | {r['truth_001']:.3f} | "
            f"{r['emp'].mean():.3f} ± {r['emp'].std(ddof=1):.3f} | {r['par'].mean():.3f} ± {r['par'].std(ddof=1):.3f} | "
            f"{abs(r['emp'].mean() - r['truth']):.3f} | {abs(r['par'].mean() - r['truth']):.3f} |"
        )
    t = timing()
    print(
        f"\nTiming, 10^6 + 10^6 losses (best of 3): parametric {t['parametric']:.3f} s, empirical {t['empirical']:.3f} s"
    )
    if args.output:
        command = shlex.join(["python", "benchmarks/epsilon_star_simulation.py", *sys.argv[1:]])
        text = published(rows, t, args.reps, time.perf_counter() - start, command)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

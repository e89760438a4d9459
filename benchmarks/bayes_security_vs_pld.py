"""Closed-form β*_MIA (Cherubin et al. 2024, Corollary 7) vs the pessimistic PLD ground truth.

Reproduces the setting of the paper's Fig. 4 / Fig. 5 (p = 1e-3, T = epochs / p): for each
(σ, epochs) it prints the closed form, 1 − δ(ε=0) from dp_accounting's PLD (REPLACE_ONE), their
difference (closed − exact; > 0 means the closed form overstates security), the proven error term of
Proposition 4, the time of each and the speed ratio.

    python benchmarks/bayes_security_vs_pld.py            # the 3 x 3 table of the issue
    python benchmarks/bayes_security_vs_pld.py --full     # adds σ ∈ {1.5, 4} and 100 epochs
    python benchmarks/bayes_security_vs_pld.py --relation add_remove
"""

from __future__ import annotations

import argparse
import time
import timeit

from lightning_privacy.analysis import bayes_security as bs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample-rate", type=float, default=1e-3)
    parser.add_argument("--full", action="store_true", help="more noise levels and 100 epochs")
    parser.add_argument("--relation", choices=bs.RELATIONS, default="replace")
    parser.add_argument("--repeats", type=int, default=20_000, help="closed-form timing repetitions")
    args = parser.parse_args(argv)

    p = args.sample_rate
    sigmas = [0.8, 1.0, 1.5, 2.0, 4.0] if args.full else [0.8, 1.0, 2.0]
    epochs_list = [1, 10, 50, 100] if args.full else [1, 10, 50]

    header = (
        f"{'sigma':>5} {'epochs':>6} {'steps':>7} | {'closed':>7} {'exact':>7} {'closed-exact':>12} "
        f"{'err_bound':>9} | {'t_closed':>9} {'t_exact':>8} {'ratio':>9}"
    )
    print(
        f"p = {p:g}, relation = {args.relation}, PLD grid = {bs.DEFAULT_VALUE_DISCRETIZATION_INTERVAL:g} (pessimistic)"
    )
    print(header)
    print("-" * len(header))
    ratios = []
    for sigma in sigmas:
        for epochs in epochs_list:
            steps = int(round(epochs / p))
            kw = dict(sample_rate=p, noise_multiplier=sigma, steps=steps, relation=args.relation)
            closed = bs.mia_bayes_security(**kw)
            t_closed = timeit.timeit(lambda: bs.mia_bayes_security(**kw), number=args.repeats) / args.repeats
            start = time.perf_counter()
            exact = bs.mia_bayes_security_exact(**kw)
            t_exact = time.perf_counter() - start
            err = bs.approximation_error(sample_rate=p, noise_multiplier=sigma, steps=steps)
            ratios.append(t_exact / t_closed)
            print(
                f"{sigma:>5.1f} {epochs:>6d} {steps:>7d} | {closed:>7.4f} {exact:>7.4f} {closed - exact:>+12.4f} "
                f"{err:>9.3f} | {t_closed * 1e6:>7.1f}us {t_exact:>7.3f}s {t_exact / t_closed:>9.0f}"
            )
    print(f"speed ratio exact/closed: min {min(ratios):.0f}, max {max(ratios):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

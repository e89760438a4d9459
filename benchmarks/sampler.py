"""The Poisson sampler's cost per step: one uniform per row (the draw before 0.2, and Opacus') vs geometric gaps.

For one rank of 4 with an expected global batch of 1,024 rows (and N = 10⁸ at p = 10⁻⁵), prints the milliseconds per
step of the O(N) draw (``rng.random(N) < p``, then the rank's residue class, as ``sampling.global_mask`` did), of the
O(batch) draw now in use (``PoissonBatchSampler.local_batch``, seeded and secure), their ratio, and the peak memory
of one draw (tracemalloc). Run: ``python benchmarks/sampler.py --output benchmarks/results/sampler.txt``.
"""

from __future__ import annotations

import argparse
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np

from lightning_privacy.dpsgd.sampling import PoissonBatchSampler

CASES = [(10**6, 1024 / 10**6), (10**7, 1024 / 10**7), (5 * 10**7, 1024 / (5 * 10**7)), (10**8, 1e-5)]
RANK, WORLD = 1, 4


def _old_draw(seed: int, step: int, n: int, p: float) -> list:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(step,))))
    rows = np.arange(RANK, n, WORLD)
    return rows[(rng.random(n) < p)[rows]].tolist()


def _timed(draw, repeats: int) -> tuple[float, float]:
    draw(0)  # warm up
    start = time.perf_counter()
    for step in range(1, repeats + 1):
        draw(step)
    per_step = (time.perf_counter() - start) / repeats * 1e3
    tracemalloc.start()
    draw(repeats + 1)
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return per_step, peak


def main() -> str:
    lines = [
        f"Poisson sampler, one rank of {WORLD}: ms per step (peak MB of one draw); "
        f"{platform.processor() or platform.machine()}, numpy {np.__version__}",
        f"{'N':>12} {'p':>10} {'O(N) draw':>18} {'gaps, seeded':>18} {'gaps, secure':>18} {'O(N) / gaps':>12}",
    ]
    for n, p in CASES:
        seeded = PoissonBatchSampler(num_samples=n, sample_rate=p, steps=1, seed=3, rank=RANK, world_size=WORLD)
        secure = PoissonBatchSampler(num_samples=n, sample_rate=p, steps=1, secure=True, rank=RANK, world_size=WORLD)
        old = _timed(lambda t, n=n, p=p: _old_draw(3, t, n, p), 3 if n >= 5 * 10**7 else 10)
        new = _timed(seeded.local_batch, 200)
        sec = _timed(secure.local_batch, 200)
        lines.append(
            f"{n:>12,} {p:>10.3g} {old[0]:>9.2f} ({old[1]:>5.0f}) {new[0]:>9.3f} ({new[1]:>5.2f}) "
            f"{sec[0]:>9.3f} ({sec[1]:>5.2f}) {old[0] / new[0]:>11.0f}×"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="write the table here too")
    args = parser.parse_args()
    table = main()
    print(table, end="")
    if args.output is not None:
        args.output.write_text(table, encoding="utf-8")

"""How fine the sensitivity levels of the safe β*_AI must be, and what they cost (issue 14).

The safe β*_AI (:class:`~lightning_privacy.attribute_ledger.AttributeLedger`, logged by
``AttributeInferenceMonitor``) rounds each R_t/(2C) *up* onto levels 2^(−k/n) (n levels per factor of two) and
composes each epoch's steps level by level onto a pessimistic PLD. Finer levels move β*_AI less but give more
distinct levels per epoch, each needing its own one-step distribution (cached) and self-composition.

At the Adult reproduction's mechanism (p = 1/107, σ = 3.4435, 107 steps per epoch, 30 epochs; R_t drawn uniformly
from [0.9, 1.4]·C, the span of the example's exact and approximate diameters) this prints, for n = 8 … 256:

- β*_AI rounded up (the safe value) and its distance to the unrounded value (every R_t its own level: the exact
  value of the same PLD grid, computed once, slowly);
- distinct levels per epoch, the first epoch's cost (cold caches) and the median per-epoch cost after it.

Usage::

    python benchmarks/ai_bayes_security_levels.py          # ~1-2 min on one core
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.analysis import composition
from lightning_privacy.analysis.composition import ComposedPLD

P, SIGMA, STEPS_PER_EPOCH, EPOCHS = 1 / 107, 3.4435, 107, 30


def _clear_caches() -> None:
    """Cold start for each grid (the one-step and power caches are module-level; benchmark-only access)."""
    composition._STEPS.data.clear()
    composition._POWERS.data.clear()


def _levels(per_octave: int) -> np.ndarray:
    return np.exp2(-np.arange(16 * per_octave, -1, -1) / per_octave)


def _run(rs: np.ndarray, levels: np.ndarray):
    """Per-epoch composition as the ledger does it; returns (β*, per-epoch seconds, levels per epoch)."""
    _clear_caches()
    pld, seconds, counts = ComposedPLD(), [], []
    for epoch in rs:
        start = time.perf_counter()
        values, steps = bs.sensitivity_levels(epoch, max_grad_norm=1.0, levels=levels)
        pld.compose(sample_rate=P, noise_multiplier=SIGMA, steps=steps, sensitivity=values)
        pld.bayes_security()
        seconds.append(time.perf_counter() - start)
        counts.append(len(values))
    return pld.bayes_security(), seconds, counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rs = np.random.default_rng(args.seed).uniform(0.9, 1.4, size=(EPOCHS, STEPS_PER_EPOCH))
    interval = composition.default_value_discretization_interval(sample_rate=P, noise_multiplier=SIGMA)

    start = time.perf_counter()
    unrounded = np.unique(np.append(rs.ravel() / 2.0, 1.0))  # every R_t/(2C) is a level: nothing is rounded
    reference = bs.ai_bayes_security_exact(
        sample_rate=P,
        noise_multiplier=SIGMA,
        max_grad_norm=1.0,
        sensitivities=rs.ravel(),
        levels=unrounded,
        value_discretization_interval=interval,
    )
    print(
        f"p = {P:.5f}, σ = {SIGMA}, {EPOCHS} epochs × {STEPS_PER_EPOCH} steps, R_t ~ U[0.9, 1.4]·C; PLD grid {interval:g}"
    )
    print(
        f"unrounded (every R_t its own level, {unrounded.size} levels): β*_AI = {reference:.6f} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    closed = bs.ai_bayes_security(sample_rate=P, noise_multiplier=SIGMA, max_grad_norm=1.0, sensitivities=rs.ravel())
    print(f"closed form (Cor. 10): {closed:.6f}\n")
    print(
        "| levels per octave | β*_AI rounded up | unrounded − rounded | levels per epoch (median) | first epoch | "
        "later epochs (median) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for per_octave in (8, 16, 32, 64, 128, 256):
        value, seconds, counts = _run(rs, _levels(per_octave))
        assert value <= reference + 1e-9  # rounding up never raises β*
        print(
            f"| {per_octave} | {value:.6f} | {reference - value:.1e} | {statistics.median(counts):.0f} | "
            f"{1e3 * seconds[0]:.0f} ms | {1e3 * statistics.median(seconds[1:]):.1f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

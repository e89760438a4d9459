"""Every one-run estimator on the same canary scores: how much of ε one DP-SGD run shows (issue 50).

The white-box gradient canaries of ``CanaryAudit("gradient")`` (Dirac canaries on distinct coordinates, added
before the noise, scored by the released noisy sum minus the batch's own clipped sum) are scored two ways from the
same run: the default summed score Σ_t y_t and the likelihood-ratio score Σ_t log[(1 − p) + p·exp((y_t·C − C²/2) /
(σC)²)] (``CanaryAudit(score="likelihood_ratio")``: the Neyman–Pearson test of one step, summed over the independent
steps). Each score feeds every estimator of the package, from the same scores and bits:

Valid for every (ε, δ)-DP mechanism (issue 56):

- ``binomial``: Steinke, Nasr, Jagielski (2023), right yes/no guesses (top-k₊ "in", bottom-k₋ "out", abstaining on
  the rest), Bonferroni over the guess grid — however canaries interact;
- ``fdp``: Mahloujifar et al.'s f-DP test of the same guesses against the (ε, δ) trade-off curve;
- ``orderstat``: order statistics of the included vs excluded scores (after Xiang et al., arXiv 2509.08704) read
  through the (ε, δ) curve: needs canaries independent given their bits, which these canaries are;
- ``headline``: the largest of fdp and orderstat at the shares of α the audit fixes for independent canaries (0.9,
  0.1: ``INDEPENDENT_WEIGHTS``) — what the audit logs as ``audit/canary_epsilon_lower_tightest`` and its summary's
  first number.

Gaussian readings (μ read as ε through the Gaussian curve: lower bounds only if the mechanism is μ-GDP, which DP-SGD's
canaries are only approximately):

- ``gdp reading``: Mahloujifar et al.'s Gaussian f-DP test; ``orderstat reading``: the order statistics' μ;
- ``gauss``: the Gaussian score model (after "Let's Ask Gauss", arXiv 2606.12733): a model's estimate, *not* a bound;
- ``Gaussian tightest``: binomial, gdp and orderstat readings at 0.05, 0.05, 0.9 of α — the headline before issue 56,
  to show what the sound headline gives up on these (approximately Gaussian) canaries.

Two sources of scores, each ÷ the accountant's ε at δ = 1e-5 (the certified PLD upper bound of the same run):

1. **Simulated DP-SGD canaries** (no training): each canary is in each of T = 300 steps with probability p = 0.1
   if included, and every step adds N(0, σ²C²) — what a correct DP-SGD gives these canaries. σ is solved for
   ε ∈ {2, 4, 8}; m ∈ {1000, 10⁴}; ``--sim-seeds`` seeds (median and [min, max]).
2. **Trained**: the Adult MLP (104-64-32-2, SGD lr 0.5, C = 1, Poisson p = 0.1, 30 epochs = 300 steps) with
   ``DPSGD`` at the same σ and ``CanaryAudit("gradient")`` with its default 1,000 canaries at ε ≈ 4
   (``--seeds`` seeds), and a wider MLP (104-128-64-2, 21.8 k coordinates) with 10⁴ canaries at ε ∈ {2, 4, 8}.

The goals of issue 50 are read off the tables and printed at the end, for the sound headline: ≥ 0.5 of ε with the
default canaries at ε ≈ 4 (trained), ≥ 0.6 of ε at m = 10⁴ for ε ∈ {2, 4, 8}. With m canaries the guess-based bounds
are capped whatever the mechanism (printed as "ceiling").

    python benchmarks/canary_estimators.py [--sim-seeds 50] [--seeds 6] [--workers 2] [--no-trained] \
        > benchmarks/results/canary_estimators.md

Progress goes to stderr, the tables to stdout. The simulations run in ``--workers`` processes.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from functools import cache, lru_cache
from typing import Dict, List, Sequence

import numpy as np
import torch

from lightning_privacy import CanaryAudit, names
from lightning_privacy.analysis.canary import guess_grid, max_epsilon_lower
from lightning_privacy.analysis.canary_fdp import tightest_canary_bound
from lightning_privacy.audits.canary import audit_canaries
from lightning_privacy.claims import Claim
from lightning_privacy.ledger import PrivacyLedger

DELTA, ALPHA, CLIP, LR, RATE, EPOCHS = 1e-5, 0.05, 1.0, 0.5, 0.1, 30
STEPS = round(EPOCHS / RATE)
TARGETS = (2.0, 4.0, 8.0)
SIZES = (1000, 10_000)
SOUND = ("binomial", "fdp", "orderstat", "headline")
READINGS = ("gdp reading", "orderstat reading", "gauss", "Gaussian tightest")
ESTIMATORS = SOUND + READINGS
KEYS = {
    "binomial": names.CANARY_EPSILON_LOWER,
    "fdp": names.CANARY_EPSILON_LOWER_FDP,
    "orderstat": names.CANARY_EPSILON_LOWER_ORDERSTAT,
    "headline": names.CANARY_EPSILON_LOWER_TIGHTEST,
    "gdp reading": names.CANARY_EPSILON_GDP_GAUSSIAN_READING,
    "orderstat reading": names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING,
    "gauss": names.CANARY_EPSILON_GAUSS,
}
#: the headline before issue 56: Gaussian readings at the shares it gave them
GAUSSIAN_TIGHTEST = {"binomial": 0.05, "gdp": 0.05, "orderstat_gaussian": 0.9}
SCORES = ("summed", "likelihood ratio")


def accountant_epsilon(sigma: float) -> float:
    return Claim.dp_sgd(noise_multiplier=sigma, sample_rate=RATE, steps=STEPS, delta=DELTA).epsilon


@cache
def sigma_for(epsilon: float) -> float:
    """σ whose accountant ε at δ is at most ``epsilon`` (p = RATE, STEPS steps): the ledger's own calibration, as DPSGD
    plans it (rounded up to 1e-4)."""
    return PrivacyLedger.calibrate(sample_rate=RATE, steps=STEPS, target_epsilon=epsilon, delta=DELTA)


def likelihood_ratio(y: np.ndarray, sigma: float, rate: float) -> np.ndarray:
    """Each step's log-likelihood ratio, included vs excluded, of y = released − batch (units of C), summed."""
    z = (y * CLIP - CLIP**2 / 2) / (sigma * CLIP) ** 2
    return np.logaddexp(np.log1p(-rate), np.log(rate) + z).sum(axis=-1)


def bounds(scores: np.ndarray, included: np.ndarray, seed: int) -> Dict[str, object]:
    """Every estimator's value from the same scores (the audit's own call, independent canaries)."""
    result = audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, seed=seed, independent=True)
    out: Dict[str, object] = {name: result.values[key] for name, key in KEYS.items()}
    out["headline test"] = result.tightest.method
    assert result.tightest.sound
    before = tightest_canary_bound(  # the headline before issue 56 (Gaussian readings), on the same scores
        scores=scores, included=included, delta=DELTA, alpha=ALPHA, methods=tuple(GAUSSIAN_TIGHTEST),
        weights=GAUSSIAN_TIGHTEST, seed=seed,
    )  # fmt: skip
    out["Gaussian tightest"] = before.epsilon_lower
    return out


def simulated(epsilon: float, m: int, seed: int) -> Dict[str, Dict[str, object]]:
    """Both scores of m simulated DP-SGD gradient canaries at the σ of ``epsilon``."""
    sigma = sigma_for(epsilon)
    rng = np.random.default_rng([seed, m, int(epsilon * 100)])
    included = rng.random(m) < 0.5
    y = np.empty((m, STEPS))
    for lo in range(0, m, 2000):  # in blocks: 10⁴ × 300 draws at once is fine, but keep the peak small
        hi = min(m, lo + 2000)
        sampled = rng.random((hi - lo, STEPS)) < RATE
        y[lo:hi] = (sampled & included[lo:hi, None]) + sigma * rng.standard_normal((hi - lo, STEPS))
    return {
        "summed": bounds(y.sum(axis=1), included, seed),
        "likelihood ratio": bounds(likelihood_ratio(y, sigma, RATE), included, seed),
    }


# ---------------------------------------------------------------------------------------------------- trained
class TwoScores(CanaryAudit):
    """The default summed score, and each step's likelihood ratio of the same y_t kept beside it."""

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.ratio = np.zeros(self.num_canaries)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        scored = self._pending is not None  # a DP step released a gradient this batch
        before = self.scores.copy()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if scored:  # y_t = released − batch at the canaries, in units of C = 1
            y = self.scores - before
            self.ratio += likelihood_ratio(y[:, None], self._dpsgd.noise_multiplier, self._sample_rate)


def trained(epsilon: float, m: int, hidden: Sequence[int], seed: int) -> Dict[str, Dict[str, object]]:
    """One DP-SGD fit of the Adult MLP with m gradient canaries; both scores' estimators from that one run."""
    import warnings

    import lightning.pytorch as pl
    from canary_audit import _trainer  # the reproduction's own Trainer settings

    from lightning_privacy import DPSGD
    from lightning_privacy.models import TabularMLP

    sigma = sigma_for(epsilon)
    dm = _adult()
    pl.seed_everything(seed, verbose=False)
    dp = DPSGD(noise_multiplier=sigma, max_grad_norm=CLIP, delta=DELTA, sampling_seed=seed, noise_seed=seed)
    audit = TwoScores("gradient", num_canaries=m, seed=seed, alpha=ALPHA, delta=DELTA)
    trainer = _trainer([dp, audit], EPOCHS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TabularMLP(dm.num_features, hidden=tuple(hidden), lr=LR), datamodule=dm)
    assert dp.steps == STEPS and abs(dp.sample_rate - RATE) < 1e-12, (dp.steps, dp.sample_rate)
    assert abs(dp.epsilon(DELTA) - epsilon) < 0.01 * epsilon, (dp.epsilon(DELTA), epsilon)
    summed = bounds(audit.scores, audit.included, seed)
    # the audit's own logged headline is the summed score's (its default): the same call, the same number
    assert summed["headline"] == audit.results[names.CANARY_EPSILON_LOWER_TIGHTEST]
    return {"summed": summed, "likelihood ratio": bounds(audit.ratio, audit.included, seed)}


@lru_cache(maxsize=1)
def _adult():
    from canary_audit import _adult as adult  # the reproduction's own Adult set-up, batch ⌈n·p⌉

    return adult(math.ceil(len(adult(256).train_dataset) * RATE))


# ----------------------------------------------------------------------------------------------------- tables
def _cell(values: List[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def table(rows: List[tuple]) -> List[str]:
    """rows: (ε, m, score, [bounds per seed]); cells are bound ÷ ε (median [min, max] over seeds)."""
    lines = [
        "| accountant ε | σ | m | score | "
        + " | ".join(ESTIMATORS)
        + " | headline's test | ceiling ÷ ε (binomial / fdp) |",
        "|" + "---|" * (len(ESTIMATORS) + 6),
    ]
    for epsilon, m, score, runs in rows:
        cells = [_cell([r[e] / epsilon for r in runs]) for e in ESTIMATORS]
        tests = sorted({str(r["headline test"]) for r in runs})
        lines.append(
            f"| {epsilon:g} | {sigma_for(epsilon):.3f} | {m} | {score} | "
            + " | ".join(cells)
            + f" | {', '.join(tests)} | "
            f"{ceiling(m, 'binomial') / epsilon:.2f} / {ceiling(m, 'fdp') / epsilon:.2f} |"
        )
    return lines


@cache
def ceiling(m: int, method: str) -> float:
    """The largest bound the guess-based test can give with m canaries (every guess right), Bonferroni'd."""
    return max_epsilon_lower(num_canaries=m, alpha=ALPHA / len(guess_grid(m)), delta=DELTA, method=method)


def goals(sim: List[tuple], real: List[tuple]) -> List[str]:
    """The issue's goals, each read from the rows above (the sound headline, median over seeds)."""

    def best(rows, epsilon, m):
        found = [
            (statistics.median(r["headline"] / e for r in runs), score)
            for e, mm, score, runs in rows
            if e == epsilon and mm == m
        ]
        return max(found) if found else None

    out = []
    default = best(real, 4.0, 1000)
    if default is not None:
        out.append(
            f"- trained, default 1000 canaries, ε = 4: headline ÷ ε = {default[0]:.3f} ({default[1]} score); goal ≥ 0.5: "
            f"{'met' if default[0] >= 0.5 else 'not met'}"
        )
    for source, rows in (("trained", real), ("simulated", sim)):
        for epsilon in TARGETS:
            found = best(rows, epsilon, 10_000)
            if found is not None:
                out.append(
                    f"- {source}, m = 10⁴, ε = {epsilon:g}: headline ÷ ε = {found[0]:.3f} ({found[1]} score); goal ≥ 0.6: "
                    f"{'met' if found[0] >= 0.6 else 'not met'}"
                )
    return out


def _simulated(task: tuple) -> Dict[str, Dict[str, object]]:
    return simulated(*task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sim-seeds", type=int, default=50, help="seeds of each simulated cell (≥ 50: a stable median)"
    )
    parser.add_argument("--seeds", type=int, default=6, help="seeds of the trained ε ≈ 4, m = 1000 run")
    parser.add_argument("--workers", type=int, default=2, help="processes for the simulations")
    parser.add_argument("--no-trained", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()

    sim = []
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for epsilon in TARGETS:
            for m in SIZES:
                start = time.perf_counter()
                tasks = [(epsilon, m, seed) for seed in range(args.sim_seeds)]
                runs = list(pool.map(_simulated, tasks))
                print(
                    f"simulated ε = {epsilon:g}, m = {m}: {time.perf_counter() - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                sim += [(epsilon, m, score, [r[score] for r in runs]) for score in SCORES]

    real = []
    if not args.no_trained:
        torch.set_num_threads(1)
        plan = [(4.0, 1000, (64, 32), seed) for seed in range(args.seeds)]
        plan += [(epsilon, 10_000, (128, 64), 0) for epsilon in TARGETS]
        done: Dict[tuple, list] = {}
        for epsilon, m, hidden, seed in plan:
            start = time.perf_counter()
            done.setdefault((epsilon, m), []).append(trained(epsilon, m, hidden, seed))
            print(
                f"trained ε = {epsilon:g}, m = {m}, MLP {hidden}, seed {seed}: {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        real = [(e, m, score, [r[score] for r in runs]) for (e, m), runs in done.items() for score in SCORES]

    print(
        f"\nOne-run ε lower bounds ÷ the accountant's ε (δ = {DELTA:g}, α = {ALPHA}); DP-SGD with C = 1, p = {RATE}, "
        f"T = {STEPS} steps, σ solved for ε. Each cell: bound ÷ ε, median [min, max] over seeds. Valid for every (ε, "
        "δ)-DP mechanism: binomial, fdp (the f-DP test of the (ε, δ) curve), orderstat (read through the (ε, δ) curve) "
        "and the headline, the largest of fdp and orderstat at 0.9·α and 0.1·α (what the audit logs and prints first). "
        "Gaussian readings (lower bounds only if the mechanism is μ-GDP): gdp reading, orderstat reading, gauss (a "
        "model's estimate, not a bound) and 'Gaussian tightest', the headline before issue 56 (binomial, gdp and "
        "orderstat readings at 0.05·α, 0.05·α, 0.9·α).\n"
    )
    print(f"**Simulated DP-SGD gradient canaries** ({args.sim_seeds} seeds)\n")
    print("\n".join(table(sim)))
    if real:
        print(
            f"\n**Trained: Adult MLP with CanaryAudit('gradient')** (m = 1000: 104-64-32-2, {args.seeds} seeds; "
            "m = 10⁴: 104-128-64-2, seed 0; both scores from the same run)\n"
        )
        print("\n".join(table(real)))
    print("\n**Goals (issue 50)**\n")
    print("\n".join(goals(sim, real)))
    print(
        f"\n<!-- written by benchmarks/canary_estimators.py in {(time.perf_counter() - started) / 60:.1f} min, "
        f"{datetime.date.today()}, torch {torch.__version__}, 1 thread -->"
    )


if __name__ == "__main__":
    main()

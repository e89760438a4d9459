"""Which Adult rows does a logistic regression expose, and which ε is worth trying?

LeBlond et al. (2023) on Adult's 6 numeric columns: train an L2-regularised logistic regression to its
optimum in Lightning, release it with ε-DP output perturbation, and let PrivacyProfileAudit rank the
training rows by privacy loss |l(x, y_i, M)| for the released model M and sweep ε to find the three
regimes of the typical profile (low-ε plateau, transition, high-ε plateau). Everything is logged to
TensorBoard (scalars, histogram of |l|, table of the most exposed rows, the transition figure).

Run:  python examples/adult_privacy_profile.py [--epsilon 100] [--logdir lightning_logs]
      python examples/adult_privacy_profile.py --output benchmarks/results/adult_privacy_profile.md
      tensorboard --logdir lightning_logs      (IMAGES: audit/profile_transition; TEXT: audit/profile_top_rows)
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import OutputPerturbation, PrivacyProfileAudit
from lightning_privacy.analysis.privacy_profile import UnitBallScaler
from lightning_privacy.data import load_adult
from lightning_privacy.data.adult import NUMERIC
from lightning_privacy.models import LogisticRegressionModule

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _sci(value: float) -> str:
    """``9.54·10⁻⁶``: the docs' notation, 3 significant digits."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}·10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def regime(fraction: float, tolerance: float) -> str:
    if fraction <= tolerance:
        return "low-ε plateau (all achievable privacy reached)"
    if fraction >= 1 - tolerance:
        return "high-ε plateau (no privacy gained by lowering ε here)"
    return "transition"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=100.0, help="ε of the released model")
    parser.add_argument("--regularization", type=float, default=1.0, help="Λ (the paper uses 1)")
    parser.add_argument("--num-samples", type=int, default=128, help="model points per ε (Monte Carlo)")
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output", default=None, help="write the published Markdown table to this file (benchmarks/results/...md)"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    warnings.filterwarnings("ignore", ".*val_dataloader.*|.*LeafSpec.*")

    table = load_adult("train")
    x = UnitBallScaler.fit(table.numeric).transform(table.numeric)  # standardise, then ‖x_i‖ ≤ 1
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(table.labels)), batch_size=len(x))

    model = LogisticRegressionModule(x.shape[1], regularization=args.regularization)
    perturbation = OutputPerturbation(epsilon=args.epsilon, seed=args.seed)
    audit = PrivacyProfileAudit(
        top_k=10,
        feature_names=list(NUMERIC),
        row_features=table.numeric,
        num_samples=args.num_samples,
        seed=args.seed,
    )
    logger = TensorBoardLogger(args.logdir, name="adult_privacy_profile")
    trainer = pl.Trainer(
        max_epochs=2,
        logger=logger,
        callbacks=[perturbation, audit],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, loader)  # full batch: each step is a full L-BFGS run

    ta = audit.transition
    print(
        f"\nn = {len(x)}, Λ = {args.regularization:g}, ‖∇J(A(x))‖ = {audit.gradient_norm:.1e}, "
        f"bound on the A_wc error = {audit.approximation_bound:.2e}"
    )
    print(
        f"released model: ε = {args.epsilon:g} (β = {perturbation.beta:.4g}), "
        f"‖M − A(x)‖ = {np.linalg.norm(perturbation.noise):.2e}"
    )
    print("\nMost exposed training rows for the released model (raw values):")
    print(f"{'rank':>4} {'row':>6} {'|l|':>9} " + " ".join(f"{c:>14}" for c in NUMERIC))
    for r, row in enumerate(audit.top_rows, 1):
        print(f"{r:>4} {row['row']:>6} {row['loss']:>9.3g} " + " ".join(f"{row[c]:>14.6g}" for c in NUMERIC))

    top = int(np.argmax(ta.quantiles))
    fraction = (ta.curves[top] - ta.low_plateau[top]) / (ta.high_plateau[top] - ta.low_plateau[top])
    print(
        f"\nTypical profile of the most exposed rank, mean|l|/β across ε "
        f"(plateaus {ta.low_plateau[top]:.3g} and {ta.high_plateau[top]:.3g}):"
    )
    for eps, value, frac in list(zip(ta.epsilons, ta.curves[top], fraction))[::4]:
        print(f"  ε = {eps:10.3g}   mean|l|/β = {value:.3e}   {regime(frac, ta.tolerance)}")
    print("\nOnsets per tracked rank quantile (low-ε plateau ends / high-ε plateau starts):")
    for q, lo, hi in zip(ta.quantiles, ta.low_onsets, ta.high_onsets):
        print(f"  quantile {q:<5g} ε_low = {lo:10.4g}   ε_high = {hi:10.4g}")
    print(f"\nRecommended ε range worth trying: [{ta.epsilon_low:.3g}, {ta.epsilon_high:.3g}]")
    print(f"TensorBoard logs: {logger.log_dir}")
    if args.output:
        lines = [
            "| tracked rank | low-plateau onset ε (end of the low plateau) | high-plateau onset ε | "
            "mean\\|l\\|/β: low → high plateau |",
            "|---|---|---|---|",
        ]
        for i, (q, lo, hi) in enumerate(zip(ta.quantiles, ta.low_onsets, ta.high_onsets)):
            label = "most exposed row" if i == top else f"quantile {q:g}"
            lines.append(
                f"| {label} | {lo:,.3g} | {hi:,.4g} | {_sci(ta.low_plateau[i])} → {_sci(ta.high_plateau[i])} |"
            )
        lines += [
            "",
            f"**Recommended ε range on this dataset: [{ta.epsilon_low:.3g}, {_sci(ta.epsilon_high)}]**. Adult train, "
            f"n = {len(x):,}, the 6 numeric columns; released model ε = {args.epsilon:g}, Λ = {args.regularization:g}, "
            f"{args.num_samples} model samples per ε, tolerance {100 * ta.tolerance:g} % of the plateau gap, "
            f"seed {args.seed}. Written by `{shlex.join(['python', 'examples/adult_privacy_profile.py', *sys.argv[1:]])}` "
            f"in {time.perf_counter() - began:.0f} s (torch {torch.__version__}, Python {platform.python_version()}).",
        ]
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

"""Theory vs practice in one training run: the accountant's ε beside an empirical ε lower bound from canaries.

An unchanged ``TabularMLP`` is trained on Adult with

- ``DPSGD(target_epsilon=--epsilon, epochs=--epochs)``: σ planned so that the accountant's ε at δ = 1e-5 is
  still ≤ the target after ``--epochs`` epochs (as Opacus' ``get_noise_multiplier``);
- ``PrivacyBudgetStopping(max_epsilon=--epsilon)``: stops before the step that would exceed it;
- ``BayesSecurityMonitor``: the safe β*_MIA and tight TPR bounds every epoch;
- ``CanaryAudit("gradient")``: ``--canaries`` Dirac gradient canaries added before DP-SGD's noise, each
  included with probability 1/2 — at the end, a statistically valid lower bound on the ε this run really has
  (Steinke, Nasr, Jagielski 2023), next to the accountant's upper bound;
- ``EpsilonStarAudit``: the loss-threshold attack's view of the same model (an estimate, not a bound).

The batch is large (n/10: p ≈ 0.1) because one-run audits need many steps at a high sample rate to have power;
with ε = 8 over 10 epochs the canary bound lands well inside [0, ε]. It prints the numbers, and TensorBoard gets
the "theory vs practice" figure (``audit/canary_theory_vs_practice``) and the privacy report.

Run:  OMP_NUM_THREADS=1 python examples/adult_canary_audit.py [--epsilon 8] [--epochs 10] [--canaries 1000]
      tensorboard --logdir lightning_logs
"""

from __future__ import annotations

import argparse
import math
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_privacy import (
    DPSGD,
    BayesSecurityMonitor,
    CanaryAudit,
    EpsilonStarAudit,
    PrivacyBudgetStopping,
    names,
)
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP
from lightning_privacy.report import log_privacy_report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=8.0, help="ε budget at δ = 1e-5 (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs σ is planned for (default: %(default)s)")
    parser.add_argument("--canaries", type=int, default=1000, help="gradient canaries m (default: %(default)s)")
    parser.add_argument("--logdir", default="lightning_logs", help="TensorBoard logs (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.epsilon > 0 or args.epochs < 1 or args.canaries < 1:
        parser.error("--epsilon must be > 0, --epochs and --canaries >= 1")
    warnings.filterwarnings("ignore", ".*LeafSpec.*|.*does not have many workers.*|.*Secure RNG.*|.*backward hook.*")
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)

    probe = AdultDataModule()
    probe.setup("fit")
    dm = AdultDataModule(batch_size=math.ceil(len(probe.train_dataset) / 10), seed=args.seed)
    dm.setup("fit")
    dpsgd = DPSGD(target_epsilon=args.epsilon, epochs=args.epochs, max_grad_norm=1.0, delta=1e-5)
    canaries = CanaryAudit("gradient", num_canaries=args.canaries, seed=args.seed)
    star = EpsilonStarAudit()
    logger = TensorBoardLogger(args.logdir, name="adult_canary_audit")
    trainer = pl.Trainer(
        max_epochs=args.epochs + 1,  # one more than planned: the budget stopper ends the run
        callbacks=[dpsgd, BayesSecurityMonitor(), PrivacyBudgetStopping(max_epsilon=args.epsilon), canaries, star],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(TabularMLP(dm.num_features, hidden=(64, 32), lr=0.5), datamodule=dm)
    out = {
        "noise_multiplier": dpsgd.noise_multiplier,
        "steps": dpsgd.steps,
        "accountant_epsilon": dpsgd.epsilon(),
        "canary_epsilon_lower_tightest": canaries.results[names.CANARY_EPSILON_LOWER_TIGHTEST],
        "canary_epsilon_lower": canaries.results[names.CANARY_EPSILON_LOWER],
        "canary_epsilon_gdp_gaussian_reading": canaries.results[names.CANARY_EPSILON_GDP_GAUSSIAN_READING],
        "canary_ceiling": canaries.results[names.CANARY_EPSILON_LOWER_MAX],
        "epsilon_star": star.results[names.EPSILON_STAR],
        "mia_bayes_security": float(trainer.callback_metrics[names.MIA_BAYES_SECURITY]),
    }
    print(f"\nσ = {out['noise_multiplier']:.4f}, {out['steps']} steps at p = {dpsgd.sample_rate:.4f}")
    print(f"accountant ε (upper bound, δ = 1e-5)   {out['accountant_epsilon']:.3f}  (budget {args.epsilon:g})")
    print(f"canary ε lower bound (any mechanism)   {out['canary_epsilon_lower_tightest']:.3f}")
    print(f"canary ε lower bound, binomial         {out['canary_epsilon_lower']:.3f}")
    print(f"canary ε, Gaussian reading (if μ-GDP)  {out['canary_epsilon_gdp_gaussian_reading']:.3f}")
    print(f"largest bound {args.canaries} canaries can give     {out['canary_ceiling']:.3f}")
    print(f"Epsilon* (estimate, not a bound)       {out['epsilon_star']:.3f}")
    print(f"β*_MIA (safe)                          {out['mia_bayes_security']:.4f}")
    report = f"{logger.log_dir}/privacy_report.md"
    log_privacy_report(trainer, report)
    print(f"privacy report: {report}\nTensorBoard:    tensorboard --logdir {args.logdir}")
    return out


if __name__ == "__main__":
    main()

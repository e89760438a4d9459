"""Seeded DP-SGD fits, their final weights and privacy numbers saved or compared bit for bit.

A refactor of the DP-SGD engine must not change what a seeded fit computes. Run it before the change with
``--save``, after it with ``--compare`` on the saved file: every configuration's weights, ε, steps and the logged
privacy metrics must be equal (``torch.equal``, no tolerance).

    python benchmarks/same_weights.py --save /tmp/before.pt       # on the commit before the change (~1 min)
    python benchmarks/same_weights.py --compare /tmp/before.pt    # after it: "bit for bit" per configuration

Configurations: hooks mode (reduced loss), ghost mode with book-keeping, ghost mode with two passes (a GRU,
``fix_modules``), the gradient canaries of a ``CanaryAudit`` and the attribute monitor's telemetry beside hooks mode,
a LoRA-style frozen backbone, and a Hugging Face Llama with LoRA at one row per step (empty batches).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_privacy import DPSGD, BayesSecurityMonitor, CanaryAudit  # noqa: E402
from tests._user_models import Data, Net  # noqa: E402

CONFIGS = {
    "hooks-attention": dict(kind="attention", mode="hooks", fix=True),
    "ghost-bookkeeping-lora": dict(kind="lora", mode="ghost", tokens=False),
    "ghost-two-pass-gru": dict(kind="gru", mode="ghost", fix=True),
    "hooks-canaries-batchnorm": dict(kind="batchnorm", mode="hooks", tokens=False, fix=True, canary=True),
    "llama-lora-one-row": dict(kind="llama", mode="ghost"),
}


class PerExample(Net):
    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}


def _fit(name: str, kind: str, mode: str, tokens: bool = True, fix: bool = False, canary: bool = False) -> Dict:
    pl.seed_everything(0)
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=7, noise_seed=11, fix_modules=fix)
    callbacks: List[Any] = [dpsgd, BayesSecurityMonitor()]
    if canary:
        callbacks.append(CanaryAudit(seed=3))
    if kind == "llama":
        from tests.callbacks._language_models import PaddedSequences, TinyCausalLM

        model, data = TinyCausalLM("llama", lora=True), dict(train_dataloaders=DataLoader(PaddedSequences(16)))
    else:
        model = (PerExample if mode == "ghost" else Net)(kind=kind)
        data = dict(datamodule=Data(tokens=tokens, batch_size=16))
    trainer = pl.Trainer(
        max_epochs=2, callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", deterministic=True,
    )  # fmt: skip
    trainer.fit(model, **data)
    metrics = {k: v.detach().clone() for k, v in trainer.callback_metrics.items() if k.startswith(("dp/", "mia/"))}
    return {
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]),
        "epsilon": dpsgd.epsilon(),
        "steps": dpsgd.steps,
        "metrics": metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path)
    group.add_argument("--compare", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = {name: _fit(name, **config) for name, config in CONFIGS.items()}
    if args.save:
        torch.save(runs, args.save)
        print(f"saved {len(runs)} fits to {args.save}")
        return
    before = torch.load(args.compare, weights_only=False)
    failed = []
    for name, run in runs.items():
        old = before[name]
        same = (
            torch.equal(run["weights"], old["weights"])
            and run["epsilon"] == old["epsilon"]
            and run["steps"] == old["steps"]
            and run["metrics"].keys() == old["metrics"].keys()
            and all(torch.equal(run["metrics"][k], old["metrics"][k]) for k in run["metrics"])
        )
        delta = float((run["weights"] - old["weights"]).abs().max())
        print(f"{name:28s} {'bit for bit' if same else f'DIFFERENT (max |Δw| {delta:.3g})'}")
        if not same:
            failed.append(name)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

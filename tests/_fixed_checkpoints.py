"""Checkpoints of :mod:`tests._user_models` trained two steps with ``DPSGD(fix_modules=True)`` on CPU."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from lightning_privacy import DPSGD
from tests._user_models import Data, Net
from tests.callbacks._tiny import trainer as tiny_trainer

N_TRAIN = 96  # not Data's default (64): the audit must take it from the checkpoint


def train_fixed(kind: str, folder: Path):
    """``(model, datamodule, checkpoint path)`` of ``Net(kind=kind)`` after two DP-SGD steps with fixed modules."""
    torch.manual_seed(0)
    model, dm = Net(kind=kind), Data(n_train=N_TRAIN, tokens=kind != "batchnorm")
    trainer = tiny_trainer([DPSGD(noise_multiplier=1.0, fix_modules=True, sampling_seed=0)], max_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DPSGD's list of replaced modules, Lightning's worker hints
        trainer.fit(model, datamodule=dm)
    path = folder / f"{kind}.ckpt"
    trainer.save_checkpoint(path)
    return model.eval(), dm, path


def without_record(path: Path, out: Path) -> Path:
    """The checkpoint as saved before DPSGD recorded the replaced modules and the training-set size."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    for state in checkpoint["callbacks"].values():
        state.pop("fixed_modules", None)
        state.pop("dataset_size", None)
    torch.save(checkpoint, out)
    return out

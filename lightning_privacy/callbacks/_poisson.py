"""Poisson sampling for Lightning's train loader.

Lightning has no public hook to replace the train dataloader whichever way it is supplied, so the swap
itself goes through :func:`lightning_privacy._compat.install_train_loader_transform` (the private-API
module, with the test that guards it); here the user's loader becomes Opacus' ``DPDataLoader``.
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader

from lightning_privacy import _compat


def install_poisson_sampling(trainer: pl.Trainer, callback: Any) -> None:
    """Make ``trainer`` draw its train batches by Poisson sampling (see module docstring)."""
    _compat.install_train_loader_transform(trainer, functools.partial(make_poisson_loader, trainer, callback))


def make_poisson_loader(trainer: pl.Trainer, callback: Any, loader: Any) -> DPDataLoader:
    """Convert one train loader; records (and checks) ``callback.sample_rate``."""
    if isinstance(loader, DPDataLoader):
        dp_loader = loader
    elif isinstance(loader, DataLoader):
        dp_loader = DPDataLoader.from_data_loader(loader, distributed=trainer.world_size > 1)
    else:
        raise MisconfigurationException(
            f"DPSGD needs a single torch DataLoader for training, got {type(loader).__name__}. Several train "
            "loaders (lists/dicts/CombinedLoader) cannot be Poisson-sampled as one dataset."
        )
    if callback.sample_rate is not None and abs(dp_loader.sample_rate - callback.sample_rate) > 1e-12:
        raise MisconfigurationException(
            f"The train loader changed its length between reloads (sample rate {callback.sample_rate:.6g} -> "
            f"{dp_loader.sample_rate:.6g}); DPSGD keeps one sample rate per run."
        )
    callback.sample_rate = float(dp_loader.sample_rate)
    return dp_loader

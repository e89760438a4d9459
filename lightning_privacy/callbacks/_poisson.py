"""Poisson sampling for Lightning's train loader — the one place that uses a private Lightning API.

Lightning has no public hook to replace the train dataloader whichever way it is supplied
(datamodule, ``LightningModule.train_dataloader`` or ``fit(train_dataloaders=...)``). All three end up
in ``trainer.fit_loop._data_source`` (a ``_DataLoaderSource``), which ``fit_loop.setup_data`` asks for
the loader after ``on_fit_start``. :func:`install_poisson_sampling` replaces that source by a subclass
whose ``dataloader()`` converts the user's loader with Opacus' ``DPDataLoader.from_data_loader``. If
Lightning changes this internal, installation fails loudly (tests/callbacks/test_dpsgd.py checks the swap for every loader source
and the failure).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader


@dataclasses.dataclass
class PoissonDataSource(_DataLoaderSource):
    """A train-data source that hands out Poisson-sampling versions of the original loaders."""

    original: _DataLoaderSource = None  # type: ignore[assignment]
    trainer: Any = None
    callback: Any = None

    def dataloader(self) -> DataLoader:
        return make_poisson_loader(self.trainer, self.callback, self.original.dataloader())


def install_poisson_sampling(trainer: pl.Trainer, callback: Any) -> None:
    """Make ``trainer`` draw its train batches by Poisson sampling (see module docstring)."""
    fit_loop = trainer.fit_loop
    source = getattr(fit_loop, "_data_source", None)
    if not isinstance(source, _DataLoaderSource):
        raise RuntimeError(
            "lightning_privacy could not find Lightning's train-data source (trainer.fit_loop._data_source); "
            f"this Lightning version ({pl.__version__}) is not supported by DPSGD's Poisson sampling."
        )
    if isinstance(source, PoissonDataSource):  # fit() called again with the same trainer
        source = source.original
    fit_loop._data_source = PoissonDataSource(
        instance=source.instance, name=source.name, original=source, trainer=trainer, callback=callback
    )


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

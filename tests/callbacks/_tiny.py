"""Tiny private-training fixtures shared by the foundation callback tests."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy.models import TabularMLP

N, D, BATCH = 256, 8, 32


def tiny_dataset(seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    return TensorDataset(x, (x[:, 0] + 0.3 * x[:, 1] > 0).long())


def tiny_loader(seed: int = 0) -> DataLoader:
    return DataLoader(tiny_dataset(seed), batch_size=BATCH, shuffle=True)


class TinyDataModule(pl.LightningDataModule):
    def train_dataloader(self):
        return tiny_loader()

    def val_dataloader(self):
        return DataLoader(tiny_dataset(1), batch_size=64)


class TinyWithLoader(TabularMLP):
    """Supplies its own train loader through the module hook."""

    def train_dataloader(self):
        return tiny_loader()


def tiny_module(**kwargs) -> TabularMLP:
    return TabularMLP(D, hidden=(16,), lr=0.5, **kwargs)


def trainer(callbacks, tmp_path=None, **kwargs) -> pl.Trainer:
    defaults = dict(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)

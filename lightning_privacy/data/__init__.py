"""Bundled datasets. ``AdultDataModule`` needs torch/lightning; the raw loader does not."""

from typing import Any

from lightning_privacy.data.adult import (
    AdultEncoder,
    AdultTable,
    NumericColumn,
    OneHotGroup,
    load_adult,
)

__all__ = ["AdultDataModule", "AdultEncoder", "AdultTable", "NumericColumn", "OneHotGroup", "load_adult"]


def __getattr__(name: str) -> Any:
    if name == "AdultDataModule":
        from lightning_privacy.data.datamodule import AdultDataModule

        return AdultDataModule
    raise AttributeError(f"module 'lightning_privacy.data' has no attribute {name!r}")

"""Adult as a LightningDataModule."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy.data.adult import AdultEncoder, AdultTable, load_adult, split_indices


class AdultDataModule(pl.LightningDataModule):
    """UCI Adult, cleaned and encoded (see :mod:`lightning_privacy.data.adult`).

    Splits: ``train`` and ``val`` come from ``adult.data`` — a fraction ``val_fraction`` of its 30,162
    clean rows (a seeded random permutation, default 10% = 3,016 rows) is held out as validation data,
    which never trains the model and so serves as non-member population data for audits; ``test`` is
    ``adult.test`` (15,060 rows). The encoder is fitted on the train split only.

    Batches are ``(features, label)``: float32 ``(B, 104)`` and int64 ``(B,)``.

    Args:
        path: folder with ``adult.data`` / ``adult.test`` (plain or gzip); ``None`` = bundled copy.
        batch_size: batch size of every loader (DP-SGD replaces the train loader by a Poisson one
            with this expected batch size).
        val_fraction: share of ``adult.data`` held out for validation, in ``[0, 1)``.
        seed: seed of the train/validation split.
        num_workers: DataLoader workers.

    Attributes:
        encoder: the fitted :class:`~lightning_privacy.data.adult.AdultEncoder`; its
            ``numeric_columns["age"]`` (input column 0) and ``one_hot_groups`` describe the inputs.
        train_table, val_table, test_table: the raw cleaned rows of each split.

    Example::

        >>> dm = AdultDataModule(batch_size=256)
        >>> dm.setup("fit")
        >>> len(dm.train_dataset), len(dm.val_dataset), dm.num_features
        (27146, 3016, 104)
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> tuple(x.shape), y.dtype
        ((256, 104), torch.int64)
        >>> dm.hparams  # saved: in checkpoints, hparams.yaml and TensorBoard's HPARAMS
        "batch_size":   256
        "num_workers":  0
        "path":         None
        "seed":         0
        "val_fraction": 0.1
    """

    def __init__(
        self,
        path: str | Path | None = None,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}")
        split_indices(1, val_fraction, seed)  # validates val_fraction
        self.save_hyperparameters()  # in checkpoints (datamodule_hyper_parameters), hparams.yaml and HPARAMS
        self.path = path
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.encoder: AdultEncoder | None = None
        self._ready = False

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        full = load_adult("train", self.path)
        train_idx, val_idx = split_indices(len(full), self.val_fraction, self.seed)
        self.train_table = full.subset(train_idx)
        self.val_table = full.subset(val_idx)
        self.test_table = load_adult("test", self.path)
        self.encoder = AdultEncoder().fit(self.train_table)
        self.train_dataset = self.to_dataset(self.train_table)
        self.val_dataset = self.to_dataset(self.val_table)
        self.test_dataset = self.to_dataset(self.test_table)
        self._ready = True

    @property
    def num_features(self) -> int:
        if self.encoder is None:
            raise RuntimeError("call setup() before num_features")
        return self.encoder.num_features

    def to_dataset(self, table: AdultTable) -> TensorDataset:
        """Encode raw rows (e.g. generated ones) with this module's encoder."""
        if self.encoder is None:
            raise RuntimeError("call setup() before to_dataset()")
        x = torch.from_numpy(self.encoder.transform(table))
        y = torch.from_numpy(np.asarray(table.labels, dtype=np.int64))
        return TensorDataset(x, y)

    def _loader(self, dataset: TensorDataset, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            generator=generator,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        if len(self.val_dataset) == 0:
            return []  # type: ignore[return-value]
        return self._loader(self.val_dataset, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, shuffle=False)

    def population_dataloader(self) -> DataLoader:
        """Rows neither trained on nor in the validation split: the Adult test split (reference-model attacks
        train their references on it and draw RMIA's population from it; see ``audit_membership``)."""
        return self._loader(self.test_dataset, shuffle=False)

    def member_dataloader(self) -> DataLoader:
        """The training rows in a fixed order (for audits; not the Poisson loader)."""
        return self._loader(self.train_dataset, shuffle=False)

    def sensitive_attribute(self, name: str, values=None):
        """A ready-made :class:`~lightning_privacy.attributes.SensitiveAttribute` for attribute inference.

        ``"age"`` (or another numeric column) is a numeric attribute whose candidates are raw values,
        written into the input with the encoder's standardisation; for ``"age"`` the default candidates
        are the whole range 17..90 (74 values, Cherubin et al. 2024, Section 6), for other numeric columns
        the distinct values of the training split. A one-hot group name (e.g. ``"race"``, ``"sex"``) gives a
        one-hot attribute over its categories.

        Args:
            name: a numeric column or one-hot group of :attr:`encoder`.
            values: candidate raw values / categories (default: see above).

        Example::

            >>> dm = AdultDataModule(); dm.setup("fit")
            >>> age = dm.sensitive_attribute("age")
            >>> age.size, age.column, age.values[0], age.values[-1]
            (74, 0, 17, 90)
            >>> dm.sensitive_attribute("sex").columns == dm.encoder.one_hot_groups["sex"].columns
            True
        """
        from lightning_privacy.attributes import SensitiveAttribute

        if self.encoder is None:
            raise RuntimeError("call setup() before sensitive_attribute()")
        if name in self.encoder.numeric_columns:
            col = self.encoder.numeric_columns[name]
            if values is None:
                values = range(17, 91) if name == "age" else col.values
            return SensitiveAttribute.numeric(column=col.column, values=values, encode=col.encode, name=name)
        if name in self.encoder.one_hot_groups:
            group = self.encoder.one_hot_groups[name]
            attribute = SensitiveAttribute.one_hot(columns=group.columns, values=group.categories, name=name)
            return attribute if values is None else attribute.select(list(values))
        raise ValueError(
            f"Expected argument `name` to be a numeric column {sorted(self.encoder.numeric_columns)} or a one-hot group "
            f"{sorted(self.encoder.one_hot_groups)}, but got {name!r}."
        )

"""UCI Adult (Census Income), bundled.

The original UCI files ship inside the package (``lightning_privacy/data/adult/``, CC BY 4.0; cite
Becker and Kohavi (1996), Adult, UCI Machine Learning Repository, https://doi.org/10.24432/C5XW20;
provenance and checksums in ``PROVENANCE.md`` beside them), so everything runs offline. Any folder with
``adult.data`` / ``adult.test`` (plain or ``.gz``) can be given instead.

Cleaning is the standard one: rows with a missing value (``"?"``) are dropped (30,162 train and 15,060
test rows remain) and the test labels' trailing period is stripped. Label 1 means income ``>50K``.

Encoding (fitted on the training split only, so validation and test never leak into it):

- six numeric columns first, standardised: ``age, fnlwgt, education-num, capital-gain, capital-loss,
  hours-per-week`` (input columns 0..5);
- then one one-hot group per categorical feature, in the order of :data:`CATEGORICAL`, with the
  categories seen in the training split (a category seen only in the test file encodes as all zeros).

:class:`AdultEncoder` keeps the metadata later work needs: :attr:`AdultEncoder.numeric_columns` maps
each numeric feature to its input column, mean, standard deviation and observed raw values (age:
17..90, 72 distinct values in the cleaned training file — 87 and 89 never occur), and
:attr:`AdultEncoder.one_hot_groups` maps each categorical feature to its input columns and categories.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = (
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native-country",
)
SPLITS = ("train", "test")


@dataclass(frozen=True)
class AdultTable:
    """Cleaned raw Adult rows.

    Attributes:
        numeric: ``(n, 6)`` float64, the columns of :data:`NUMERIC` as raw values.
        categorical: ``(n, 8)`` array of str, the columns of :data:`CATEGORICAL`.
        labels: ``(n,)`` int64, 1 for income ``>50K``.
    """

    numeric: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index: np.ndarray | Sequence[int]) -> AdultTable:
        """Rows ``index`` as a new table."""
        index = np.asarray(index)
        return AdultTable(self.numeric[index], self.categorical[index], self.labels[index])


def _open(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _find_file(split: str, path: str | Path | None) -> Path | None:
    name = "adult.data" if split == "train" else "adult.test"
    if path is None:
        return None
    folder = Path(path)
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"`path`={str(path)!r} holds neither {name} nor {name}.gz")


def load_adult(split: str = "train", path: str | Path | None = None) -> AdultTable:
    """Load and clean one split of Adult.

    Args:
        split: ``"train"`` (``adult.data``) or ``"test"`` (``adult.test``).
        path: a folder holding the UCI files; ``None`` uses the copy bundled with the package.

    Returns:
        The cleaned rows as an :class:`AdultTable`.

    Raises:
        ValueError: for an unknown ``split`` or a malformed row.
        FileNotFoundError: when ``path`` lacks the file.

    Example::

        >>> table = load_adult("train")
        >>> len(table), table.numeric.shape, int(table.labels.sum())
        (30162, (30162, 6), 7508)
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}")
    file = _find_file(split, path)
    if file is None:
        name = ("adult.data" if split == "train" else "adult.test") + ".gz"
        with resources.as_file(resources.files("lightning_privacy.data") / "adult" / name) as bundled:
            return _parse(bundled)
    return _parse(file)


def _parse(file: Path) -> AdultTable:
    numeric_idx = [COLUMNS.index(c) for c in NUMERIC]
    categorical_idx = [COLUMNS.index(c) for c in CATEGORICAL]
    numeric, categorical, labels = [], [], []
    with _open(file) as handle:
        for lineno, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("|"):
                continue
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != len(COLUMNS):
                raise ValueError(f"{file}:{lineno}: expected {len(COLUMNS)} fields, found {len(fields)}")
            if "?" in fields:
                continue
            label = fields[-1].rstrip(".")
            if label not in ("<=50K", ">50K"):
                raise ValueError(f"{file}:{lineno}: unknown label {fields[-1]!r}")
            numeric.append([float(fields[i]) for i in numeric_idx])
            categorical.append([fields[i] for i in categorical_idx])
            labels.append(1 if label == ">50K" else 0)
    return AdultTable(
        numeric=np.asarray(numeric, dtype=np.float64),
        categorical=np.asarray(categorical, dtype=str),
        labels=np.asarray(labels, dtype=np.int64),
    )


@dataclass(frozen=True)
class NumericColumn:
    """A standardised numeric input column and the raw values it was fitted on."""

    name: str
    column: int
    mean: float
    std: float
    values: tuple  # sorted distinct raw values observed in the fitting split

    def encode(self, raw: float | np.ndarray) -> float | np.ndarray:
        """Map raw value(s) to the model's input scale."""
        return (raw - self.mean) / self.std

    def decode(self, encoded: float | np.ndarray) -> float | np.ndarray:
        """Map input-scale value(s) back to raw values."""
        return encoded * self.std + self.mean


@dataclass(frozen=True)
class OneHotGroup:
    """The input columns of one one-hot-encoded categorical feature (category k -> ``columns[k]``)."""

    name: str
    columns: tuple
    categories: tuple


class AdultEncoder:
    """Standardise numerics and one-hot encode categoricals, fitted on one table.

    Example::

        >>> enc = AdultEncoder().fit(load_adult("train"))
        >>> enc.num_features, enc.numeric_columns["age"].column, enc.numeric_columns["age"].values[:3]
        (104, 0, (17.0, 18.0, 19.0))
        >>> enc.one_hot_groups["sex"].categories
        ('Female', 'Male')
    """

    def __init__(self) -> None:
        self.numeric_columns: dict[str, NumericColumn] = {}
        self.one_hot_groups: dict[str, OneHotGroup] = {}
        self.feature_names: list[str] = []

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def fit(self, table: AdultTable) -> AdultEncoder:
        if len(table) == 0:
            raise ValueError("`table` is empty: cannot fit the encoder")
        names = list(NUMERIC)
        mean = table.numeric.mean(axis=0)
        std = table.numeric.std(axis=0)
        std[std == 0] = 1.0
        self.numeric_columns = {
            name: NumericColumn(name, i, float(mean[i]), float(std[i]), tuple(np.unique(table.numeric[:, i]).tolist()))
            for i, name in enumerate(NUMERIC)
        }
        self.one_hot_groups = {}
        for j, name in enumerate(CATEGORICAL):
            categories = tuple(sorted(set(table.categorical[:, j].tolist())))
            start = len(names)
            self.one_hot_groups[name] = OneHotGroup(name, tuple(range(start, start + len(categories))), categories)
            names.extend(f"{name}={c}" for c in categories)
        self.feature_names = names
        return self

    def transform(self, table: AdultTable) -> np.ndarray:
        """Encode ``table`` as a float32 ``(n, num_features)`` array."""
        if not self.feature_names:
            raise RuntimeError("AdultEncoder.transform called before fit")
        out = np.zeros((len(table), self.num_features), dtype=np.float32)
        for i, col in enumerate(self.numeric_columns.values()):
            out[:, col.column] = col.encode(table.numeric[:, i])
        for j, group in enumerate(self.one_hot_groups.values()):
            lookup = {c: k for k, c in enumerate(group.categories)}
            for row, value in enumerate(table.categorical[:, j]):
                k = lookup.get(value)
                if k is not None:
                    out[row, group.columns[k]] = 1.0
        return out

    @property
    def groups(self) -> Mapping[str, NumericColumn | OneHotGroup]:
        """Every original feature -> its column metadata."""
        return {**self.numeric_columns, **self.one_hot_groups}


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, val) index split of ``range(n)``."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"`val_fraction` must be in [0, 1), got {val_fraction!r}")
    perm = np.random.default_rng(seed).permutation(n)
    n_val = int(round(val_fraction * n))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])

"""The two kinds of data PANORAMIA's generators and pipeline handle (numpy only).

- a **table**: an object with ``numeric`` (``(n, d)`` float), ``categorical`` (``(n, k)`` str) and
  ``labels`` (``(n,)`` int) arrays, such as :class:`lightning_privacy.data.AdultTable`; new tables are
  built with ``type(table)(numeric=..., categorical=..., labels=...)``;
- **arrays**: a tuple ``(x, y)`` of a feature/image array with ``n`` rows and ``(n,)`` int labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TABLE, ARRAYS = "table", "arrays"


def kind(data: Any, name: str = "data") -> str:
    """``"table"`` or ``"arrays"``; a clear ``TypeError`` for anything else."""
    if all(hasattr(data, a) for a in ("numeric", "categorical", "labels")):
        n = len(data.labels)
        if np.asarray(data.numeric).shape[:1] != (n,) or np.asarray(data.categorical).shape[:1] != (n,):
            raise ValueError(
                f"`{name}` is a table whose numeric/categorical/labels row counts differ: "
                f"{np.asarray(data.numeric).shape}, {np.asarray(data.categorical).shape}, {n}"
            )
        return TABLE
    if isinstance(data, tuple) and len(data) == 2:
        x, y = np.asarray(data[0]), np.asarray(data[1])
        if y.ndim != 1 or x.shape[:1] != y.shape:
            raise ValueError(
                f"`{name}` must be a tuple (x, y) with x.shape[0] == len(y) and 1-d y, got shapes "
                f"{x.shape} and {y.shape}"
            )
        return ARRAYS
    raise TypeError(
        f"`{name}` must be a table (with .numeric, .categorical, .labels, e.g. AdultTable) or a tuple "
        f"(x, y) of arrays, got {type(data).__name__}"
    )


def table_arrays(data: Any, who: str) -> tuple:
    """``(numeric float64, categorical, labels)`` of a table that a tabular generator can fit.

    Raises:
        TypeError: for anything but a table (naming ``who``).
        ValueError: for fewer than 2 rows.
    """
    if kind(data) != TABLE:
        raise TypeError(
            f"{who} fits tables (numeric/categorical/labels), got {type(data).__name__}; "
            "use DigitsGenerator for (x, y) image arrays"
        )
    labels = np.asarray(data.labels)
    if len(labels) < 2:
        raise ValueError(f"`data` must have at least 2 rows to fit a generator, got {len(labels)}")
    return np.asarray(data.numeric, dtype=np.float64), np.asarray(data.categorical), labels


def length(data: Any) -> int:
    return len(data.labels) if kind(data) == TABLE else len(data[1])


def labels(data: Any) -> np.ndarray:
    return np.asarray(data.labels if kind(data) == TABLE else data[1])


def subset(data: Any, index: np.ndarray) -> Any:
    index = np.asarray(index)
    if kind(data) == TABLE:
        return type(data)(
            numeric=np.asarray(data.numeric)[index],
            categorical=np.asarray(data.categorical)[index],
            labels=np.asarray(data.labels)[index],
        )
    return np.asarray(data[0])[index], np.asarray(data[1])[index]


def concat(*parts: Any) -> Any:
    first = parts[0]
    if kind(first) == TABLE:
        return type(first)(
            numeric=np.concatenate([np.asarray(p.numeric) for p in parts]),
            categorical=np.concatenate([np.asarray(p.categorical) for p in parts]),
            labels=np.concatenate([np.asarray(p.labels) for p in parts]),
        )
    return np.concatenate([np.asarray(p[0]) for p in parts]), np.concatenate([np.asarray(p[1]) for p in parts])


def same_schema(a: Any, b: Any, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` when two data sets cannot be mixed (kind or column shapes differ)."""
    ka, kb = kind(a, name_a), kind(b, name_b)
    if ka != kb:
        raise ValueError(f"`{name_a}` is {ka} data but `{name_b}` is {kb} data")
    if ka == TABLE:
        sa = (np.asarray(a.numeric).shape[1:], np.asarray(a.categorical).shape[1:])
        sb = (np.asarray(b.numeric).shape[1:], np.asarray(b.categorical).shape[1:])
    else:
        sa, sb = np.asarray(a[0]).shape[1:], np.asarray(b[0]).shape[1:]
    if sa != sb:
        raise ValueError(f"`{name_a}` and `{name_b}` have mismatched shapes: {sa} vs {sb}")


class FeatureCoder:
    """A float matrix for tree classifiers, with one categorical coding fitted on reference data.

    Tables: the numeric columns, then each categorical column as an integer code (categories unseen
    at fit time become NaN, i.e. "missing" for scikit-learn's gradient boosting), then the label.
    Arrays: ``x`` flattened, then the label. :attr:`categorical_mask` marks the coded columns.
    """

    def fit(self, data: Any) -> FeatureCoder:
        self.kind = kind(data)
        if self.kind == TABLE:
            cats = np.asarray(data.categorical)
            self.vocab = [np.unique(cats[:, j]) for j in range(cats.shape[1])]
            d = np.asarray(data.numeric).shape[1]
            self.categorical_mask = np.zeros(d + len(self.vocab) + 1, dtype=bool)
            self.categorical_mask[d:] = True
        else:
            width = int(np.prod(np.asarray(data[0]).shape[1:]))
            self.categorical_mask = np.zeros(width + 1, dtype=bool)
            self.categorical_mask[-1] = True
        return self

    def transform(self, data: Any) -> np.ndarray:
        if kind(data) != self.kind:
            raise ValueError(f"FeatureCoder was fitted on {self.kind} data, got {kind(data)} data")
        if self.kind == TABLE:
            cats = np.asarray(data.categorical)
            cols = [np.asarray(data.numeric, dtype=np.float64)]
            for j, vocab in enumerate(self.vocab):
                pos = np.minimum(np.searchsorted(vocab, cats[:, j]), len(vocab) - 1)
                code = pos.astype(np.float64)
                code[vocab[pos] != cats[:, j]] = np.nan
                cols.append(code[:, None])
            cols.append(np.asarray(data.labels, dtype=np.float64)[:, None])
            return np.concatenate(cols, axis=1)
        x = np.asarray(data[0], dtype=np.float64).reshape(len(data[1]), -1)
        return np.concatenate([x, np.asarray(data[1], dtype=np.float64)[:, None]], axis=1)

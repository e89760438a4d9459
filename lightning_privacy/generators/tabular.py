"""Default generator for mixed-type tables: a Bayesian network on discretised columns (numpy only).

The paper uses MST (McKenna et al., 2021) at ``eps = 1000``, i.e. essentially without noise: a
maximum spanning tree over the pairwise marginals of discretised columns, then sampling from the
graphical model that matches those marginals. Without noise the tree-structured model that matches
its marginals is exactly the Chow–Liu tree, which :class:`TabularGenerator` fits with
``max_parents=1``. With ``max_parents=2`` (the default) it grows the network greedily as PrivBayes
(Zhang et al., 2017) does without noise, choosing for each column the parent set (of size 0, 1 or 2
among the columns already placed) with the best BIC score ``n * I(child; parents) - log(n) / 2 *
free parameters``, so that sparse parent combinations are not memorised.

Columns are the numeric ones (discretised into at most ``max_bins`` quantile bins; columns with few
distinct values keep them exactly), the categorical ones and the label. Sampling is ancestral; a
sampled numeric bin is turned back into a value by drawing one of the fitting rows' values in that
bin, so generated values are always values the column can take (integral ages, the exact
capital-gain atoms, ...) and the within-bin distribution is the empirical one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from lightning_privacy.generators import _data
from lightning_privacy.generators.base import check_sample_size


@dataclass
class _Node:
    column: int
    parents: tuple
    cardinality: int
    table: np.ndarray  # (parent configurations, cardinality) conditional probabilities
    parent_strides: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _entropy_counts(codes: np.ndarray, size: int) -> float:
    p = np.bincount(codes, minlength=size).astype(np.float64)
    p = p[p > 0] / codes.shape[0]
    return float(-(p * np.log(p)).sum())


class TabularGenerator:
    """Chow–Liu / PrivBayes-style Bayesian network for tables with numeric, categorical and label columns.

    Args:
        max_parents: parents per column (1 = Chow–Liu tree, the noise-free MST structure; 2 =
            default, greedy BIC-scored network).
        max_bins: quantile bins per numeric column (columns with at most this many distinct values
            are kept exact).
        seed: seed of sampling.

    Attributes:
        order: column indices in sampling order (numeric, then categorical, then the label).
        parents: the parent columns of each column (a dict).

    Raises:
        TypeError: :meth:`fit` on data that is not a table.
        ValueError: :meth:`fit` on fewer than 2 rows; :meth:`sample` before :meth:`fit`.

    Example::

        >>> from lightning_privacy.data import load_adult
        >>> table = load_adult("train").subset(range(2000))
        >>> gen = TabularGenerator(seed=0).fit(table)
        >>> fake = gen.sample(5)
        >>> fake.numeric.shape, fake.categorical.shape, fake.labels.dtype
        ((5, 6), (5, 8), dtype('int64'))
        >>> bool(np.all(np.isin(fake.numeric[:, 0], table.numeric[:, 0])))  # ages the data has
        True
    """

    def __init__(self, *, max_parents: int = 2, max_bins: int = 32, seed: int = 0) -> None:
        if isinstance(max_parents, bool) or not isinstance(max_parents, int) or not 0 <= max_parents <= 3:
            raise ValueError(f"`max_parents` must be an int in [0, 3], got {max_parents!r}")
        if isinstance(max_bins, bool) or not isinstance(max_bins, int) or max_bins < 2:
            raise ValueError(f"`max_bins` must be an int >= 2, got {max_bins!r}")
        self.max_parents = max_parents
        self.max_bins = max_bins
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._fitted = False

    # ------------------------------------------------------------------ discretisation
    def _discretise(self, table: Any) -> np.ndarray:
        numeric = np.asarray(table.numeric, dtype=np.float64)
        categorical = np.asarray(table.categorical)
        labels = np.asarray(table.labels)
        n, d = numeric.shape
        self._num_d, self._cat_k = d, categorical.shape[1]
        self._edges, self._bin_values, self._vocab = [], [], []
        columns = []
        for j in range(d):
            v = numeric[:, j]
            distinct = np.unique(v)
            if distinct.size <= self.max_bins:
                edges = distinct[:-1]  # one bin per distinct value
            else:
                q = np.quantile(v, np.linspace(0, 1, self.max_bins + 1)[1:-1], method="inverted_cdf")
                edges = np.unique(q)
            codes = np.searchsorted(edges, v, side="left")
            self._edges.append(edges)
            self._bin_values.append([np.sort(v[codes == b]) for b in range(edges.size + 1)])
            columns.append(codes)
        for j in range(self._cat_k):
            vocab, codes = np.unique(categorical[:, j], return_inverse=True)
            self._vocab.append(vocab)
            columns.append(codes)
        vocab, codes = np.unique(labels, return_inverse=True)
        self._label_vocab = vocab
        columns.append(codes)
        self._cat_dtype = categorical.dtype
        return np.stack(columns, axis=1).astype(np.int64)

    # ------------------------------------------------------------------ structure + parameters
    def fit(self, data: Any) -> "TabularGenerator":
        if _data.kind(data) != _data.TABLE:
            raise TypeError(
                f"TabularGenerator fits tables (numeric/categorical/labels), got {type(data).__name__}; "
                "use DigitsGenerator for (x, y) image arrays"
            )
        n = len(data.labels)
        if n < 2:
            raise ValueError(f"`data` must have at least 2 rows to fit a generator, got {n}")
        self._table_type = type(data)
        codes = self._discretise(data)
        n, ncol = codes.shape
        card = codes.max(axis=0) + 1
        self._card = card
        label_col = ncol - 1
        placed = [label_col]
        remaining = [c for c in range(ncol) if c != label_col]
        parents: dict = {label_col: ()}
        penalty = 0.5 * np.log(n)
        h = {c: _entropy_counts(codes[:, c], card[c]) for c in range(ncol)}

        def config(cols):
            key = np.zeros(n, dtype=np.int64)
            for c in cols:
                key = key * card[c] + codes[:, c]
            _, inv = np.unique(key, return_inverse=True)
            return inv, int(inv.max()) + 1

        def score(child, pa):
            if not pa:
                return 0.0
            inv, k = config(pa)
            joint = inv * card[child] + codes[:, child]
            _, jinv = np.unique(joint, return_inverse=True)
            h_pa = _entropy_counts(inv, k)
            h_joint = _entropy_counts(jinv, int(jinv.max()) + 1)
            mi = h[child] + h_pa - h_joint
            return n * mi - penalty * (card[child] - 1) * (k - 1)

        cache: dict = {}
        while remaining:
            best = (-np.inf, None, ())
            for child in remaining:
                for size in range(0, min(self.max_parents, len(placed)) + 1):
                    for pa in combinations(placed, size):
                        key = (child, pa)
                        if key not in cache:
                            cache[key] = score(child, pa)
                        if cache[key] > best[0]:
                            best = (cache[key], child, pa)
            _, child, pa = best
            parents[child] = pa
            placed.append(child)
            remaining.remove(child)
        self.order = placed
        self.parents = parents
        self._nodes = []
        for c in placed:
            pa = parents[c]
            strides = np.ones(len(pa), dtype=np.int64)
            for i in range(len(pa) - 2, -1, -1):
                strides[i] = strides[i + 1] * card[pa[i + 1]]
            n_cfg = int(np.prod([card[p] for p in pa])) if pa else 1
            key = codes[:, list(pa)] @ strides if pa else np.zeros(n, dtype=np.int64)
            counts = np.zeros((n_cfg, card[c]))
            np.add.at(counts, (key, codes[:, c]), 1.0)
            marginal = np.bincount(codes[:, c], minlength=card[c]) / n
            totals = counts.sum(axis=1, keepdims=True)
            # unseen parent configurations fall back to the column's marginal
            table = np.where(totals > 0, counts / np.maximum(totals, 1), marginal[None, :])
            self._nodes.append(_Node(c, pa, int(card[c]), np.cumsum(table, axis=1), strides))
        self._fitted = True
        return self

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if not self._fitted:
            raise ValueError("TabularGenerator.sample called before fit")
        rng = self._rng
        codes = np.zeros((n, len(self._card)), dtype=np.int64)
        for node in self._nodes:
            key = codes[:, list(node.parents)] @ node.parent_strides if node.parents else np.zeros(n, np.int64)
            cum = node.table[key]
            u = rng.random(n)[:, None] * cum[:, -1:]
            codes[:, node.column] = np.minimum((cum <= u).sum(axis=1), node.cardinality - 1)
        numeric = np.zeros((n, self._num_d))
        for j in range(self._num_d):
            for b, values in enumerate(self._bin_values[j]):
                rows = np.flatnonzero(codes[:, j] == b)
                if rows.size:
                    numeric[rows, j] = values[rng.integers(0, values.size, rows.size)]
        categorical = np.empty((n, self._cat_k), dtype=self._cat_dtype)
        for j in range(self._cat_k):
            categorical[:, j] = self._vocab[j][codes[:, self._num_d + j]]
        labels = self._label_vocab[codes[:, -1]].astype(np.int64)
        return self._table_type(numeric=numeric, categorical=categorical, labels=labels)

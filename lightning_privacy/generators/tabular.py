"""Generators for mixed-type tables (numpy + scikit-learn trees).

:class:`TabularGenerator` (the default) is a sequential-CART synthesiser in the style of synthpop
(Reiter 2005; Nowok, Raab and Dibben 2016): columns are visited in a fixed order (label, categorical
columns, numeric columns); the first is drawn from its empirical marginal and every later column
from a decision tree fitted on the columns before it — a generated row is routed to a leaf and
takes the column's value from a random fitting row ("donor") in that leaf. Values are therefore
always values the column takes, and higher-order interactions (e.g. age x hours x relationship of
teenagers working part time, which a pairwise model misses) are kept. ``min_samples_leaf`` (default
20) keeps leaves from copying single rows.

:class:`BayesNetGenerator` is the marginal-based alternative close to the paper's MST (McKenna et
al., 2021) at ``eps = 1000``, i.e. essentially without noise: with ``max_parents=1`` it is the
Chow-Liu tree (the maximum spanning tree of pairwise mutual information, the structure MST selects
without noise); with ``max_parents=2`` it grows the network greedily as noise-free PrivBayes does,
choosing for each column the parent set (size 0-2 among the columns already placed) with the best
BIC score ``n * I(child; parents) - log(n) / 2 * free parameters``. Numeric columns are
discretised into at most ``max_bins`` quantile bins (columns with few distinct values keep them
exactly) and a sampled bin is turned back into one of the fitting rows' values in that bin.

On Adult the gradient-boosting baseline's ``c_lb`` is far lower for the CART generator than for the
Bayesian network, whose most "obviously real" rows are teenagers working part time (measured values:
``docs/reproductions/panoramia.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Optional

import numpy as np
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

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


class BayesNetGenerator:
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
        >>> gen = BayesNetGenerator(seed=0).fit(table)
        >>> fake = gen.sample(5)
        >>> fake.numeric.shape, fake.categorical.shape, fake.labels.dtype
        ((5, 6), (5, 8), dtype('int64'))
        >>> bool(np.all(np.isin(fake.numeric[:, 0], table.numeric[:, 0])))  # ages the data has
        True
    """

    def __init__(
        self,
        *,
        max_parents: int = 2,
        max_bins: int = 32,
        penalty: Optional[float] = None,
        smoothing: float = 0.0,
        seed: int = 0,
    ) -> None:
        if isinstance(max_parents, bool) or not isinstance(max_parents, int) or not 0 <= max_parents <= 3:
            raise ValueError(f"`max_parents` must be an int in [0, 3], got {max_parents!r}")
        if isinstance(max_bins, bool) or not isinstance(max_bins, int) or max_bins < 2:
            raise ValueError(f"`max_bins` must be an int >= 2, got {max_bins!r}")
        if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or penalty < 0):
            raise ValueError(f"`penalty` must be None or a float >= 0, got {penalty!r}")
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or smoothing < 0:
            raise ValueError(f"`smoothing` must be a float >= 0, got {smoothing!r}")
        self.penalty = penalty
        self.smoothing = float(smoothing)
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
    def fit(self, data: Any) -> BayesNetGenerator:
        _data.table_arrays(data, "BayesNetGenerator")  # validates
        self._table_type = type(data)
        codes = self._discretise(data)
        n, ncol = codes.shape
        card = codes.max(axis=0) + 1
        self._card = card
        label_col = ncol - 1
        placed = [label_col]
        remaining = [c for c in range(ncol) if c != label_col]
        parents: dict = {label_col: ()}
        penalty = 0.5 * np.log(n) if self.penalty is None else self.penalty
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
        alpha = self.smoothing
        for c in placed:
            # parents ordered by their own score with the child: the back-off chain drops the last first
            pa = tuple(sorted(parents[c], key=lambda p: -cache.get((c, (p,)), score(c, (p,)))))
            marginal = np.bincount(codes[:, c], minlength=card[c]) / n
            table = marginal[None, :]
            key = np.zeros(n, dtype=np.int64)
            for p in pa:  # P_j = (N_j + alpha P_{j-1}) / (N_j + alpha); unseen configurations back off
                key = key * card[p] + codes[:, p]
                lower = np.repeat(table, card[p], axis=0)
                counts = np.zeros((lower.shape[0], card[c]))
                np.add.at(counts, (key, codes[:, c]), 1.0)
                totals = counts.sum(axis=1, keepdims=True)
                if alpha > 0:
                    table = (counts + alpha * lower) / (totals + alpha)
                else:
                    table = np.where(totals > 0, counts / np.maximum(totals, 1), lower)
            strides = np.ones(len(pa), dtype=np.int64)
            for i in range(len(pa) - 2, -1, -1):
                strides[i] = strides[i + 1] * card[pa[i + 1]]
            self._nodes.append(_Node(c, pa, int(card[c]), np.cumsum(table, axis=1), strides))
        self._fitted = True
        return self

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if not self._fitted:
            raise ValueError("BayesNetGenerator.sample called before fit")
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


class TabularGenerator:
    """Sequential-CART synthesiser for tables with numeric, categorical and label columns (the default).

    Args:
        min_samples_leaf: rows per tree leaf (the donor pool of each generated value), ``>= 1``.
        seed: seed of the trees and of sampling.

    Attributes:
        visit_order: column names in the order they are generated.

    Raises:
        TypeError: :meth:`fit` on data that is not a table.
        ValueError: :meth:`fit` on fewer than 2 rows; :meth:`sample` before :meth:`fit`; a bad argument.

    Example::

        >>> from lightning_privacy.data import load_adult
        >>> table = load_adult("train").subset(range(2000))
        >>> fake = TabularGenerator(seed=0).fit(table).sample(5)
        >>> fake.numeric.shape, fake.categorical.shape, fake.labels.dtype
        ((5, 6), (5, 8), dtype('int64'))
        >>> bool(np.all(np.isin(fake.numeric[:, 0], table.numeric[:, 0])))  # ages the data has
        True
    """

    def __init__(self, *, min_samples_leaf: int = 20, seed: int = 0) -> None:
        if isinstance(min_samples_leaf, bool) or not isinstance(min_samples_leaf, int) or min_samples_leaf < 1:
            raise ValueError(f"`min_samples_leaf` must be a positive int, got {min_samples_leaf!r}")
        self.min_samples_leaf = min_samples_leaf
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._fitted = False

    def fit(self, data: Any) -> TabularGenerator:
        numeric, categorical, labels = _data.table_arrays(data, "TabularGenerator")
        self._table_type, self._cat_dtype = type(data), categorical.dtype
        self._vocab = [np.unique(categorical[:, j]) for j in range(categorical.shape[1])]
        self._k, self._d = categorical.shape[1], numeric.shape[1]
        codes = [np.searchsorted(v, categorical[:, j]) for j, v in enumerate(self._vocab)]
        x = np.column_stack([labels, *codes, numeric]).astype(np.float64)
        self.visit_order = [
            "label",
            *[f"categorical[{j}]" for j in range(self._k)],
            *[f"numeric[{j}]" for j in range(self._d)],
        ]
        self._first = x[:, 0].copy()
        self._steps = []
        for j in range(1, x.shape[1]):
            tree_type = DecisionTreeClassifier if j <= self._k else DecisionTreeRegressor
            tree = tree_type(min_samples_leaf=self.min_samples_leaf, random_state=self.seed).fit(x[:, :j], x[:, j])
            leaves = tree.apply(x[:, :j])
            order = np.argsort(leaves, kind="stable")
            ids, starts = np.unique(leaves[order], return_index=True)
            self._steps.append((tree, ids, np.r_[starts, len(order)], x[order, j]))
        self._fitted = True
        return self

    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if not self._fitted:
            raise ValueError("TabularGenerator.sample called before fit")
        rng = self._rng
        x = np.zeros((n, 1 + self._k + self._d))
        x[:, 0] = self._first[rng.integers(0, len(self._first), n)]
        for j, (tree, ids, bounds, donors) in enumerate(self._steps, start=1):
            if n == 0:
                break
            pos = np.searchsorted(ids, tree.apply(x[:, :j]))
            lo, hi = bounds[pos], bounds[pos + 1]
            x[:, j] = donors[lo + (rng.random(n) * (hi - lo)).astype(np.int64)]
        categorical = np.empty((n, self._k), dtype=self._cat_dtype)
        for j in range(self._k):
            categorical[:, j] = self._vocab[j][x[:, 1 + j].astype(np.int64)]
        return self._table_type(numeric=x[:, 1 + self._k :], categorical=categorical, labels=x[:, 0].astype(np.int64))

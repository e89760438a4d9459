"""A small image generator: a class-conditional Gaussian copula over pixels (numpy/scipy/sklearn).

Made for scikit-learn's bundled 8x8 ``load_digits`` images (intensities 0..16), to show that
PANORAMIA is not tabular-only. It is deliberately small (the paper uses StyleGAN2 on CIFAR-10):
for each class, every pixel is mapped to normal scores through its empirical CDF, the correlation of
those scores is estimated with Ledoit–Wolf shrinkage, and samples are mapped back through each
pixel's empirical quantile function. Marginals are therefore exactly the observed ones per class
(always-black border pixels stay black, intensities stay on the observed grid) and the pixel
dependence is Gaussian. On digits this was harder for the baseline to spot than PCA + Gaussian
mixtures (a comparison made when the generator was chosen; the digits audit it serves is in
``docs/reproductions/panoramia.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from sklearn.covariance import LedoitWolf

from lightning_privacy.generators import _data
from lightning_privacy.generators.base import check_sample_size


class DigitsGenerator:
    """Class-conditional Gaussian-copula generator for small images ``(x, y)``.

    Args:
        seed: seed of fitting (tie-breaking) and sampling.

    Raises:
        TypeError: :meth:`fit` on data that is not ``(x, y)`` arrays.
        ValueError: :meth:`fit` with a class of fewer than 2 images; :meth:`sample` before :meth:`fit`.

    Example::

        >>> from sklearn.datasets import load_digits
        >>> digits = load_digits()
        >>> gen = DigitsGenerator(seed=0).fit((digits.images[:500], digits.target[:500]))
        >>> x, y = gen.sample(4)
        >>> x.shape, y.shape, bool(np.all(np.isin(x, digits.images[:500])))
        ((4, 8, 8), (4,), True)
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._fitted = False

    def fit(self, data: Any) -> DigitsGenerator:
        if _data.kind(data) != _data.ARRAYS:
            raise TypeError(f"DigitsGenerator fits (x, y) image arrays, got {type(data).__name__}")
        x = np.asarray(data[0], dtype=np.float64)
        y = np.asarray(data[1])
        self._shape = x.shape[1:]
        flat = x.reshape(len(y), -1)
        self.classes_, counts = np.unique(y, return_counts=True)
        if counts.min() < 2:
            raise ValueError(
                f"`data` needs at least 2 images per class, class {self.classes_[counts.argmin()]!r} has {counts.min()}"
            )
        self._prior = counts / counts.sum()
        self._models = []
        for c in self.classes_:
            xc = flat[y == c]
            n = len(xc)
            # ranks with random tie-breaking -> uniform scores -> normal scores
            jitter = self._rng.random(xc.shape) * 1e-6
            ranks = np.argsort(np.argsort(xc + jitter, axis=0), axis=0)
            z = stats.norm.ppf((ranks + 0.5) / n)
            cov = LedoitWolf().fit(z).covariance_
            self._models.append((np.linalg.cholesky(cov + 1e-9 * np.eye(cov.shape[0])), np.sort(xc, axis=0)))
        self._fitted = True
        return self

    def sample(self, n: int) -> tuple:
        n = check_sample_size(n)
        if not self._fitted:
            raise ValueError("DigitsGenerator.sample called before fit")
        labels = self._rng.choice(len(self.classes_), size=n, p=self._prior)
        flat = np.zeros((n, int(np.prod(self._shape))))
        for i, (chol, sorted_x) in enumerate(self._models):
            rows = np.flatnonzero(labels == i)
            if rows.size:
                z = self._rng.standard_normal((rows.size, chol.shape[0])) @ chol.T
                k = np.minimum((stats.norm.cdf(z) * len(sorted_x)).astype(np.int64), len(sorted_x) - 1)
                flat[rows] = np.take_along_axis(sorted_x, k, axis=0)
        return flat.reshape((n, *self._shape)), self.classes_[labels]

"""Drop generated rows that a real-vs-synthetic classifier flags with high confidence.

The paper does this for tabular data and CelebA (Appendix B.3): "we train an additional classifier to
distinguish between real data from D_G and additional synthetic data (not used in the audit) [and]
remove from the audit data synthetic samples predicted as synthetic with high confidence"; the
authors' code keeps a generated row unless ``P(real) < 0.1``. Rejection sampling turns G into
another generator G' (G conditioned on passing the filter), and PANORAMIA's c-closeness is then a
property of G', so the audit stays valid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier

from lightning_privacy.generators import _data
from lightning_privacy.generators.base import Generator, check_sample_size


class FilteredGenerator:
    """Wrap a generator; reject samples the discriminator is sure are synthetic.

    ``fit(data)`` fits the wrapped generator on ``data`` (D_G), draws ``len(data)`` extra synthetic
    rows and trains a gradient-boosting classifier of real (``data``) vs synthetic. ``sample(n)``
    draws batches from the wrapped generator and keeps the rows with ``P(real) >= threshold``.

    Args:
        generator: the wrapped generator (``fit``/``sample``).
        threshold: rows with ``P(real) < threshold`` are dropped (authors' code: 0.1), in ``[0, 1)``.
        max_rounds: give up (``RuntimeError``) if ``n`` rows are not accepted within this many batches.
        seed: seed of the classifier.

    Attributes:
        acceptance_rate: share of drawn rows kept so far (``nan`` before sampling).

    Example::

        >>> from lightning_privacy.data import load_adult
        >>> from lightning_privacy.generators import TabularGenerator
        >>> table = load_adult("train").subset(range(1500))
        >>> gen = FilteredGenerator(TabularGenerator(seed=0), threshold=0.1).fit(table)
        >>> len(gen.sample(200)), 0.0 < gen.acceptance_rate <= 1.0
        (200, True)
    """

    def __init__(self, generator: Generator, *, threshold: float = 0.1, max_rounds: int = 20, seed: int = 0) -> None:
        if not (hasattr(generator, "fit") and hasattr(generator, "sample")):
            raise TypeError(f"`generator` must have fit(data) and sample(n), got {type(generator).__name__}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold < 1.0:
            raise ValueError(f"`threshold` must be a float in [0, 1), got {threshold!r}")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"`max_rounds` must be a positive int, got {max_rounds!r}")
        self.generator = generator
        self.threshold = float(threshold)
        self.max_rounds = max_rounds
        self.seed = seed
        self._drawn = 0
        self._kept = 0
        self._classifier = None

    @property
    def acceptance_rate(self) -> float:
        return self._kept / self._drawn if self._drawn else float("nan")

    def fit(self, data: Any) -> FilteredGenerator:
        self.generator.fit(data)
        fake = self.generator.sample(_data.length(data))
        _data.same_schema(data, fake, "data", "generated rows")
        self._coder = _data.FeatureCoder().fit(data)
        x_real, x_fake, mask = self._coder.transform(data), self._coder.transform(fake), self._coder.categorical_mask
        x = np.concatenate([x_real, x_fake])
        y = np.r_[np.ones(len(x_real)), np.zeros(len(x_fake))]
        self._classifier = HistGradientBoostingClassifier(
            categorical_features=mask if mask.any() else None, random_state=self.seed
        ).fit(x, y)
        return self

    def real_probability(self, rows: Any) -> np.ndarray:
        """The discriminator's ``P(real)`` for ``rows``."""
        if self._classifier is None:
            raise ValueError("FilteredGenerator used before fit")
        return self._classifier.predict_proba(self._coder.transform(rows))[:, 1]

    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if self._classifier is None:
            raise ValueError("FilteredGenerator.sample called before fit")
        kept, total = [], 0
        batch = max(n, 16)
        for _ in range(self.max_rounds):
            rows = self.generator.sample(batch)
            keep = np.flatnonzero(self.real_probability(rows) >= self.threshold)
            self._drawn += batch
            self._kept += keep.size
            kept.append(_data.subset(rows, keep))
            total += keep.size
            if total >= n:
                return _data.subset(_data.concat(*kept), np.arange(n))
            rate = max(keep.size / batch, 0.05)
            batch = int(np.ceil(1.2 * (n - total) / rate)) + 16
        raise RuntimeError(
            f"FilteredGenerator accepted only {total} of the {n} rows requested after {self.max_rounds} "
            f"rounds (acceptance rate {self.acceptance_rate:.3f}); lower `threshold`={self.threshold}"
        )

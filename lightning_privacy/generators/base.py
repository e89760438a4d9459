"""The generator protocol PANORAMIA needs: ``fit(data)`` then ``sample(n)``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from lightning_privacy.generators import _data


@runtime_checkable
class Generator(Protocol):
    """Anything that learns a data distribution and samples from it.

    ``data`` is a table (``numeric``/``categorical``/``labels`` arrays, e.g.
    :class:`~lightning_privacy.data.AdultTable`) or a tuple ``(x, y)`` of arrays; ``sample(n)``
    returns ``n`` rows of the same kind and layout (labels included, because the helper and target
    models need a loss). Sampling must be reproducible from the generator's seed.

    Example::

        >>> from lightning_privacy.generators import HeldOutRows
        >>> isinstance(HeldOutRows((np.zeros((3, 2)), np.zeros(3, dtype=int))), Generator)
        True
    """

    def fit(self, data: Any) -> Generator: ...

    def sample(self, n: int) -> Any: ...


def check_sample_size(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"`n` must be a non-negative int, got {n!r}")
    return int(n)


class HeldOutRows:
    """A "generator" that returns real rows from a held-out pool, without replacement.

    It is the distribution itself (``c = 0``), which makes it the reference for two things: the
    paper's *real non-members* comparison (RM;RN, Section 5) and a sanity check that ``c_lb`` is
    about 0 when the generator cannot be told apart from the data. ``fit`` only checks that the
    pool has the same layout as the data.

    Args:
        pool: held-out rows (a table or ``(x, y)`` arrays) that are **not** in the target's training set.
        seed: seed of the random order in which rows are handed out.

    Raises:
        ValueError: from :meth:`sample` when the pool is exhausted.

    Example::

        >>> gen = HeldOutRows((np.arange(10.0)[:, None], np.arange(10) % 2), seed=0)
        >>> x, y = gen.fit((np.zeros((4, 1)), np.zeros(4, dtype=int))).sample(3)
        >>> x.shape, gen.remaining
        ((3, 1), 7)
    """

    def __init__(self, pool: Any, *, seed: int = 0) -> None:
        _data.kind(pool, "pool")
        self.pool = pool
        self.seed = seed
        self._order = np.random.default_rng(seed).permutation(_data.length(pool))
        self._next = 0

    @property
    def remaining(self) -> int:
        return len(self._order) - self._next

    def fit(self, data: Any) -> HeldOutRows:
        _data.same_schema(data, self.pool, "data", "pool")
        return self

    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if n > self.remaining:
            raise ValueError(
                f"`n`={n} exceeds the {self.remaining} held-out rows left in the pool of {len(self._order)}"
            )
        idx = self._order[self._next : self._next + n]
        self._next += n
        return _data.subset(self.pool, idx)

"""Synthetic-data generators for PANORAMIA: a small protocol, ``fit(data)`` then ``sample(n)``.

- :class:`Generator`: the protocol (``data`` is a table such as
  :class:`~lightning_privacy.data.AdultTable`, or a tuple ``(x, y)`` of arrays).
- :class:`TabularGenerator`: the default for mixed-type tables (sequential CART, synthpop-style).
- :class:`BayesNetGenerator`: noise-free MST / PrivBayes-style Bayesian network on discretised
  columns (closest to the paper's MST; easier for the baseline to spot on Adult).
- :class:`DigitsGenerator`: small images (class-conditional PCA + Gaussian mixtures; scikit-learn).
- :class:`FilteredGenerator`: drops samples a real-vs-synthetic classifier flags with high confidence.
- :class:`HeldOutRows`: real held-out rows as "generated" ones (the real-non-member comparison).
- :class:`SDVGenerator` (optional, ``pip install sdv``): SDV's GaussianCopula / CTGAN / TVAE
  synthesizers; loaded on first access, so importing this package never imports SDV.

None of them imports torch (SDVGenerator does when it fits).
"""

from lightning_privacy.generators.base import Generator, HeldOutRows
from lightning_privacy.generators.filtering import FilteredGenerator
from lightning_privacy.generators.images import DigitsGenerator
from lightning_privacy.generators.tabular import BayesNetGenerator, TabularGenerator

__all__ = [
    "BayesNetGenerator",
    "DigitsGenerator",
    "FilteredGenerator",
    "Generator",
    "HeldOutRows",
    "SDVGenerator",
    "TabularGenerator",
]


def __getattr__(name: str):
    if name == "SDVGenerator":  # lazy: the adapter module imports SDV only when a generator is built
        from lightning_privacy.generators.sdv_adapter import SDVGenerator

        return SDVGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

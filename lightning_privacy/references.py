"""Reference models for membership attacks: :func:`train_references` and :class:`ReferenceModels`.

They live in :mod:`lightning_privacy.callbacks.references` (they train with Lightning and DP-SGD, the callbacks
layer); this module re-exports them so ``from lightning_privacy.references import train_references`` keeps working.
The usual import is ``from lightning_privacy.audits import train_references``.
"""

from lightning_privacy.callbacks.references import CACHE_VERSION, ReferenceModels, train_references

__all__ = ["CACHE_VERSION", "ReferenceModels", "train_references"]

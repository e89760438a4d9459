"""Reference models for membership attacks: moved to :mod:`lightning_privacy.references` (re-exported here)."""

from lightning_privacy.references import CACHE_VERSION, ReferenceModels, train_references

__all__ = ["CACHE_VERSION", "ReferenceModels", "train_references"]

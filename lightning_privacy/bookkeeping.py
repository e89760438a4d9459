"""Deprecated (removed in 0.4.0): ghost clipping's clipped sum in one backward pass, moved to
:mod:`lightning_privacy.dpsgd.bookkeeping` in 0.3.0; each name still resolves here, with a ``DeprecationWarning``
naming the new import."""

from lightning_privacy._deprecation import moved_module

__getattr__, __dir__, __all__ = moved_module(
    __name__, "lightning_privacy.dpsgd.bookkeeping", ["BookKeeping"], since="0.3.0", removed_in="0.4.0"
)

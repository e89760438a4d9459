"""Ghost clipping's clipped sum in one backward pass: moved to :mod:`lightning_privacy.dpsgd.bookkeeping`
(re-exported here)."""

from lightning_privacy.dpsgd.bookkeeping import BookKeeping

__all__ = ["BookKeeping"]

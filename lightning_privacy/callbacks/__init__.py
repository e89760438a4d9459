"""Lightning callbacks, one per file (re-exported lazily from :mod:`lightning_privacy`)."""

from typing import Any

from lightning_privacy import _CALLBACKS

__all__ = list(_CALLBACKS)


def __getattr__(name: str) -> Any:
    import lightning_privacy

    if name in _CALLBACKS:
        return getattr(lightning_privacy, name)
    raise AttributeError(f"module 'lightning_privacy.callbacks' has no attribute {name!r}")

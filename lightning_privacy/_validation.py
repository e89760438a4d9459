"""Argument checks of the callbacks, the ledger and the commands (numpy-free, torch-free).

Every message names the argument, what is allowed and the value received: "`delta` must be a float in (0, 1),
got 2.0". Nothing is clamped. Callbacks pass ``exc=MisconfigurationException`` (Lightning's convention); pure code
keeps the default ``ValueError``. The pure ``analysis`` layer has its own home for its checks, in torchmetrics'
style ("Expected argument `alpha` to be in (0, 1), but got 1.5."): :mod:`lightning_privacy.analysis._checks`,
which keeps that layer importable on its own (numpy/scipy only).

Example:
    >>> check_positive("noise_multiplier", 1.5)
    1.5
    >>> check_choice("relation", "swap", ("replace", "add_remove"))
    Traceback (most recent call last):
    ...
    ValueError: `relation` must be one of ('replace', 'add_remove'), got 'swap'
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Type

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_open_unit",
    "check_positive",
]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(
    name: str, value: Any, *, exc: Type[Exception] = ValueError, optional: bool = False
) -> Optional[float]:
    """A finite number > 0 (``None`` passes when ``optional``)."""
    if value is None and optional:
        return None
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise exc(f"`{name}` must be a positive finite number, got {value!r}")
    return float(value)


def check_open_unit(
    name: str, value: Any, *, exc: Type[Exception] = ValueError, optional: bool = False, float_only: bool = False
) -> Optional[float]:
    """A number in (0, 1) (``None`` passes when ``optional``; ``float_only`` refuses ints, as δ always was)."""
    if value is None and optional:
        return None
    kind = "a float in" if float_only else "in"
    ok_type = isinstance(value, float) if float_only else _is_real(value)
    if not ok_type or not 0 < value < 1:
        raise exc(f"`{name}` must be {kind} (0, 1), got {value!r}")
    return float(value)


def check_int(name: str, value: Any, *, minimum: int = 1, exc: Type[Exception] = ValueError) -> int:
    """A whole number (a Python int, not a bool) ≥ ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise exc(f"`{name}` must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, allowed: Sequence[Any], *, exc: Type[Exception] = ValueError) -> Any:
    """One of ``allowed``."""
    if value not in allowed:
        raise exc(f"`{name}` must be one of {tuple(allowed)}, got {value!r}")
    return value


def check_bool(name: str, value: Any, *, exc: Type[Exception] = ValueError) -> bool:
    """True or False (not a truthy stand-in)."""
    if not isinstance(value, bool):
        raise exc(f"`{name}` must be True or False, got {value!r}")
    return value

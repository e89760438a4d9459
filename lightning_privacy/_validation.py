"""Argument checks shared by every layer (numpy-free, torch-free): one home for the few shapes they take.

Two message styles, both naming the argument, what is allowed and the value received; nothing is clamped:

- ``check_*`` (callbacks, the ledger, commands): "`delta` must be a float in (0, 1), got 2.0". Callbacks pass
  ``exc=MisconfigurationException`` (Lightning's convention); pure code keeps the default ``ValueError``.
- ``expect_*`` (the pure ``analysis`` functions, torchmetrics' style): "Expected argument `alpha` to be in (0, 1),
  but got 1.5." — ``TypeError`` for a wrong type, ``ValueError`` for a value out of range.

Example:
    >>> check_positive("noise_multiplier", 1.5)
    1.5
    >>> check_choice("relation", "swap", ("replace", "add_remove"))
    Traceback (most recent call last):
    ...
    ValueError: `relation` must be one of ('replace', 'add_remove'), got 'swap'
    >>> expect_real("alpha", 0.05, low=0.0, high=1.0, low_open=True, high_open=True)
    0.05
    >>> expect_count("num_guesses", 2.5)
    Traceback (most recent call last):
    ...
    TypeError: Expected argument `num_guesses` to be a non-negative integer, but got 2.5.
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
    "expect_choice",
    "expect_count",
    "expect_real",
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


# ------------------------------------------------------------------------------ torchmetrics-style (analysis)
def _is_real_like(value: Any) -> bool:
    """A real number, numpy scalars included (they register as ``numbers.Real``), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def expect_real(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A real number in the interval [low, high] (ends open as asked); NaN never passes, ±inf only as a closed end."""
    if not _is_real_like(value):
        raise TypeError(f"Expected argument `{name}` to be a real number, but got {value!r}.")
    x = float(value)
    ok = not math.isnan(x) and (x > low if low_open else x >= low) and (x < high if high_open else x <= high)
    if not ok:
        if math.isinf(low) and math.isinf(high):
            raise ValueError(f"Expected argument `{name}` to be a real number, but got {value!r}.")
        interval = ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open else "]")
        raise ValueError(f"Expected argument `{name}` to be in {interval}, but got {value!r}.")
    return x


def expect_count(name: str, value: Any) -> int:
    """A whole number ≥ 0 (a float such as 3.0 is accepted, 2.5 is not)."""
    message = f"Expected argument `{name}` to be a non-negative integer, but got {value!r}."
    if not _is_real_like(value):
        raise TypeError(message)
    if not isinstance(value, numbers.Integral) and not (math.isfinite(value) and value == int(value)):
        raise TypeError(message)
    if value < 0:
        raise ValueError(message)
    return int(value)


def expect_choice(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    """One of ``allowed`` (compared with ``==`` after a hashability-safe membership test)."""
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        raise ValueError(f"Expected argument `{name}` to be one of {tuple(allowed)}, but got {value!r}.")
    return value

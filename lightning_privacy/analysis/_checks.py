"""Argument checks of the pure ``analysis`` layer, in torchmetrics' style (numpy only).

Messages name the argument, what is allowed and the value received ("Expected argument `alpha` to be in (0, 1),
but got 1.5."), with ``TypeError`` for a wrong type and ``ValueError`` for a value out of range; nothing is clamped.
They live inside the layer so that it stays importable on its own (numpy/scipy; no torch, no Lightning, nothing
from the rest of the package); the callbacks' and commands' checks are :mod:`lightning_privacy._validation`.

Example:
    >>> expect_real("alpha", 0.05, low=0.0, high=1.0, low_open=True, high_open=True)
    0.05
    >>> expect_count("num_guesses", 2.5)
    Traceback (most recent call last):
    ...
    TypeError: Expected argument `num_guesses` to be a non-negative integer, but got 2.5.
    >>> real_array("steps", [10, 20]).tolist()
    [10.0, 20.0]
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

__all__ = ["expect_choice", "expect_count", "expect_real", "real_array"]


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


def real_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array of dim 0 or 1; TypeError/ValueError name ``name`` and the value."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, (str, bytes)):
        raise TypeError(f"Expected argument `{name}` to be a real number or a 1-D sequence of them, but got {value!r}.")
    if isinstance(value, numbers.Real):
        arr = np.asarray(float(value))
    else:
        try:
            arr = np.asarray(value)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise TypeError(f"Expected argument `{name}` to be numeric, but got {value!r}.") from exc
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise TypeError(
                f"Expected argument `{name}` to be a real number or a 1-D sequence of them, but got {value!r}."
            )
        arr = arr.astype(float)
    if arr.ndim > 1:
        raise ValueError(f"Expected argument `{name}` to be a scalar or 1-D, but got shape {arr.shape}: {value!r}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"Expected argument `{name}` to be finite (no NaN or inf), but got {value!r}.")
    return arr

"""Module paths kept for a while after their contents moved: each name still resolves, with a ``DeprecationWarning``."""

import warnings
from importlib import import_module
from typing import Any, Callable, List, Sequence, Tuple


def moved_names(old: str, new: str, names: Sequence[str], *, since: str, removed_in: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the module ``old``, whose ``names`` moved to the module ``new``: each resolves to
    the new object with a ``DeprecationWarning`` that points at the importing line and names the new import.

    Example::

        >>> import warnings
        >>> getattr_ = moved_names("pkg.old", "math", ["pi"], since="0.3.0", removed_in="0.4.0")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     round(getattr_("pi"), 2)
        3.14
        >>> print(caught[0].message)
        pkg.old.pi moved to math.pi in 0.3.0 and this path is removed in 0.4.0: `from math import pi`.
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {new}.{name} in {since} and this path is removed in {removed_in}: "
            f"`from {new} import {name}`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(new), name)

    return __getattr__


def moved_module(
    old: str, new: str, names: Sequence[str], *, since: str, removed_in: str
) -> Tuple[Callable[[str], Any], Callable[[], List[str]], List[str]]:
    """``(__getattr__, __dir__, __all__)`` of a module whose ``names`` all moved to ``new`` (see :func:`moved_names`).

    Example::

        >>> getattr_, dir_, all_ = moved_module("pkg.old", "math", ["pi", "e"], since="0.3.0", removed_in="0.4.0")
        >>> dir_(), all_
        (['e', 'pi'], ['pi', 'e'])
    """
    return moved_names(old, new, names, since=since, removed_in=removed_in), lambda: sorted(names), list(names)

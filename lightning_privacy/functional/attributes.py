"""What an attribute-inference attacker wants to learn, and how to substitute it in a batch.

Attribute inference (Cherubin et al. 2024, Game 3 and Section 5): a record ``z = (φ, s)`` has a
sensitive attribute ``s`` taking values in a finite set ``A``; the attacker knows ``φ`` and wants ``s``.
The data-dependent bound of Corollary 10 needs, for every example of a batch, the example re-written
with each candidate value ``a ∈ A``. :class:`SensitiveAttribute` describes ``A`` and that re-writing:

- :meth:`SensitiveAttribute.numeric`: one numeric input column holding the (encoded) raw value,
  e.g. Adult's standardised ``age`` with raw candidates 17..90;
- :meth:`SensitiveAttribute.one_hot`: a one-hot group of columns, value ``k`` = column ``k`` set to 1
  and the others of the group to 0;
- :meth:`SensitiveAttribute.custom`: a user function ``substitute(inputs, value)`` for anything else
  (images, text, dict batches).

:meth:`SensitiveAttribute.expand` turns a batch ``(B, ...)`` into ``(B, |A|, ...)``: row ``b`` repeated
once per candidate value, in the order of :attr:`SensitiveAttribute.values`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

__all__ = ["SensitiveAttribute", "KINDS"]

KINDS = ("numeric", "one_hot", "custom")
ValuesSpec = Union[str, Sequence[Any], None]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _column_index(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TypeError(f"Expected argument `{name}` to be a non-negative int, but got {value!r}.")
    return int(value)


def _check_distinct(name: str, values: Sequence[Any]) -> None:
    try:
        distinct = len(set(values)) == len(values)
    except TypeError:  # unhashable values (tensors, arrays): the caller vouches for them
        return
    if not distinct:
        raise ValueError(f"Expected argument `{name}` to hold distinct values, but got {list(values)!r}.")


def _tree_map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    """Apply ``fn`` to every tensor of a (possibly nested) tuple/list/dict of tensors."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((k, _tree_map(fn, v)) for k, v in tree.items())
    if isinstance(tree, (tuple, list)):
        return type(tree)(_tree_map(fn, v) for v in tree)
    raise TypeError(f"Expected a tensor or a tuple/list/dict of tensors, but got {type(tree).__name__}.")


def _tree_stack(trees: Sequence[Any], dim: int) -> Any:
    """Stack same-structured trees leaf by leaf along ``dim``."""
    first = trees[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(trees), dim=dim)
    if isinstance(first, dict):
        return type(first)((k, _tree_stack([t[k] for t in trees], dim)) for k in first)
    return type(first)(_tree_stack([t[i] for t in trees], dim) for i in range(len(first)))


def _tree_signature(tree: Any) -> Any:
    """Structure and leaf shapes/dtypes, to check that a substitution kept the batch's form."""
    if isinstance(tree, torch.Tensor):
        return ("tensor", tuple(tree.shape), tree.dtype)
    if isinstance(tree, dict):
        return ("dict", tuple((k, _tree_signature(v)) for k, v in tree.items()))
    if isinstance(tree, (tuple, list)):
        return (type(tree).__name__, tuple(_tree_signature(v) for v in tree))
    return ("other", type(tree).__name__)


def tree_batch_size(tree: Any) -> int:
    """Leading dimension shared by every tensor of ``tree`` (the batch size).

    Example::

        >>> tree_batch_size({"x": torch.zeros(3, 2), "mask": torch.ones(3)})
        3
    """
    sizes = set()
    _tree_map(lambda t: sizes.add(t.shape[0] if t.ndim else None), tree)
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"Expected every input tensor to share one leading batch dimension, but got sizes {sorted(map(str, sizes))}."
        )
    return sizes.pop()


class SensitiveAttribute:
    """A sensitive attribute: its candidate values ``A`` and how to write each into a batch.

    Build one with :meth:`numeric`, :meth:`one_hot` or :meth:`custom` (or take a ready-made one from
    :meth:`~lightning_privacy.data.datamodule.AdultDataModule.sensitive_attribute`). The values are
    kept in the order given; :meth:`select` restricts them (domain knowledge, Section 5.4).

    Attributes:
        kind: ``"numeric"``, ``"one_hot"`` or ``"custom"``.
        name: a label for messages and logs.
        values: the candidate values ``A`` (raw values, category labels or user objects).

    Example::

        >>> age = SensitiveAttribute.numeric(column=0, values=range(17, 91), encode=lambda a: (a - 38.4) / 13.1,
        ...                                  name="age")
        >>> age.size, age.values[:3]
        (74, (17, 18, 19))
        >>> x = torch.zeros(2, 3)
        >>> age.expand(x).shape
        torch.Size([2, 74, 3])
        >>> round(float(age.substitute(x, 90)[1, 0]), 4)
        3.9389
        >>> age.select("extremes").values
        (17, 90)
    """

    def __init__(
        self,
        *,
        kind: str,
        values: Iterable[Any],
        name: Optional[str] = None,
        column: Optional[int] = None,
        encode: Optional[Callable[[Any], float]] = None,
        columns: Optional[Sequence[int]] = None,
        substitute: Optional[Callable[[Any, Any], Any]] = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"Expected argument `kind` to be one of {KINDS}, but got {kind!r}.")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"Expected argument `values` to be a sequence of candidate values, but got {values!r}.")
        values = tuple(values)
        if len(values) < 2:
            raise ValueError(
                f"Expected argument `values` to hold at least 2 candidate values (an attribute with one possible "
                f"value has nothing to infer), but got {values!r}."
            )
        self.kind = kind
        self.name = name if name is not None else kind
        self.column: Optional[int] = None
        self.columns: Optional[tuple] = None
        self.encode = encode
        self._substitute = substitute
        if kind == "numeric":
            self.column = _column_index("column", column)
            bad = [v for v in values if not _is_real(v)]
            if bad:
                raise ValueError(
                    f"Expected argument `values` to be finite real numbers, but got {bad[0]!r} in {values!r}."
                )
            _check_distinct("values", values)
            if encode is not None and not callable(encode):
                raise TypeError(f"Expected argument `encode` to be callable or None, but got {encode!r}.")
            encoded = [float(encode(v)) if encode is not None else float(v) for v in values]
            bad = [(v, e) for v, e in zip(values, encoded) if not math.isfinite(e)]
            if bad:
                raise ValueError(
                    f"Expected `encode` to map every value to a finite number, but encode({bad[0][0]!r}) = {bad[0][1]!r}."
                )
            self._encoded = torch.tensor(encoded, dtype=torch.float64)
        elif kind == "one_hot":
            if columns is None or isinstance(columns, (str, bytes)) or not isinstance(columns, Iterable):
                raise TypeError(f"Expected argument `columns` to be a sequence of column indices, but got {columns!r}.")
            cols = tuple(_column_index("columns", c) for c in columns)
            if len(cols) != len(values):
                raise ValueError(
                    f"Expected one value per column of the one-hot group, but got {len(cols)} `columns` {cols!r} and "
                    f"{len(values)} `values` {values!r}."
                )
            _check_distinct("columns", cols)
            _check_distinct("values", values)
            self.columns = cols
        else:
            if not callable(substitute):
                raise TypeError(
                    f"Expected argument `substitute` to be callable as substitute(inputs, value), but got {substitute!r}."
                )
            _check_distinct("values", values)
        self.values = values

    # ------------------------------------------------------------------------------ constructors
    @classmethod
    def numeric(
        cls,
        *,
        column: int,
        values: Iterable[float],
        encode: Optional[Callable[[Any], float]] = None,
        name: Optional[str] = None,
    ) -> SensitiveAttribute:
        """A numeric input column; ``values`` are raw values, ``encode`` maps them to the input scale.

        Args:
            column: index of the column in the last input dimension.
            values: the candidate raw values (at least 2, distinct, finite).
            encode: raw value -> model input (e.g. standardisation); identity if ``None``.
            name: label for messages.

        Example::

            >>> SensitiveAttribute.numeric(column=2, values=[0, 1]).expand(torch.ones(1, 3))
            tensor([[[1., 1., 0.],
                     [1., 1., 1.]]])
        """
        return cls(kind="numeric", values=values, column=column, encode=encode, name=name)

    @classmethod
    def one_hot(
        cls, *, columns: Sequence[int], values: Optional[Sequence[Any]] = None, name: Optional[str] = None
    ) -> SensitiveAttribute:
        """A one-hot group: value ``values[k]`` sets ``columns[k]`` to 1 and the group's other columns to 0.

        Args:
            columns: the group's column indices (at least 2, distinct).
            values: labels of the categories, one per column; default: the column indices.
            name: label for messages.

        Example::

            >>> SensitiveAttribute.one_hot(columns=[1, 2], values=["F", "M"]).substitute(torch.ones(1, 3), "M")
            tensor([[1., 0., 1.]])
        """
        columns = tuple(columns) if isinstance(columns, Iterable) and not isinstance(columns, (str, bytes)) else columns
        return cls(kind="one_hot", values=columns if values is None else values, columns=columns, name=name)

    @classmethod
    def custom(
        cls, *, substitute: Callable[[Any, Any], Any], values: Sequence[Any], name: Optional[str] = None
    ) -> SensitiveAttribute:
        """Any other attribute: ``substitute(inputs, value)`` returns the batch with the attribute set to ``value``.

        ``inputs`` is the whole batch (a tensor or a tuple/list/dict of tensors with a leading batch
        dimension); the result must have the same structure, shapes and dtypes, and must not modify
        ``inputs`` in place.

        Example::

            >>> flip = SensitiveAttribute.custom(substitute=lambda x, v: x * v, values=[-1.0, 1.0], name="sign")
            >>> flip.expand(torch.tensor([[2.0]]))
            tensor([[[-2.],
                     [ 2.]]])
        """
        return cls(kind="custom", values=values, substitute=substitute, name=name)

    # ------------------------------------------------------------------------------ values
    @property
    def size(self) -> int:
        """|A|, the number of candidate values."""
        return len(self.values)

    def select(self, values: ValuesSpec = "all") -> SensitiveAttribute:
        """The same attribute restricted to some candidate values (Section 5.4, domain knowledge).

        Args:
            values: ``"all"`` (or ``None``) keeps every value; ``"extremes"`` keeps the smallest and the
                largest (only for real-valued candidates); a sequence keeps those values, in that order.

        Raises:
            ValueError: for an unknown mode, an unordered attribute with ``"extremes"`` or values that
                are not candidates.

        Example::

            >>> sex = SensitiveAttribute.one_hot(columns=[5, 6], values=["Female", "Male"])
            >>> sex.select(["Male", "Female"]).columns
            (6, 5)
        """
        if values is None or (isinstance(values, str) and values == "all"):
            return self
        if isinstance(values, str):
            if values != "extremes":
                raise ValueError(
                    f"Expected argument `values` to be 'all', 'extremes' or a sequence of candidates, but got {values!r}."
                )
            if not all(_is_real(v) for v in self.values):
                raise ValueError(
                    f"values='extremes' needs real-valued candidates (an ordered attribute); {self.name!r} has "
                    f"{self.values[:5]!r}... Pass the two values you consider most revealing, e.g. values=[a, b]."
                )
            keep = [self.values.index(min(self.values)), self.values.index(max(self.values))]
        else:
            if not isinstance(values, Iterable):
                raise TypeError(
                    f"Expected argument `values` to be 'all', 'extremes' or a sequence, but got {values!r}."
                )
            keep = []
            for v in values:
                matches = [i for i, c in enumerate(self.values) if _same_value(c, v)]
                if not matches:
                    raise ValueError(
                        f"Expected every entry of `values` to be a candidate of {self.name!r}, but got {v!r}."
                    )
                keep.append(matches[0])
        chosen = [self.values[i] for i in keep]
        if self.kind == "numeric":
            return SensitiveAttribute.numeric(column=self.column, values=chosen, encode=self.encode, name=self.name)
        if self.kind == "one_hot":
            return SensitiveAttribute.one_hot(columns=[self.columns[i] for i in keep], values=chosen, name=self.name)
        return SensitiveAttribute.custom(substitute=self._substitute, values=chosen, name=self.name)

    def _index(self, value: Any) -> int:
        for i, c in enumerate(self.values):
            if _same_value(c, value):
                return i
        raise ValueError(f"Expected argument `value` to be one of the candidates of {self.name!r}, but got {value!r}.")

    # ------------------------------------------------------------------------------ substitution
    def _check_tabular(self, inputs: Any) -> torch.Tensor:
        if not isinstance(inputs, torch.Tensor) or inputs.ndim < 2 or not inputs.is_floating_point():
            got = (
                f"{type(inputs).__name__} of shape {tuple(inputs.shape)}"
                if isinstance(inputs, torch.Tensor)
                else type(inputs).__name__
            )
            raise ValueError(
                f"A {self.kind} attribute needs a floating-point tensor (batch, ..., features) as inputs, but got {got}; "
                "use SensitiveAttribute.custom for other inputs."
            )
        width = inputs.shape[-1]
        used = [self.column] if self.kind == "numeric" else list(self.columns)
        if max(used) >= width:
            raise ValueError(
                f"Attribute {self.name!r} uses column {max(used)}, but the inputs have only {width} columns "
                f"(shape {tuple(inputs.shape)})."
            )
        return inputs

    def substitute(self, inputs: Any, value: Any) -> Any:
        """``inputs`` with the attribute of every row set to ``value`` (a new object; inputs untouched)."""
        k = self._index(value)
        if self.kind == "custom":
            out = self._substitute(inputs, self.values[k])
            if _tree_signature(out) != _tree_signature(inputs):
                raise ValueError(
                    f"substitute(inputs, {self.values[k]!r}) of attribute {self.name!r} must return inputs of the same "
                    f"structure, shapes and dtypes: got {_tree_signature(out)} for {_tree_signature(inputs)}."
                )
            return out
        x = self._check_tabular(inputs).clone()
        if self.kind == "numeric":
            x[..., self.column] = self._encoded[k].to(x.dtype)
        else:
            x[..., list(self.columns)] = 0
            x[..., self.columns[k]] = 1
        return x

    def expand(self, inputs: Any) -> Any:
        """All substitutions at once: ``(B, ...)`` -> ``(B, |A|, ...)``, value ``k`` at index ``k`` of dim 1."""
        if self.kind == "custom":
            return _tree_stack([self.substitute(inputs, v) for v in self.values], dim=1)
        x = self._check_tabular(inputs)
        out = x.unsqueeze(1).repeat_interleave(self.size, dim=1)
        if self.kind == "numeric":
            out[:, :, ..., self.column] = self._encoded.to(dtype=x.dtype, device=x.device).view(
                1, self.size, *([1] * (x.ndim - 2))
            )
        else:
            cols = torch.tensor(self.columns, device=x.device)
            eye = torch.eye(self.size, dtype=x.dtype, device=x.device)  # (value k, group column j)
            out[..., cols] = eye.view(1, self.size, *([1] * (x.ndim - 2)), self.size).expand(out[..., cols].shape)
        return out

    def __repr__(self) -> str:
        where = {"numeric": f"column={self.column}", "one_hot": f"columns={self.columns}", "custom": "substitute=..."}[
            self.kind
        ]
        shown = self.values if self.size <= 6 else (*self.values[:3], "...", *self.values[-2:])
        return f"SensitiveAttribute.{self.kind}(name={self.name!r}, {where}, |A|={self.size}, values={shown})"


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return a is b

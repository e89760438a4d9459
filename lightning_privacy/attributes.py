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

Checking candidates against the data (:func:`observed_values`, :func:`check_candidates`): candidates on
the wrong scale (raw ages 17..90 written into Adult's standardised age column, which holds about
-1.6..3.9) make every substituted example an outlier; the bound is then computed for the wrong
question and overstates privacy, without any error. The check compares the values the attribute
writes with what the batch holds where it writes them:

- numeric: with ``[lo, hi]`` the column's observed range and ``w = hi - lo`` its span, the candidates
  (as written, i.e. after ``encode``) are *far outside* when their span exceeds ``100 w`` (wrong unit,
  e.g. raw incomes into a standardised column) or when more than half of them lie outside
  ``[lo - w, hi + w]`` (wrong location or unit, e.g. raw ages). A batch says little about a column's
  range, so the check waits for at least 128 finite values with at least 3 distinct ones (several
  batches if they are small) and its thresholds are generous. On Adult (tested on random batches of
  128 and 256 rows), every numeric column's correctly encoded candidates, all or the extremes, pass,
  heavy tails (capital-gain) included, while the raw candidates of age, fnlwgt, capital-gain,
  capital-loss and hours-per-week fail. It cannot catch every mistake: a wrong scale whose
  candidates still mostly overlap the data passes (raw education-num 1..16 against its standardised
  -3.5..2.3 on some batches; raw extremes of which one falls inside the data);
- one-hot: the group's columns must hold only 0 and 1, with at most one 1 per row;
- custom: ``substitute`` is the user's own function; what it writes cannot be compared with the
  batch, so it is not checked.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

__all__ = ["SensitiveAttribute", "KINDS", "observed_values", "check_candidates"]

KINDS = ("numeric", "one_hot", "custom")
#: the numeric check decides once it has seen this many finite values of the column ...
CHECK_MIN_VALUES = 128
#: ... with at least this many distinct ones (a nearly constant sample tells nothing about the range)
CHECK_MIN_DISTINCT = 3
#: candidates' span above this multiple of the column's observed span: wrong unit
CHECK_SPAN_FACTOR = 100.0
#: a candidate more than this many observed spans beyond the observed range is outside
CHECK_MARGIN = 1.0
_ONE_HOT_TOLERANCE = 1e-6
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


# ------------------------------------------------------------------------------ candidates vs data
def observed_values(attribute: SensitiveAttribute, inputs: Any) -> Optional[torch.Tensor]:
    """What ``inputs`` hold where ``attribute`` writes: a detached float64 CPU tensor, or ``None``.

    Numeric attributes give every value of the column (1-D); one-hot groups give ``(rows, group
    columns)``; custom attributes give ``None`` (their ``substitute`` cannot be read).

    Raises:
        ValueError: when a numeric or one-hot attribute does not fit the inputs (see :meth:`SensitiveAttribute.expand`).

    Example::

        >>> observed_values(SensitiveAttribute.numeric(column=1, values=[0, 1]), torch.tensor([[5.0, 0.5], [6.0, 2.0]]))
        tensor([0.5000, 2.0000], dtype=torch.float64)
    """
    if attribute.kind == "custom":
        return None
    x = attribute._check_tabular(inputs).detach()
    if attribute.kind == "numeric":
        return x[..., attribute.column].reshape(-1).to(device="cpu", dtype=torch.float64)
    columns = list(attribute.columns)
    return x[..., columns].reshape(-1, len(columns)).to(device="cpu", dtype=torch.float64)


def check_candidates(attribute: SensitiveAttribute, observed: Optional[torch.Tensor]) -> Optional[bool]:
    """Whether the values ``attribute`` writes fit what its column(s) hold (rule: module docstring).

    Args:
        attribute: the attribute whose candidates are checked.
        observed: :func:`observed_values` of one or more batches (concatenated along dim 0).

    Returns:
        ``True`` when they fit; ``None`` when the data are too few to tell (numeric: fewer than
        ``CHECK_MIN_VALUES`` finite values or fewer than ``CHECK_MIN_DISTINCT`` distinct ones) or the
        attribute is custom.

    Raises:
        ValueError: when the candidates are far outside the column's observed range (numeric), or the
            group's columns hold values other than 0/1 or several 1s in one row (one-hot). The message
            names the attribute, the column's observed range and the candidates' range.

    Example::

        >>> column = torch.linspace(-1.6, 3.9, 200, dtype=torch.float64)  # a standardised age column
        >>> check_candidates(SensitiveAttribute.numeric(column=0, values=[-1.5, 0.0, 3.5]), column)
        True
        >>> check_candidates(SensitiveAttribute.numeric(column=0, values=range(17, 91), name="age"), column)
        Traceback (most recent call last):
        ...
        ValueError: The candidate values of attribute 'age' are far outside what input column 0 holds: ...
        >>> check_candidates(SensitiveAttribute.numeric(column=0, values=[0, 1]), column[:10]) is None
        True
    """
    if attribute.kind == "custom" or observed is None:
        return None
    if attribute.kind == "one_hot":
        return _check_one_hot(attribute, observed)
    values = observed[torch.isfinite(observed)]
    if values.numel() < CHECK_MIN_VALUES or values.unique().numel() < CHECK_MIN_DISTINCT:
        return None
    lo, hi = float(values.min()), float(values.max())
    span = hi - lo
    written = attribute._encoded
    low, high = float(written.min()), float(written.max())
    outside = int(((written < lo - CHECK_MARGIN * span) | (written > hi + CHECK_MARGIN * span)).sum())
    reasons = []
    if high - low > CHECK_SPAN_FACTOR * span:
        reasons.append(
            f"their span {high - low:.4g} is more than {CHECK_SPAN_FACTOR:g} times the column's span {span:.4g}"
        )
    if 2 * outside > attribute.size:
        reasons.append(
            f"{outside} of the {attribute.size} lie more than {CHECK_MARGIN:g} observed span beyond that range, "
            f"outside [{lo - CHECK_MARGIN * span:.4g}, {hi + CHECK_MARGIN * span:.4g}]"
        )
    if not reasons:
        return True
    raw = min(attribute.values), max(attribute.values)
    how = (
        "as given (no `encode`)" if attribute.encode is None else f"from raw values {raw[0]:g}..{raw[1]:g} by `encode`"
    )
    raise ValueError(
        f"The candidate values of attribute {attribute.name!r} are far outside what input column {attribute.column} "
        f"holds: the column's observed range is [{lo:.4g}, {hi:.4g}] ({values.numel()} values), while the "
        f"{attribute.size} candidates, written {how}, range over [{low:.4g}, {high:.4g}]; {' and '.join(reasons)}."
    )


def _check_one_hot(attribute: SensitiveAttribute, observed: torch.Tensor) -> Optional[bool]:
    if observed.shape[0] == 0:
        return None
    tol = _ONE_HOT_TOLERANCE
    binary = (observed.abs() <= tol) | ((observed - 1).abs() <= tol)
    where = f"attribute {attribute.name!r} is a one-hot group over input columns {attribute.columns}, but"
    if not bool(binary.all()):
        row, col = (int(i) for i in (~binary).nonzero()[0])
        raise ValueError(
            f"The {where} the batch holds values other than 0 and 1 there: the columns range over "
            f"[{float(observed.min()):.4g}, {float(observed.max()):.4g}] (e.g. {float(observed[row, col]):.4g} in "
            f"column {attribute.columns[col]}), while the candidates write 0 and 1."
        )
    several = int((observed.sum(dim=1) > 1 + tol).sum())
    if several:
        raise ValueError(
            f"The {where} {several} of {observed.shape[0]} rows of the batch hold a 1 in several of these columns: "
            "they are not one one-hot group."
        )
    return True

"""The statement's constants and the checks of what it reads: a DPSGD state's fields and the checkpoint's own.

A checkpoint is data, and a statement is read from files that may have been edited, truncated or written by another
program. Every value the statement uses is checked here before any arithmetic, so a malformed field is one
``ValueError`` naming the field and its value ("DPSGD state field `max_grad_norm` is None: expected a finite number
> 0"), never a ``TypeError`` from deep inside a computation. :func:`dpsgd_fields` gives the checked values of a DPSGD
state as a :class:`DPFields`.

Example::

    >>> fields = dpsgd_fields({"version": 2, "accountant": "pld", "max_grad_norm": 1.0, "noise_multiplier": 1.5,
    ...     "ledger": {"version": 1, "accountant": "pld", "history": [[1.5, 0.01, 100]]}})
    >>> fields.history, fields.steps, fields.expected_batch_size
    ([(1.5, 0.01, 100)], 100, None)
    >>> dpsgd_fields({"accountant": "pld", "max_grad_norm": None, "ledger": {"accountant": "pld", "history": []}})
    Traceback (most recent call last):
    ...
    ValueError: DPSGD state field `max_grad_norm` is None: expected a finite number > 0
"""

from __future__ import annotations

import ast
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["DEFAULT_DELTA", "FORMAT", "FORMAT_VERSION", "FPRS", "DPFields", "dpsgd_fields", "source_fields"]

FORMAT = "lightning-privacy privacy statement"
FORMAT_VERSION = 1
#: The standard false-positive rates of the TPR bounds (those :class:`~lightning_privacy.BayesSecurityMonitor` logs).
FPRS = (0.001, 0.01, 0.1)
RELATIONS = ("replace", "add_remove")  # the TPR bounds are given for both
RELATION_LABELS = {"replace": "replace one example", "add_remove": "add or remove one example"}
DEFAULT_DELTA = 1e-5  # DPSGD's default δ, for a version-1 DPSGD state that did not save its δ
Segment = Tuple[float, float, int]


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message stays one readable line whatever the field holds."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bad(name: str, value: Any, expected: str, what: str = "DPSGD state field") -> ValueError:
    return ValueError(f"{what} `{name}` is {shown(value)}: expected {expected}")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number(
    name: str,
    value: Any,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = True,
    high_open: bool = True,
    optional: bool = False,
    what: str = "DPSGD state field",
) -> Optional[float]:
    """A finite real number in the interval (``None`` passes when ``optional``); else a ValueError naming it."""
    if value is None and optional:
        return None
    ok = _real(value) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        span = f"> {low:g}" if math.isinf(high) else f"in {left}{low:g}, {high:g}{right}"
        raise _bad(name, value, f"a finite number {span}" + (" or None" if optional else ""), what)
    return float(value)


def whole(
    name: str, value: Any, *, minimum: int = 0, optional: bool = True, what: str = "DPSGD state field"
) -> Optional[int]:
    """A whole number ≥ ``minimum`` (an int, not a bool or a float; ``None`` passes when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise _bad(name, value, f"a whole number >= {minimum}" + (" or None" if optional else ""), what)
    return int(value)


def flag(name: str, value: Any, *, what: str = "DPSGD state field") -> Optional[bool]:
    """``True``, ``False`` or ``None``."""
    if value is not None and not isinstance(value, bool):
        raise _bad(name, value, "True, False or None", what)
    return value


def text(name: str, value: Any, *, optional: bool = True, what: str = "DPSGD state field") -> Optional[str]:
    """A string (``None`` passes when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _bad(name, value, "a string" + (" or None" if optional else ""), what)
    return value


def plain(name: str, value: Any, *, what: str = "DPSGD state field") -> Any:
    """``value`` if it is plain JSON (None, bools, finite numbers, strings, lists and string-keyed dicts of them)."""

    def ok(item: Any) -> bool:
        if item is None or isinstance(item, (bool, str)):
            return True
        if _real(item):
            return math.isfinite(item)
        if isinstance(item, (list, tuple)):
            return all(ok(x) for x in item)
        if isinstance(item, Mapping):
            return all(isinstance(k, str) and ok(v) for k, v in item.items())
        return False

    if not ok(value):
        raise _bad(name, value, "plain values (numbers, strings, lists, dicts)", what)
    return value


def segments(name: str, value: Any) -> List[Segment]:
    """A ledger's history: ``[[noise_multiplier > 0, sample_rate in (0, 1], steps >= 0], ...]``."""
    if not isinstance(value, (list, tuple)):
        raise _bad(name, value, "a list of [noise_multiplier, sample_rate, steps]")
    out = []
    for i, entry in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise _bad(where, entry, "[noise_multiplier, sample_rate, steps]")
        sigma, rate, steps = entry
        if not (_real(sigma) and math.isfinite(sigma) and sigma > 0):
            raise _bad(where, entry, "[noise_multiplier, sample_rate, steps] with a finite noise_multiplier > 0")
        if not (_real(rate) and math.isfinite(rate) and 0 < rate <= 1):
            raise _bad(where, entry, "[noise_multiplier, sample_rate, steps] with a sample_rate in (0, 1]")
        if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 0:
            raise _bad(where, entry, "[noise_multiplier, sample_rate, steps] with a whole number of steps >= 0")
        out.append((float(sigma), float(rate), int(steps)))
    return out


@dataclass
class DPFields:
    """The checked values of a DPSGD state (``None``: not recorded)."""

    accountant: str
    max_grad_norm: float
    history: List[Segment]
    ledger_accountant: str
    relation: str
    noise_multiplier: Optional[float] = None
    sample_rate: Optional[float] = None
    sample_rate_given: Optional[bool] = None
    sample_rate_origin: Optional[str] = None
    expected_batch_size: Optional[float] = None
    delta: Optional[float] = None
    dataset_size: Optional[int] = None
    sampling_seed: Optional[int] = None
    noise_seed: Optional[int] = None
    secure_mode: Optional[bool] = None
    grad_sample_mode: Optional[str] = None
    grad_sample_mode_switch: Optional[Dict[str, Any]] = None  # auto's switch to functional mode: step, reason
    privacy_unit: Optional[Dict[str, Any]] = None  # {"unit": "example"} or a person's: k, sampling, reduction
    clipping: Optional[Dict[str, Any]] = None  # the clipping rule: {"rule": "fixed"} or {"rule": "automatic", ...}
    precision: Optional[Dict[str, Any]] = None  # the Trainer's precision and the steps bounded up to 16-bit rounding
    loss_reduction: Optional[str] = None
    strategy: Optional[str] = None
    world_size: Optional[int] = None
    fixed_modules: List[Dict[str, Any]] = field(default_factory=list)
    digest: Optional[str] = None

    @property
    def steps(self) -> int:
        """The steps of the ledger's history."""
        return sum(t for _, _, t in self.history)


def dpsgd_fields(state: Mapping[str, Any]) -> DPFields:
    """The checked fields of a DPSGD state (see the module docstring).

    Raises:
        ValueError: a field of the wrong type, out of range or not finite; one line naming the field and its value.
    """
    version = state.get("version")
    if version is not None and version not in (1, 2):
        raise _bad("version", version, "1 or 2")
    if "ledger" in state:
        ledger = state["ledger"]
        if not isinstance(ledger, Mapping):
            raise _bad("ledger", ledger, "a dict (the privacy ledger's state)")
        history_name = "ledger.history"
    else:  # version 1: the accountant's history only
        ledger = {"accountant": state.get("accountant"), "history": state.get("history")}
        history_name = "history"
    fixed = state.get("fixed_modules") or []
    if not isinstance(fixed, (list, tuple)) or not all(isinstance(entry, Mapping) for entry in fixed):
        raise _bad("fixed_modules", fixed, "a list of dicts (module, old and new class)")
    return DPFields(
        accountant=text("accountant", state.get("accountant"), optional=False),
        max_grad_norm=number("max_grad_norm", state.get("max_grad_norm")),
        history=segments(history_name, ledger.get("history")),
        ledger_accountant=text("ledger.accountant", ledger.get("accountant"), optional=False),
        relation=text("ledger.relation", ledger.get("relation", "replace"), optional=False),
        noise_multiplier=number("noise_multiplier", state.get("noise_multiplier"), optional=True),
        sample_rate=number("sample_rate", state.get("sample_rate"), high=1.0, high_open=False, optional=True),
        sample_rate_given=flag("sample_rate_given", state.get("sample_rate_given")),
        sample_rate_origin=text("sample_rate_origin", state.get("sample_rate_origin")),
        expected_batch_size=number("expected_batch_size", state.get("expected_batch_size"), optional=True),
        delta=number("delta", state.get("delta"), high=1.0, optional=True),
        dataset_size=whole("dataset_size", state.get("dataset_size")),
        sampling_seed=whole("sampling_seed", state.get("sampling_seed"), minimum=-(2**63)),
        noise_seed=whole("noise_seed", state.get("noise_seed"), minimum=-(2**63)),
        secure_mode=flag("secure_mode", state.get("secure_mode")),
        grad_sample_mode=text("grad_sample_mode", state.get("grad_sample_mode")),
        grad_sample_mode_switch=_switch(state.get("grad_sample_mode_switch")),
        privacy_unit=_unit(state.get("privacy_unit")),
        clipping=_clipping(state.get("clipping")),
        precision=_precision(state.get("precision")),
        loss_reduction=text("loss_reduction", state.get("loss_reduction")),
        strategy=text("strategy", state.get("strategy")),
        world_size=whole("world_size", state.get("world_size"), minimum=1),
        fixed_modules=[dict(plain(f"fixed_modules[{i}]", entry)) for i, entry in enumerate(fixed)],
        digest=text("digest", state.get("digest")),
    )


def _switch(value: Any) -> Optional[Dict[str, Any]]:
    """``grad_sample_mode="auto"``'s switch record (``None``: none): a dict with a whole ``step`` and a ``reason``."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("reason"), str):
        raise _bad("grad_sample_mode_switch", value, "a dict with 'step', 'reason' and 'from'")
    whole("grad_sample_mode_switch.step", value.get("step"), optional=False)
    return dict(plain("grad_sample_mode_switch", value))


def _clipping(value: Any) -> Optional[Dict[str, Any]]:
    """The clipping rule record (``None``: not recorded, fixed)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("rule") not in ("fixed", "automatic", "quantile"):
        raise _bad("clipping", value, "a dict with 'rule' 'fixed', 'quantile' or 'automatic'")
    if value["rule"] == "automatic":
        number("clipping.stability", value.get("stability"))
    return dict(plain("clipping", value))


def _precision(value: Any) -> Optional[Dict[str, Any]]:
    """The precision record (``None``: not recorded): the Trainer's ``precision`` (``None`` before a fit) and the
    whole number of ``rounded_steps``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _bad("precision", value, "a dict with 'precision' and 'rounded_steps'")
    text("precision.precision", value.get("precision"))
    whole("precision.rounded_steps", value.get("rounded_steps"), optional=False)
    return dict(plain("precision", value))


def _unit(value: Any) -> Optional[Dict[str, Any]]:
    """The privacy unit record (``None``: not recorded, a row): ``{"unit": "example"}`` or ``{"unit": "user", ...}``."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("unit") not in ("example", "user"):
        raise _bad("privacy_unit", value, "a dict with 'unit' 'example' or 'user'")
    if value["unit"] == "user":
        whole("privacy_unit.max_examples_per_user", value.get("max_examples_per_user"), minimum=1)
        flag("privacy_unit.user_sampling", value.get("user_sampling"))
    return dict(plain("privacy_unit", value))


def state_key_arguments(key: str) -> Dict[str, Any]:
    """The arguments a callback's state key records (``DPSGD{'noise_multiplier': None, ...}``), or ``{}``."""
    _, brace, rest = key.partition("{")
    if not brace:
        return {}
    try:
        found = ast.literal_eval("{" + rest)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return {}
    return dict(found) if isinstance(found, dict) else {}


def key_fields(key: str, arguments: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """The σ and C a DPSGD state key records (``DPSGD{'noise_multiplier': 1.5, 'max_grad_norm': 1.0, ...}``),
    checked; ``{}`` for a key that records neither."""
    what = f"DPSGD state key {shown(key, 40)}:"
    found = {}
    if "noise_multiplier" in arguments:
        found["noise_multiplier"] = number("noise_multiplier", arguments["noise_multiplier"], optional=True, what=what)
    if "max_grad_norm" in arguments:
        found["max_grad_norm"] = number("max_grad_norm", arguments["max_grad_norm"], optional=True, what=what)
    return found


def source_fields(checkpoint: Mapping[str, Any]) -> Dict[str, Any]:
    """The checkpoint's own ``epoch``, ``global_step`` and Lightning version, checked (``None``: not recorded)."""
    what = "checkpoint field"
    return {
        "epoch": whole("epoch", checkpoint.get("epoch"), what=what),
        "global_step": whole("global_step", checkpoint.get("global_step"), what=what),
        "lightning": text("pytorch-lightning_version", checkpoint.get("pytorch-lightning_version"), what=what),
    }


def planned(arguments: Mapping[str, Any], key: str) -> Dict[str, Any]:
    """The planning target a DPSGD state key records (``target_bayes_security``, ``target_epsilon``, ``epochs``)."""
    what = f"DPSGD state key {shown(key, 40)}:"
    found: Dict[str, Any] = {}
    for name in ("target_bayes_security", "target_epsilon"):
        if arguments.get(name) is not None:
            found[name] = number(name, arguments[name], what=what)
    if arguments.get("epochs") is not None:
        found["epochs"] = whole("epochs", arguments["epochs"], minimum=1, what=what)
    return found


def audit_values(key: str, values: Mapping[str, Any], wanted: Sequence[str]) -> Dict[str, Optional[float]]:
    """An audit state's values of the ``wanted`` keys: numbers (``None`` for a non-finite one, which JSON cannot
    hold); anything else is a ValueError naming the audit and the value."""
    found: Dict[str, Optional[float]] = {}
    for name in wanted:
        if name in values:
            value = values[name]
            if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
                value = value.item()  # a 0-d tensor
            if not _real(value):
                raise _bad(name, value, "a number", f"audit state {shown(key, 40)}: value")
            found[name] = float(value) if math.isfinite(value) else None
    return found

"""Helpers of the tests that read a benchmark's results file or load a benchmark script as a module, and compare a
number recomputed now with the number a file prints (:func:`assert_printed`, :func:`assert_all_printed`)."""

from __future__ import annotations

import importlib.util
import math
import re
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Dict, List, NamedTuple, Sequence

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (not run: its ``main`` is behind ``__name__ == "__main__"``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_table(path: Path, header_start: str, occurrence: int = 0) -> List[Dict[str, str]]:
    """The rows of the Markdown table of ``path`` whose header line starts with ``header_start`` (the first such
    table, or the ``occurrence``-th counting from 0), each a dict of its header's cells (stripped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(header_start)][occurrence]
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.strip("|").split("|")))))
    return rows


# ------------------------------------------------------------------------------- numbers recomputed against a file
# A results file prints a number rounded to its last digit; a value recomputed now (another numpy, scipy or
# dp_accounting, another CPU) may land on the other side of a rounding edge and print one unit apart (+2.7e-5 where
# the file has +2.8e-5). Tests that recompute a file's number compare the value with the printed number, not the
# strings: within one unit of the printed number's last digit (rounding, at most half a unit, plus drift).

_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[+\-−]?)"  # a sign only where it does not follow a digit or letter (0.1-0.2 is a range)
    r"(?:(?P<special>nan|inf)\b|"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.(?P<frac>[0-9]+))?(?:[eE](?P<exp>[+\-−]?[0-9]+))?)",
    flags=re.IGNORECASE,
)


class Printed(NamedTuple):
    """A number as a file prints it: its ``value``, the ``unit`` of its last printed digit and the ``text`` read."""

    value: float
    unit: float
    text: str


def printed_numbers(text: str) -> List[Printed]:
    """Every number of ``text`` in order, with the unit of its last printed digit: ``0.1234`` → 1e-4, ``+2.7e-5`` →
    1e-6 (the mantissa's digits), ``5,000`` and ``12`` → 1 (integer digits; a thousands comma is not a decimal
    point). Signs ``+``, ``-`` and ``−`` (U+2212) count; anything around the numbers (``%``, ``×``, ``±``, ``[a, b]``,
    `` / ``, an en dash between a range's ends) is skipped, so a percentage is read in percent. ``nan`` and ``inf``
    read as themselves (unit 0)."""
    found = []
    for match in _NUMBER.finditer(text):
        sign = -1.0 if match["sign"] in ("-", "−") else 1.0
        if match["special"]:
            found.append(Printed(sign * float(match["special"].lower()), 0.0, match[0]))
            continue
        frac, exp = match["frac"] or "", int((match["exp"] or "0").replace("−", "-"))
        digits = f"{match['int'].replace(',', '')}.{frac or '0'}e{exp}"
        found.append(Printed(sign * float(digits), float(Decimal(1).scaleb(exp - len(frac))), match[0]))
    return found


def _within_one_unit(value: float, printed: Printed) -> bool:
    if math.isnan(printed.value) or math.isnan(value):
        return math.isnan(printed.value) and math.isnan(value)
    if math.isinf(printed.value) or math.isinf(value):
        return value == printed.value
    # one unit, and a billionth of one more for the binary floating point of value − printed (2.7e-5 vs 2.8e-5)
    return abs(value - printed.value) <= printed.unit * (1 + 1e-9)


def assert_printed(value: float, printed: str, what: str = "") -> None:
    """``value`` (recomputed now) is the one number of ``printed`` (a file's text: ``"+2.7e-5"``, ``"0.5000"``,
    ``"24.7 %"``, ``"1.6×"``) within one unit of its last printed digit: ``|value − number| ≤ unit``, so a value
    rounded either way at an edge passes (2.7499e-5 against ``+2.8e-5``) and one two units off fails (2.6e-5). A
    percentage is compared in percent. NaN matches only ``nan``; signs count (−2.7e-5 is not ``+2.7e-5``)."""
    numbers = printed_numbers(printed)
    assert len(numbers) == 1, f"{what}: expected one number in {printed!r}, found {[n.text for n in numbers]}"
    (number,) = numbers
    assert _within_one_unit(float(value), number), (
        f"{what}: recomputed {value!r}, the file prints {printed!r} (± {number.unit:g}, one unit of its last digit)"
    )


def assert_all_printed(values: Sequence[float], printed: str, what: str = "") -> None:
    """Each of ``values`` is the number at its place in ``printed`` within one unit of its last printed digit (see
    :func:`assert_printed`): ``"0.5000 / 0.9949"``, ``"+3.6e-8 / +2.8e-5"``, ``"0.34 [0.16, 0.37]"``, ``"3.6–24.7 %"``.
    ``printed`` holds exactly as many numbers as ``values``."""
    numbers, values = printed_numbers(printed), [float(v) for v in values]
    assert len(numbers) == len(values), (
        f"{what}: {len(values)} values for the {len(numbers)} numbers of {printed!r}: {[n.text for n in numbers]}"
    )
    off = [(v, n.text) for v, n in zip(values, numbers) if not _within_one_unit(v, n)]
    assert not off, (
        f"{what}: recomputed {values}, the file prints {printed!r}; more than one unit of the last digit apart: "
        + ", ".join(f"{v!r} vs {text}" for v, text in off)
    )

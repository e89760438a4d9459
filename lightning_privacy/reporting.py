"""What a part of the privacy report is made of, and the one method that provides it.

Whatever owns numbers worth reporting (a callback, an audit result) implements :class:`ReportContributor`: a
``report_section`` method that returns a :class:`ReportSection` (title, value rows, extra tables, lazy figures,
warnings) or ``None`` for nothing to say. :mod:`lightning_privacy.report` collects the sections of the Trainer's
callbacks (ordered by their ``report_order``) and renders them as Markdown or HTML without knowing any callback or
audit class: a new audit provides its section and touches no report code.

The rounding helpers say which way a value may be rounded: a lower bound (β*) down, an upper bound (ε, advantage,
TPR) up, so that the page never shows more privacy than was computed. Plain Python: no torch, no Lightning.

Example::

    >>> section = ReportSection("My audit", [("ε lower bound", up(1.23456), "what it means")])
    >>> section.rows[0][1], section.figures, section.warnings
    ('1.235', [], ())
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Protocol, Tuple, runtime_checkable

__all__ = [
    "ReportContributor",
    "ReportSection",
    "ReportTable",
    "claim_rows",
    "down",
    "down_sig",
    "result_warnings",
    "up",
]

Row = Tuple[str, str, str]  # (quantity, value, meaning), Markdown inline text


@dataclass
class ReportTable:
    """A table beside a section's value rows: a caption (Markdown inline), column names, cells."""

    caption: str
    header: List[str]
    cells: List[List[str]]


@dataclass
class ReportSection:
    """One contributor's part of the report.

    Attributes:
        title: the section's heading.
        rows: ``(quantity, value, meaning)`` rows of the value table, Markdown inline text.
        extras: further tables, after the value table.
        figures: ``(draw, caption)``: ``draw()`` returns a ``matplotlib.figure.Figure``; drawn only for the HTML page.
        warnings: why the numbers may carry no information; shown first, under the heading.
    """

    title: str
    rows: List[Row]
    extras: List[ReportTable] = field(default_factory=list)
    figures: List[Tuple[Callable[[], Any], str]] = field(default_factory=list)
    warnings: Tuple[str, ...] = ()


@runtime_checkable
class ReportContributor(Protocol):
    """Anything with a section in the report: a callback (given the Trainer, after ``fit``) or an audit result.

    A callback may also set ``report_order`` (an int, default 100): sections appear by increasing order, then in the
    order of ``trainer.callbacks``.
    """

    def report_section(self, trainer: Any = None) -> Optional[ReportSection]:
        """This contributor's section, or ``None`` when it has nothing to report."""


def result_warnings(result: Any) -> Tuple[str, ...]:
    """An attack point beyond the accountant's bound (``outside``) first, then the result's ``warnings``."""
    return (*getattr(result, "outside", ()), *getattr(result, "warnings", ()))


def down(value: float, digits: int = 4) -> str:
    """A lower bound (β*) shown with ``digits`` decimals, rounded down: the page never shows more security.

    Example::

        >>> down(0.81239), up(0.0123451), up(0.5, 1)
        ('0.8123', '0.01235', '0.5')
    """
    return f"{math.floor(value * 10**digits) / 10**digits:.{digits}f}" if math.isfinite(value) else f"{value}"


def up(value: float, digits: Optional[int] = None) -> str:
    """An upper bound (ε, advantage, TPR) rounded up: to ``digits`` decimals, or to 4 significant digits."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.4g}"
    if digits is None:
        scale = 10.0 ** (math.floor(math.log10(abs(value))) - 3)
        return f"{math.ceil(value / scale) * scale:.4g}"
    return f"{math.ceil(value * 10**digits) / 10**digits:.{digits}f}"


def down_sig(value: float) -> str:
    """A lower end rounded down to 4 significant digits (the counterpart of :func:`up`'s default)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.4g}"
    scale = 10.0 ** (math.floor(math.log10(abs(value))) - 3)
    return f"{math.floor(value / scale) * scale:.4g}"


def claim_rows(result: Any, key: str) -> List[Row]:
    """The claim a result tested (add/remove, the in/out game) and its verdict; no rows without a claim."""
    verdict = getattr(result, "claim_verdict", None)
    if verdict is None:
        return []
    claim = result.claim
    epsilon = "no finite ε" if not math.isfinite(claim.epsilon) else f"ε = {up(claim.epsilon)}"
    return [
        (
            "claim tested",
            claim.label,
            f"the guarantee checked, in the in/out game (add/remove relation): {epsilon} at δ = {claim.delta:.3g} "
            "and its trade-off curve (TPR bound at every FPR)",
        ),
        (f"`{key}`", str(int(verdict.contradicted)), verdict.sentence() + " (multiple comparisons accounted for)"),
    ]

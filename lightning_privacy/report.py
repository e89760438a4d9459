"""End-of-training privacy report: everything the privacy callbacks of a Trainer know after ``fit``.

:func:`privacy_report` returns Markdown, one section per callback in ``trainer.callbacks`` that provides one (its
``report_section(trainer)``, :mod:`lightning_privacy.reporting`: this module knows no callback or audit class), each
value with a one-line plain-language meaning; approximate values (closed
forms, estimates) are marked as such. The last section is the run's privacy statement for release
(:mod:`lightning_privacy.statement`: the same one ``lightning-privacy statement`` gives for a checkpoint).
:func:`privacy_report_html` returns the same sections as one self-contained HTML page with the figures embedded
(base64 PNG): β* per epoch with the budget and the TPR–FPR region, the Epsilon* histograms and fits, the PANORAMIA curves, the privacy profile with its most
exposed rows, the canary audit's theory-vs-practice chart, the membership attack's log–log ROC inside the
accountant's region, β*_AI per epoch and, on log–log axes, the region DP-SGD's accountant allows any membership
attack. :func:`log_privacy_report` writes the Markdown
to the loggers as text ``privacy/report`` (TensorBoard's TEXT, an MLflow artifact, W&B HTML, a file beside CSVLogger's
metrics: :mod:`lightning_privacy.loggers`) and, optionally, to a file: ``.html``/``.htm`` gets the page, any other
suffix (``.md``) the Markdown.

The audit sections render the audits' results (:mod:`lightning_privacy.audits`): :func:`audit_report`
gives the same section for a result of a direct call such as ``audit_epsilon_star(model, ...)``. A result's
``warnings`` (why its numbers may carry no information) come first in its section, after any sentence saying that an
attack beat the accountant's bound (``outside``), as quoted
"**Warning:**" paragraphs in the Markdown and highlighted paragraphs on the HTML page.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import re
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

import lightning.pytorch as pl

from lightning_privacy import __version__, names
from lightning_privacy.loggers import log_text
from lightning_privacy.reporting import ReportSection

__all__ = ["REPORT_TAG", "audit_report", "figure_png", "log_privacy_report", "privacy_report", "privacy_report_html"]

REPORT_TAG = names.PRIVACY_REPORT
HTML_SUFFIXES = (".html", ".htm")
DEFAULT_ORDER = 100  # a contributor's ``report_order`` when it sets none


def _table(title: str, rows: List[tuple], warnings: Tuple[str, ...] = ()) -> str:
    """A section's heading, its warnings (one quoted "**Warning:**" paragraph each) and its value table."""
    lines = [f"## {title}", ""]
    for warning in warnings:
        lines += [f"> **Warning:** {warning}", ""]
    lines += ["| quantity | value | meaning |", "|---|---|---|"]
    lines += [f"| {q} | {v} | {m} |" for q, v, m in rows]
    return "\n".join(lines)


def audit_report(result: Any) -> str:
    """The report's Markdown section for one audit result (e.g. of a direct ``audit_epsilon_star`` call).

    The result's ``warnings`` (e.g. Normal fits the KS test rejects) come first, under the heading; then its value
    table (the result's :meth:`report_section`, :mod:`lightning_privacy.reporting`).

    Raises:
        TypeError: for anything but a result of :mod:`lightning_privacy.audits`.

    Example::

        >>> import numpy as np
        >>> from lightning_privacy.audits import audit_epsilon_star_from_losses
        >>> rng = np.random.default_rng(0)
        >>> result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)
        >>> lines = audit_report(result).splitlines()
        >>> print(lines[0], lines[2][:55], sep="\\n")  # Gamma losses: the KS test rejects the Normal fits
        ## Epsilon* audit
        > **Warning:** the Normal fits of Epsilon* are rejected
        >>> lines[6].split(" | ")[:2]
        ['| `audit/epsilon_star`', '4.122']
    """
    from lightning_privacy.audits._common import AuditResult

    if not isinstance(result, AuditResult) or not callable(getattr(result, "report_section", None)):
        raise TypeError(f"`result` must be a result of lightning_privacy.audits, got {type(result).__name__}")
    section = result.report_section()
    return _table(section.title, section.rows, section.warnings)


def _contributors() -> List[str]:
    """The package's callbacks that have a report section, in the report's order (for the error message)."""
    import lightning_privacy

    found = []
    for name in lightning_privacy._CALLBACKS:
        klass = getattr(lightning_privacy, name)
        if callable(getattr(klass, "report_section", None)):
            found.append((getattr(klass, "report_order", DEFAULT_ORDER), name))
    return [name for _, name in sorted(found, key=lambda pair: pair[0])]


def _sections(trainer: pl.Trainer) -> List[ReportSection]:
    """Every callback's section (those with a ``report_section``), by ``report_order`` then in the Trainer's order,
    and last the run's privacy statement (:func:`lightning_privacy.statement.privacy_statement`)."""
    from lightning_privacy.statement import privacy_statement

    found = []
    for cb in trainer.callbacks:
        make = getattr(cb, "report_section", None)
        section = make(trainer) if callable(make) else None
        if section is not None:
            found.append((getattr(cb, "report_order", DEFAULT_ORDER), section))
    if not found:
        raise ValueError(
            f"No privacy callback in trainer.callbacks: add one of {', '.join(_contributors())} to get a report."
        )
    return [
        *(section for _, section in sorted(found, key=lambda pair: pair[0])),
        privacy_statement(trainer).report_section(),
    ]


def _header(trainer: pl.Trainer) -> str:
    return f"After {trainer.current_epoch} epoch(s), global step {trainer.global_step}."


def _markdown(section: ReportSection) -> str:
    parts = [_table(section.title, section.rows, section.warnings)]
    for extra in section.extras:
        lines = [f"**{extra.caption}**", "", "| " + " | ".join(extra.header) + " |", "|---" * len(extra.header) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in extra.cells]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def privacy_report(trainer: pl.Trainer) -> str:
    """A Markdown report of the privacy callbacks in ``trainer.callbacks`` (call after ``fit``).

    Raises:
        ValueError: if the trainer has none of the privacy callbacks.

    Example::

        >>> import lightning.pytorch as pl
        >>> privacy_report(pl.Trainer(logger=False, enable_progress_bar=False))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: No privacy callback in trainer.callbacks: add one of ... to get a report.
    """
    parts = [_markdown(section) for section in _sections(trainer)]
    return "\n\n".join([f"# Privacy report\n\n{_header(trainer)}", *parts]) + "\n"


# --- HTML ----------------------------------------------------------------------------------------
_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d2330;
       background: #f6f7f9; margin: 0; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { margin: 0 0 4px; font-size: 28px; }
h2 { margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid #e3e6ec; font-size: 20px; }
p.meta, footer { color: #5b6474; margin: 0 0 12px; }
nav ol { margin: 6px 0 0; padding-left: 22px; columns: 2; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 14px; }
th, td { border: 1px solid #dde1e8; padding: 6px 10px; text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; }
td.value { font-variant-numeric: tabular-nums; white-space: nowrap; font-weight: 600; }
td.meaning { color: #3c4454; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 6px 0; }
code { font: 13px ui-monospace, "DejaVu Sans Mono", monospace; background: #f1f3f6; padding: 1px 4px;
       border-radius: 3px; }
figure { margin: 10px 0 18px; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6ec; }
figcaption { color: #5b6474; font-size: 13px; margin-top: 4px; }
p.warning { background: #fff4e5; border-left: 4px solid #d9822b; padding: 8px 12px; margin: 8px 0 12px; }
footer { margin-top: 36px; font-size: 13px; }
"""


def _inline(text: str) -> str:
    """Markdown-ish cell text as HTML: escaped, with `code` spans kept as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(text)))


def _slug(title: str, used: set) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
    slug, n = base, 1
    while slug in used:
        n += 1
        slug = f"{base}-{n}"
    used.add(slug)
    return slug


def figure_png(figure: Any, *, dpi: int = 110) -> bytes:
    """A ``matplotlib.figure.Figure`` as PNG bytes (no pyplot: the user's backend is left alone).

    Example::

        >>> from matplotlib.figure import Figure
        >>> figure_png(Figure(figsize=(1, 1)))[:8]
        b'\\x89PNG\\r\\n\\x1a\\n'
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _html_figure(draw: Callable[[], Any], caption: str) -> str:
    try:
        png = figure_png(draw())
    except (ValueError, RuntimeError) as err:  # e.g. no parametric fit to draw
        return f'<p class="meta">Figure not drawn: {html.escape(str(err))}</p>'
    data = base64.b64encode(png).decode("ascii")
    alt = html.escape(caption, quote=True)
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _html_table(header: List[str], rows: List[List[str]], caption: str = "", classes: Tuple[str, ...] = ()) -> str:
    head = "".join(f"<th>{_inline(h)}</th>" for h in header)
    body = []
    for cells in rows:
        tds = "".join(
            f'<td class="{classes[i]}">{_inline(c)}</td>'
            if i < len(classes) and classes[i]
            else f"<td>{_inline(c)}</td>"
            for i, c in enumerate(cells)
        )
        body.append(f"<tr>{tds}</tr>")
    cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def privacy_report_html(trainer: pl.Trainer) -> str:
    """The report as one self-contained HTML page: every section's table, extra tables and figures (base64 PNG).

    The page needs nothing else (no script, no stylesheet, no network); open it in any browser or attach it to
    a review. Text is escaped with :func:`html.escape`.

    Raises:
        ValueError: if the trainer has none of the privacy callbacks.

    Example::

        >>> import lightning.pytorch as pl
        >>> privacy_report_html(pl.Trainer(logger=False, enable_progress_bar=False))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: No privacy callback in trainer.callbacks: add one of ... to get a report.
    """
    sections = _sections(trainer)
    used: set = set()
    slugs = [_slug(s.title, used) for s in sections]
    toc = "".join(f'<li><a href="#{slug}">{html.escape(s.title)}</a></li>' for s, slug in zip(sections, slugs))
    body = []
    for section, slug in zip(sections, slugs):
        parts = [f'<section id="{slug}"><h2>{html.escape(section.title)}</h2>']
        parts += [f'<p class="warning"><strong>Warning:</strong> {_inline(w)}</p>' for w in section.warnings]
        parts.append(
            _html_table(
                ["quantity", "value", "meaning"], [list(r) for r in section.rows], classes=("", "value", "meaning")
            )
        )
        for extra in section.extras:
            parts.append(_html_table(extra.header, extra.cells, caption=extra.caption))
        parts += [_html_figure(draw, caption) for draw, caption in section.figures]
        parts.append("</section>")
        body.append("\n".join(parts))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Privacy report</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            "<main>",
            "<h1>Privacy report</h1>",
            f'<p class="meta">{html.escape(_header(trainer))}</p>',
            f"<nav><strong>Sections</strong><ol>{toc}</ol></nav>",
            *body,
            f"<footer>Written by lightning-privacy {html.escape(__version__)} on {when}. Values marked approximate "
            "or estimate are not bounds; lower and upper bounds say so in their meaning.</footer>",
            "</main>",
            "</body>",
            "</html>",
        ]
    )


def log_privacy_report(trainer: pl.Trainer, path: Optional[Union[str, Path]] = None) -> str:
    """:func:`privacy_report` as the text ``privacy/report`` on every logger (rank 0), and to ``path`` if given.

    TensorBoard gets it as TEXT, MLflow as the artifact ``text/privacy/report_step<k>.md``, W&B as HTML under the key
    ``privacy/report``, CSVLogger as ``<log_dir>/text/privacy/report_step<k>.md`` (:mod:`lightning_privacy.loggers`);
    any other logger is warned about once.

    The suffix of ``path`` picks the format: ``.html``/``.htm`` writes :func:`privacy_report_html` (one
    self-contained page with the figures), anything else (``.md``) the Markdown. Only global rank 0 writes.

    Returns:
        The Markdown report (what the loggers get), on every rank.
    """
    text = privacy_report(trainer)
    log_text(trainer, REPORT_TAG, text)
    if path is not None and trainer.is_global_zero:
        path = Path(path)
        page = privacy_report_html(trainer) if path.suffix.lower() in HTML_SUFFIXES else text
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    return text

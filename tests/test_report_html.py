"""The self-contained HTML report: same numbers as the Markdown, figures as embedded PNGs, and a real browser.

The browser tests open the file in Debian's headless Chromium (``make browser`` installs it; they are skipped
where it is missing): ``--dump-dom`` must show every ``<img>`` with a ``data:`` URI that decodes to a valid PNG,
the browser itself must decode each one (a copy of the page records ``naturalWidth``), and the screenshot must
show the tables and figures rather than a blank page.
"""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser

import matplotlib.image
import numpy as np
import pytest
from torch.utils.data import DataLoader

from lightning_privacy import (
    DPSGD,
    BayesSecurityMonitor,
    CanaryAudit,
    EpsilonStarAudit,
    PrivacyBudgetStopping,
    PrivacyProfileAudit,
    names,
)
from lightning_privacy.models import LogisticRegressionModule
from lightning_privacy.report import log_privacy_report, privacy_report, privacy_report_html
from tests.callbacks._tiny import TinyDataModule, tiny_module, trainer
from tests.callbacks.test_privacy_profile_audit import (
    D,
    N,
    data,  # noqa: F401  (fixture)
)
from tests.callbacks.test_privacy_profile_audit import _trainer as _pp_trainer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not on PATH (`make browser` installs it)"
)


class _Page(HTMLParser):
    """The parts of a page the tests read: images, section tables' (quantity, value) rows, links, scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.images, self.links, self.scripts, self.rows, self.h2 = [], [], 0, [], []
        self._cell, self._cells, self._in_h2 = None, None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        elif tag in ("a", "link"):
            self.links.append(attrs.get("href", ""))
        elif tag == "script":
            self.scripts += 1
        elif tag == "tr":
            self._cells = []
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "h2":
            self._in_h2 = True
            self.h2.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cells is not None:
            self._cells.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._cells is not None:
            self.rows.append(self._cells)
            self._cells = None
        elif tag == "h2":
            self._in_h2 = False

    def handle_data(self, text):
        if self._cell is not None:
            self._cell += text
        if self._in_h2:
            self.h2[-1] += text


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _png(src: str) -> bytes:
    assert src.startswith("data:image/png;base64,"), src[:40]
    raw = base64.b64decode(src.split(",", 1)[1], validate=True)
    assert raw.startswith(PNG_SIGNATURE)
    return raw


def _markdown_rows(report: str) -> list:
    """(quantity, value) of every three-column table row of the Markdown report, backticks removed."""
    rows = []
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 3 and cells != ["quantity", "value", "meaning"]:
            rows.append((cells[0].replace("`", ""), cells[1].replace("`", "")))
    return rows


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny DP-SGD fit with the monitor, a budget, Epsilon* and the canary audit; its report files."""
    folder = tmp_path_factory.mktemp("html_report")
    callbacks = [
        DPSGD(noise_multiplier=1.5),
        BayesSecurityMonitor(),
        PrivacyBudgetStopping(min_bayes_security=0.7),
        EpsilonStarAudit(),
        CanaryAudit("gradient", num_canaries=100, seed=0),
    ]
    t = trainer(callbacks, folder, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    html_path, md_path = folder / "report.html", folder / "report.md"
    returned = log_privacy_report(t, html_path)
    log_privacy_report(t, md_path)
    return t, returned, html_path, md_path


def test_suffix_picks_the_format(fitted):
    t, returned, html_path, md_path = fitted
    markdown = privacy_report(t)
    assert returned == markdown == md_path.read_text(encoding="utf-8")  # the Markdown, whatever the file
    page = html_path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert '<meta charset="utf-8">' in page


def test_html_has_every_markdown_number_and_meaning(fitted):
    t, _, html_path, _ = fitted
    page = _parse(html_path.read_text(encoding="utf-8"))
    markdown = privacy_report(t)
    html_rows = {(row[0], row[1]) for row in page.rows if len(row) == 3}
    md_rows = _markdown_rows(markdown)
    assert len(md_rows) >= 20
    assert not set(md_rows) - html_rows  # every (quantity, value) of the Markdown, the same text
    meanings = [row[2] for row in page.rows if len(row) == 3 and row[0] != "quantity"]
    assert all(m.strip() for m in meanings) and len(meanings) == len(md_rows)  # each number has its meaning
    assert page.h2 == [
        "DP-SGD",
        "Bayes security against membership inference",
        "Budget stopping",
        "Epsilon* audit",
        "One-run canary audit",
        "Privacy statement",  # lightning_privacy.statement: the same statement as `lightning-privacy statement`
    ]
    monitor, canary = t.callbacks[1], t.callbacks[4]
    assert (
        "β*_MIA",
        f"{monitor.final[names.MIA_BAYES_SECURITY]:.4f}",
    ) in html_rows
    assert (names.CANARY_EPSILON_LOWER, f"{canary.results[names.CANARY_EPSILON_LOWER]:.4g}") in html_rows


def test_figures_are_embedded_pngs_and_nothing_is_fetched(fitted):
    _, _, html_path, _ = fitted
    text = html_path.read_text(encoding="utf-8")
    page = _parse(text)
    # the monitor (β* per epoch and the TPR-FPR region; the region on log-log axes), Epsilon* (histograms and fits),
    # the canary audit
    assert len(page.images) == 4
    for img in page.images:
        image = matplotlib.image.imread(io.BytesIO(_png(img["src"])), format="png")
        assert image.shape[0] > 200 and image.shape[1] > 400
        assert img["alt"]
    assert page.scripts == 0
    assert all(link.startswith("#") for link in page.links)  # only the table of contents
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", text)


def test_text_is_escaped():
    from lightning_privacy.report import _inline

    assert _inline("a < b & `audit/x` <script>") == "a &lt; b &amp; <code>audit/x</code> &lt;script&gt;"


def test_privacy_profile_top_rows(data):  # noqa: F811
    _, _, dataset = data
    audit = PrivacyProfileAudit(epsilon=0.5, top_k=4, num_samples=32, feature_names=["a", "b", "c"])
    t = _pp_trainer([audit])
    t.fit(LogisticRegressionModule(D), DataLoader(dataset, batch_size=N))
    page = _parse(privacy_report_html(t))
    header = ["rank", "row", "loss", "a", "b", "c"]
    assert header in page.rows
    start = page.rows.index(header)
    top = page.rows[start + 1 : start + 5]
    assert [int(r[1]) for r in top] == [row["row"] for row in audit.result.top_rows]
    assert [float(r[2]) for r in top] == pytest.approx([row["loss"] for row in audit.result.top_rows], rel=1e-3)
    assert len(page.images) == 1
    assert "| rank | row | loss | a | b | c |" in privacy_report(t)  # the Markdown has the rows too


@pytest.mark.slow
def test_panoramia_curves(tmp_path):
    from lightning_privacy import PanoramiaAudit
    from tests.callbacks.test_panoramia_audit import _fit as _fit_panoramia

    audit = PanoramiaAudit(audit_size=300, generator_size=400, helper_epochs=2, num_thresholds=20, seed=0)
    t = _fit_panoramia(tmp_path, audit, False)
    page = _parse(privacy_report_html(t))
    assert "PANORAMIA audit" in page.h2 and len(page.images) == 1
    _png(page.images[0]["src"])


# --- a real browser ------------------------------------------------------------------------------
def _chromium(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
@needs_chromium
def test_chromium_dom_has_the_images(fitted, tmp_path):
    _, _, html_path, _ = fitted
    dom = _chromium("--dump-dom", html_path.as_uri()).stdout
    page = _parse(dom)
    assert "Privacy report" in dom and len(page.h2) == 6
    assert len(page.images) == 4
    for img in page.images:
        _png(img["src"])
    # the browser decodes every image: a copy of the page records each one's natural size once loaded
    probe = tmp_path / "probe.html"
    script = (
        "<script>window.addEventListener('load', () => { for (const img of document.images) "
        "img.setAttribute('data-loaded', img.complete + ':' + img.naturalWidth + 'x' + img.naturalHeight); });"
        "</script>"
    )
    probe.write_text(html_path.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    dom = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri()).stdout
    loaded = re.findall(r'data-loaded="(true|false):(\d+)x(\d+)"', dom)
    assert len(loaded) == 4, dom[:500]
    for complete, width, height in loaded:
        assert complete == "true" and int(width) > 400 and int(height) > 200


@pytest.mark.slow
@needs_chromium
def test_chromium_screenshot_is_not_blank(fitted, tmp_path):
    _, _, html_path, _ = fitted
    png = tmp_path / "report.png"
    _chromium("--window-size=1200,2400", f"--screenshot={png}", html_path.as_uri())
    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (2400, 1200)
    rgb = (image[..., :3] * 255).astype(int)
    colours = {tuple(px) for px in rgb[::5, ::5].reshape(-1, 3)}
    assert len(colours) > 200  # text, table shading, the figures' lines and fills: not a blank or error page
    # the β* figure sits below the first two tables: the lower half of the shot has plotted content too
    lower = rgb[1200:]
    assert np.mean(np.any(lower < 200, axis=-1)) > 0.02

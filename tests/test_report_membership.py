"""The report's membership-attack section (Markdown and HTML) and the HTML figures of issue 22, item 5.

A tiny DP-SGD fit with ``MembershipAudit`` (RMIA, two references), the Bayes-security and attribute-inference
monitors: the section's numbers are the result's, rounded up (an attack is never shown weaker than measured); the
HTML page embeds the attack's log–log ROC, β*_AI per epoch and the accountant's region on log–log axes.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, AttributeInferenceMonitor, BayesSecurityMonitor, MembershipAudit, names
from lightning_privacy.audits import audit_membership
from lightning_privacy.report import audit_report, privacy_report, privacy_report_html
from tests.callbacks._tiny import TinyDataModule, tiny_dataset, tiny_module, trainer
from tests.callbacks.test_attribute_inference_monitor import ATTR
from tests.test_report_html import _markdown_rows, _parse, _png

pytestmark = pytest.mark.filterwarnings("ignore")
TITLE = "Membership attack (RMIA/LiRA/LOSS)"


def _row(report: str, quantity: str) -> str:
    match = re.search(r"^\| " + re.escape(quantity) + r" \| ([^|]+) \|", report, flags=re.M)
    assert match, f"no row {quantity!r} in:\n{report}"
    return match.group(1).strip()


def _meaning(report: str, quantity: str) -> str:
    match = re.search(r"^\| " + re.escape(quantity) + r" \| [^|]+ \| ([^|]+) \|", report, flags=re.M)
    assert match, quantity
    return match.group(1).strip()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("membership_report")
    population = DataLoader(tiny_dataset(2), batch_size=32)
    audit = MembershipAudit("rmia", num_references=2, population=population, cache_dir=str(folder / "refs"))
    monitor = AttributeInferenceMonitor(attribute=ATTR)
    callbacks = [DPSGD(noise_multiplier=1.5), BayesSecurityMonitor(), monitor, audit]
    t = trainer(callbacks, folder, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    return t, audit, monitor


def _up_ok(shown: str, value: float, rel: float = 1e-3) -> None:
    """``shown`` is ``value`` rounded up at 4 significant digits."""
    number = float(shown)
    assert number >= value and number == pytest.approx(value, rel=rel, abs=1e-12)


def test_section_numbers_are_the_results_rounded_up(fitted):
    t, audit, _ = fitted
    result = audit.result
    report = privacy_report(t)
    assert f"## {TITLE}" in report
    assert _row(report, "attack") == "RMIA (offline, 2 reference model(s))"
    members, nonmembers = int(result.is_member.sum()), int((~result.is_member).sum())
    assert _row(report, "members / non-members") == f"{members} / {nonmembers}"
    _up_ok(_row(report, f"`{names.RMIA_AUC}`"), result.auc)
    for j, point in enumerate(result.tpr):
        key = f"`{names.membership_key('rmia', f'tpr_at_fpr_{point.fpr:g}')}`"
        tpr, low, high = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", _row(report, key)).groups()
        _up_ok(tpr, point.tpr)
        _up_ok(high, point.tpr_high)
        assert float(low) <= point.tpr_low and float(low) == pytest.approx(point.tpr_low, rel=1e-3, abs=1e-12)
        # the accountant's bound beside it (DP-SGD trained the model), rounded up too
        bound = float(_meaning(report, key).split("the accountant allows at most ")[1].split(" ")[0])
        assert bound >= result.ledger_tpr_bounds[j] and bound == pytest.approx(result.ledger_tpr_bounds[j], rel=1e-3)
    _up_ok(_row(report, f"`{names.membership_key('rmia', 'epsilon_lower')}`"), result.epsilon["epsilon_lower"])
    assert _row(report, "RMIA γ / offline a") == f"{result.gamma:g} / {result.offline_a:.3f}"
    assert _row(report, "reference models").startswith("2 (2 trained by this run, cached in")
    # a direct audit_membership call gives the same section
    assert audit_report(result).split("\n", 1)[1] in report


def test_outside_and_warnings_come_first(fitted):
    _, audit, _ = fitted
    loud = SimpleNamespace(**{k: getattr(audit.result, k) for k in vars(audit.result)})
    loud.outside = ("the attack's TPR at FPR ≤ 0.01 is at least 0.5 but the accountant allows at most 0.1 there",)
    loud.warnings = ("the scores look reversed",)
    stand_in = SimpleNamespace(result=loud, results=audit.results, attack="rmia", references=None)
    from lightning_privacy.callbacks.membership_audit import MembershipAudit
    from lightning_privacy.report import _table

    section = MembershipAudit.report_section(stand_in)
    text = _table(TITLE, section.rows, section.warnings)
    lines = text.splitlines()
    assert lines[2] == f"> **Warning:** {loud.outside[0]}" and lines[4] == f"> **Warning:** {loud.warnings[0]}"
    assert not any(row.startswith("| reference models") for row in lines)  # no ReferenceModels, no row


def test_loss_attack_section_without_ledger():
    from tests.callbacks._tiny import tiny_loader

    model = tiny_module()
    result = audit_membership(
        model, tiny_loader(), DataLoader(tiny_dataset(1), batch_size=64), attack="loss", warn=False
    )
    text = audit_report(result)
    assert text.startswith(f"## {TITLE}") and "LOSS (reference-free)" in text
    assert "the accountant allows" not in text and "RMIA γ" not in text


def test_html_has_the_three_figures(fitted):
    t, audit, monitor = fitted
    page = _parse(privacy_report_html(t))
    assert TITLE in page.h2
    captions = [img["alt"] for img in page.images]
    for img in page.images:
        _png(img["src"])
    expected = {
        "Membership attack (RMIA): the ROC curve on log–log axes": 1,
        "β*_AI after each epoch": 1,
        "The region DP-SGD's accountant allows every membership attack": 1,
        "Left: β*_MIA after each epoch": 1,  # the linear region, beside the log-log one
    }
    for start, count in expected.items():
        assert sum(c.startswith(start) for c in captions) == count, (start, captions)
    assert (
        "shaded: the region DP-SGD's accountant allows"
        in captions[[c.startswith("Membership") for c in captions].index(True)]
    )
    # the Markdown's every (quantity, value) is on the page
    html_rows = {(row[0], row[1]) for row in page.rows if len(row) == 3}
    assert not set(_markdown_rows(privacy_report(t))) - html_rows
    # the monitor kept one record per epoch; the figure draws them
    assert [e["epoch"] for e in monitor.epochs] == [0, 1] and monitor.epochs[-1]["steps"] == monitor.steps
    assert monitor.epochs[-1]["safe"] == monitor.bayes_security()


def test_figures_draw_what_they_say(fitted):
    t, _, monitor = fitted
    from lightning_privacy.figures import attribute_inference_figure, membership_region_figure

    ledger = t.callbacks[0].ledger
    ax = membership_region_figure(ledger).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    x, y = ax.lines[0].get_data()
    np.testing.assert_allclose(y, np.clip(ledger.tpr_bounds(x), 1e-5, 1.0))
    ax = attribute_inference_figure(monitor.epochs, attribute="x0").axes[0]
    assert list(ax.lines[0].get_ydata()) == [e["safe"] for e in monitor.epochs]
    assert list(ax.lines[1].get_ydata()) == [e["closed"] for e in monitor.epochs]
    assert all(not math.isnan(v) for v in ax.lines[0].get_ydata())


def test_a_run_without_these_callbacks_is_unchanged(tmp_path):
    """Only DPSGD: the Markdown has the DP-SGD section and the statement only; the HTML adds just the log-log region."""
    t = trainer([DPSGD(noise_multiplier=1.5)], tmp_path, max_epochs=1)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    report = privacy_report(t)
    assert report.count("\n## ") == 2 and TITLE not in report and "β*_AI" not in report
    page = _parse(privacy_report_html(t))
    assert page.h2 == ["DP-SGD", "Privacy statement"]
    assert [img["alt"][:40] for img in page.images] == ["The region DP-SGD's accountant allows ev"]

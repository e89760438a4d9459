"""The report's audit and attribute-inference sections, on real (small) fits of each callback."""

import re

import pytest
from torch.utils.data import DataLoader

from lightning_privacy import (
    DPSGD,
    AttributeInferenceMonitor,
    EpsilonStarAudit,
    PanoramiaAudit,
    PrivacyProfileAudit,
    names,
)
from lightning_privacy.models import LogisticRegressionModule, TabularMLP
from lightning_privacy.report import privacy_report
from tests.callbacks.test_attribute_inference_monitor import ATTR, SIGMA
from tests.callbacks.test_attribute_inference_monitor import _fit as _fit_ai
from tests.callbacks.test_epsilon_star_audit import _data as _es_data
from tests.callbacks.test_epsilon_star_audit import _trainer as _es_trainer
from tests.callbacks.test_panoramia_audit import _fit as _fit_panoramia
from tests.callbacks.test_privacy_profile_audit import (
    D,
    N,
    data,  # noqa: F401  (fixture)
)
from tests.callbacks.test_privacy_profile_audit import _trainer as _pp_trainer


def _row(report: str, quantity: str) -> str:
    match = re.search(r"^\| " + re.escape(quantity) + r" \| ([^|]+) \|", report, flags=re.M)
    assert match, f"no row {quantity!r} in:\n{report}"
    return match.group(1).strip()


def test_attribute_inference_section(tmp_path):
    monitor = AttributeInferenceMonitor(attribute=ATTR, method="exact", publish=True)
    t = _fit_ai([DPSGD(noise_multiplier=SIGMA), monitor], tmp_path, max_epochs=1)
    report = privacy_report(t)
    shown = float(_row(report, f"β*_AI (`{monitor.key}`)"))
    assert shown <= monitor.bayes_security() and shown == pytest.approx(monitor.bayes_security(), abs=1e-4)  # down
    assert int(_row(report, "steps accounted")) == monitor.steps == t.global_step


def test_epsilon_star_section(tmp_path):
    train, val = _es_data()
    audit = EpsilonStarAudit()
    t = _es_trainer(tmp_path, [audit], max_epochs=1, loggers=False)
    t.fit(TabularMLP(8, hidden=(16,), lr=0.2), DataLoader(train, batch_size=32), DataLoader(val, batch_size=64))
    report = privacy_report(t)
    assert float(_row(report, f"`{names.EPSILON_STAR}`")) == pytest.approx(audit.results[names.EPSILON_STAR], rel=1e-3)


@pytest.mark.slow
def test_panoramia_section(tmp_path):
    audit = PanoramiaAudit(audit_size=300, generator_size=400, helper_epochs=2, num_thresholds=20, seed=0)
    t = _fit_panoramia(tmp_path, audit, False)
    report = privacy_report(t)
    assert float(_row(report, "ε̃")) == pytest.approx(audit.result.epsilon, abs=5e-4)
    assert float(_row(report, "c_lb")) == pytest.approx(audit.result.c_lb, abs=5e-4)
    audit.result = None  # e.g. on another rank, or restored from a checkpoint: the logged values remain
    assert float(_row(privacy_report(t), "c_lb")) == pytest.approx(audit.last_values[names.PANORAMIA_C_LB], abs=5e-4)


def test_privacy_profile_section(data):  # noqa: F811
    x, y, dataset = data
    audit = PrivacyProfileAudit(epsilon=0.5, top_k=4, num_samples=32)
    t = _pp_trainer([audit])
    t.fit(LogisticRegressionModule(D), DataLoader(dataset, batch_size=N))
    report = privacy_report(t)
    assert float(_row(report, "largest row loss")) == pytest.approx(float(audit.profile.losses[-1]), rel=1e-3)
    low, high = (float(v) for v in _row(report, "recommended ε range").strip("[]").split(","))
    assert low == pytest.approx(audit.transition.epsilon_low, rel=1e-2)
    assert high == pytest.approx(audit.transition.epsilon_high, rel=1e-2)

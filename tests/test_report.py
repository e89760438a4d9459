"""The end-of-training privacy report: numbers equal the callbacks' values, TensorBoard text, file, errors."""

from __future__ import annotations

import re

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.report import REPORT_TAG, log_privacy_report, privacy_report
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer


def _value(report: str, quantity: str) -> str:
    """The value cell of the table row whose quantity starts with ``quantity``."""
    match = re.search(r"^\| " + re.escape(quantity) + r"[^|]* \| ([^|]+) \|", report, flags=re.M)
    assert match, f"no row {quantity!r} in\n{report}"
    return match.group(1).strip()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("report")
    dpsgd, monitor = DPSGD(noise_multiplier=1.5), BayesSecurityMonitor()
    stopper = PrivacyBudgetStopping(min_bayes_security=0.8)  # reached in the first epoch (step 9)
    logger = TensorBoardLogger(tmp_path)
    t = trainer([dpsgd, monitor, stopper], tmp_path, max_epochs=2, logger=logger)
    t.fit(tiny_module(), tiny_loader())
    return t, dpsgd, monitor, stopper, tmp_path


def test_report_numbers_equal_the_callbacks(fitted):
    t, dpsgd, monitor, stopper, _ = fitted
    report = privacy_report(t)
    assert report.startswith("# Privacy report")
    assert float(_value(report, "noise multiplier σ")) == pytest.approx(dpsgd.noise_multiplier, abs=1e-4)
    assert float(_value(report, "clipping norm C")) == pytest.approx(dpsgd.max_grad_norm)
    assert float(_value(report, "sample rate p")) == pytest.approx(dpsgd.sample_rate, rel=1e-5)
    assert int(_value(report, "optimizer steps")) == dpsgd.steps > 0
    assert float(_value(report, "divisor of the noised sum")) == dpsgd.expected_batch_size == tiny_loader().batch_size
    assert "number of batches per epoch is treated as public" in report  # p = 1/len(loader): what it makes public
    assert float(_value(report, f"ε at δ = {dpsgd.delta:g}")) == pytest.approx(dpsgd.epsilon(), rel=1e-3)
    final = monitor.final
    assert float(_value(report, f"ε at δ = {dpsgd.delta:g}")) >= dpsgd.epsilon()  # an upper bound, rounded up
    # lower bounds on security are rounded down to the 4 decimals shown, upper bounds on leakage up
    for quantity, value, direction in [
        ("β*_MIA", final[names.MIA_BAYES_SECURITY], -1),  # the first β*_MIA row
        ("β*_MIA", dpsgd.ledger.bayes_security(), -1),  # the ledger's safe value is the reported one
        ("β*_MIA closed form", monitor.final_closed_form, 0),  # an approximation: rounded to nearest
        ("membership advantage", final[names.MIA_ADVANTAGE], 1),
        ("TPR bound at FPR 0.001", final[names.MIA_TPR_BOUND_FPR_0_001], 1),
        ("TPR bound at FPR 0.01", final[names.MIA_TPR_BOUND_FPR_0_01], 1),
        ("TPR bound at FPR 0.1", final[names.MIA_TPR_BOUND_FPR_0_1], 1),
    ]:
        shown = float(_value(report, quantity))
        assert shown == pytest.approx(value, abs=1e-4 if direction else 5e-5), quantity
        assert direction * (shown - value) >= 0, quantity
    beta = final[names.MIA_BAYES_SECURITY]
    accuracy = float(report.split("accuracy ≤ ")[1].split("%")[0])
    assert 0 <= accuracy - 100 * (1 - beta / 2) <= 0.1  # rounded up to one decimal
    assert "approximate" in report  # the closed form is marked as such
    assert float(_value(report, "budget β*_MIA")) == stopper.min_bayes_security
    assert stopper.stopped_at_step is not None
    assert int(_value(report, "stopped after step")) == stopper.stopped_at_step


def test_log_privacy_report_writes_tensorboard_text_and_file(fitted):
    t, *_, tmp_path = fitted
    path = tmp_path / "out" / "privacy_report.md"
    text = log_privacy_report(t, path)
    assert path.read_text(encoding="utf-8") == text == privacy_report(t)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(t.logger.log_dir, size_guidance={"tensors": 0}).Reload()
    assert f"{REPORT_TAG}/text_summary" in events.Tags()["tensors"]


def test_report_without_privacy_callbacks_raises(tmp_path):
    with pytest.raises(ValueError, match="No privacy callback in trainer.callbacks"):
        privacy_report(trainer([], tmp_path))
    with pytest.raises(ValueError, match="No privacy callback"):
        log_privacy_report(trainer([], tmp_path), tmp_path / "never.md")
    assert not (tmp_path / "never.md").exists()

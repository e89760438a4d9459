"""Every audit result says when it carries no information: ``warnings`` in to_dict(), summary(), the report, TensorBoard.

Each criterion is tested where it holds and where it does not; then the same warnings reach the TensorBoard text and
the Markdown / HTML report written through the callbacks.
"""

import json
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import EpsilonStarAudit, PanoramiaAudit, names
from lightning_privacy.audits import (
    audit_canaries,
    audit_epsilon_star_from_losses,
    audit_panoramia,
    audit_privacy_profile,
)
from lightning_privacy.audits.epsilon_star import KS_LEVEL
from lightning_privacy.models import LogisticRegressionModule, TabularMLP
from lightning_privacy.report import audit_report, privacy_report, privacy_report_html


def _strict(result):
    return json.loads(json.dumps(result.to_dict(), allow_nan=False))


# --- Epsilon*: Normal fits rejected by their KS test ----------------------------------------------
def test_epsilon_star_fits_rejected_are_flagged_everywhere():
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match="Normal fits of Epsilon\\* are rejected"):
        result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)
    d = result.details["parametric"]
    assert min(d.ks_pvalue_member, d.ks_pvalue_nonmember) < KS_LEVEL
    assert result.fits_rejected
    (warning,) = result.warnings
    assert "KS p = " in warning and "not reliable" in warning and "method='empirical'" in warning
    assert f"empirical ε* = {result.values[names.EPSILON_STAR_EMPIRICAL]:.3g}" in warning
    out = _strict(result)
    assert out["warnings"] == [warning] and out["fits_rejected"] is True
    summary = result.summary()
    assert summary.startswith("Epsilon* audit") and f"> **Warning:** {warning}" in summary
    assert "(Normal fits rejected: not reliable)" in summary and f"(rejected at {KS_LEVEL:g})" in summary
    section = audit_report(result)
    assert warning in section and "NOT RELIABLE here" in section


def test_epsilon_star_with_fitting_normals_has_no_warning():
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning issued either
        result = audit_epsilon_star_from_losses(rng.normal(1, 1, 2000), rng.normal(2, 1, 2000), delta=1e-4)
    d = result.details["parametric"]
    assert min(d.ks_pvalue_member, d.ks_pvalue_nonmember) >= KS_LEVEL
    assert result.warnings == () and not result.fits_rejected
    assert _strict(result)["warnings"] == [] and _strict(result)["fits_rejected"] is False
    assert "Warning" not in result.summary() and "rejected" not in result.summary()
    assert "Warning" not in audit_report(result) and "NOT RELIABLE" not in audit_report(result)


def test_epsilon_star_on_too_few_losses_to_check_the_fits():
    rng = np.random.default_rng(0)
    result = audit_epsilon_star_from_losses(rng.normal(1, 1, 15), rng.normal(2, 1, 40), warn=False)
    assert any("too few losses to check the Normal fits" in w and "15 members" in w for w in result.warnings)


def test_epsilon_star_losses_that_look_reversed():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(1, 1, 2000), rng.normal(2, 1, 2000)
    swapped = audit_epsilon_star_from_losses(nonmembers, members, delta=1e-4, warn=False)
    assert swapped.values[names.MIA_EPSILON_LOWER] == 0.0
    (warning,) = [w for w in swapped.warnings if "higher losses" in w]
    assert "look swapped" in warning and names.MIA_EPSILON_LOWER in warning
    right = audit_epsilon_star_from_losses(members, nonmembers, delta=1e-4, warn=False)
    assert not any("higher losses" in w for w in right.warnings)


# --- canary audit: scores that look reversed ------------------------------------------------------
def test_canary_scores_that_look_reversed():
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 2.0 * included
    assert audit_canaries(scores, included, delta=1e-5).warnings == ()
    reversed_ = audit_canaries(-scores, included, delta=1e-5)
    (warning,) = reversed_.warnings
    assert "canary scores look reversed" in warning and "negate the scores" in warning
    assert reversed_.epsilon_lower == 0.0
    assert _strict(reversed_)["warnings"] == [warning] and f"> **Warning:** {warning}" in reversed_.summary()


# --- privacy profile: its notes are its warnings ----------------------------------------------------
def test_privacy_profile_notes_are_its_warnings():
    x = torch.tensor([[0.6, 0.0], [0.0, 0.5], [-0.4, 0.3], [0.2, -0.7]], dtype=torch.float64)
    model = LogisticRegressionModule(2)  # untrained: not at the optimum
    result = audit_privacy_profile(model, [(x, torch.tensor([1, 0, 0, 1]))], top_k=2, warn=False)
    assert result.warnings == tuple(result.notes) and any("not at the optimum" in w for w in result.warnings)
    assert _strict(result)["warnings"] == list(result.warnings)
    assert result.summary().startswith("> **Warning:** the model is not at the optimum")


# --- PANORAMIA: too few correct guesses -------------------------------------------------------------
def _blobs(n=150, features=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, (x[:, 0] > 0).long()


def test_panoramia_without_correct_guesses_says_it_carries_no_information():
    x, y = _blobs()
    torch.manual_seed(0)
    target = torch.nn.Linear(4, 2)  # never trained: its loss tells members from generated rows by chance only
    result = audit_panoramia(target, (x.numpy(), y.numpy()), helper_epochs=1, num_thresholds=20, progress=False)
    assert result.c_plus_epsilon_lb == 0.0 and result.epsilon == 0.0
    (warning,) = result.warnings
    assert warning.startswith("no information") and "not evidence of privacy" in warning
    assert _strict(result)["warnings"] == [warning]
    summary = result.summary()
    assert f"> **Warning:** {warning}" in summary
    assert "MIA no recall level rejects c+eps = 0" in summary and "MIA best at" not in summary  # not "1/1"
    assert warning in audit_report(result)


# --- the callbacks: TensorBoard text and the report ---------------------------------------------
def _text(logdir, tag):
    events = EventAccumulator(str(logdir), size_guidance={"tensors": 0}).Reload()
    (full,) = [t for t in events.Tags()["tensors"] if t.startswith(tag)]
    return events.Tensors(full)[0].tensor_proto.string_val[0].decode()


def _gamma_losses(model, batch):
    """Logits whose membership loss is x[:, 0] (2 classes, label 0): the losses are the data."""
    x = batch[0]
    return torch.stack([torch.zeros_like(x[:, 0]), x[:, 0]], dim=1), torch.zeros(len(x), dtype=torch.long)


def _trainer(tmp_path, callbacks):
    return pl.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        callbacks=callbacks,
        logger=TensorBoardLogger(tmp_path, name="tb"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )


def test_epsilon_star_warning_in_tensorboard_text_and_report(tmp_path):
    rng = np.random.default_rng(0)
    members = torch.as_tensor(rng.gamma(2, 5, (1500, 1)), dtype=torch.float32)
    nonmembers = torch.as_tensor(rng.gamma(3, 5, (1500, 1)), dtype=torch.float32)
    y = torch.zeros(1500, dtype=torch.long)
    audit = EpsilonStarAudit(
        forward_fn=_gamma_losses,
        member_dataloader=DataLoader(TensorDataset(members, y), batch_size=500),
        population_dataloader=DataLoader(TensorDataset(nonmembers, y), batch_size=500),
        log_histograms=False,
        log_figure=False,
    )
    trainer = _trainer(tmp_path, [audit])
    with pytest.warns(UserWarning, match="EpsilonStarAudit: the Normal fits of Epsilon\\* are rejected"):
        trainer.fit(TabularMLP(1, hidden=(4,)), DataLoader(TensorDataset(members, y), batch_size=500))
    (warning,) = audit.result.warnings
    assert audit.result.fits_rejected and audit.summary() == audit.result.summary()
    text = _text(tmp_path / "tb" / "version_0", names.EPSILON_STAR_SUMMARY)
    assert warning in text and "(Normal fits rejected: not reliable)" in text
    report = privacy_report(trainer)
    assert f"> **Warning:** {warning}" in report and "NOT RELIABLE here" in report
    page = privacy_report_html(trainer)
    assert '<p class="warning"><strong>Warning:</strong> the Normal fits of Epsilon* are rejected' in page


def test_panoramia_warning_in_tensorboard_text_and_report(tmp_path):
    x, y = _blobs()
    audit = PanoramiaAudit(members=(x.numpy(), y.numpy()), helper_epochs=1, num_thresholds=20)
    trainer = _trainer(tmp_path, [audit])
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="PanoramiaAudit: no information"):
        trainer.fit(TabularMLP(4, hidden=(4,), lr=1e-4), DataLoader(TensorDataset(x, y), batch_size=50))
    (warning,) = audit.result.warnings
    assert warning in _text(tmp_path / "tb" / "version_0", names.PANORAMIA_SUMMARY)
    assert f"> **Warning:** {warning}" in privacy_report(trainer)
    assert '<p class="warning"><strong>Warning:</strong> no information' in privacy_report_html(trainer)

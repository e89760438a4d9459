"""audit_privacy_profile: the same numbers as PrivacyProfileAudit on the same model; the four views; progress."""

import json
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from lightning_privacy import OutputPerturbation, PrivacyProfileAudit, names
from lightning_privacy.audits import PrivacyProfileResult, audit_privacy_profile
from lightning_privacy.audits.privacy_profile import STAGES
from lightning_privacy.models import LogisticRegressionModule
from lightning_privacy.report import audit_report, privacy_report
from tests.callbacks.test_privacy_profile_audit import (
    D,
    N,
    data,  # noqa: F401  (fixture)
)


def _trainer(callbacks, **kwargs):
    defaults = dict(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)


def test_callback_and_direct_call_give_the_same_values(data, capsys):  # noqa: F811
    _, _, dataset = data
    perturbation = OutputPerturbation(epsilon=2.0, seed=3)
    callback = PrivacyProfileAudit(top_k=5, num_samples=16, feature_names=["a", "b", "c"])
    model = LogisticRegressionModule(D)
    trainer = _trainer([callback, perturbation], enable_progress_bar=True)
    trainer.fit(model, DataLoader(dataset, batch_size=N))
    err = capsys.readouterr().err
    assert "privacy profile" in err and all(stage in err for stage in STAGES)

    result = audit_privacy_profile(
        model,
        DataLoader(dataset, batch_size=32, shuffle=True),  # read in dataset order all the same
        epsilon=2.0,
        base_weights=perturbation.base_weights,
        top_k=5,
        num_samples=16,
        feature_names=["a", "b", "c"],
        progress=False,
    )
    assert "privacy profile" not in capsys.readouterr().err
    assert isinstance(result, PrivacyProfileResult)
    assert result.metrics() == callback.result.metrics()
    np.testing.assert_array_equal(result.profile.losses, callback.profile.losses)
    np.testing.assert_array_equal(result.profile.indices, callback.profile.indices)
    assert result.top_rows == callback.top_rows and result.summary() == callback.result.summary()
    assert audit_report(result) in privacy_report(trainer)

    # the four views
    assert set(result.metrics()) == {
        names.PROFILE_MAX_LOSS,
        names.PROFILE_EPSILON_LOW,
        names.PROFILE_EPSILON_HIGH,
        names.PROFILE_GRADIENT_NORM,
        names.PROFILE_APPROXIMATION_BOUND,
    }
    assert result.summary().startswith("Most exposed training rows (loss = |l(x, y_i, M)|)")
    assert isinstance(result.figure(), Figure) and len(result.figure().axes) == 2
    out = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert out["epsilon"] == 2.0 and out["num_rows"] == N and out["top_rows"][0]["row"] == result.top_rows[0]["row"]


def test_notes_warn_once_or_not_at_all(data):  # noqa: F811
    x, y, dataset = data
    loader = DataLoader(dataset, batch_size=32)
    model = LogisticRegressionModule(D, optimizer="sgd", lr=0.01)
    with pytest.warns(UserWarning, match="audit_privacy_profile: the model is not at the optimum") as record:
        result = audit_privacy_profile(model, loader, num_samples=16)
    assert len(record) == 1 and result.notes and result.gradient_norm > 1e-4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = audit_privacy_profile(model, loader, num_samples=16, warn=False)
    assert quiet.notes == result.notes
    with pytest.raises(ValueError, match="pass `regularization`"):
        audit_privacy_profile(model.linear, loader, layer=model.linear)


def test_skipped_under_fast_dev_run_with_one_info_line(data, rank_zero_infos):  # noqa: F811
    _, _, dataset = data
    callback = PrivacyProfileAudit(num_samples=16)
    _trainer([callback], fast_dev_run=True).fit(LogisticRegressionModule(D), DataLoader(dataset, batch_size=N))
    assert callback.result is None and callback.profile is None
    lines = [m for m in rank_zero_infos if "skipped under `fast_dev_run`" in m]
    assert lines == [
        "PrivacyProfileAudit: skipped under `fast_dev_run` (an audit of a one-batch run would mean nothing)."
    ]

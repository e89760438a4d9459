"""audit_panoramia: the same numbers as PanoramiaAudit on the same model; the four views; progress; skips."""

import json

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import PanoramiaAudit, names
from lightning_privacy.audits import PanoramiaAuditResult, audit_panoramia
from lightning_privacy.audits.panoramia import member_arrays
from lightning_privacy.functional.panoramia import PHASES, PanoramiaResult
from lightning_privacy.models import TabularMLP
from lightning_privacy.report import audit_report, privacy_report
from tests.callbacks.test_panoramia_audit import SmallAdult

SETTINGS = dict(audit_size=300, generator_size=400, helper_epochs=2, num_thresholds=20, seed=0)


def _trainer(tmp_path, callbacks, **kwargs):
    defaults = dict(
        max_epochs=1,
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)


def test_callback_and_direct_call_give_the_same_values(tmp_path, capsys):
    dm = SmallAdult(batch_size=128)
    model = TabularMLP(104, hidden=(32,), lr=1e-2, optimizer="adam")
    callback = PanoramiaAudit(member_fraction=0.9, **SETTINGS)
    trainer = _trainer(tmp_path, [callback], enable_progress_bar=True)  # the Trainer shows a bar: so does the audit
    trainer.fit(model, datamodule=dm)
    err = capsys.readouterr().err
    assert "PANORAMIA" in err and all(phase in err for phase in PHASES)

    result = audit_panoramia(
        model,
        dm.train_table,
        encode=lambda rows: dm.to_dataset(rows).tensors,
        member_fraction=0.9,
        progress=False,
        **SETTINGS,
    )
    assert "PANORAMIA" not in capsys.readouterr().err
    assert isinstance(result, PanoramiaAuditResult) and isinstance(result, PanoramiaResult)
    assert result.metrics() == callback.result.metrics() == callback.last_values  # exactly
    np.testing.assert_array_equal(result.mia_scores, callback.result.mia_scores)
    assert result.sizes == callback.result.sizes and result.sizes["members"] == 1080
    assert result.summary() == callback.result.summary()
    assert "age=" in result.summary()  # Adult's column names, given by the audits layer
    assert audit_report(result) in privacy_report(trainer)

    # the four views
    assert set(result.metrics()) == {names.PANORAMIA_EPSILON, names.PANORAMIA_C_LB, names.PANORAMIA_C_PLUS_EPSILON_LB}
    assert isinstance(result.figure(), Figure) and len(result.figure().axes) == 2
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["epsilon"] == result.epsilon and data[names.PANORAMIA_C_LB] == result.c_lb
    assert data["beta"] == 0.05 and data["sizes"]["audit"] == 300 and "NOT" in data["meaning"]


def test_member_batches_are_read_in_dataset_order():
    x = torch.arange(24, dtype=torch.float32).reshape(6, 1, 2, 2)
    loader = DataLoader(TensorDataset(x, torch.arange(6)), batch_size=4, shuffle=True)
    xs, ys = member_arrays(loader)
    np.testing.assert_array_equal(ys, np.arange(6))
    np.testing.assert_array_equal(xs, x.numpy())
    flat = DataLoader(TensorDataset(torch.zeros(6, 3), torch.zeros(6, dtype=torch.long)), batch_size=4)
    with pytest.raises(ValueError, match="cannot generate non-members for flat features of shape \\(3,\\)"):
        member_arrays(flat)
    assert member_arrays(flat, generator=object())[0].shape == (6, 3)
    with pytest.raises(ValueError, match="`member_fraction` must be in \\(0, 1\\], got 0"):
        audit_panoramia(torch.nn.Linear(2, 2), flat, member_fraction=0)


def test_skipped_under_fast_dev_run_with_one_info_line(tmp_path, rank_zero_infos):
    callback = PanoramiaAudit(**SETTINGS)
    _trainer(tmp_path, [callback], fast_dev_run=True, enable_progress_bar=False).fit(
        TabularMLP(104, hidden=(8,)), datamodule=SmallAdult(batch_size=128)
    )
    assert callback.result is None and callback.last_values == {}
    lines = [m for m in rank_zero_infos if "skipped under `fast_dev_run`" in m]
    assert lines == ["PanoramiaAudit: skipped under `fast_dev_run` (an audit of a one-batch run would mean nothing)."]

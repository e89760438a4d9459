"""audit_epsilon_star: the same numbers as EpsilonStarAudit on the same model; the four views; once per step."""

import csv
import json
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_privacy import EpsilonStarAudit, names
from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star
from lightning_privacy.audits import EpsilonStarResult, audit_epsilon_star, audit_epsilon_star_from_losses
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP
from lightning_privacy.report import audit_report, privacy_report
from tests._launch import run_ddp
from tests.callbacks.test_epsilon_star_audit import _data, _losses


def _fit(tmp_path, callbacks, **kwargs):
    defaults = dict(
        max_epochs=1,
        default_root_dir=tmp_path,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path, name="csv"),
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)


def _csv_rows(tmp_path):
    return list(csv.DictReader(open(next(Path(tmp_path, "csv").rglob("metrics.csv")))))


def test_adult_callback_and_direct_call_give_the_same_values(tmp_path):
    """The acceptance check: Adult's member / validation loaders, a trained model, exactly the logged ε*."""
    torch.manual_seed(0)
    dm = AdultDataModule(batch_size=512)
    model = TabularMLP(104, hidden=(16,), lr=0.05)
    callback = EpsilonStarAudit()
    trainer = _fit(tmp_path, [callback], limit_train_batches=10, limit_val_batches=2)
    trainer.fit(model, datamodule=dm)

    result = audit_epsilon_star(model, dm.member_dataloader(), dm.val_dataloader())
    assert isinstance(result, EpsilonStarResult)
    assert result.metrics() == callback.results  # exactly: same floats, same keys, same order
    assert result.epsilon_star == callback.result.epsilon_star
    assert result.summary() == callback.summary()
    np.testing.assert_array_equal(result.member_losses, callback.result.member_losses)
    logged = {k: float(v) for r in _csv_rows(tmp_path) for k, v in r.items() if v and k.startswith("audit/")}
    assert logged == pytest.approx(result.metrics(), rel=1e-12)  # CSV holds repr(float): the same number
    assert result.to_dict()["num_members"] == len(dm.train_dataset) == 27146
    # the training loader itself (shuffled) is read in dataset order: the same audit
    again = audit_epsilon_star(model, dm.train_dataloader(), dm.val_dataloader())
    assert again.metrics() == result.metrics()
    # the report renders the direct call's result as the callback's section
    assert audit_report(result) in privacy_report(trainer)


def test_from_losses_equals_the_analysis_and_the_model_version():
    torch.manual_seed(0)
    train, val = _data()
    model = TabularMLP(8, hidden=(16,))
    direct = audit_epsilon_star(model, DataLoader(train, batch_size=32), DataLoader(val, batch_size=50))
    members, nonmembers = _losses(model, train), _losses(model, val)
    from_losses = audit_epsilon_star_from_losses(members, nonmembers)
    assert from_losses.metrics() == pytest.approx(direct.metrics(), rel=1e-6)
    delta = default_delta(len(train))
    assert from_losses.delta == delta
    assert from_losses.values[names.EPSILON_STAR] == pytest.approx(epsilon_star(members, nonmembers, delta=delta))
    assert from_losses.values[names.EPSILON_STAR_EMPIRICAL] == pytest.approx(
        epsilon_star(members, nonmembers, delta=delta, method="empirical")
    )
    # tensors are accepted as they are
    tensors = audit_epsilon_star_from_losses(torch.from_numpy(members), torch.from_numpy(nonmembers))
    assert tensors.metrics() == from_losses.metrics()


def test_four_views():
    rng = np.random.default_rng(0)
    result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 800), rng.gamma(3, 5, 600), delta=1e-4)
    assert set(result.metrics()) == {names.EPSILON_STAR, names.EPSILON_STAR_EMPIRICAL, names.MIA_EPSILON_LOWER}
    assert all(isinstance(v, float) for v in result.metrics().values())
    assert result.summary().startswith("Epsilon* audit") and "KS p-values" in result.summary()
    figure = result.figure()
    assert isinstance(figure, Figure) and len(figure.axes[0].lines) == 3
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))  # strict JSON
    assert (data["num_members"], data["num_nonmembers"], data["delta"]) == (800, 600, 1e-4)
    assert data["parametric"]["epsilon_star"] == result.epsilon_star
    assert data["mia"]["epsilon_lower"] == result.values[names.MIA_EPSILON_LOWER]


def test_a_failed_fit_is_a_note_not_an_error():
    constant = np.ones(50)
    with pytest.warns(UserWarning, match="audit/epsilon_star not computed"):
        result = audit_epsilon_star_from_losses(constant, constant, delta=1e-3)
    assert names.EPSILON_STAR not in result.values and result.notes
    with pytest.raises(ValueError, match="no parametric fit"):
        result.figure()
    assert json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"delta": 0.5}, "`delta`"),
        ({"mia_alpha": 0.0}, "`mia_alpha`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        audit_epsilon_star_from_losses(np.arange(10.0), np.arange(10.0), **kwargs)
    with pytest.raises(ValueError, match="needs member and non-member examples, got 0 and 3"):
        audit_epsilon_star_from_losses([], [1.0, 2.0, 3.0])


class _Counting(EpsilonStarAudit):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = []

    def audit(self, trainer, pl_module):
        self.steps.append(trainer.global_step)
        return super().audit(trainer, pl_module)


def test_at_most_one_audit_per_training_step(tmp_path):
    """Issue: every_n_epochs=2 over 4 epochs audited twice at the last step. Now once per step."""
    train, val = _data()
    callback = _Counting(every_n_epochs=2, log_figure=False, log_histograms=False)
    trainer = _fit(tmp_path, [callback], max_epochs=4)
    trainer.fit(TabularMLP(8, hidden=(8,)), DataLoader(train, batch_size=100), DataLoader(val, batch_size=100))
    assert callback.steps == [6, 12]
    steps = [int(r["step"]) for r in _csv_rows(tmp_path) if r.get(names.EPSILON_STAR)]
    assert steps == [6, 12]  # one CSV row per audit, at strictly increasing steps
    # an epoch that is not audited still gets its fit-end audit
    callback = _Counting(every_n_epochs=2, log_figure=False, log_histograms=False)
    _fit(tmp_path, [callback], max_epochs=3, logger=False).fit(
        TabularMLP(8, hidden=(8,)), DataLoader(train, batch_size=100), DataLoader(val, batch_size=100)
    )
    assert callback.steps == [6, 9]


def test_skipped_under_fast_dev_run_with_one_info_line(tmp_path, rank_zero_infos):
    train, val = _data()
    callback = _Counting(every_n_epochs=1)
    _fit(tmp_path, [callback], fast_dev_run=True, logger=False).fit(
        TabularMLP(8, hidden=(8,)), DataLoader(train, batch_size=100), DataLoader(val, batch_size=100)
    )
    assert callback.steps == [] and callback.result is None
    lines = [m for m in rank_zero_infos if "skipped under `fast_dev_run`" in m]
    assert lines == ["_Counting: skipped under `fast_dev_run` (an audit of a one-batch run would mean nothing)."]


def test_every_logged_tag_is_a_names_constant(tmp_path):
    train, val = _data()
    trainer = _fit(tmp_path, [EpsilonStarAudit()], logger=TensorBoardLogger(tmp_path, name="tb"))
    trainer.fit(TabularMLP(8, hidden=(8,)), DataLoader(train, batch_size=100), DataLoader(val, batch_size=100))
    events = EventAccumulator(str(next(Path(tmp_path, "tb").rglob("events.out.*")).parent)).Reload()
    tags = events.Tags()
    audit_tags = {t for kind in ("scalars", "histograms", "images") for t in tags[kind] if t.startswith("audit/")}
    audit_tags |= {t.removesuffix("/text_summary") for t in tags["tensors"] if t.startswith("audit/")}
    assert audit_tags == {
        names.EPSILON_STAR,
        names.EPSILON_STAR_EMPIRICAL,
        names.MIA_EPSILON_LOWER,
        names.EPSILON_STAR_MEMBER_LOSSES,
        names.EPSILON_STAR_NONMEMBER_LOSSES,
        names.EPSILON_STAR_FIGURE,
        names.EPSILON_STAR_SUMMARY,
    }
    assert audit_tags <= set(names.ALL_KEYS)


def _ddp_worker(root):
    """One rank of a torchrun launch (tests/_launch.py): the audit under DDP; the trained weights back."""
    torch.manual_seed(0)
    train, val = _data(n_train=301, n_val=151)
    model = TabularMLP(8, hidden=(16,))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        limit_train_batches=2,
        callbacks=[EpsilonStarAudit(log_histograms=False, log_figure=False)],
        logger=CSVLogger(root, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, DataLoader(train, batch_size=32), DataLoader(val, batch_size=32))
    return model.state_dict()


@pytest.mark.slow
def test_two_process_ddp_audit_equals_a_direct_call(tmp_path):
    """Under DDP the gathered losses are put back in dataset order: every value (also the MIA bound, whose
    holdout split depends on the order) equals a direct single-process call on the same model."""
    state = run_ddp("tests.audits.test_epsilon_star:_ddp_worker", tmp_path, root=str(tmp_path))[0]
    train, val = _data(n_train=301, n_val=151)
    model = TabularMLP(8, hidden=(16,))
    model.load_state_dict(state)
    logged = {k: float(v) for r in _csv_rows(tmp_path) for k, v in r.items() if v and k.startswith("audit/")}
    direct = audit_epsilon_star(model, DataLoader(train, batch_size=32), DataLoader(val, batch_size=32))
    assert logged == pytest.approx(direct.metrics(), rel=1e-6)

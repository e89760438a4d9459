"""PanoramiaAudit: logs the three scalars, a figure and the report at fit end; CLI command; errors."""

import pickle

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import PanoramiaAudit, names
from lightning_privacy.callbacks.panoramia_audit import SUMMARY_TAG, panoramia_figure
from lightning_privacy.checkpoints import dpsgd_state_digest
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP


class SmallAdult(AdultDataModule):
    """The first 1,200 training rows of Adult (fast)."""

    def setup(self, stage=None):
        if self._ready:
            return
        super().setup(stage)
        self.train_table = self.train_table.subset(np.arange(1200))
        self.train_dataset = self.to_dataset(self.train_table)


def _fit(tmp_path, callback, loggers):
    dm = SmallAdult(batch_size=128)
    model = TabularMLP(104, hidden=(32,), lr=1e-2, optimizer="adam")
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[callback],
        logger=loggers,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    return trainer


def test_audit_logs_scalars_figure_and_text(tmp_path):
    audit = PanoramiaAudit(audit_size=300, generator_size=400, helper_epochs=2, num_thresholds=20, seed=0)
    csv = CSVLogger(tmp_path, name="csv")
    tb = TensorBoardLogger(tmp_path, name="tb")
    _fit(tmp_path, audit, [csv, tb])
    res = audit.result
    assert res is not None and res.sizes["members"] == 1200 and res.sizes["audit"] == 300
    assert res.epsilon == max(0.0, res.c_plus_epsilon_lb - res.c_lb)
    logged = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()
    for key in (names.PANORAMIA_EPSILON, names.PANORAMIA_C_LB, names.PANORAMIA_C_PLUS_EPSILON_LB):
        assert key in logged
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert any("panoramia" in tag for tag in events.Tags()["images"])
    text_tags = events.Tags()["tensors"]
    assert any(SUMMARY_TAG in tag for tag in text_tags)
    text = events.Tensors([t for t in text_tags if SUMMARY_TAG in t][0])[0].tensor_proto.string_val[0].decode()
    assert "NOT a lower bound" in text and "most obviously real" in text and "age=" in text
    assert audit.state_dict()["last"][names.PANORAMIA_C_LB] == res.c_lb


def test_member_fraction_and_explicit_members(tmp_path):
    dm = SmallAdult()
    dm.setup()
    audit = PanoramiaAudit(
        members=dm.train_table,
        encode=lambda t: dm.to_dataset(t).tensors,
        member_fraction=0.75,
        audit_size=200,
        generator_size=300,
        helper_epochs=1,
        num_thresholds=10,
        seed=1,
    )
    _fit(tmp_path, audit, CSVLogger(tmp_path))
    assert audit.result.sizes["members"] == 900


def test_flat_arrays_without_generator_raise(tmp_path):
    class Plain(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=16)

    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[PanoramiaAudit()],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(MisconfigurationException, match="cannot generate non-members for flat features"):
        trainer.fit(Plain())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"member_fraction": 0.0}, "`member_fraction` must be in \\(0, 1\\], got 0.0"),
        ({"beta": 1.0}, "`beta` must be in \\(0, 1\\), got 1.0"),
        ({"audit_size": 5}, "`audit_size` must be an int >= 20, got 5"),
        ({"classifier": "svm"}, "`classifier` must be 'auto', 'hgb' or 'torch', got 'svm'"),
        ({"mia_features": "x"}, "`mia_features` must be 'target_loss' or 'calibrated', got 'x'"),
        ({"generator": object()}, "`generator` must have fit\\(data\\) and sample\\(n\\)"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        PanoramiaAudit(**kwargs)


def test_state_key_state_dict_and_pickle():
    audit = PanoramiaAudit(member_fraction=0.5, audit_size=3000, seed=1)
    assert audit.state_key == "PanoramiaAudit{'member_fraction': 0.5, 'audit_size': 3000, 'seed': 1}"
    other = pickle.loads(pickle.dumps(audit))
    other.load_state_dict({"version": 1, "last": {names.PANORAMIA_EPSILON: 0.25}})
    state = {"version": 1, "last": {names.PANORAMIA_EPSILON: 0.25}}
    assert other.state_dict() == {**state, "digest": dpsgd_state_digest(state)}  # sealed: the statement checks it
    other.load_state_dict({})  # older checkpoints without the key load
    assert other.state_dict()["last"] == {}


def test_figure_has_two_panels():
    from lightning_privacy.analysis.panoramia import panoramia_bounds
    from lightning_privacy.functional.panoramia import PanoramiaResult

    rng = np.random.default_rng(0)
    s = rng.integers(0, 2, 200)
    tb, ta = rng.random(200), s + rng.random(200)
    res = PanoramiaResult(panoramia_bounds(s, tb, ta), s, tb, ta, (np.zeros((200, 2)), s), np.arange(3))
    fig = panoramia_figure(res)
    assert len(fig.axes) == 2


def test_cli_audit_panoramia(tmp_path, capsys):
    from lightning_privacy.cli import main

    model = TabularMLP(104, hidden=(16,))
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=SmallAdult(batch_size=64))
    ckpt = tmp_path / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    out = tmp_path / "out.json"
    fig = tmp_path / "fig.png"
    code = main(
        [
            "audit",
            "panoramia",
            "--checkpoint",
            str(ckpt),
            "--member-fraction",
            "0.05",
            "--mia-features",
            "calibrated",
            "--helper-epochs",
            "1",
            "--figure",
            str(fig),
            "--output",
            str(out),
        ]
    )
    assert code == 0 and fig.stat().st_size > 0
    import json

    data = json.loads(out.read_text())
    assert data["epsilon"] == max(0.0, data["c_plus_epsilon_lb"] - data["c_lb"])
    assert "PANORAMIA audit" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--data must be 'adult'"):
        main(["audit", "panoramia", "--checkpoint", str(ckpt), "--data", "cifar"])


def test_audit_after_dp_sgd_training(tmp_path):
    """With the DPSGD callback (Opacus hooks on the module) the audit still runs at fit end."""
    from lightning_privacy import DPSGD

    audit = PanoramiaAudit(audit_size=300, generator_size=400, helper_epochs=1, num_thresholds=20, seed=0)
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[DPSGD(noise_multiplier=1.0), audit],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(TabularMLP(104, hidden=(32,), lr=1e-2), datamodule=SmallAdult(batch_size=128))
    assert audit.result is not None and audit.result.epsilon >= 0.0

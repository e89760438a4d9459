"""`lightning-privacy audit epsilon-star --checkpoint ...` on a small Adult model."""

import json

import lightning.pytorch as pl
import pytest
import torch

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star
from lightning_privacy.cli import main
from lightning_privacy.data.datamodule import AdultDataModule
from lightning_privacy.functional.membership_loss import membership_losses_from_loader
from lightning_privacy.models import TabularMLP


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    dm = AdultDataModule(batch_size=512)
    model = TabularMLP(104, hidden=(16,), lr=0.05)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=10,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    trainer.save_checkpoint(path)
    return path, model, dm


def test_cli_matches_direct_computation(checkpoint, capsys):
    path, model, dm = checkpoint
    assert main(["audit", "epsilon-star", "--checkpoint", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    members = membership_losses_from_loader(model, dm.member_dataloader()).double().numpy()
    nonmembers = membership_losses_from_loader(model, dm.val_dataloader()).double().numpy()
    delta = default_delta(members.size)
    assert (out["num_members"], out["num_nonmembers"]) == (27146, 3016)
    assert out["delta"] == pytest.approx(delta)
    assert out[names.EPSILON_STAR] == pytest.approx(epsilon_star(members, nonmembers, delta=delta), rel=1e-6)
    assert out[names.EPSILON_STAR_EMPIRICAL] == pytest.approx(
        epsilon_star(members, nonmembers, delta=delta, method="empirical"), rel=1e-6
    )
    assert out[names.MIA_EPSILON_LOWER] >= 0.0
    assert out["parametric"]["ks_pvalue_member"] is not None


def test_cli_table_with_test_rows_and_explicit_delta(checkpoint, capsys):
    path, _, _ = checkpoint
    assert (
        main(
            [
                "audit",
                "epsilon-star",
                "--checkpoint",
                str(path),
                "--nonmembers",
                "test",
                "--delta",
                "1e-6",
                "--model",
                "lightning_privacy.models:TabularMLP",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "27146 / 15060 (test rows)" in text and names.EPSILON_STAR in text and "1e-06" in text


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--model", "nowhere:Nothing"], "cannot be imported"),
        (["--model", "TabularMLP"], "module:Class"),
        (["--delta", "0.5"], "--delta"),
    ],
)
def test_cli_bad_arguments(checkpoint, capsys, extra, match):
    path, _, _ = checkpoint
    assert main(["audit", "epsilon-star", "--checkpoint", str(path), *extra]) == 2
    assert match in capsys.readouterr().err


def test_cli_missing_checkpoint(tmp_path, capsys):
    assert main(["audit", "epsilon-star", "--checkpoint", str(tmp_path / "none.ckpt")]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_cli_rebuilds_adult_with_the_split_the_checkpoint_saved(checkpoint, capsys, tmp_path):
    path, _, _ = checkpoint
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["datamodule_hyper_parameters"]["val_fraction"] == 0.1  # AdultDataModule saves its hyperparameters
    saved["datamodule_hyper_parameters"]["val_fraction"] = 0.2  # as if trained on the 80 % split
    torch.save(saved, tmp_path / "split.ckpt")
    assert main(["audit", "epsilon-star", "--checkpoint", str(tmp_path / "split.ckpt"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_members"] == 24130 and "val_fraction" not in captured.err
    assert main(["audit", "epsilon-star", "--checkpoint", str(tmp_path / "split.ckpt"), "--val-fraction", "0.1"]) == 0
    err = capsys.readouterr().err
    assert "warning: `--val-fraction` sets val_fraction=0.1 over val_fraction=0.2" in err

"""`lightning-privacy audit ...` on a model and datamodule of one's own, on loss files, and on a hostile checkpoint.

Every test runs the installed console script as a subprocess, as a user would.
"""

import importlib
import json
import os
import sys
import textwrap

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star
from lightning_privacy.audits import audit_epsilon_star_from_losses
from lightning_privacy.functional.membership_loss import membership_loss
from tests._cli import run_cli as _cli

USER_MODULE = '''
"""A user's own model and data: three classes of Gaussian blobs, no member_dataloader()."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self, features: int = 6, hidden: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3)
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class Blobs(pl.LightningDataModule):
    def __init__(self, n: int = 400, features: int = 6, seed: int = 0, batch_size: int = 50):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(2 * n, features, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
        self.train_set = TensorDataset(x[:n], y[:n])
        self.val_set = TensorDataset(x[n:], y[n:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)
'''


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """The user's module written to a folder, a model trained on its datamodule and saved; the module object."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "usermod_lp_audit.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("usermod_lp_audit")
        torch.manual_seed(0)
        dm, model = module.Blobs(n=400), module.Net()
        trainer = pl.Trainer(
            max_epochs=15,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, datamodule=dm)
        checkpoint = folder / "user.ckpt"
        trainer.save_checkpoint(checkpoint)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("usermod_lp_audit", None)
    return folder, checkpoint, model, dm


def _losses(model, dataset):
    model.eval()
    with torch.no_grad():
        x, y = dataset.tensors
        return membership_loss(model(x), y).double().numpy()


def test_user_model_and_datamodule_give_the_same_epsilon_star(user_model, tmp_path):
    folder, checkpoint, model, dm = user_model
    out = _cli(
        "audit",
        "epsilon-star",
        "--checkpoint",
        checkpoint,
        "--model",
        "usermod_lp_audit:Net",
        "--datamodule",
        "usermod_lp_audit:Blobs",
        "--datamodule-args",
        '{"n": 400, "batch_size": 64}',
        "--json",
        cwd=tmp_path,
        extra_path=folder,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # exactly one JSON object, nothing else on stdout
    members, nonmembers = _losses(model, dm.train_set), _losses(model, dm.val_set)
    delta = default_delta(400)
    assert (data["num_members"], data["num_nonmembers"], data["datamodule"]) == (400, 400, "Blobs")
    assert data["delta"] == pytest.approx(delta)
    assert data[names.EPSILON_STAR] == pytest.approx(epsilon_star(members, nonmembers, delta=delta), rel=1e-6)
    assert data[names.EPSILON_STAR_EMPIRICAL] == pytest.approx(
        epsilon_star(members, nonmembers, delta=delta, method="empirical"), rel=1e-6
    )
    assert data[names.EPSILON_STAR] > 0.1  # the model overfits its 400 rows a little: something to measure


def test_loss_files_give_the_same_values(tmp_path):
    rng = np.random.default_rng(1)
    members, nonmembers = rng.gamma(2, 5, 700), rng.gamma(2.6, 5, 500)
    np.save(tmp_path / "members.npy", members)
    np.savetxt(tmp_path / "nonmembers.csv", nonmembers, fmt="%.17g", header="loss of each non-member")
    args = ["audit", "epsilon-star", "--member-losses", "members.npy", "--nonmember-losses", "nonmembers.csv"]
    out = _cli(*args, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    want = audit_epsilon_star_from_losses(members, nonmembers)
    assert {k: data[k] for k in want.metrics()} == want.metrics()
    assert (data["num_members"], data["num_nonmembers"], data["member_losses"]) == (700, 500, "members.npy")
    table = _cli(*args, "--delta", "1e-4", cwd=tmp_path)
    assert table.returncode == 0 and "700 / 500" in table.stdout and names.EPSILON_STAR in table.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--member-losses", "members.txt"], "give `--checkpoint`, or both"),
        (["--member-losses", "bad.txt", "--nonmember-losses", "members.txt"], "is not one number a line"),
        (["--checkpoint", "x.ckpt", "--member-losses", "members.txt"], "not both"),
        (
            ["--checkpoint", "members.txt", "--datamodule", "a.b:C", "--val-fraction", "0.2"],
            "--val-fraction only apply",
        ),
        (["--checkpoint", "members.txt"], "is not a checkpoint torch can read"),
    ],
)
def test_clear_one_line_errors(tmp_path, args, message):
    (tmp_path / "members.txt").write_text("1.0\n2.0\n3.0\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_text("loss\n1.0\n", encoding="utf-8")
    out = _cli("audit", "epsilon-star", *args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr and "Traceback" not in out.stderr


class _Payload:
    """Pickles as a call of os.system: the classic hostile checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("command", ["epsilon-star", "panoramia"])
def test_a_checkpoint_with_more_than_weights_is_refused_and_never_runs(tmp_path, command):
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _Payload(marker)}}, checkpoint)
    out = _cli("audit", command, "--checkpoint", checkpoint, cwd=tmp_path)
    assert out.returncode == 2 and not marker.exists()
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in out.stderr
    assert str(checkpoint) in line and "more than plain weights" in line and "run code" in line
    assert "system" in line  # what the file would have called


def test_panoramia_on_flat_float_rows_of_a_user_datamodule(user_model, tmp_path):
    folder, checkpoint, _, _ = user_model
    args = [
        "audit",
        "panoramia",
        "--checkpoint",
        checkpoint,
        "--model",
        "usermod_lp_audit:Net",
        "--datamodule",
        "usermod_lp_audit:Blobs",
        "--datamodule-args",
        '{"n": 300}',
        "--helper-epochs",
        "1",
        "--json",
    ]
    out = _cli(*args, cwd=tmp_path, extra_path=folder)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["sizes"]["members"] == 300 and data["epsilon"] >= 0.0
    assert data[names.PANORAMIA_EPSILON] == data["epsilon"] and "num0=" in data["report"]
    assert "PANORAMIA" in out.stderr and "MIA classifier" in out.stderr  # the progress bar, on stderr
    quiet = _cli(*args, "--quiet", "--seed", "1", cwd=tmp_path, extra_path=folder)
    assert quiet.returncode == 0 and "PANORAMIA" not in quiet.stderr and json.loads(quiet.stdout)["epsilon"] >= 0


@pytest.mark.parametrize("command", ["membership", "epsilon-star"])
def test_a_checkpoint_of_another_module_without_model_names_the_option(user_model, tmp_path, command):
    """The issue: ``audit membership --checkpoint own.ckpt`` ended in ``TabularMLP.__init__() missing 1 required ...``."""
    _, checkpoint, _, _ = user_model
    out = _cli("audit", command, "--checkpoint", checkpoint, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "not trained with the default module lightning_privacy.models:TabularMLP" in out.stderr
    assert "`--model module:Class`" in out.stderr and "`--datamodule module:Class`" in out.stderr

"""docs/guides/audit_your_own_model.md: every command of the page runs as written, on files a user would have.

The test writes the ``my_project.py`` the page names (a LightningModule ``Net`` and a LightningDataModule
``Blobs``, not Adult), trains it and saves ``model.ckpt``, writes the loss and score files, then runs each
``lightning-privacy`` line of the page's ```bash blocks with the installed console script, from that
folder, with no PYTHONPATH (the classes are found in the current folder). ``--json`` lines must print one
strict JSON object; the printed example output must be what the command prints. The Python blocks of the docs
run in ``tests/test_docs.py``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guides" / "audit_your_own_model.md"
CLI = str(Path(sys.executable).parent / "lightning-privacy")

MY_PROJECT = '''
"""A user's own model and data: Gaussian blobs in three classes."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self, features: int = 6, hidden: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class Blobs(pl.LightningDataModule):
    def __init__(self, n: int = 300, features: int = 6, seed: int = 0, batch_size: int = 50):
        super().__init__()
        self.save_hyperparameters()  # in the checkpoint: the audit rebuilds the same rows
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(2 * n, features, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
        self.train_set, self.val_set = TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)
'''


def _section() -> str:
    return PAGE.read_text(encoding="utf-8")


def _blocks(kind: str) -> list:
    return re.findall(rf"^```{kind}\n(.*?)^```", _section(), flags=re.S | re.M)


def _commands() -> list:
    return [line.strip() for block in _blocks("bash") for line in block.splitlines() if line.strip()]


def _params():
    for command in _commands():
        yield pytest.param(command, id=" ".join(shlex.split(command)[1:4]))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's folder: my_project.py, model.ckpt, losses and scores as .npy/.csv/.txt."""
    folder = tmp_path_factory.mktemp("my_project")
    (folder / "my_project.py").write_text(textwrap.dedent(MY_PROJECT), encoding="utf-8")
    train = textwrap.dedent(
        """
        import lightning.pytorch as pl
        import torch
        from my_project import Blobs, Net

        torch.manual_seed(0)
        trainer = pl.Trainer(max_epochs=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(Net(), datamodule=Blobs())
        trainer.save_checkpoint("model.ckpt")
        """
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", train], cwd=folder, env=env, check=True, capture_output=True, timeout=300)
    rng = np.random.default_rng(1)
    np.save(folder / "member_losses.npy", rng.gamma(2, 5, 700))
    np.savetxt(folder / "nonmember_losses.csv", rng.gamma(2.6, 5, 500), fmt="%.17g", header="one loss a line")
    # the page's example output: 1,000 simulated scores, 500 members scoring 1.5 higher on average
    rng = np.random.default_rng(0)
    is_member = np.repeat([1, 0], 500)
    scores = rng.normal(loc=1.5 * is_member)
    np.save(folder / "scores.npy", scores)
    np.savetxt(folder / "labels.txt", is_member, fmt="%d")
    np.savetxt(folder / "losses.txt", -scores, fmt="%.17g")
    return folder


def _run(command: str, folder: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "lightning-privacy"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([CLI, *argv[1:]], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_the_page_has_its_commands():
    commands = _commands()
    assert any("--model my_project:Net --datamodule my_project:Blobs" in c for c in commands)
    assert any("--member-losses" in c for c in commands)
    assert any(c.startswith("lightning-privacy estimate --scores") for c in commands)
    report = (ROOT / "docs" / "guides" / "html_report.md").read_text(encoding="utf-8")
    assert 'log_privacy_report(trainer, "privacy_report.html")' in report
    assert "../assets/benchmarks/results/privacy_report_html.png" in report
    assert (ROOT / "benchmarks" / "results" / "privacy_report_html.png").is_file()


@pytest.mark.parametrize("command", list(_params()))
def test_command_runs_as_written(command, project):
    proc = _run(command, project)
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    if "--json" in shlex.split(command):

        def refuse(token):
            raise AssertionError(f"not strict JSON: {token}")

        assert isinstance(json.loads(proc.stdout, parse_constant=refuse), dict)
    else:
        assert proc.stdout.strip()


def test_printed_example_is_what_the_command_prints(project):
    (example,) = _blocks("text")
    command = next(c for c in _commands() if c.startswith("lightning-privacy estimate --scores scores.npy"))
    proc = _run(command, project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == example.rstrip("\n")

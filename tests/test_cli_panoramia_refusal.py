"""`lightning-privacy audit panoramia` refuses data it cannot generate with one line and exit status 2, naming what
it supports and `--generator`; with `--generator`, token ids are audited and its warnings reach stderr and the JSON.

Every test runs the installed console script as a subprocess, as a user would (see test_cli_audit_any_model.py).
"""

import json
import sys
import textwrap

import pytest

from tests._cli import cli_warnings as _warnings
from tests._cli import run_cli as _cli

USER_MODULE = '''
"""A user's token-id classifier and a model of 5-d inputs, their data, and their own token generator."""
import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class TokenNet(pl.LightningModule):
    def __init__(self, vocabulary: int = 50):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(vocabulary, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, ids):
        return self.head(self.embedding(ids))


class Tokens(pl.LightningDataModule):
    def __init__(self, n: int = 150, length: int = 12, vocabulary: int = 50):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocabulary, (n, length), generator=g)
        self.train_set = TensorDataset(ids, (ids[:, 0] < vocabulary // 2).long())

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=50)


class VideoNet(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 4 * 4, 2))

    def forward(self, x):
        return self.net(x)


class Videos(pl.LightningDataModule):
    def __init__(self, n: int = 150):
        super().__init__()
        self.train_set = TensorDataset(torch.rand(n, 2, 3, 4, 4), torch.randint(0, 2, (n,)))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=50)


class TokenGenerator:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fit(self, data):
        self.x, self.y = np.asarray(data[0]), np.asarray(data[1])
        return self

    def sample(self, n):
        rows = self.rng.integers(0, len(self.x), (n, self.x.shape[1]))
        return np.take_along_axis(self.x, rows, axis=0), self.y[self.rng.integers(0, len(self.y), n)]
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's module in a folder and a bare state_dict checkpoint of each (untrained) model."""
    import importlib

    import torch

    folder = tmp_path_factory.mktemp("user")
    (folder / "usermod_lp_warn.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("usermod_lp_warn")
        torch.save(module.TokenNet().state_dict(), folder / "tokens.pt")
        torch.save(module.VideoNet().state_dict(), folder / "videos.pt")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("usermod_lp_warn", None)
    return folder


@pytest.mark.parametrize(
    "model, data, what",
    [
        ("TokenNet", "Tokens", "x holds integers (int64) of shape (12,) per example (token ids?)"),
        ("VideoNet", "Videos", "x has shape (2, 3, 4, 4) per example (5-d inputs)"),
    ],
)
def test_panoramia_refuses_data_it_cannot_generate_in_one_line(user, model, data, what):
    checkpoint = user / ("tokens.pt" if model == "TokenNet" else "videos.pt")
    out = _cli(
        "audit",
        "panoramia",
        "--checkpoint",
        checkpoint,
        "--model",
        f"usermod_lp_warn:{model}",
        "--datamodule",
        f"usermod_lp_warn:{data}",
        cwd=user,
        extra_path=user,
    )
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in out.stderr and "PANORAMIA" not in line.split(":")[0]
    assert line.startswith("lightning-privacy audit panoramia: error: PANORAMIA cannot generate non-members")
    assert what in line and "tables" in line and "float images (N, H, W) or (N, C, H, W)" in line
    assert "`--generator pkg.module:Class`" in line


def test_panoramia_on_token_ids_with_generator_runs_and_reports_warnings(user):
    out = _cli(
        "audit",
        "panoramia",
        "--checkpoint",
        user / "tokens.pt",
        "--model",
        "usermod_lp_warn:TokenNet",
        "--datamodule",
        "usermod_lp_warn:Tokens",
        "--generator",
        "usermod_lp_warn:TokenGenerator",
        "--helper-epochs",
        "1",
        "--quiet",
        "--json",
        cwd=user,
        extra_path=user,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["sizes"]["members"] == 150 and data["epsilon"] == 0.0  # an untrained model: nothing to find
    (warning,) = data["warnings"]
    assert warning.startswith("no information") and warning in data["report"]
    assert _warnings(out.stderr, "audit panoramia") == [warning]

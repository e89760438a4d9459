"""`lightning-privacy audit membership --claim-…` end to end (a subprocess, as a user runs it): a memorising model is
contradicted, its claim printed and recorded; the checkpoint's own ledger is the claim by default; bad claim options
are one line naming the flag."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from lightning_privacy import DPSGD, names
from tests._cli import run_cli
from tests.callbacks._tiny import trainer

COMMAND = "audit membership"
MODULE = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl


class Memo(pl.LightningDataModule):
    """Random rows with random labels: members are told apart only by memorisation."""

    def __init__(self, n: int = 200, batch_size: int = 50):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(2 * n, 20, generator=g), torch.randint(0, 2, (2 * n,), generator=g)
        self.train_set, self.val_set = TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)
'''


def _fit(folder, callbacks=(), **model_kwargs):
    import importlib
    import sys

    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("memo_lp_claims")
        from lightning_privacy.models import TabularMLP

        torch.manual_seed(0)
        model = TabularMLP(20, hidden=(256,), **model_kwargs)
        t = trainer(list(callbacks), max_epochs=40, limit_val_batches=0)
        t.fit(model, datamodule=module.Memo())
        path = folder / ("dp.ckpt" if callbacks else "plain.ckpt")
        t.save_checkpoint(path)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("memo_lp_claims", None)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memo")
    (folder / "memo_lp_claims.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def plain(folder):
    return _fit(folder, lr=1e-2, optimizer="adam")


@pytest.fixture(scope="module")
def private(folder):
    dpsgd = DPSGD(noise_multiplier=4.0, max_grad_norm=1.0, sampling_seed=0)
    return _fit(folder, [dpsgd], lr=0.5), dpsgd


def _run(folder, checkpoint, *extra, cwd):
    args = (
        "--checkpoint", checkpoint, "--attack", "loss", "--model", "lightning_privacy.models:TabularMLP",
        "--datamodule", "memo_lp_claims:Memo", "--json", *extra,
    )  # fmt: skip
    return run_cli(*COMMAND.split(), *args, cwd=cwd, extra_path=folder)


def _json(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_memorising_model_contradicts_a_dp_sgd_claim(folder, plain, tmp_path):
    figure = tmp_path / "roc.png"
    claim = ("--claim-noise-multiplier", "4", "--claim-sample-rate", "0.25", "--claim-steps", "160")
    done = _run(folder, plain, *claim, "--figure", figure, cwd=tmp_path)
    out = _json(done)
    assert out["verdict"] == "contradicted" and out[names.LOSS_CLAIM_CONTRADICTED] == 1.0
    assert out["claim"]["kind"] == "dp_sgd" and out["claim"]["noise_multiplier"] == 4.0
    assert out["claim"]["steps"] == 160 and out["claim"]["delta"] == 1e-5 and out["relation"] == "add_remove"
    assert out["evidence"]["statistic"] > out["evidence"]["bound"] and out["evidence"]["contradicts"]
    assert out["ledger"] is None  # a plain checkpoint: the claim is the options'
    assert "claim: DP-SGD σ = 4, q = 0.25, 160 steps (δ = 1e-05)" in done.stderr
    assert "verdict: the claim DP-SGD σ = 4, q = 0.25, 160 steps (δ = 1e-05) is contradicted" in done.stderr
    assert "| verdict | contradicted at confidence 95%" in out["report"]
    assert figure.read_bytes().startswith(b"\x89PNG")
    loose = _json(_run(folder, plain, "--claim-epsilon", "30", "--claim-delta", "1e-5", cwd=tmp_path))
    assert loose["verdict"] == "consistent" and loose["evidence"] is None and loose["claim"]["kind"] == "epsilon_delta"
    assert loose[names.LOSS_CLAIM_CONTRADICTED] == 0.0 and loose["delta"] == 1e-5


def test_the_checkpoints_own_ledger_is_the_default_claim(folder, private, tmp_path):
    path, dpsgd = private
    out = _json(_run(folder, path, cwd=tmp_path))
    assert out["claim"]["history"] == [[4.0, 0.25, 160]] and out["ledger"]["steps"] == 160
    assert out["verdict"] == "consistent" and out[names.LOSS_CLAIM_CONTRADICTED] == 0.0
    assert out["claim"]["epsilon"] == pytest.approx(dpsgd.ledger.privacy_loss_distribution("add_remove").epsilon(1e-5))
    # --claim-* replaces the ledger as the claim; the region stays the ledger's
    tight = _json(_run(folder, path, "--claim-epsilon", "0.01", "--claim-delta", "0", cwd=tmp_path))
    assert tight["claim"]["kind"] == "epsilon_delta" and tight["ledger_tpr_bounds"] is not None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--claim-epsilon", "1"], "`--claim-epsilon` needs `--claim-delta`"),
        (["--claim-epsilon", "-1", "--claim-delta", "0"], "`--claim-epsilon` must be a finite number >= 0, got -1.0"),
        (["--claim-epsilon", "1", "--claim-delta", "1"], r"`--claim-delta` must be in [0, 1), got 1.0"),
        (["--claim-noise-multiplier", "1", "--claim-steps", "3"], "`--claim-sample-rate` is missing"),
        (
            ["--claim-noise-multiplier", "0", "--claim-sample-rate", "0.1", "--claim-steps", "3"],
            "`--claim-noise-multiplier` must be > 0, got 0.0",
        ),
        (
            ["--claim-noise-multiplier", "1", "--claim-sample-rate", "1.5", "--claim-steps", "3"],
            "`--claim-sample-rate` must be in (0, 1], got 1.5",
        ),
        (
            ["--claim-noise-multiplier", "1", "--claim-sample-rate", "0.1", "--claim-steps", "0"],
            "`--claim-steps` must be >= 1, got 0",
        ),
        (["--claim-epsilon", "1", "--claim-delta", "0", "--claim-steps", "3"], "not both"),
        (["--claim-delta", "1e-5"], "`--claim-delta` needs `--claim-epsilon`"),
    ],
)
def test_bad_claim_options_are_one_line_naming_the_flag(extra, message, tmp_path):
    done = run_cli(*COMMAND.split(), "--checkpoint", "missing.ckpt", "--attack", "loss", *extra, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"lightning-privacy {COMMAND}: error: ") and message in line

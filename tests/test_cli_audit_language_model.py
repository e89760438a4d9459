"""`lightning-privacy audit membership` and `audit epsilon-star` on a language model's checkpoint, whose batches are
mappings (``{"input_ids": ..., "attention_mask": ...}``), run as a user runs them (a subprocess, the others through ``cli.main`` in this process): a missing
``--signal`` and a ``--signal`` the attack cannot read are refused in one line before any reference model trains."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from lightning_privacy import cli
from tests._cli import run_cli

LM_MODULE = '''
"""A user's causal language model and its data: random token sequences, right-padded, as mappings."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_privacy.functional.sequence_loss import causal_lm_signal

V, T = 24, 10


class Rows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.mask = (torch.arange(T)[None, :] < torch.randint(4, T + 1, (n, 1), generator=g)).long()
        self.ids = torch.randint(1, V, (n, T), generator=g) * self.mask

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


class TinyLM(pl.LightningModule):
    def __init__(self, width: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.embed, self.head = torch.nn.Embedding(V, width), torch.nn.Linear(width, V)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.embed(input_ids))

    def training_step(self, batch, batch_idx):
        losses = causal_lm_signal(self, batch)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Sequences(pl.LightningDataModule):
    def __init__(self, n: int = 64):
        super().__init__()
        self.save_hyperparameters()
        self.train_set, self.val_set = Rows(n, seed=1), Rows(n, seed=2)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)
'''

MODEL = ("--model", "lm_lp_cli:TinyLM", "--datamodule", "lm_lp_cli:Sequences")
SIGNALS = "lightning_privacy.functional.sequence_loss"


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """The module written to a folder (put on the CLI's PYTHONPATH) and a checkpoint of one epoch of training."""
    folder = tmp_path_factory.mktemp("lm")
    (folder / "lm_lp_cli.py").write_text(textwrap.dedent(LM_MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("lm_lp_cli")
        torch.manual_seed(0)
        trainer = pl.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        with warnings.catch_warnings():  # no validation_step: the val loader is the audit's non-members
            warnings.simplefilter("ignore")
            trainer.fit(module.TinyLM(), datamodule=module.Sequences())
        checkpoint = folder / "lm.ckpt"
        trainer.save_checkpoint(checkpoint)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("lm_lp_cli", None)
    return folder, checkpoint


@pytest.fixture
def in_process(monkeypatch, capsys):
    """``run(folder, *args)``: the command through ``cli.main`` from ``folder`` (no start-up of torch), as a process's
    ``(returncode, stdout, stderr)``."""

    def run(folder, *args):
        monkeypatch.chdir(folder)
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, "lm_lp_cli", raising=False)
        code = cli.main(["audit", *map(str, args)])
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    yield run
    sys.modules.pop("lm_lp_cli", None)


def _errors(stderr: str, command: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith(f"lightning-privacy {command}: error: ")]


def test_a_language_models_batches_without_signal_are_refused_before_any_reference_trains(
    lm_checkpoint, tmp_path, in_process
):
    folder, checkpoint = lm_checkpoint
    refs = tmp_path / "refs"
    args = ("--checkpoint", checkpoint, *MODEL, "--attack", "rmia", "--cache-dir", refs, "--reference-epochs", "1")
    done = run_cli("audit", "membership", *args, cwd=tmp_path, extra_path=folder)  # as a user runs it
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr  # today: KeyError: 0
    assert _errors(done.stderr, "audit membership") == [
        "lightning-privacy audit membership: error: the batches are mappings with keys ['attention_mask', "
        "'input_ids'], not the (x, y) pairs the default `forward_fn` reads: for a causal language model pass "
        f"`--signal {SIGNALS}:causal_lm_signal`, one loss per sequence, or `--signal MODULE:FUNCTION` of your own "
        "returning one loss per example"
    ]
    assert not refs.exists() and "references: training" not in done.stderr  # refused before the references trained

    epsilon_star = in_process(folder, "epsilon-star", "--checkpoint", checkpoint, *MODEL)
    assert epsilon_star.returncode == 2
    assert f"pass `--signal {SIGNALS}:causal_lm_signal`" in _errors(epsilon_star.stderr, "audit epsilon-star")[0]
    with_signal = in_process(
        folder, "epsilon-star", "--checkpoint", checkpoint, *MODEL, "--signal", f"{SIGNALS}:causal_lm_signal", "--json"
    )
    assert with_signal.returncode == 0, with_signal.stderr
    assert json.loads(with_signal.stdout)["num_members"] == 64  # one loss per sequence


def test_a_score_signal_for_rmia_or_lira_is_refused_before_any_reference_trains(lm_checkpoint, tmp_path, in_process):
    """`--signal ...:min_k_percent_signal` gives a score, not a likelihood: today RMIA found it out only after
    training every reference model."""
    folder, checkpoint = lm_checkpoint
    refs = tmp_path / "refs"
    common = ("--checkpoint", checkpoint, *MODEL, "--cache-dir", refs, "--reference-epochs", "1", "--json")
    done = in_process(folder, "membership", *common, "--attack", "lira", "--signal", f"{SIGNALS}:min_k_percent_signal")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1  # one line, before the checkpoint is even read
    assert done.stderr.startswith(
        "lightning-privacy audit membership: error: `--attack lira` needs a likelihood Pr(x | θ) from every model, "
        f"but `--signal` '{SIGNALS}:min_k_percent_signal' gives a score (kind 'score', e.g. Min-K%): use it with "
        f"`--attack loss`, or give RMIA and LiRA a likelihood signal such as `--signal {SIGNALS}:causal_lm_signal`"
    )
    assert not refs.exists()

    # the same checkpoint with a likelihood signal: the references do train (so the refusals above came first)
    ok = in_process(
        folder, "membership", *common, "--attack", "rmia", "--num-references", "1", "--signal",
        f"{SIGNALS}:causal_lm_signal",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["references"]["trained"] == 1 and (refs / "reference_0.pt").is_file()
    assert out["num_members"] == 64 and out["variant"] == "offline"

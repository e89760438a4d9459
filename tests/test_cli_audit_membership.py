"""`lightning-privacy audit membership` on small Adult checkpoints, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_privacy import DPSGD, names
from lightning_privacy.data.datamodule import AdultDataModule
from lightning_privacy.models import TabularMLP
from tests._cli import cli_warnings, run_cli

COMMAND = "audit membership"


def _fit(folder, callbacks=(), **kwargs):
    torch.manual_seed(0)
    model = TabularMLP(104, hidden=(16,), lr=0.05)
    trainer = pl.Trainer(
        callbacks=list(callbacks),
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=AdultDataModule(batch_size=512))
    path = folder / "model.ckpt"
    trainer.save_checkpoint(path)
    return path, model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One epoch of ten batches (no DP-SGD)."""
    return _fit(tmp_path_factory.mktemp("plain"), max_epochs=1, limit_train_batches=10)[0]


@pytest.fixture(scope="module")
def dp_checkpoint(tmp_path_factory):
    """Three DP-SGD steps: the checkpoint holds DPSGD's ledger."""
    dpsgd = DPSGD(noise_multiplier=1.0, delta=1e-4, sampling_seed=0)  # a non-default delta: the audit reads it back
    return _fit(tmp_path_factory.mktemp("dp"), [dpsgd], max_steps=3)[0], dpsgd


def _json(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # exactly one JSON object on stdout


def test_without_a_separate_population_the_nonmembers_are_halved(checkpoint, tmp_path):
    # with the test rows as non-members, Adult's population (its test split) would overlap them: they are halved
    args = ("--checkpoint", checkpoint, "--attack", "loss", "--nonmembers", "test", "--json")
    done = run_cli(*COMMAND.split(), *args, cwd=tmp_path)
    out = _json(done)
    assert out["population"]["population_rows"] == out["num_nonmembers"] == 7530
    assert "seeded split" in out["population"]["source"]
    assert "split by a permutation seeded with --seed 0" in done.stderr


def test_loss_attack_json(checkpoint, tmp_path):
    done = run_cli(*COMMAND.split(), "--checkpoint", checkpoint, "--attack", "loss", "--json", cwd=tmp_path)
    out = _json(done)
    assert out["attack"] == "loss" and out["variant"] == "reference-free" and out["references"] is None
    # Adult's population is its test split (15060 rows), the audited non-members all 3016 validation rows
    assert out["population"]["population_rows"] == 15060 and out["num_nonmembers"] == 3016
    assert out["num_members"] == 27146 and out["population"]["source"] == "AdultDataModule.population_dataloader()"
    assert out["population"]["population_batch_size"] == 512  # the batch size the target trained with
    assert out["ledger"] is None and out["ledger_tpr_bounds"] is None and "no DP-SGD history" in done.stderr
    for key in ("auc", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "tpr_at_fpr_0.1", "epsilon_lower"):
        assert 0.0 <= out[names.membership_key("loss", key)] <= (1.0 if "epsilon" not in key else np.inf)
    assert [p["fpr"] for p in out["tpr_at_fpr"]] == [0.001, 0.01, 0.1]
    assert "scores" not in out  # the scores go to --output only
    assert cli_warnings(done.stderr, COMMAND) == out["warnings"] + out["outside"]


def test_rmia_trains_references_then_reuses_them(checkpoint, tmp_path):
    figure, output = tmp_path / "roc.png", tmp_path / "audit.json"
    args = ("--checkpoint", checkpoint, "--attack", "rmia", "--json", "--seed", "3")
    first = run_cli(
        *COMMAND.split(), *args, "--num-references", "2", "--reference-epochs", "2", "--figure", figure,
        "--output", output, cwd=tmp_path,
    )  # fmt: skip
    out = _json(first)
    cache = f"{checkpoint}.references"  # the default: next to the checkpoint
    assert out["references"] == {
        "cache_dir": cache,
        "num_references": 2,
        "trained": 2,
        "loaded": 0,
        "epochs": 2,
        "dp_sgd": None,  # a target trained without DP-SGD: so are its references
        "training_seconds": out["references"]["training_seconds"],
    }
    assert len(out["references"]["training_seconds"]) == 2
    assert f"training 2 reference model(s) for 2 epoch(s) (--reference-epochs) into {cache}" in first.stderr
    assert "validation_step" not in first.stderr  # the references train without validation data, on purpose
    assert out["variant"] == "offline" and out["num_references"] == 2 and out["gamma"] == 2.0
    assert figure.read_bytes().startswith(b"\x89PNG")
    saved = json.loads(output.read_text())
    assert len(saved["scores"]) == len(saved["is_member"]) == out["num_members"] + out["num_nonmembers"]
    assert saved[names.RMIA_AUC] == out[names.RMIA_AUC]

    second = run_cli(*COMMAND.split(), *args, "--references", cache, cwd=tmp_path)
    again = _json(second)
    assert again["references"]["trained"] == 0 and again["references"]["loaded"] == 2
    assert f"references: loading 2 reference model(s) from {cache}" in second.stderr
    assert again[names.RMIA_AUC] == out[names.RMIA_AUC]  # the same references, the same attack


def test_dp_checkpoint_is_audited_inside_its_ledger(dp_checkpoint, tmp_path):
    path, dpsgd = dp_checkpoint
    figure = tmp_path / "roc.png"
    done = run_cli(
        *COMMAND.split(), "--checkpoint", path, "--attack", "loss", "--json", "--figure", figure, cwd=tmp_path
    )
    out = _json(done)
    assert out["ledger"]["steps"] == dpsgd.ledger.steps == 3
    assert out["ledger"]["epsilon"] == pytest.approx(dpsgd.ledger.epsilon(dpsgd.delta), rel=1e-9)
    bounds = dpsgd.ledger.tpr_bounds([p["fpr_high"] for p in out["tpr_at_fpr"]], relation="add_remove")
    assert out["ledger_tpr_bounds"] == pytest.approx(bounds.tolist(), rel=1e-9)
    assert out["outside"] == []  # three noisy steps: no attack point beyond the accountant's bound
    assert "DP-SGD history of 3 step(s)" in done.stderr and figure.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--attack", "mia"], "--attack: invalid choice"),
        (["--gamma", "0.5"], "`--gamma` must be >= 1"),
        (["--delta", "1"], "`--delta`"),
        (["--num-references", "0"], "`--num-references` must be >= 1"),
        (["--attack", "loss", "--num-references", "2"], "`--attack loss` uses no reference models"),
        (["--references", "a", "--cache-dir", "b"], "`--references DIR`"),
        (["--model", "TabularMLP"], "`--model` must look like"),
    ],
)
def test_bad_flags_name_the_flag(checkpoint, tmp_path, extra, match):
    done = run_cli(*COMMAND.split(), "--checkpoint", checkpoint, *extra, cwd=tmp_path)
    assert done.returncode == 2 and match in done.stderr and done.stdout == ""
    assert "Traceback" not in done.stderr


def test_bare_state_dict_needs_reference_epochs(tmp_path):
    model = TabularMLP(104, hidden=(16,))
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    model_args = json.dumps({"num_features": 104, "hidden": [16]})
    done = run_cli(*COMMAND.split(), "--checkpoint", "weights.pt", "--model-args", model_args, cwd=tmp_path)
    assert done.returncode == 2 and "give `--reference-epochs N`" in done.stderr
    assert not (tmp_path / "weights.pt.references" / "reference_0.pt").exists()


def test_dp_target_gets_dp_references(dp_checkpoint, tmp_path):
    path, dpsgd = dp_checkpoint
    args = ("--checkpoint", path, "--attack", "lira", "--num-references", "2", "--reference-epochs", "1", "--json")
    done = run_cli(*COMMAND.split(), *args, "--cache-dir", tmp_path / "refs", cwd=tmp_path)
    out = _json(done)
    # trained like the target: DP-SGD at the checkpoint's sigma, C, delta, loss reduction and gradient mode,
    # batches of its training batch size (512)
    assert out["references"]["dp_sgd"] == {
        "noise_multiplier": dpsgd.noise_multiplier,
        "max_grad_norm": dpsgd.max_grad_norm,
        "delta": dpsgd.delta,
        "accountant": dpsgd.accountant_mechanism,
        "loss_reduction": dpsgd.loss_reduction,
        "grad_sample_mode": dpsgd.grad_sample_mode,
    }
    assert out["delta"] == dpsgd.delta  # the run's delta, saved in the checkpoint
    assert out["population"]["population_batch_size"] == 512 and out["references"]["trained"] == 2
    assert f"with DP-SGD like the target's (sigma {dpsgd.noise_multiplier:g}" in done.stderr
    assert out["variant"] == "offline" and out["ledger"]["steps"] == 3


SIGNAL = '''
import torch.nn.functional as F


def cross_entropy(model, batch):
    """One membership loss per example: the cross-entropy (monotone in the true class's probability)."""
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")
'''


def test_a_signal_function_replaces_the_logits(checkpoint, tmp_path):
    """`--signal module:function`: the cross-entropy ranks examples as the membership loss does, so the LOSS attack's
    numbers are the same; a name that does not import is one line naming the flag."""
    (tmp_path / "signals_lp.py").write_text(SIGNAL, encoding="utf-8")
    args = (*COMMAND.split(), "--checkpoint", checkpoint, "--attack", "loss", "--json")
    plain = _json(run_cli(*args, cwd=tmp_path))
    signal = _json(run_cli(*args, "--signal", "signals_lp:cross_entropy", cwd=tmp_path, extra_path=tmp_path))
    for key in ("auc", "tpr_at_fpr_0.01", "tpr_at_fpr_0.1"):
        assert signal[names.membership_key("loss", key)] == pytest.approx(plain[names.membership_key("loss", key)])
    bad = run_cli(*args, "--signal", "signals_lp:nothing", cwd=tmp_path, extra_path=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "`--signal` 'signals_lp:nothing'" in bad.stderr

"""`lightning-privacy audit` on checkpoints of DPSGD(fix_modules=True), with the datamodule the checkpoint saved.

The user's module is ``tests/_user_models.py`` copied to a folder as ``my_models.py``; each model is trained two DP-SGD
steps on ``Data(n_train=96)`` (the class default is 64) and saved. The acceptance case (the transformer), the refusal
of an unrecorded checkpoint and PANORAMIA run the installed console script from that folder; the other layer kinds and
the datamodule arguments run the same command in this process (``cli.main``), which saves a start-up of torch each.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_privacy import cli, names
from lightning_privacy.audits import audit_epsilon_star, load_checkpoint
from tests import _user_models
from tests._fixed_checkpoints import N_TRAIN, train_fixed, without_record
from tests._user_models import KINDS, Net

CLI = str(Path(sys.executable).parent / "lightning-privacy")
USER_CLASSES = ("--model", "my_models:Net", "--datamodule", "my_models:Data")
REPLACED = {
    "attention": "block.self_attn (MultiheadAttention → DPMultiheadAttention)",
    "lstm": "rnn (LSTM → DPLSTM)",
    "gru": "rnn (GRU → DPGRU)",
    "batchnorm": "body.1 (BatchNorm1d → GroupNorm)",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The user's folder: my_models.py and one checkpoint per layer kind; the in-process models and datamodules."""
    here = tmp_path_factory.mktemp("my_project")
    shutil.copy(_user_models.__file__, here / "my_models.py")
    return here, {kind: train_fixed(kind, here) for kind in KINDS}


@pytest.fixture
def in_process(monkeypatch, capsys):
    """``run(here, *args)``: the command through ``cli.main`` from ``here``, as ``(returncode, stdout, stderr)``."""

    def run(here, *args, command="epsilon-star"):
        monkeypatch.chdir(here)
        monkeypatch.syspath_prepend(str(here))
        monkeypatch.delitem(sys.modules, "my_models", raising=False)
        code = cli.main(["audit", command, *map(str, args), *USER_CLASSES])
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    yield run
    sys.modules.pop("my_models", None)


def _audit(here, *args, command="epsilon-star"):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    argv = [CLI, "audit", command, *map(str, args), *USER_CLASSES]
    return subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=600)


def _warnings(proc):
    return [line for line in proc.stderr.splitlines() if ": warning: " in line]


@pytest.mark.parametrize("kind", KINDS)
def test_epsilon_star_audits_a_fixed_checkpoint_on_the_members_it_trained_on(folder, in_process, kind):
    here, trained = folder
    _, dm, path = trained[kind]
    run = _audit if kind == "attention" else in_process  # the acceptance case through the console script
    out = run(here, "--checkpoint", path.name, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["num_members"], data["num_nonmembers"], data["datamodule"]) == (N_TRAIN, 48, "Data")
    (warning,) = [w for w in _warnings(out) if "DPSGD(fix_modules=True)" in w]  # once, naming the module
    assert REPLACED[kind] in warning
    with pytest.warns(UserWarning, match="DPSGD"):
        model = load_checkpoint(Net, path)
    want = audit_epsilon_star(model, dm.train_dataloader(), dm.val_dataloader(), warn=False).to_dict()
    assert data[names.EPSILON_STAR] == pytest.approx(want[names.EPSILON_STAR], rel=1e-6, abs=1e-9)


def test_an_override_of_a_saved_datamodule_argument_is_named(folder, in_process):
    here, trained = folder
    out = in_process(here, "--checkpoint", trained["lstm"][2].name, "--datamodule-args", '{"batch_size": 32}', "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["num_members"] == N_TRAIN
    (warning,) = [w for w in _warnings(out) if "batch_size" in w]
    assert "`--datamodule-args` sets batch_size=32 over batch_size=16" in warning


def test_members_of_another_size_than_dpsgd_trained_on_are_refused_naming_both(folder, in_process):
    here, trained = folder
    out = in_process(here, "--checkpoint", trained["lstm"][2].name, "--datamodule-args", '{"n_train": 64}')
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert any("sets n_train=64 over n_train=96" in w for w in _warnings(out))
    (error,) = [line for line in out.stderr.splitlines() if ": error: " in line]
    assert f"trained by DPSGD on {N_TRAIN} examples" in error and "gives 64 members" in error


def test_a_checkpoint_without_the_record_names_dpsgd_fix_modules_and_fix_modules_loads_it(folder, in_process):
    here, trained = folder
    old = without_record(trained["attention"][2], here / "old_attention.ckpt")
    out = _audit(here, "--checkpoint", old.name)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "DPSGD(fix_modules=True)" in out.stderr and "--fix-modules" in out.stderr
    assert "block.self_attn.qlinear.weight" in out.stderr
    fixed = in_process(here, "--checkpoint", old.name, "--fix-modules", "--json")
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["num_members"] == N_TRAIN  # saved n_train, no DPSGD size to check against


def test_panoramia_audits_a_fixed_batchnorm_checkpoint_on_its_saved_float_rows(folder):
    here, trained = folder
    out = _audit(
        here, "--checkpoint", trained["batchnorm"][2].name, "--helper-epochs", "1", "--quiet", "--json",
        command="panoramia",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["sizes"]["members"] == N_TRAIN  # Data(tokens=False, n_train=96), as saved
    assert any(REPLACED["batchnorm"] in w for w in _warnings(out))

"""Issue 21's four user models played end to end: training with every callback, the audit CLI, the report, refusals.

The models are ``tests/_user_models.py``'s ``Net`` (copied to a folder as the user's ``my_models.py``): a ResNet-style
CNN with BatchNorm (``"resnet"``), an Embedding + ``nn.TransformerEncoderLayer`` classifier (``"attention"``), a
frozen Linear backbone with a trainable low-rank update (``"lora"``) and an LSTM (``"lstm"``). Each trains two epochs
on ``Data(n_train=96)`` (the class default is 64) with DP-SGD (``fix_modules=True`` where DP-SGD needs it), the
BayesSecurityMonitor, ``CanaryAudit()``, ``EpsilonStarAudit`` and a ``ModelCheckpoint``; its last checkpoint is then
audited by the installed console script, ``lightning-privacy audit epsilon-star --json``, and the trainer's report is
built. Everything is seeded; which models' Normal fits the KS test rejects is not pinned (see the comment there).

Refusals: DP-SGD without ``fix_modules`` on the BatchNorm, attention and LSTM models (the fix first, each layer
named once), PANORAMIA on the token-id model's checkpoint (one line, exit 2, ``--generator``), and a budget the first
step breaks (the σ that allows one epoch, which then trains one).
"""

import html
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import DPSGD, BayesSecurityMonitor, CanaryAudit, EpsilonStarAudit, PrivacyBudgetStopping, names
from lightning_privacy.report import privacy_report, privacy_report_html
from tests import _user_models
from tests._user_models import INPUTS, Data, Net
from tests.callbacks._tiny import trainer as tiny_trainer

CLI = str(Path(sys.executable).parent / "lightning-privacy")
USER_MODELS = ("resnet", "attention", "lora", "lstm")
N_TRAIN, N_VAL = 96, 48  # not Data's default n_train (64): the audit must take it from the checkpoint
EPOCHS = 2
TRAINABLE = {"resnet": 842, "attention": 714, "lora": 46, "lstm": 690}  # coordinates: all fewer than 1000 canaries
REPLACED = {  # what DPSGD(fix_modules=True) replaces, as its warning and the CLI's name it
    "resnet": ("body.1 (BatchNorm2d → GroupNorm)", "body.3.bn (BatchNorm2d → GroupNorm)"),
    "attention": ("block.self_attn (MultiheadAttention → DPMultiheadAttention)",),
    "lora": (),
    "lstm": ("rnn (LSTM → DPLSTM)",),
}
REFUSED = {  # DPSGD without fix_modules: each layer once, after its kind and replacement
    "resnet": "BatchNorm2d → GroupNorm: body.1, body.3.bn.",
    "attention": "MultiheadAttention → DPMultiheadAttention: block.self_attn.",
    "lstm": "LSTM → DPLSTM: rnn.",
}
# The KS check (p < 0.01) compares 48 held-out φ with 48 Normal draws, so its p-values are discrete: on the machine
# these tests were written on resnet and lstm were rejected at member p = 0.0092, the first value below 0.01. That is
# one rounding away from the other side on another CPU's kernels, so the tests assert that the flag, the warning, the
# CLI and the report agree with the result, not which models it rejects (tests/audits/test_result_warnings.py checks
# the criterion itself on constructed losses).


def data(kind, **kwargs):
    """The datamodule of ``kind``'s inputs: token ids, float rows or float images."""
    return Data(
        n_train=N_TRAIN, n_val=N_VAL, tokens=INPUTS[kind] == "tokens", images=INPUTS[kind] == "images", **kwargs
    )


def trainer(callbacks, folder, **kwargs):
    return tiny_trainer(callbacks, folder, **{"max_epochs": EPOCHS, "enable_checkpointing": True, **kwargs})


class _Infos(logging.Handler):
    """The ``rank_zero_info`` lines of a fit."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _train(kind, folder):
    torch.manual_seed(0)
    model, dm = Net(kind=kind), data(kind)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if "base" in k}
    callbacks = SimpleNamespace(
        dpsgd=DPSGD(noise_multiplier=1.0, fix_modules=kind != "lora", sampling_seed=0),
        monitor=BayesSecurityMonitor(),
        canary=CanaryAudit(),
        epsilon_star=EpsilonStarAudit(),
        checkpoint=ModelCheckpoint(dirpath=folder / kind, save_last=True),
    )
    t = trainer(list(vars(callbacks).values()), folder)
    infos, log = _Infos(), logging.getLogger("lightning.pytorch.utilities.rank_zero")
    log.addHandler(infos)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(model, datamodule=dm)
    finally:
        log.removeHandler(infos)
        log.setLevel(level)
    return SimpleNamespace(
        trainer=t,
        model=model,
        frozen=frozen,
        cb=callbacks,
        infos=infos.lines,
        warnings=[str(w.message) for w in caught],
        checkpoint=Path(callbacks.checkpoint.last_model_path),
    )


def _cli(here, *args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    argv = [CLI, *map(str, args)]
    return subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=600)


def _audit_epsilon_star(here, kind, checkpoint):
    return _cli(
        here, "audit", "epsilon-star", "--checkpoint", checkpoint.relative_to(here), "--model", "my_models:Net",
        "--model-args", json.dumps({"kind": kind}), "--datamodule", "my_models:Data", "--json",
    )  # fmt: skip


def _warning_lines(stderr, command):
    prefix = f"lightning-privacy audit {command}: warning: "
    return [line[len(prefix) :] for line in stderr.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's folder (``my_models.py``), each model trained with every callback, and its CLI audit."""
    here = tmp_path_factory.mktemp("my_project")
    shutil.copy(_user_models.__file__, here / "my_models.py")
    runs = {kind: _train(kind, here) for kind in USER_MODELS}
    for kind, run in runs.items():
        run.audit = _audit_epsilon_star(here, kind, run.checkpoint)
    return here, runs


@pytest.mark.parametrize("kind", USER_MODELS)
def test_training_runs_every_callback(project, kind):
    _, runs = project
    run = runs[kind]
    cb = run.cb
    assert run.trainer.current_epoch == EPOCHS and cb.dpsgd.steps == run.trainer.global_step > 0
    replaced = [w for w in run.warnings if "DPSGD(fix_modules=True) replaced" in w]
    if REPLACED[kind]:
        (warning,) = replaced
        assert all(name in warning for name in REPLACED[kind])
        assert f"replaced {len(REPLACED[kind])} module(s)" in warning
    else:
        assert replaced == []
    # the monitor read DP-SGD's accountant every epoch
    assert len(cb.monitor.epochs) == EPOCHS and 0 < cb.monitor.final_closed_form < 1
    # CanaryAudit() adapted to the few trainable coordinates, said so at fit start, and audited
    assert cb.canary.num_canaries == TRAINABLE[kind] and cb.canary.result is not None
    assert (
        f"CanaryAudit: the model has {TRAINABLE[kind]} trainable coordinates, fewer than the default 1000 canaries: "
        f"one canary on each (num_canaries={TRAINABLE[kind]})."
    ) in run.infos
    assert cb.epsilon_star.result is not None and run.checkpoint.name == "last.ckpt" and run.checkpoint.exists()
    if kind == "lora":  # the backbone stayed frozen, its adapter trained
        assert all(torch.equal(v, run.model.state_dict()[k]) for k, v in run.frozen.items())
        assert run.model.body[0].up.weight.abs().sum() > 0


@pytest.mark.parametrize("kind", USER_MODELS)
def test_the_audit_cli_audits_the_checkpoint_on_its_saved_members_with_its_warnings(project, kind):
    _, runs = project
    run = runs[kind]
    out = run.audit
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["num_members"], result["num_nonmembers"], result["datamodule"]) == (N_TRAIN, N_VAL, "Data")
    warnings_ = _warning_lines(out.stderr, "epsilon-star")
    replaced = [w for w in warnings_ if "DPSGD(fix_modules=True)" in w]
    if REPLACED[kind]:
        (warning,) = replaced  # once, naming each replaced module
        assert all(name in warning for name in REPLACED[kind])
    else:
        assert replaced == []
    # the same audit as the callback's at fit end (same weights, same members and non-members)
    callback = run.cb.epsilon_star.result.to_dict()
    assert result[names.EPSILON_STAR] == pytest.approx(callback[names.EPSILON_STAR], rel=1e-6, abs=1e-9)
    assert (result["fits_rejected"], result["warnings"]) == (callback["fits_rejected"], callback["warnings"])
    # (the DP noise is secret, so the trained weights differ run to run: besides the KS rejection, the audit may add
    # other warnings, e.g. that a lower bound of 0 shows nothing; each is printed once, as the CLI's stderr shows)
    rejected = [w for w in result["warnings"] if w.startswith("the Normal fits of Epsilon* are rejected (KS p = ")]
    if result["fits_rejected"]:
        (ks,) = rejected
        assert "use the empirical ε*" in ks
    else:
        assert rejected == []
    assert all(warnings_.count(w) == 1 for w in result["warnings"]), (result["warnings"], warnings_)


@pytest.mark.parametrize("kind", USER_MODELS)
def test_the_report_carries_the_warnings(project, kind):
    _, runs = project
    run = runs[kind]
    markdown, page = privacy_report(run.trainer), privacy_report_html(run.trainer)
    result = run.cb.epsilon_star.result
    # the callback issued each of its result's warnings, and only those
    issued = [w.split(": ", 1)[1] for w in run.warnings if w.startswith("EpsilonStarAudit: ")]
    assert issued == list(result.warnings)
    for warning in result.warnings:
        assert f"> **Warning:** {warning}" in markdown
        shown = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(warning))  # the page sets `names` as code
        assert f'<p class="warning"><strong>Warning:</strong> {shown}</p>' in page
    flag = "NOT RELIABLE here: the KS test rejects the Normal fits (see the warning)"  # on the ε* row
    assert (flag in markdown, html.escape(flag) in page) == (result.fits_rejected,) * 2
    if not result.warnings:
        assert "**Warning:**" not in markdown and 'class="warning"' not in page


@pytest.mark.parametrize("kind", ("resnet", "attention", "lstm"))
def test_dpsgd_without_fix_modules_names_the_fix_first_and_each_layer_once(tmp_path, kind):
    torch.manual_seed(0)  # (hooks mode: the default, auto, trains attention and LSTM layers in functional mode)
    t = trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode="hooks")], tmp_path, enable_checkpointing=False)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(Net(kind=kind), datamodule=data(kind))
    message = str(info.value)
    assert "Pass `DPSGD(fix_modules=True)`" in message.splitlines()[0]
    assert REFUSED[kind] in message
    for layer in REPLACED[kind]:
        assert message.count(layer.split(" ")[0] + ",") + message.count(layer.split(" ")[0] + ".") == 1
    assert len(message) < 600 and t.global_step == 0
    if kind != "resnet":
        assert "BatchNorm" not in message


@pytest.mark.parametrize("kind", ("attention", "lstm"))
def test_the_default_dpsgd_trains_attention_and_lstm_layers_without_replacing_them(tmp_path, kind):
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0)
    t = trainer([dpsgd], tmp_path, enable_checkpointing=False, max_steps=2)
    net = Net(kind=kind)
    t.fit(net, datamodule=data(kind))
    assert t.global_step == 2 and dpsgd.grad_sample_mode == "functional" and not dpsgd.fixed_modules
    assert "has no exact Opacus per-example gradient" in dpsgd.grad_sample_mode_reason


def test_panoramia_refuses_the_token_id_checkpoint_in_one_line(project):
    here, runs = project
    out = _cli(
        here, "audit", "panoramia", "--checkpoint", runs["attention"].checkpoint.relative_to(here),
        "--model", "my_models:Net", "--datamodule", "my_models:Data",
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if ": error: " in line]
    (line,) = lines
    assert line.startswith("lightning-privacy audit panoramia: error: PANORAMIA cannot generate non-members")
    assert "token ids" in line and "`--generator pkg.module:Class`" in line


@pytest.mark.parametrize("budget", [dict(max_epsilon=0.3), dict(min_bayes_security=0.99)], ids=["epsilon", "beta"])
def test_a_budget_the_first_step_breaks_is_refused_with_the_noise_for_one_epoch(tmp_path, budget):
    torch.manual_seed(0)
    model = Net(kind="lora")
    before = [p.detach().clone() for p in model.parameters()]
    t = trainer([DPSGD(noise_multiplier=1.0, sampling_seed=0), PrivacyBudgetStopping(**budget)], tmp_path)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(model, datamodule=data("lora"))
    message = str(info.value)
    ((name, value),) = budget.items()
    assert message.startswith(f"PrivacyBudgetStopping({name}={value:g}): the first optimizer step already breaks")
    assert "stopping after step 0" not in message
    found = re.search(r"noise_multiplier=([\d.]+) allows one epoch \((\d+) steps\)", message)
    sigma, epoch = float(found.group(1)), int(found.group(2))
    assert epoch == N_TRAIN // 16 and f"pass `DPSGD(noise_multiplier={found.group(1)})`" in message
    assert t.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the σ named trains that epoch within the budget
    dp = DPSGD(noise_multiplier=sigma, sampling_seed=0)
    trainer([dp, PrivacyBudgetStopping(**budget)], tmp_path, enable_checkpointing=False).fit(
        Net(kind="lora"), datamodule=data("lora")
    )
    assert dp.steps >= epoch

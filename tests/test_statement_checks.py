"""The statement checks what it states (lightning_privacy.statement.fields and .consistency), on a real DPSGD
checkpoint edited as a file could be: a malformed field is one error line naming it and its value (exit 2, never a
traceback); σ, q, C, the accountant or the steps edited so that the state disagrees with its ledger, its key or the
checkpoint's global_step give the status "inconsistent" and no guarantee (exit 2, a sentence naming both values); a
consistent rewrite is caught by the digest only while the digest is not recomputed; a state saved before any step is
not differentially private (`--require-dp` exits 3); the divisor of the noised sum and the source of q are shown."""

from __future__ import annotations

import copy
import json
import math
import re
import warnings

import pytest
import torch

from lightning_privacy import DPSGD, privacy_statement
from lightning_privacy.checkpoints import dpsgd_state_digest
from lightning_privacy.cli import main
from lightning_privacy.ledger import PrivacyLedger
from tests._cli import run_cli
from tests.callbacks._tiny import BATCH, N, tiny_loader, tiny_module, trainer

pytestmark = pytest.mark.filterwarnings("ignore")
SIGMA, RATE, STEPS = 1.5, BATCH / N, N // BATCH  # one epoch of the tiny fit: q = 1/len(loader) = 0.125, 8 steps


def _fit(folder, **kwargs):
    torch.manual_seed(0)
    t = trainer([DPSGD(noise_multiplier=SIGMA)], folder, max_epochs=1, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(tiny_module(), tiny_loader())
    path = folder / "model.ckpt"
    t.save_checkpoint(path)
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The contents of a real checkpoint of a DPSGD fit (8 steps), as torch.load(weights_only=True) gives them."""
    return _fit(tmp_path_factory.mktemp("checks"))


def _key(checkpoint) -> str:
    return next(k for k in checkpoint["callbacks"] if k.startswith("DPSGD"))


def edited(base, edit, *, reseal=True):
    """A copy of the checkpoint with ``edit(state, checkpoint)`` applied to its DPSGD state; ``reseal``: the digest
    recomputed, as a program that rewrites the state would (so only the other checks can see the edit)."""
    checkpoint = copy.deepcopy(base)
    state = checkpoint["callbacks"][_key(checkpoint)]
    before = state.get("digest")
    edit(state, checkpoint)
    if reseal and "digest" in state and state["digest"] == before:  # (an edit of the digest itself stays)
        state["digest"] = dpsgd_state_digest(state)
    return checkpoint


def saved(tmp_path, checkpoint, name="edited.ckpt"):
    path = tmp_path / name
    torch.save(checkpoint, path)
    return path


def cli(capsys, *args):
    """``lightning-privacy`` in this process: (exit status, stdout, stderr lines)."""
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err.splitlines()


def _set(name, value):
    return lambda state, _: state.__setitem__(name, value)


def _history(value):
    return lambda state, _: state["ledger"].__setitem__("history", value)


def _global_step(value):
    return lambda _, checkpoint: checkpoint.__setitem__("global_step", value)


# --- a malformed field: one line naming it, exit 2, no traceback ------------------------------------------------------
MALFORMED = [
    # (edit, what the line names)
    (_set("max_grad_norm", None), "`max_grad_norm` is None"),
    (_set("max_grad_norm", [1.0]), "`max_grad_norm` is [1.0]"),
    (_set("max_grad_norm", -1.0), "`max_grad_norm` is -1.0"),
    (_set("delta", [1e-5]), "`delta` is [1e-05]"),
    (_set("delta", 2.0), "`delta` is 2.0"),
    (_set("noise_multiplier", "1.5"), "`noise_multiplier` is '1.5'"),
    (_set("noise_multiplier", math.inf), "`noise_multiplier` is inf"),
    (_set("sample_rate", math.nan), "`sample_rate` is nan"),
    (_set("sample_rate", 0.0), "`sample_rate` is 0.0"),
    (_set("sample_rate", 0), "`sample_rate` is 0"),
    (_set("sample_rate", 1.5), "`sample_rate` is 1.5"),
    (_set("expected_batch_size", "32"), "`expected_batch_size` is '32'"),
    (_set("sample_rate_given", "no"), "`sample_rate_given` is 'no'"),
    (_set("dataset_size", 256.5), "`dataset_size` is 256.5"),
    (_set("secure_mode", 1), "`secure_mode` is 1"),
    (_set("world_size", 0), "`world_size` is 0"),
    (_set("fixed_modules", "none"), "`fixed_modules` is 'none'"),
    (_set("digest", 123), "`digest` is 123"),
    (_set("precision", "bf16-mixed"), "`precision` is 'bf16-mixed'"),
    (_set("precision", {"precision": "bf16-mixed", "rounded_steps": -1}), "`precision.rounded_steps` is -1"),
    (_set("precision", {"precision": "bf16-mixed", "rounded_steps": 2.0}), "`precision.rounded_steps` is 2.0"),
    (_set("precision", {"precision": 16, "rounded_steps": 0}), "`precision.precision` is 16"),
    (_set("accountant", None), "`accountant` is None"),
    (_set("ledger", [1, 2]), "`ledger` is [1, 2]"),
    (_history("8 steps"), "`ledger.history` is '8 steps'"),
    (_history([[SIGMA, RATE]]), "`ledger.history[0]` is [1.5, 0.125]"),
    (_history([[SIGMA, RATE, "8"]]), "`ledger.history[0]` is [1.5, 0.125, '8']"),
    (_history([[SIGMA, 1.5, 8]]), "`ledger.history[0]` is [1.5, 1.5, 8]"),
    (_history([[SIGMA, 0.0, 8]]), "`ledger.history[0]` is [1.5, 0.0, 8]"),
    (_history([[math.nan, RATE, 8]]), "`ledger.history[0]` is [nan, 0.125, 8]"),
    (_history([[SIGMA, RATE, 8.0]]), "`ledger.history[0]` is [1.5, 0.125, 8.0]"),
    (_global_step("8"), "checkpoint field `global_step` is '8'"),
    (_global_step(-1), "checkpoint field `global_step` is -1"),
]


@pytest.mark.parametrize(("edit", "named"), MALFORMED, ids=[named for _, named in MALFORMED])
def test_a_malformed_field_is_one_error_line_naming_it(base, tmp_path, capsys, edit, named):
    path = saved(tmp_path, edited(base, edit))
    with pytest.raises(ValueError) as raised:
        privacy_statement(path)
    assert named in str(raised.value) and "\n" not in str(raised.value)
    for flags in ([], ["--json"], ["--require-dp"]):
        status, out, err = cli(capsys, "statement", path, *flags)
        assert status == 2 and out == "", (flags, out)
        assert len(err) == 1 and err[0].startswith(f"lightning-privacy statement: error: checkpoint '{path}': ")
        assert named in err[0] and "Traceback" not in err[0]


def test_the_console_script_prints_one_line_for_max_grad_norm_none(base, tmp_path):
    """The issue's case, run as a user runs it: a TypeError traceback with exit 1 before."""
    path = saved(tmp_path, edited(base, _set("max_grad_norm", None)))
    proc = run_cli("statement", path, "--require-dp", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"lightning-privacy statement: error: checkpoint '{path}': DPSGD state field `max_grad_norm` is None: "
        "expected a finite number > 0"
    )


# --- an inconsistent state: status "inconsistent", no guarantee, exit 2 with both values ---------------------------
def _sigma_everywhere(value):
    """σ rewritten consistently: the state, its key, the ledger's history and both lists of PLD chunks."""

    def edit(state, checkpoint):
        key = _key(checkpoint)
        state["noise_multiplier"] = value
        state["ledger"]["history"] = [[value, p, t] for _, p, t in state["ledger"]["history"]]
        for chunks in ("chunks", "epsilon_chunks"):
            state["ledger"][chunks] = [[p, value, *rest] for p, _, *rest in state["ledger"][chunks]]
        callbacks = checkpoint["callbacks"]
        callbacks[key.replace(f"'noise_multiplier': {SIGMA}", f"'noise_multiplier': {value}")] = callbacks.pop(key)

    return edit


def _ledger_of(steps):
    """A ledger state of ``steps`` steps at the fit's (σ, q), as DPSGD saves it."""
    ledger = PrivacyLedger(accountant="pld", delta=1e-5)
    ledger.step(noise_multiplier=SIGMA, sample_rate=RATE, steps=steps)
    return ledger.state_dict()


def _at_step_300(steps):
    """The checkpoint as one at global step 300, its ledger of ``steps`` steps (history and chunks alike)."""

    def edit(state, checkpoint):
        state["ledger"] = _ledger_of(steps)
        checkpoint["global_step"] = 300

    return edit


def _history_steps(steps):
    def edit(state, _):
        state["ledger"]["history"] = [[s, p, steps] for s, p, _ in state["ledger"]["history"]]

    return edit


INCONSISTENT = [
    # (id, edit, sentences that must be among the problems)
    (
        "sigma beside the history",
        _set("noise_multiplier", 5.0),
        [
            "`noise_multiplier` is 5 in the DPSGD state but 1.5 in the last segment of the ledger's history",
            "`noise_multiplier` is 5 in the DPSGD state but 1.5 in its state key",
        ],
    ),
    (
        "q beside the history",
        _set("sample_rate", 0.01),
        ["`sample_rate` is 0.01 in the DPSGD state but 0.125 in the last segment of the ledger's history"],
    ),
    (
        "C beside the key",
        _set("max_grad_norm", 2.0),
        ["`max_grad_norm` is 2 in the DPSGD state but 1 in its state key"],
    ),
    ("accountant", _set("accountant", "rdp"), ["`accountant` is 'rdp' in the DPSGD state but 'pld' in its ledger"]),
    (
        "more rounded steps than steps",
        _set("precision", {"precision": "bf16-mixed", "rounded_steps": STEPS + 1}),
        ["`precision.rounded_steps` is 9 in the DPSGD state but the ledger records 8 step(s)"],
    ),
    (
        "history steps 10 at global step 300",
        lambda state, checkpoint: (_at_step_300(300)(state, checkpoint), _history_steps(10)(state, checkpoint)),
        ["the ledger records 10 DP-SGD step(s) but the checkpoint's global_step is 300"],
    ),
    (
        "ledger of 10 steps at global step 300",
        _at_step_300(10),
        ["the ledger records 10 DP-SGD step(s) but the checkpoint's global_step is 300: 290 optimizer step(s)"],
    ),
    (
        "history steps edited, not the global step",
        _history_steps(2),
        ["the ledger records 2 DP-SGD step(s) but the checkpoint's global_step is 8"],
    ),
    (
        "history one step short of the global step",
        _history_steps(STEPS - 1),
        ["the ledger records 7 DP-SGD step(s) but the checkpoint's global_step is 8: 1 optimizer step(s) are not in"],
    ),
    (
        "ledger one step short at global step 300",
        _at_step_300(299),
        ["the ledger records 299 DP-SGD step(s) but the checkpoint's global_step is 300: 1 optimizer step(s)"],
    ),
]


@pytest.mark.parametrize(("edit", "problems"), [c[1:] for c in INCONSISTENT], ids=[c[0] for c in INCONSISTENT])
def test_an_inconsistent_state_states_no_guarantee_and_exits_2_naming_both_values(
    base, tmp_path, capsys, edit, problems
):
    path = saved(tmp_path, edited(base, edit))
    statement = privacy_statement(path)
    data = statement.to_dict()
    found = data["consistency"]
    assert found["status"] == "inconsistent" and found["digest"] == "verified"  # resealed: the checks saw it
    for problem in problems:
        assert any(p.startswith(problem) for p in found["problems"]), (problem, found["problems"])
    assert not statement.differentially_private and statement.epsilon is None and data["guarantee"] is None
    assert statement.summary.startswith(f"Inconsistent DP-SGD state: {found['problems'][0]}")
    assert statement.metadata()["privacy"]["epsilon"] is None
    text = statement.to_text()
    assert "ε at δ" not in text and f"INCONSISTENT: {found['problems'][0]}".replace("`", "") in text
    assert f"- INCONSISTENT: {found['problems'][0]}" in statement.to_markdown().replace("\\*", "*")
    for flags in (["--json"], ["--json", "--require-dp"]):
        status, out, err = cli(capsys, "statement", path, *flags)
        assert status == 2
        assert json.loads(out)["consistency"] == found  # the statement is printed, with its status
        assert err == [
            f"lightning-privacy statement: error: {path}: inconsistent DPSGD state: {p}" for p in found["problems"]
        ]


def test_the_console_script_names_sigma_beside_an_unchanged_history(base, tmp_path):
    path = saved(tmp_path, edited(base, _set("noise_multiplier", 5.0)))
    proc = run_cli("statement", path, "--require-dp", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "state consistency" in proc.stdout and "INCONSISTENT (2 problem(s))" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and all("inconsistent DPSGD state" in line for line in lines)
    assert "is 5 in the DPSGD state but 1.5 in the last segment of the ledger's history" in lines[0]


def test_a_resumed_fit_and_a_refit_by_a_new_trainer_are_consistent(tmp_path):
    """Real runs, not edits: resuming from a checkpoint restores global_step and the ledger alike; the same module
    fitted again by a new Trainer with the same DPSGD has more ledger steps than global_step (noted, stated)."""
    dpsgd, model = DPSGD(noise_multiplier=SIGMA), tiny_module()
    first = trainer([dpsgd], tmp_path, max_epochs=1)
    first.fit(model, tiny_loader())
    first.save_checkpoint(tmp_path / "first.ckpt")
    resumed = trainer([DPSGD(noise_multiplier=SIGMA)], tmp_path, max_epochs=2)
    resumed.fit(tiny_module(), tiny_loader(), ckpt_path=tmp_path / "first.ckpt")
    resumed.save_checkpoint(tmp_path / "resumed.ckpt")
    statement = privacy_statement(tmp_path / "resumed.ckpt")
    data = statement.to_dict()
    assert (data["source"]["global_step"], data["mechanism"]["steps"]) == (2 * STEPS, 2 * STEPS)
    assert data["consistency"] == {"status": "consistent", "problems": [], "notes": [], "digest": "verified"}
    assert statement.differentially_private
    again = trainer([dpsgd], tmp_path, max_epochs=1)
    again.fit(model, tiny_loader())  # the same module: its ledger composes both fits
    again.save_checkpoint(tmp_path / "again.ckpt")
    statement = privacy_statement(tmp_path / "again.ckpt")
    assert statement.differentially_private and statement.epsilon == dpsgd.epsilon()
    assert statement.consistency["notes"][0].startswith(
        f"The ledger records {2 * STEPS} DP-SGD steps, the checkpoint's global_step {STEPS}: "
    )


def test_more_ledger_steps_than_global_steps_is_noted_not_refused(base):
    """The same module fitted again by a new Trainer with the same DPSGD: global_step restarted, ε counts both."""
    statement = privacy_statement(edited(base, _global_step(3)))
    found = statement.consistency
    assert found["status"] == "consistent" and statement.differentially_private
    assert found["notes"] == [
        "The ledger records 8 DP-SGD steps, the checkpoint's global_step 3: the module was fitted before by another "
        "Trainer with the same DPSGD (its global_step restarted; ε composes every fit's steps)."
    ]
    assert found["notes"][0] in statement.to_text()


def test_the_checkpoint_at_step_300_is_consistent_before_its_edit(base):
    """The baseline of the two "steps 10 at global step 300" cases: 300 steps at global step 300 are consistent."""
    statement = privacy_statement(edited(base, _at_step_300(300)))
    assert statement.consistency["status"] == "consistent" and statement.to_dict()["mechanism"]["steps"] == 300
    ledger = PrivacyLedger(accountant="pld", delta=1e-5)
    ledger.step(noise_multiplier=SIGMA, sample_rate=RATE, steps=300)
    assert statement.epsilon == ledger.epsilon()


def test_a_full_batch_fit_q_1_is_a_valid_consistent_state(tmp_path):
    """q = 1 (every example in every step: one batch of the whole training set) is in (0, 1]: stated, not refused."""
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=SIGMA)
    t = trainer([dpsgd], tmp_path, max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(tiny_module(), torch.utils.data.DataLoader(tiny_loader().dataset, batch_size=N))
    t.save_checkpoint(tmp_path / "full.ckpt")
    state = torch.load(tmp_path / "full.ckpt", map_location="cpu", weights_only=True)
    state = state["callbacks"][_key(state)]
    assert state["sample_rate"] == 1.0 and state["ledger"]["history"] == [[SIGMA, 1.0, 2]]
    statement = privacy_statement(tmp_path / "full.ckpt")
    assert statement.consistency == {"status": "consistent", "problems": [], "notes": [], "digest": "verified"}
    assert statement.differentially_private and statement.to_dict()["mechanism"]["sample_rate"] == 1.0
    ledger = PrivacyLedger(accountant="pld", delta=1e-5)
    ledger.step(noise_multiplier=SIGMA, sample_rate=1.0, steps=2)
    assert statement.epsilon == pytest.approx(ledger.epsilon(), rel=1e-9) and statement.epsilon == dpsgd.epsilon()


# --- the digest: an edit after saving, unless the digest is recomputed -----------------------------------------------
def test_sigma_rewritten_everywhere_is_caught_by_the_digest_only(base, capsys, tmp_path):
    own = privacy_statement(base)
    assert own.consistency["digest"] == "verified"
    # σ → 5 in the state, its key, the history and the chunks: every value agrees, the digest does not
    forged = edited(base, _sigma_everywhere(5.0), reseal=False)
    statement = privacy_statement(forged)
    assert statement.consistency["status"] == "inconsistent" and statement.consistency["digest"] == "mismatch"
    (problem,) = statement.consistency["problems"]
    digest = base["callbacks"][_key(base)]["digest"]
    assert problem.startswith(f"the DPSGD state's `digest` is {digest[:19]}… but its contents give sha256:")
    status, _, err = cli(capsys, "statement", saved(tmp_path, forged), "--json")
    assert status == 2 and len(err) == 1 and "`digest`" in err[0]
    # the same rewrite with the digest recomputed passes every check: what the statement cannot protect against
    resealed = privacy_statement(edited(base, _sigma_everywhere(5.0)))
    assert resealed.consistency == {"status": "consistent", "problems": [], "notes": [], "digest": "verified"}
    assert resealed.differentially_private and resealed.epsilon < own.epsilon / 3
    assert any("passes every check" in s for s in resealed.to_dict()["not_covered"])
    # a state without a digest (an older checkpoint) is read, and the statement says the digest is not recorded
    older = privacy_statement(edited(base, lambda state, _: state.pop("digest")))
    assert older.consistency["digest"] == "not recorded" and older.epsilon == own.epsilon
    assert "consistent; no digest recorded" in older.to_text()
    assert any("carries no digest" in s for s in older.to_dict()["not_covered"])


# --- a state saved before any step ----------------------------------------------------------------------------------
def test_a_dpsgd_checkpoint_saved_before_any_step_is_not_differentially_private(tmp_path):
    zero = _fit(tmp_path, limit_train_batches=0)  # DPSGD set up (q, the divisor), no step taken
    state = zero["callbacks"][_key(zero)]
    assert state["ledger"]["history"] == [] and zero["global_step"] == 0 and state["sample_rate"] == RATE
    statement = privacy_statement(tmp_path / "model.ckpt")
    data = statement.to_dict()
    assert data["consistency"]["status"] == "consistent"
    assert not statement.differentially_private and data["differentially_private"] is False
    assert data["mechanism"]["steps"] == 0 and statement.summary.startswith("No DP-SGD step recorded")
    privacy = statement.metadata()["privacy"]
    assert privacy["differentially_private"] is False and privacy["epsilon"] is None
    assert privacy["mia_bayes_security"] is None and "differential-privacy" not in statement.metadata()["tags"]
    # a history of empty segments is no step either
    empty = edited(zero, _history([[SIGMA, RATE, 0]]))
    assert not privacy_statement(empty).differentially_private
    proc = run_cli("statement", tmp_path / "model.ckpt", "--require-dp", cwd=tmp_path)
    assert proc.returncode == 3 and "No DP-SGD step recorded" in proc.stdout
    assert proc.stderr.strip() == (
        f"lightning-privacy statement: error: --require-dp: {tmp_path / 'model.ckpt'} holds a DPSGD state that took "
        "no step"
    )


# --- what is public: the divisor and the source of q -----------------------------------------------------------------
def test_the_divisor_and_the_source_of_q_are_shown(base, capsys, tmp_path):
    statement = privacy_statement(base)
    m = statement.to_dict()["mechanism"]
    assert (m["expected_batch_size"], m["sample_rate_given"]) == (float(BATCH), False)
    text = statement.to_text()
    assert re.search(rf"^divisor of the noised sum \(expected batch size\)\s+{BATCH}$", text, flags=re.M)
    assert "| sample rate q | 0.125 | each example joins a batch with probability q (1/len(train loader)) |" in (
        statement.to_markdown()
    )
    notes = " ".join(statement.to_dict()["not_covered"])
    assert "the number of batches per epoch is treated as public" in notes
    assert f"training set size N = {N}" in notes
    assert statement.metadata()["privacy"]["expected_batch_size"] == float(BATCH)
    given = privacy_statement(edited(base, _set("sample_rate_given", True)))
    assert "q was given (`DPSGD(sample_rate=...)`)" in " ".join(given.to_dict()["not_covered"])
    assert "number of batches per epoch is treated as public" not in " ".join(given.to_dict()["not_covered"])

    def older(state, _):  # a checkpoint saved before DPSGD recorded them
        for name in ("expected_batch_size", "sample_rate_given", "digest"):
            state.pop(name)

    old = privacy_statement(edited(base, older))
    assert old.differentially_private and old.epsilon == statement.epsilon
    assert re.search(r"^divisor of the noised sum \(expected batch size\)\s+not recorded$", old.to_text(), flags=re.M)
    notes = " ".join(old.to_dict()["not_covered"])
    assert "divided by int(N·q), computed from the private training set size" in notes
    assert "Whether q was given (`DPSGD(sample_rate=...)`) or is 1/len(train loader) is not recorded" in notes
    status, out, _ = cli(capsys, "statement", saved(tmp_path, edited(base, older)), "--json")
    assert status == 0 and json.loads(out)["mechanism"]["expected_batch_size"] is None


def test_a_loader_that_drops_its_last_batch_is_named_with_the_true_origin_of_q(tmp_path, capsys):
    """Issue 55: ``shuffle=True, drop_last=True`` made q = 1/⌊N/B⌋ = 1/7 instead of 1/8 (here 250 rows at batch 32),
    and the statement still printed "1/⌈N/batch size⌉"; now a warning says so at the fit, and the report, the saved
    state, the statement and its CLI give q's true origin."""
    from torch.utils.data import DataLoader, Subset

    from lightning_privacy.report import privacy_report
    from tests.callbacks._tiny import tiny_dataset

    torch.manual_seed(0)
    dp = DPSGD(noise_multiplier=SIGMA)
    t = trainer([dp], tmp_path, max_epochs=1)
    loader = DataLoader(Subset(tiny_dataset(), range(250)), batch_size=BATCH, shuffle=True, drop_last=True)
    with pytest.warns(UserWarning, match=r"drop_last=True, shuffle=True\) by Poisson sampling at q") as caught:
        t.fit(tiny_module(), loader)
    message = next(str(w.message) for w in caught if "drop_last" in str(w.message))
    assert "1/⌊N/batch size⌋ = 1/7 (250 rows, batch_size=32)" in message and "from 8 to 7" in message
    assert dp.sample_rate == pytest.approx(1 / 7) and dp.ledger.steps == 7
    assert "1/⌊N/batch size⌋ (the loader's drop_last=True)" in privacy_report(t)
    t.save_checkpoint(tmp_path / "drop_last.ckpt")
    statement = privacy_statement(tmp_path / "drop_last.ckpt")
    notes = " ".join(statement.to_dict()["not_covered"])
    assert "q = 1/len(train loader) = 1/⌊N/batch size⌋ (the train loader had drop_last=True)" in notes
    assert "1/⌈N/batch size⌉" not in notes
    assert "(1/len(train loader) = 1/⌊N/batch size⌋: drop_last=True) |" in statement.to_markdown()
    status, out, _ = cli(capsys, "statement", tmp_path / "drop_last.ckpt")
    assert status == 0 and "1/⌊N/batch size⌋ (the train loader had drop_last=True)" in out
    default = privacy_statement(_fit(tmp_path / "default"))  # without drop_last: ⌈N/B⌉, as before
    assert "q = 1/len(train loader) = 1/⌈N/batch size⌉" in " ".join(default.to_dict()["not_covered"])

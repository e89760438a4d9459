"""``lightning-privacy statement CHECKPOINT``, run as a user runs it: the values of the run, as text, JSON and a model
card; a checkpoint without DP-SGD (exit 0, or 3 under --require-dp); a missing file (exit 2); the demo's checkpoint."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from lightning_privacy import privacy_statement
from lightning_privacy.reporting import down, up
from tests._cli import run_cli
from tests.test_statement import fit_with_checkpoints

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit_with_checkpoints(tmp_path_factory.mktemp("cli_statement"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return fit_with_checkpoints(tmp_path_factory.mktemp("cli_statement_plain"), dp=False)


def test_json_is_the_statement_of_the_run(fitted, tmp_path):
    path = fitted["final"]
    proc = run_cli("statement", path, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert data == privacy_statement(path).to_dict()
    dpsgd = fitted["dpsgd"]
    m, g = data["mechanism"], data["guarantee"]
    assert (m["noise_multiplier"], m["sample_rate"], m["steps"]) == (1.5, dpsgd.sample_rate, dpsgd.steps)
    assert g["epsilon"] == dpsgd.epsilon() and g["bayes_security"] == dpsgd.ledger.bayes_security()
    verdicts = {a["audit"]: a["verdict"] for a in data["audits"]}
    assert verdicts == {
        "MembershipAudit (loss)": fitted["membership"].result.verdict,
        "CanaryAudit": fitted["canary"].result.verdict,
    }


def test_text_and_markdown_print_the_same_values(fitted, tmp_path):
    path = fitted["final"]
    statement = privacy_statement(path)
    g = statement.to_dict()["guarantee"]
    text = run_cli("statement", path, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"Privacy statement of {path}\n")
    for quantity, value in [
        ("noise multiplier σ", "1.5"),
        ("optimizer steps T", "16"),
        ("ε at δ = 1e-05", up(g["epsilon"])),
        ("β*_MIA", down(g["bayes_security"])),
        ("TPR bound at FPR 0.001 (replace one example)", up(g["tpr_bounds"]["replace"]["fpr_0.001"])),
    ]:
        assert re.search(rf"^{re.escape(quantity)}\s+{re.escape(value)}$", text.stdout, flags=re.M), quantity
    assert "MembershipAudit (loss): verdict" in text.stdout and "Versions: lightning-privacy" in text.stdout
    card = run_cli("statement", path, "--markdown", cwd=tmp_path)
    assert card.returncode == 0, card.stderr
    assert card.stdout == statement.to_markdown()
    front = card.stdout.split("---\n")[1]
    assert yaml.safe_load(front)["privacy"]["epsilon"] == float(up(g["epsilon"]))


def test_a_checkpoint_without_dpsgd_says_so(plain, tmp_path):
    proc = run_cli("statement", plain["last"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "No DP-SGD:" in proc.stdout and "ε at δ" not in proc.stdout and proc.stderr == ""
    required = run_cli("statement", plain["last"], "--json", "--require-dp", cwd=tmp_path)
    assert required.returncode == 3
    assert json.loads(required.stdout)["differentially_private"] is False  # the statement is still printed
    assert required.stderr.strip() == (
        f"lightning-privacy statement: error: --require-dp: {plain['last']} holds no DP-SGD step"
    )


def test_a_missing_or_unreadable_file_is_one_error_line_naming_it(tmp_path):
    missing = tmp_path / "missing.ckpt"
    proc = run_cli("statement", missing, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"lightning-privacy statement: error: checkpoint '{missing}': no such file"
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint", encoding="utf-8")
    proc = run_cli("statement", notes, "--json", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"checkpoint '{notes}' is not a file torch can read" in proc.stderr
    both = run_cli("statement", notes, "--json", "--markdown", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


@pytest.mark.slow
def test_the_statement_of_the_demos_checkpoint_prints_the_demos_numbers(tmp_path):
    """The issue's check: `lightning-privacy statement` on the demo's checkpoint gives what the demo printed."""
    demo = run_cli("demo", "--epochs", "1", "--no-progress", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    checkpoint = "runs/demo/version_0/final.ckpt"
    assert f"Its statement:    lightning-privacy statement {checkpoint}" in demo.stdout
    printed = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in demo.stdout.splitlines() if "  " in line)
    proc = run_cli("statement", checkpoint, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    m, g = data["mechanism"], data["guarantee"]
    assert printed["noise multiplier σ (planned)"] == f"{m['noise_multiplier']:.4f}"
    assert printed["sample rate p / steps"] == f"{m['sample_rate']:.5f} / {m['steps']}"
    assert printed["β*_MIA (exact, safe: pessimistic PLD)"] == f"{g['bayes_security']:.4f}"
    assert printed["membership advantage (1 − β*)"] == f"{g['advantage']:.4f}"
    tpr = g["tpr_bounds"]["replace"]
    assert printed["TPR bound at FPR 0.001 / 0.01 / 0.1"] == " / ".join(
        f"{tpr[f'fpr_{fpr}']:.4f}" for fpr in ("0.001", "0.01", "0.1")
    )
    assert printed["ε at δ = 1e-05, PLD (add/remove)"] == f"{g['epsilon']:.3f}  (certified upper bound)"
    assert m["planned_for"] == {"target_bayes_security": 0.9, "epochs": 1} and m["dataset_size"] > 20000

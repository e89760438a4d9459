"""The privacy statement (lightning_privacy.statement): from a real DP-SGD fit's checkpoints, its numbers equal the run's
ledger, monitor and audits; JSON round trip; the model card's YAML and Markdown parse; a run without DP-SGD says so;
bad input is named; the privacy report carries the same statement; the guide shows what the function gives."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import markdown
import opacus
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

import lightning_privacy
from lightning_privacy import (
    DPSGD,
    BayesSecurityMonitor,
    CanaryAudit,
    MembershipAudit,
    PrivacyBudgetStopping,
    names,
    privacy_statement,
)
from lightning_privacy.checkpoints import dpsgd_state_digest
from lightning_privacy.report import privacy_report, privacy_report_html
from lightning_privacy.reporting import down, up
from lightning_privacy.statement import FPRS, PrivacyStatement
from tests.callbacks._tiny import BATCH, N, tiny_dataset, tiny_loader, tiny_module, trainer

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
TOP_KEYS = [
    "format",
    "format_version",
    "source",
    "differentially_private",
    "consistency",
    "summary",
    "mechanism",
    "guarantee",
    "budget",
    "audits",
    "versions",
    "not_covered",
    "approximations",
]
CLAIM = (2.0, 1e-5)  # the (ε, δ) claim the membership audit tests


def fit_with_checkpoints(folder: Path, *, dp: bool = True) -> dict:
    """A tiny fit (16 steps) with a ModelCheckpoint, the monitor, a budget, a LOSS attack every epoch and (with DP-SGD)
    gradient canaries at fit end; ``last.ckpt`` is ModelCheckpoint's, ``final.ckpt`` is saved after fit."""
    torch.manual_seed(0)
    nonmembers = DataLoader(tiny_dataset(1), batch_size=64)
    membership = MembershipAudit(
        "loss", every_n_epochs=1, nonmember_dataloader=nonmembers, log_figure=False, claim=CLAIM if dp else None
    )
    if dp:
        dpsgd, monitor = DPSGD(noise_multiplier=1.5), BayesSecurityMonitor()
        canary = CanaryAudit("gradient", num_canaries=100)
        callbacks = [dpsgd, monitor, PrivacyBudgetStopping(min_bayes_security=0.5), membership, canary]
    else:
        dpsgd = monitor = None
        canary = CanaryAudit("input", num_canaries=50)
        callbacks = [membership, canary]
    checkpoints = ModelCheckpoint(dirpath=folder / "checkpoints", save_last=True)
    t = trainer([*callbacks, checkpoints], folder, max_epochs=2, enable_checkpointing=True)
    t.fit(tiny_module(), tiny_loader())
    t.save_checkpoint(folder / "final.ckpt")
    return dict(
        trainer=t,
        dpsgd=dpsgd,
        monitor=monitor,
        membership=membership,
        canary=canary,
        last=folder / "checkpoints" / "last.ckpt",
        final=folder / "final.ckpt",
    )


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit_with_checkpoints(tmp_path_factory.mktemp("statement"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return fit_with_checkpoints(tmp_path_factory.mktemp("statement_plain"), dp=False)


def _front_matter(text: str) -> tuple:
    """(the YAML block parsed, the Markdown after it)."""
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


# --- the numbers ---------------------------------------------------------------------------------------------------
def test_the_statement_of_a_checkpoint_equals_the_runs_ledger_and_monitor(fitted):
    dpsgd, monitor = fitted["dpsgd"], fitted["monitor"]
    statement = privacy_statement(fitted["last"])
    data = statement.to_dict()
    assert list(data) == TOP_KEYS and data["format_version"] == 1
    assert data["source"] == {
        "kind": "checkpoint",
        "path": str(fitted["last"]),
        "epoch": 1,
        "global_step": 16,
        "lightning_checkpoint": True,
    }
    assert statement.differentially_private and data["differentially_private"] is True
    assert data["consistency"] == {"status": "consistent", "problems": [], "notes": [], "digest": "verified"}
    m, g = data["mechanism"], data["guarantee"]
    assert m["noise_multiplier"] == dpsgd.noise_multiplier == 1.5
    assert m["sample_rate"] == dpsgd.sample_rate
    assert m["steps"] == dpsgd.steps == 16
    assert m["max_grad_norm"] == dpsgd.max_grad_norm and m["delta"] == dpsgd.delta
    # the public divisor of the noised sum (the loader's batch_size), and q = 1/len(train loader) (not given)
    assert m["expected_batch_size"] == dpsgd.expected_batch_size == BATCH and m["sample_rate_given"] is False
    assert m["accountant"] == "pld" and m["relation"] == "replace"
    assert m["history"] == [list(segment) for segment in dpsgd.ledger.history]
    assert m["dataset_size"] == dpsgd.dataset_size == N
    assert (m["sampling_seed"], m["noise_seed"]) == ("secret", "secret")
    assert m["grad_sample_mode"] == "hooks" and m["loss_reduction"] == "mean" and m["fixed_modules"] == []
    # recorded in DPSGD's state since 0.3.0 (a 0.2.0 checkpoint lacks them: the statement says "not recorded")
    assert m["secure_mode"] is False and (m["strategy"], m["world_size"]) == ("SingleDeviceStrategy", 1)
    assert statement.epsilon == g["epsilon"] == dpsgd.epsilon()
    assert g["delta"] == dpsgd.delta and g["epsilon_relation"] == "add_remove"
    beta = monitor.final[names.MIA_BAYES_SECURITY]
    assert g["bayes_security"] == dpsgd.ledger.bayes_security() == beta
    assert g["advantage"] == monitor.final[names.MIA_ADVANTAGE] and g["bayes_security_relation"] == "replace"
    assert g["bayes_security_closed_form"] == monitor.final_closed_form
    for fpr in FPRS:
        key = {
            0.001: names.MIA_TPR_BOUND_FPR_0_001,
            0.01: names.MIA_TPR_BOUND_FPR_0_01,
            0.1: names.MIA_TPR_BOUND_FPR_0_1,
        }
        assert g["tpr_bounds"]["replace"][f"fpr_{fpr:g}"] == monitor.final[key[fpr]]
        # the other relation's PLD is derived from the history, not saved: the run composed it at each audit's read,
        # the statement in one go, both pessimistic (the same to round-off)
        assert g["tpr_bounds"]["add_remove"][f"fpr_{fpr:g}"] == pytest.approx(
            float(dpsgd.ledger.tpr_bounds(fpr, relation="add_remove")), rel=1e-9
        )
    assert data["budget"] == {"min_bayes_security": 0.5, "delta": None, "threat": "mia", "stopped_at_step": None}
    versions = data["versions"]["computed_with"]
    assert versions["lightning_privacy"] == lightning_privacy.__version__
    assert versions["torch"] == torch.__version__ and versions["opacus"] == opacus.__version__
    assert data["versions"]["checkpoint_saved_with"]["lightning"] == versions["lightning"]
    # what the numbers do not cover, and the approximations, are named
    text = " ".join(data["not_covered"])
    for phrase in ("per training example, not per person", "dp/clip_fraction", "without `secure_mode`"):
        assert phrase in text, phrase
    assert "strategy" not in text  # recorded since 0.3.0
    assert any(
        "certified upper bound of the pessimistic privacy-loss distribution" in s for s in data["approximations"]
    )
    assert any("closed form" in s and "approximation" in s for s in data["approximations"])
    # the same numbers from the Trainer, and from the checkpoint saved after fit
    for other in (privacy_statement(fitted["trainer"]), privacy_statement(fitted["final"])):
        assert other.to_dict()["guarantee"] == g


def test_the_trainers_statement_names_the_claims_tested_the_strategy_and_secure_mode(fitted):
    data = privacy_statement(fitted["trainer"]).to_dict()
    assert data["source"]["kind"] == "trainer"
    m = data["mechanism"]
    assert (m["strategy"], m["world_size"], m["secure_mode"]) == ("SingleDeviceStrategy", 1, False)
    membership, canary = fitted["membership"], fitted["canary"]
    audits = {a["audit"]: a for a in data["audits"]}
    assert list(audits) == ["MembershipAudit (loss)", "CanaryAudit"]
    assert audits["MembershipAudit (loss)"]["claim"]["label"] == "(ε = 2, δ = 1e-05)-DP"
    assert audits["MembershipAudit (loss)"]["verdict"] == membership.result.verdict
    assert audits["CanaryAudit"]["claim"] == canary.result.claim.to_dict()  # the run's own ledger at fit end
    assert audits["CanaryAudit"]["verdict"] == canary.result.verdict
    assert {a["confidence"] for a in audits.values()} == {0.95}
    assert not any("secure_mode is not recorded" in s for s in data["not_covered"])


def test_a_checkpoint_holds_the_audits_saved_before_it_with_their_verdicts(fitted):
    membership, canary = fitted["membership"], fitted["canary"]
    during = privacy_statement(fitted["last"]).to_dict()  # ModelCheckpoint: before the fit-end canary audit
    assert [a["audit"] for a in during["audits"]] == ["MembershipAudit (loss)"]
    entry = during["audits"][0]
    assert entry["values"] == membership.results  # the last epoch's audit (the fit-end audit is skipped)
    assert entry["verdict"] == membership.result.verdict
    assert entry["claim"] is None and entry["confidence"] is None  # the checkpoint records the verdict only
    assert any("records each verdict, not the claim" in s for s in during["not_covered"])
    assert any("trainer.save_checkpoint" in s for s in during["not_covered"])
    after = privacy_statement(fitted["final"]).to_dict()
    audits = {a["audit"]: a for a in after["audits"]}
    assert list(audits) == ["MembershipAudit (loss)", "CanaryAudit"]
    expected = {k: v for k, v in canary.results.items() if "optimistic" not in k}  # not a valid bound: left out
    assert audits["CanaryAudit"]["values"] == expected and names.CANARY_CLAIM_CONTRADICTED in expected
    assert audits["CanaryAudit"]["verdict"] == canary.result.verdict
    markdown_text = privacy_statement(fitted["final"]).to_markdown()
    assert f"| CanaryAudit | `{names.CANARY_EPSILON_LOWER}` = " in markdown_text
    assert f"| not recorded | {canary.result.verdict} |" in markdown_text


# --- JSON and Markdown ---------------------------------------------------------------------------------------------
def test_json_round_trip(fitted):
    statement = privacy_statement(fitted["final"])
    text = statement.to_json()
    data = json.loads(text)
    assert data == statement.to_dict() and list(data) == TOP_KEYS
    again = PrivacyStatement.from_json(text)
    assert again == statement and again.to_markdown() == statement.to_markdown()
    assert PrivacyStatement.from_dict(data).to_text() == statement.to_text()
    assert list(data["mechanism"]) == [
        "name",
        "noise_multiplier",
        "sample_rate",
        "sample_rate_given",
        "sample_rate_origin",
        "steps",
        "max_grad_norm",
        "expected_batch_size",
        "delta",
        "accountant",
        "relation",
        "history",
        "dataset_size",
        "sampling_seed",
        "noise_seed",
        "secure_mode",
        "grad_sample_mode",
        "grad_sample_mode_switch",
        "privacy_unit",
        "clipping",
        "precision",
        "loss_reduction",
        "strategy",
        "world_size",
        "fixed_modules",
        "planned_for",
    ]
    assert list(data["guarantee"]) == [
        "epsilon",
        "delta",
        "epsilon_relation",
        "bayes_security",
        "bayes_security_relation",
        "advantage",
        "tpr_bounds",
        "bayes_security_closed_form",
    ]
    with pytest.raises(ValueError, match="`data` must be a privacy statement"):
        PrivacyStatement.from_dict({"format": "something else"})
    with pytest.raises(ValueError, match="format_version 99"):
        PrivacyStatement.from_dict({**data, "format_version": 99})


def test_the_model_card_has_a_yaml_block_and_markdown_that_renders(fitted):
    statement = privacy_statement(fitted["final"])
    data = statement.to_dict()
    g, m = data["guarantee"], data["mechanism"]
    meta, body = _front_matter(statement.to_markdown())
    assert meta == statement.metadata()
    assert {"differential-privacy", "dp-sgd", "lightning-privacy"} <= set(meta["tags"])
    privacy = meta["privacy"]
    assert privacy["differentially_private"] is True and privacy["mechanism"] == "DP-SGD"
    assert g["epsilon"] <= privacy["epsilon"] <= g["epsilon"] * (1 + 1e-3)  # rounded up
    assert g["bayes_security"] - 1e-4 <= privacy["mia_bayes_security"] <= g["bayes_security"]  # rounded down
    assert isinstance(privacy["delta"], float) and privacy["delta"] == m["delta"]  # 1.0e-05, a float in YAML 1.1
    assert privacy["steps"] == 16 and privacy["noise_multiplier"] == 1.5 and privacy["dataset_size"] == N
    assert privacy["audits"] == [{"name": a["audit"], "verdict": a["verdict"]} for a in data["audits"]]
    assert body.lstrip().startswith("## Privacy\n")
    assert f"| ε at δ = 1e-05 | {up(g['epsilon'])} |" in body
    assert f"| β\\*_MIA | {down(g['bayes_security'])} |" in body  # escaped: β*_MIA … β* would be emphasis
    page = markdown.markdown(body, extensions=["tables"])
    assert page.count("<table>") == 4 and page.count("<h3>") == 6  # mechanism, guarantee, audits, versions
    assert "<td>noise multiplier σ</td>" in page and "<li>" in page and "<em>" not in page and "β*_MIA" in page
    section = statement.to_markdown(front_matter=False, heading_level=3)
    assert section.startswith("### Privacy\n") and "#### Guarantee" in section and "---\n" not in section
    with pytest.raises(ValueError, match="`heading_level` must be an int in 1..5, got 0"):
        statement.to_markdown(heading_level=0)


# --- without DP-SGD, other settings, errors ------------------------------------------------------------------------
def test_a_run_without_dpsgd_says_so_and_states_no_numbers(plain):
    statement = privacy_statement(plain["final"])
    data = statement.to_dict()
    assert not statement.differentially_private and statement.epsilon is None
    assert data["mechanism"] is None and data["guarantee"] is None
    assert statement.summary.startswith("No DP-SGD:") and "no ε, β*_MIA or TPR bound" in statement.summary
    assert any("Nothing bounds what the model reveals" in s for s in data["not_covered"])
    audits = {a["audit"]: a for a in data["audits"]}  # the audits still say what they found
    assert set(audits) == {"MembershipAudit (loss)", "CanaryAudit"}
    assert all(a["verdict"] is None for a in audits.values())  # no claim to test without DP-SGD
    meta, body = _front_matter(statement.to_markdown())
    assert meta["privacy"]["differentially_private"] is False and meta["privacy"]["mechanism"] == "none"
    assert "epsilon" not in meta["privacy"] and "differential-privacy" not in meta["tags"]
    assert "ε at δ" not in body and "_MIA ≥" not in body and "No DP-SGD:" in body
    assert "| differentially private | no |" in body
    assert "No DP-SGD:" in statement.to_text()


def test_fixed_seeds_the_gdp_accountant_and_an_old_state_are_named(fitted):
    checkpoint = torch.load(fitted["last"], weights_only=True)
    key, state = next((k, s) for k, s in checkpoint["callbacks"].items() if k.startswith("DPSGD"))
    state.update(sampling_seed=0, noise_seed=3)
    state["digest"] = dpsgd_state_digest(state)  # as DPSGD would have saved it with these seeds
    data = privacy_statement(checkpoint).to_dict()
    assert data["source"]["kind"] == "checkpoint dict"
    assert (data["mechanism"]["sampling_seed"], data["mechanism"]["noise_seed"]) == ("fixed", "fixed")
    assert sum("fixed seed" in s for s in data["not_covered"]) == 2
    state.update(accountant="gdp", ledger={**state["ledger"], "accountant": "gdp"})
    del state["delta"], state["digest"]  # an older state: no δ, no digest
    statement = privacy_statement(checkpoint)
    data = statement.to_dict()
    assert data["mechanism"]["accountant"] == "gdp" and data["mechanism"]["delta"] == 1e-5
    assert any("δ = 1e-05 is assumed" in s for s in data["not_covered"])
    assert any("NOT an upper bound" in s for s in data["approximations"])
    assert "NOT an upper bound" in statement.report_section().warnings[0]
    checkpoint["callbacks"]["DPSGD{'copy': 1}"] = dict(state)
    with pytest.raises(ValueError, match="2 DPSGD states"):
        privacy_statement(checkpoint)


def test_bad_input_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"checkpoint '{tmp_path / 'missing.ckpt'}': no such file")):
        privacy_statement(tmp_path / "missing.ckpt")
    with pytest.raises(ValueError, match=re.escape(f"checkpoint '{tmp_path}' is not a file")):
        privacy_statement(str(tmp_path))
    (tmp_path / "notes.txt").write_text("not a checkpoint", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"checkpoint '{tmp_path / 'notes.txt'}' is not a file torch")):
        privacy_statement(tmp_path / "notes.txt")
    torch.save(torch.ones(3), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match="holds a Tensor, not a checkpoint"):
        privacy_statement(tmp_path / "tensor.pt")
    torch.save({"callbacks": {}, "hook": print}, tmp_path / "code.ckpt")
    with pytest.raises(ValueError, match=r"refused checkpoint .*code\.ckpt.*`print`.*run code"):
        privacy_statement(tmp_path / "code.ckpt")
    with pytest.raises(TypeError, match="`source` must be a checkpoint path, a checkpoint dict or a Trainer, got 3.5"):
        privacy_statement(3.5)


# --- the report ----------------------------------------------------------------------------------------------------
def test_the_privacy_report_ends_with_the_same_statement(fitted, tmp_path):
    t = fitted["trainer"]
    statement = privacy_statement(t)
    report = privacy_report(t)
    tail = report[report.index("## Privacy statement") :]
    for quantity, value, meaning in statement.report_section().rows:
        assert f"| {quantity} | {value} | {meaning} |" in tail
    assert "| MembershipAudit (loss) |" in tail and "(ε = 2, δ = 1e-05)-DP" in tail
    assert "**What the numbers do not cover**" in tail and "**Versions**" in tail
    eps = up(statement.epsilon)
    assert f"| ε at δ = 1e-05 | {eps} |" in tail
    page = privacy_report_html(t)
    assert "<h2>Privacy statement</h2>" in page and f'<td class="value">{eps}</td>' in page
    assert math.isfinite(statement.epsilon)


# --- the guide -----------------------------------------------------------------------------------------------------
def test_the_guides_rendered_model_card_is_what_to_markdown_prints():
    """docs/guides/reporting.md shows the printed Markdown (a text block `tests/test_docs.py` compares with what the
    block prints) and, below it, the same section as rendered Markdown: the two must agree."""
    from tests.test_docs import fenced_blocks, same_output

    guide = ROOT / "docs" / "guides" / "reporting.md"
    text = guide.read_text(encoding="utf-8")
    printed = next(code for lang, code, _, _ in fenced_blocks(guide) if lang == "text" and code.startswith("---"))
    rendered = text.split("<!-- model card: start -->\n", 1)[1].split("<!-- model card: end -->", 1)[0]
    section = printed[printed.index("## Privacy") :]
    assert rendered.strip().startswith("## Privacy")
    assert same_output(section, rendered)


# --- the audits it prints, checked (issue 55) ---------------------------------------------------------------------
def _edited_checkpoint(path, edit):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    edit(checkpoint["callbacks"])
    return checkpoint


def _state(callbacks, prefix):
    return callbacks[next(k for k in callbacks if k.startswith(prefix))]


def _statement_cli(tmp_path, checkpoint, name):
    from tests._cli import run_cli

    torch.save(checkpoint, tmp_path / name)
    return run_cli("statement", tmp_path / name, cwd=tmp_path)


def test_an_audit_result_edited_after_saving_is_caught_by_its_digest(fitted, tmp_path):
    """Issue 55: a canary lower bound edited ×10 and an RMIA/LOSS AUC edited to 0.99 printed "consistent; digest
    verified", exit 0. The audits save a digest beside their results, as DPSGD does; the CLI process exits 2."""
    saved = torch.load(fitted["final"], map_location="cpu", weights_only=True)["callbacks"]
    assert all(str(_state(saved, name)["digest"]).startswith("sha256:") for name in ("CanaryAudit", "MembershipAudit"))
    assert privacy_statement(fitted["final"]).consistency["status"] == "consistent"

    def times_ten(callbacks):  # (+ 0.01: the tiny run's bound may be 0)
        results = _state(callbacks, "CanaryAudit")["results"]
        results[names.CANARY_EPSILON_LOWER] = results[names.CANARY_EPSILON_LOWER] * 10 + 0.01

    def auc(callbacks):
        _state(callbacks, "MembershipAudit")["results"][names.LOSS_AUC] = 0.99

    for name, edit in (("canary", times_ten), ("auc", auc)):
        checkpoint = _edited_checkpoint(fitted["final"], edit)
        statement = privacy_statement(checkpoint)
        assert statement.consistency["status"] == "inconsistent" and not statement.differentially_private
        assert statement.epsilon is None  # no guarantee stated
        problem = statement.consistency["problems"][0]
        assert "state's `digest` is sha256:" in problem and "changed after the audit saved them" in problem
        done = _statement_cli(tmp_path, checkpoint, f"{name}.ckpt")
        assert done.returncode == 2, done.stderr
        assert "audits and DP-SGD state disagree: the " in done.stderr and "digest" in done.stderr


def test_a_lower_bound_above_the_certified_epsilon_is_a_contradiction_even_resealed(fitted, tmp_path):
    """An empirical ε lower bound above the ledger's ε at the audit's δ contradicts the guarantee: exit 2 with the
    sentence, whether the digest was recomputed or not (here it is, so only the contradiction shows)."""
    from lightning_privacy.checkpoints import dpsgd_state_digest

    certified = fitted["dpsgd"].epsilon(1e-5)

    def above(callbacks):
        state = _state(callbacks, "CanaryAudit")
        state["results"][names.CANARY_EPSILON_LOWER] = certified * 1.1
        state["digest"] = dpsgd_state_digest(state)

    checkpoint = _edited_checkpoint(fitted["final"], above)
    statement = privacy_statement(checkpoint)
    assert statement.consistency["status"] == "inconsistent" and statement.epsilon is None
    (problem,) = statement.consistency["problems"]
    expected = (
        f"CanaryAudit's empirical ε lower bound `{names.CANARY_EPSILON_LOWER}` = {certified * 1.1:.4g} (δ = 1e-05) "
        f"exceeds the certified ε = {certified:.4g} at that δ: the audit contradicts the guarantee"
    )
    assert problem.startswith(expected)
    assert statement.summary.startswith("Audits and DP-SGD state disagree: CanaryAudit's empirical ε lower bound")
    done = _statement_cli(tmp_path, checkpoint, "above.ckpt")
    assert done.returncode == 2 and expected in done.stderr

    def just_below(callbacks):  # the same bound just under the certified ε: consistent
        state = _state(callbacks, "CanaryAudit")
        state["results"][names.CANARY_EPSILON_LOWER] = certified * 0.999
        state["digest"] = dpsgd_state_digest(state)

    assert privacy_statement(_edited_checkpoint(fitted["final"], just_below)).consistency["status"] == "consistent"


def test_audits_of_a_run_whose_privacy_history_was_deleted_are_inconsistent(fitted, tmp_path):
    """Issue 55: deleting the privacy history from the DPSGD state printed "holds no DPSGD state", exit 0, with the
    audits listed as consistent."""

    def no_history(callbacks):
        _state(callbacks, "DPSGD").pop("ledger")

    checkpoint = _edited_checkpoint(fitted["final"], no_history)
    statement = privacy_statement(checkpoint)
    assert statement.consistency["status"] == "inconsistent" and not statement.differentially_private
    problems = statement.consistency["problems"]
    assert problems[0].startswith("the checkpoint holds DPSGD's state under \"DPSGD{'noise_multiplier': 1.5")
    assert "without its privacy history (`ledger`)" in problems[0]
    assert any("CanaryAudit of gradient canaries" in p for p in problems)
    assert statement.summary.startswith("Inconsistent: the checkpoint holds DPSGD's state")
    assert "no: inconsistent state" in statement.to_text()
    done = _statement_cli(tmp_path, checkpoint, "no_history.ckpt")
    assert done.returncode == 2 and "without its privacy history (`ledger`)" in done.stderr


def test_a_run_without_dp_sgd_and_its_audits_is_still_consistent(plain):
    """No DPSGD key, input canaries: nothing is missing (no DP run was audited); the audits' digests verify."""
    statement = privacy_statement(plain["final"])
    assert statement.consistency is None and not statement.differentially_private

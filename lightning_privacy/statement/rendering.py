"""The pieces a statement is rendered from: its value rows, audit and version cells, its consistency lines, and the
YAML of a model card's metadata (:class:`~lightning_privacy.statement.PrivacyStatement` puts them together)."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from lightning_privacy import names
from lightning_privacy.ledger import accountant_label
from lightning_privacy.reporting import down, up
from lightning_privacy.statement.fields import FPRS, RELATION_LABELS, RELATIONS

__all__ = ["AUDIT_HEADER", "audit_cells", "consistency_lines", "escape", "guarantee_rows", "mechanism_rows", "yaml"]

Row = Tuple[str, str, str]
AUDIT_HEADER = ["audit", "values", "claim tested", "verdict"]
_SEEDS = {
    "secret": "secret (OS entropy per fit)",
    "fixed": "fixed (reproducible, not secret)",
    "secure": "secure (OS CSPRNG every step)",
}
_VERDICT_SUFFIX = "_claim_contradicted"


def _consistency_row(data: dict) -> List[Row]:
    consistency = data.get("consistency")
    if consistency is None:  # a statement's JSON from before the check
        return []
    if consistency["status"] == "inconsistent":
        value = f"INCONSISTENT ({len(consistency['problems'])} problem(s))"
    else:
        value = "consistent; " + ("digest verified" if consistency["digest"] == "verified" else "no digest recorded")
    meaning = (
        "σ, q, C and the steps of the DPSGD state agree with its ledger, its key and the checkpoint's global_step; "
        "the audits' values with their digests and the certified ε"
    )
    return [("state consistency", value, meaning)]


def mechanism_rows(data: dict) -> List[Row]:
    """The mechanism's rows: (quantity, value, meaning)."""
    m = data["mechanism"]
    if m is None and (data.get("consistency") or {}).get("status") == "inconsistent":
        return [
            ("differentially private", "no: inconsistent state", "the source's DPSGD state or its audits do not agree"),
            *_consistency_row(data),
        ]
    if m is None:
        return [("differentially private", "no", "the source holds no DPSGD state: no DP-SGD guarantee is stated")]
    consistency = data.get("consistency") or {}
    if consistency.get("status") == "inconsistent":
        private = "no: inconsistent state"
    else:
        private = "yes" if m["steps"] else "no step"
    given = m.get("sample_rate_given")
    source = {True: " (given: `DPSGD(sample_rate=...)`)", False: " (1/len(train loader))"}.get(given, "")
    if given is False and "drop_last" in str(m.get("sample_rate_origin") or ""):
        source = " (1/len(train loader) = 1/⌊N/batch size⌋: drop_last=True)"
    divisor = m.get("expected_batch_size")
    rows = [
        ("differentially private", private, "trained with DP-SGD by lightning-privacy's DPSGD callback"),
        *_consistency_row(data),
        (
            "mechanism",
            "DP-SGD",
            "each example's gradient clipped to norm C, Gaussian noise of std σ·C added to their sum, batches "
            "Poisson-sampled",
        ),
        (
            "noise multiplier σ",
            "—" if m["noise_multiplier"] is None else f"{m['noise_multiplier']:.6g}",
            "noise std / C",
        ),
        ("clipping norm C", f"{m['max_grad_norm']:g}", "each example's gradient is clipped to norm ≤ C"),
        (
            "divisor of the noised sum (expected batch size)",
            "not recorded" if divisor is None else f"{divisor:g}",
            "the public constant each step's noised clipped sum is divided by (all processes together)",
        ),
        (
            "sample rate q",
            "—" if m["sample_rate"] is None else f"{m['sample_rate']:.6g}",
            f"each example joins a batch with probability q{source}",
        ),
        ("optimizer steps T", str(m["steps"]), "DP-SGD steps the accountant recorded (over resumes)"),
        (
            "training set size N",
            "not recorded" if m["dataset_size"] is None else str(m["dataset_size"]),
            "rows the Poisson sampling drew from",
        ),
        ("privacy unit", *_unit_row(m.get("privacy_unit") or {"unit": "example"})),
        *_clipping_rows(m.get("clipping") or {"rule": "fixed"}),
        ("δ", f"{m['delta']:g}", "δ of the (ε, δ) guarantee"),
        ("accountant", m["accountant"], "the accountant that gives ε (pld: the package's pessimistic PLD)"),
        ("batch sampling", _SEEDS[m["sampling_seed"]], "the Poisson masks' randomness"),
        ("noise", _SEEDS[m["noise_seed"]], "the Gaussian noise's randomness"),
        (
            "per-example gradients",
            str(m["grad_sample_mode"]),
            _mode_note(m.get("grad_sample_mode_switch")),
        ),
        (
            "strategy",
            "not recorded" if m["strategy"] is None else f"{m['strategy']} ({m['world_size']} process(es))",
            "the Trainer's strategy",
        ),
        ("precision", *_precision_row(m.get("precision"))),
    ]
    planned = m["planned_for"]
    if planned:
        target = (
            f"β*_MIA ≥ {planned['target_bayes_security']:g}"
            if "target_bayes_security" in planned
            else f"ε ≤ {planned.get('target_epsilon', float('nan')):g}"
        )
        rows.append(
            ("planned for", f"{target} after {planned.get('epochs')} epochs", "σ was calibrated for this target")
        )
    return rows


def _precision_row(record: Optional[dict]) -> Tuple[str, str]:
    """The precision's value and note: the Trainer's precision and the steps bounded only up to 16-bit rounding."""
    if record is None or record.get("precision") is None:
        return "not recorded", "the Trainer's precision"
    rounded = record.get("rounded_steps") or 0
    if rounded:
        return str(record["precision"]), f"{rounded} step(s) bounded by C only up to 16-bit rounding"
    return str(record["precision"]), "each example bounded by C up to float32 rounding (or finer) at every step"


def guarantee_rows(data: dict) -> List[Row]:
    """The guarantee's rows (none without a stated guarantee)."""
    g, m = data["guarantee"], data["mechanism"]
    if g is None or not m["steps"]:
        return []
    eps = g["epsilon"]
    beta = g["bayes_security"]
    relation = RELATION_LABELS[g["bayes_security_relation"]]
    rows = [
        (
            f"ε at δ = {g['delta']:g}",
            "no finite ε" if eps is None else up(eps),
            f"(ε, δ)-DP, {RELATION_LABELS['add_remove']}: {accountant_label(m['accountant'])}",
        ),
        *(
            [
                (
                    f"ε of one row at δ = {g['delta']:g}",
                    up(g["row_epsilon"]),
                    "the same run's guarantee for adding or "
                    "removing one row, not a person (under user-level sampling a row moves its person's gradient by up to 2C)",
                )
            ]
            if g.get("row_epsilon") is not None
            else []
        ),  # fmt: skip
        (
            "β*_MIA",
            down(beta),
            f"certified lower bound ({relation}): any membership attacker's accuracy ≤ "
            f"{up(100 * (1 - beta / 2), 1)}% at a uniform prior",
        ),
        ("membership advantage", up(g["advantage"]), "1 − β*: bound on any attacker's TPR − FPR"),
    ]
    for relation_key in (g["bayes_security_relation"], *[r for r in RELATIONS if r != g["bayes_security_relation"]]):
        if relation_key not in g["tpr_bounds"]:  # (a ledger of groups: add/remove only)
            continue
        for fpr in FPRS:
            rows.append(
                (
                    f"TPR bound at FPR {fpr:g} ({RELATION_LABELS[relation_key]})",
                    up(g["tpr_bounds"][relation_key][f"fpr_{fpr:g}"]),
                    f"largest share of members any attack finds while flagging {fpr:.1%} of non-members",
                )
            )
    closed = g["bayes_security_closed_form"]
    rows.append(
        (
            "β*_MIA closed form",
            "—" if closed is None or math.isnan(closed) else f"{closed:.4f}",
            "approximate (Cor. 7), for comparison; can overstate security",
        )
    )
    budget = data["budget"]
    if budget is not None:
        limit = (
            f"β*_{budget['threat'].upper()} ≥ {budget['min_bayes_security']:g}"
            if "min_bayes_security" in budget
            else f"ε ≤ {budget['max_epsilon']:g}"
        )
        stopped = budget["stopped_at_step"]
        rows.append(
            (
                "budget",
                f"{limit}, stopped after step {stopped}" if stopped is not None else f"{limit}, not reached",
                "PrivacyBudgetStopping stops before the step that would break it",
            )
        )
    return rows


def consistency_lines(data: dict) -> List[str]:
    """The consistency check's problems (each naming both values), then its notes; empty when there are none."""
    consistency = data.get("consistency") or {}
    return [f"INCONSISTENT: {p}." for p in consistency.get("problems", [])] + list(consistency.get("notes", []))


def audit_cells(audit: dict) -> List[str]:
    """An audit's cells under :data:`AUDIT_HEADER`."""
    values = []
    for key, value in audit["values"].items():
        if key.endswith(_VERDICT_SUFFIX):
            continue
        trust = names.KEY_DOCS[key][2]
        kind = " (lower bound)" if trust == names.LOWER_BOUND else " (estimate)" if trust == names.ESTIMATE else ""
        values.append(f"`{key}` = {'not finite' if value is None else f'{value:.4g}'}{kind}")
    if audit["verdict"] is None:
        claim = "none tested"
    elif audit["claim"] is not None:
        claim = audit["claim"]["label"]
    else:
        claim = "not recorded"
    verdict = "—" if audit["verdict"] is None else audit["verdict"]
    if audit["verdict"] is not None and audit["confidence"] is not None:
        verdict += f" at confidence {audit['confidence']:.0%}"
    return [audit["audit"], "; ".join(values), claim, verdict]


def version_cells(data: dict) -> List[List[str]]:
    """``[package, version]`` rows: those that computed the statement, and the Lightning that saved the checkpoint."""
    computed = data["versions"]["computed_with"]
    cells = [[package.replace("_", "-"), str(version)] for package, version in computed.items()]
    saved = data["versions"]["checkpoint_saved_with"].get("lightning")
    if data["source"]["kind"] != "trainer" and saved:
        cells.append(["lightning (checkpoint saved with)", str(saved)])
    return cells


# --- YAML ----------------------------------------------------------------------------------------------------------
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*(?: [A-Za-z0-9_.\-]+)*")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}  # YAML 1.1 booleans and null


def _yaml_scalar(value: Any) -> str:
    """A scalar in YAML that PyYAML and other YAML 1.1/1.2 readers read back as the same type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "null"
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 reads 1e-05 as a string: 1.0e-05
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text  # a plain scalar every YAML reader takes for this string
    return json.dumps(text, ensure_ascii=False)  # a double-quoted YAML scalar


def yaml(value: Any, indent: int = 0) -> List[str]:
    """Block-style YAML of plain dicts, lists and scalars."""
    pad = " " * indent
    lines: List[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, (Mapping, list)) and item:
                lines.append(f"{pad}{key}:")
                lines += yaml(item, indent + 2)
            else:
                empty = "{}" if isinstance(item, Mapping) else "[]"
                lines.append(f"{pad}{key}: {empty if isinstance(item, (Mapping, list)) else _yaml_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, Mapping):
                inner = yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].strip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    return lines


def escape(line: str) -> str:
    """``line`` with ``*`` escaped outside code spans: ``β*_MIA … β*`` in one paragraph would otherwise be emphasis."""
    parts = line.split("`")
    return "`".join(part if i % 2 else part.replace("*", "\\*") for i, part in enumerate(parts))


def _clipping_rows(rule: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """The statement's clipping row (none for fixed clipping: the C row says it)."""
    if rule.get("rule") == "automatic":
        note = (
            f"each gradient scaled by 1/(‖g‖ + {rule.get('stability', 0):g}) (Bu et al.'s AUTO-S): norm below 1, "
            "accounted as C = 1"
        )
        return [("clipping", "automatic", note)]
    if rule.get("rule") == "quantile":
        sigma_b = rule.get("count_noise_multiplier")
        count = "the expected batch size / 20" if sigma_b is None else f"{sigma_b:g}"
        note = (
            f"C adapted after each step towards the {rule.get('target_quantile'):g} quantile of the norms (Andrew et "
            f"al.; learning rate {rule.get('learning_rate'):g}) from a count noised with σ_b = {count}; σ is the "
            "combined mechanism's (gradient and count together), C the first step's"
        )
        return [("clipping", "quantile", note)]
    return []


def _unit_row(unit: Dict[str, Any]) -> Tuple[str, str]:
    """The statement's privacy-unit row: whose privacy every number is, and how a person's rows were used."""
    if unit.get("unit") != "user":
        return "example (one row)", "every ε, β* and bound is for adding or removing one row"
    from lightning_privacy.dpsgd.users import unit_row  # (the report's row too; torch only for a person-level run)

    value, how = unit_row(unit)
    return value, f"every ε, β* and bound is for adding or removing one person; {how}"


def _mode_note(switch: Any) -> str:
    """The per-example gradients row's note: what the modes mean, or ``auto``'s switch (step and reason)."""
    if not switch:
        return (
            "hooks: Opacus' per-sample gradients; ghost: ghost clipping; functional: torch.func on each example alone"
        )
    return (
        f"grad_sample_mode='auto' switched from {switch.get('from', 'hooks')} at step {switch['step']}, before that "
        f"step's noised update: {switch['reason']}"
    )

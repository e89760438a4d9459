"""The statement as an object: :class:`PrivacyStatement` holds its plain values and renders them as JSON, a model
card's Markdown with YAML metadata, the privacy report's section and text for a terminal."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from lightning_privacy.reporting import ReportSection, ReportTable, down, up
from lightning_privacy.statement.fields import FORMAT, FORMAT_VERSION
from lightning_privacy.statement.rendering import (
    AUDIT_HEADER,
    audit_cells,
    consistency_lines,
    escape,
    guarantee_rows,
    mechanism_rows,
    version_cells,
    yaml,
)

__all__ = ["PrivacyStatement"]


class PrivacyStatement:
    """A model's privacy statement (:func:`~lightning_privacy.statement.privacy_statement`): plain values and their
    renderings.

    ``to_dict()`` has these keys (``format_version`` 1; a key's meaning never changes within a version; keys are
    added, and a statement's JSON without them still reads):
    ``format``, ``format_version``, ``source`` (``kind``, ``path``, ``epoch``, ``global_step``,
    ``lightning_checkpoint``), ``differentially_private`` (a consistent DPSGD state with at least one step),
    ``consistency`` (``None`` without DP-SGD: ``status`` ``"consistent"`` or ``"inconsistent"``, ``problems`` and
    ``notes`` as sentences, ``digest`` ``"verified"``, ``"mismatch"`` or ``"not recorded"``), ``summary``,
    ``mechanism`` (``None`` without DP-SGD: ``name``, ``noise_multiplier``, ``sample_rate``, ``sample_rate_given``,
    ``steps``, ``max_grad_norm``, ``expected_batch_size`` (the divisor of the noised sum), ``delta``, ``accountant``,
    ``relation``, ``history``, ``dataset_size``, ``sampling_seed`` and ``noise_seed`` (``"secret"``, ``"fixed"`` or ``"secure"``),
    ``secure_mode``, ``grad_sample_mode``, ``privacy_unit``, ``precision`` (``None``: not recorded; ``precision``, the
    Trainer's, and ``rounded_steps``, the steps whose examples were bounded by C only up to 16-bit rounding),
    ``loss_reduction``, ``strategy``, ``world_size``,
    ``fixed_modules``, ``planned_for``), ``guarantee`` (``None`` without DP-SGD or for an inconsistent state: ``epsilon``, ``delta``, ``epsilon_relation``,
    ``bayes_security``, ``bayes_security_relation``, ``advantage``, ``tpr_bounds`` by relation and ``fpr_0.001`` /
    ``fpr_0.01`` / ``fpr_0.1``, ``bayes_security_closed_form``; for a person: ``row_epsilon``), ``budget``, ``audits`` (``audit``, ``values``,
    ``verdict``, ``claim``, ``confidence``), ``versions`` (``computed_with``, ``checkpoint_saved_with``),
    ``not_covered`` and ``approximations`` (sentences). ``None`` stands for "not recorded" (and for a non-finite ε).

    Example::

        >>> from lightning_privacy.statement import privacy_statement
        >>> statement = PrivacyStatement.from_json(privacy_statement({"state_dict": {}}).to_json())
        >>> statement.differentially_private, statement.epsilon
        (False, None)
        >>> statement.to_markdown().splitlines()[:4]
        ['---', 'tags:', '  - lightning-privacy', 'privacy:']
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f"`data` must be a privacy statement's to_dict() (format {FORMAT!r}), got {data!r:.80}")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"`data` has format_version {data.get('format_version')!r}; this lightning-privacy reads "
                f"{FORMAT_VERSION}"
            )
        self._data = copy.deepcopy(dict(data))

    # ---------------------------------------------------------------------------------------------------- values
    def to_dict(self) -> Dict[str, Any]:
        """The statement as plain values (a copy), ready for :func:`json.dumps`."""
        return copy.deepcopy(self._data)

    @property
    def differentially_private(self) -> bool:
        """Whether the statement states a guarantee: the source holds a DPSGD state with at least one step that
        agrees with its ledger, its key and the checkpoint's global_step (:attr:`consistency`)."""
        return bool(self._data["differentially_private"])

    @property
    def consistency(self) -> Optional[Dict[str, Any]]:
        """The consistency check's result (``None`` without DP-SGD): ``status``, ``problems``, ``notes``, ``digest``."""
        found = self._data.get("consistency")
        return None if found is None else copy.deepcopy(found)

    @property
    def epsilon(self) -> Optional[float]:
        """The accountant's ε at δ (``None`` without DP-SGD, for an inconsistent state or for no finite ε)."""
        guarantee = self._data["guarantee"]
        return None if guarantee is None else guarantee["epsilon"]

    @property
    def summary(self) -> str:
        """One paragraph: the guarantee, or why there is none."""
        return self._data["summary"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyStatement) and other._data == self._data

    def __repr__(self) -> str:
        return f"PrivacyStatement({self.summary!r})"

    # ---------------------------------------------------------------------------------------------------- JSON
    def to_json(self, *, indent: Optional[int] = 2) -> str:
        """The statement as JSON (standard JSON: no NaN or infinity)."""
        return json.dumps(self._data, indent=indent, ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> PrivacyStatement:
        """A statement back from :meth:`to_json`.

        Raises:
            ValueError: text that is no statement's JSON.
        """
        return cls(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyStatement:
        """A statement back from :meth:`to_dict`."""
        return cls(data)

    # ---------------------------------------------------------------------------------------------------- Markdown
    def metadata(self) -> Dict[str, Any]:
        """The model card's YAML metadata as a dict: ``tags`` and a ``privacy`` block (safe-rounded values)."""
        data, m, g = self._data, self._data["mechanism"], self._data["guarantee"]
        tags = ["differential-privacy", "dp-sgd", "lightning-privacy"] if data["differentially_private"] else []
        privacy: Dict[str, Any] = {"differentially_private": data["differentially_private"]}
        if m is None:
            privacy["mechanism"] = "none"
        else:
            stated = bool(data["differentially_private"]) and g is not None
            privacy.update(
                mechanism="DP-SGD",
                state_consistency=(data.get("consistency") or {}).get("status"),
                epsilon=None if not stated or g["epsilon"] is None else float(up(g["epsilon"])),
                delta=m["delta"],
                epsilon_relation="add_remove",
                accountant=m["accountant"],
                noise_multiplier=m["noise_multiplier"],
                sample_rate=m["sample_rate"],
                sample_rate_given=m.get("sample_rate_given"),
                steps=m["steps"],
                max_grad_norm=m["max_grad_norm"],
                expected_batch_size=m.get("expected_batch_size"),
                dataset_size=m["dataset_size"],
                mia_bayes_security=float(down(g["bayes_security"])) if stated else None,
                mia_bayes_security_relation=None if g is None else g["bayes_security_relation"],
                sampling_seed=m["sampling_seed"],
                noise_seed=m["noise_seed"],
            )
        if data["audits"]:
            privacy["audits"] = [{"name": a["audit"], "verdict": a["verdict"]} for a in data["audits"]]
        privacy["statement"] = f"lightning-privacy {data['versions']['computed_with']['lightning_privacy']}"
        return {"tags": tags or ["lightning-privacy"], "privacy": privacy}

    def to_markdown(self, *, front_matter: bool = True, heading_level: int = 2) -> str:
        """A Markdown section for a model card (Hugging Face's README.md), with its YAML metadata block first.

        Args:
            front_matter: start with the ``---`` YAML block (:meth:`metadata`); ``False``: the section alone, to add
                to a card that has its own metadata.
            heading_level: the level of the section's heading (``## Privacy`` by default); its parts are one deeper.

        Raises:
            ValueError: ``heading_level`` not in 1..5.
        """
        if isinstance(heading_level, bool) or heading_level not in (1, 2, 3, 4, 5):
            raise ValueError(f"`heading_level` must be an int in 1..5, got {heading_level!r}")
        data = self._data
        head, part = "#" * heading_level, "#" * (heading_level + 1)
        lines: List[str] = [f"{head} Privacy", "", data["summary"], ""]
        table = ["| quantity | value | meaning |", "|---|---|---|"]
        lines += [f"{part} Mechanism", "", *table, *(f"| {q} | {v} | {m} |" for q, v, m in mechanism_rows(data)), ""]
        checked = consistency_lines(data)
        if checked:
            lines += [f"{part} Consistency", "", *(f"- {s}" for s in checked), ""]
        guarantee = guarantee_rows(data)
        if guarantee:
            lines += [f"{part} Guarantee", "", *table, *(f"| {q} | {v} | {m} |" for q, v, m in guarantee), ""]
        lines += [f"{part} Audits", ""]
        if data["audits"]:
            lines += ["| " + " | ".join(AUDIT_HEADER) + " |", "|---" * len(AUDIT_HEADER) + "|"]
            lines += ["| " + " | ".join(audit_cells(a)) + " |" for a in data["audits"]]
        else:
            lines.append("No audit results are recorded.")
        lines += ["", f"{part} What the numbers do not cover", "", *(f"- {s}" for s in data["not_covered"]), ""]
        lines += [f"{part} Approximations", "", *(f"- {s}" for s in data["approximations"]), ""]
        lines += [f"{part} Versions", "", "| package | version |", "|---|---|"]
        lines += [f"| {a} | {b} |" for a, b in version_cells(data)]
        body = [escape(line) for line in lines]
        return "\n".join([*(["---", *yaml(self.metadata()), "---", ""] if front_matter else []), *body]) + "\n"

    # ---------------------------------------------------------------------------------------------------- report, text
    def report_section(self, trainer: Any = None) -> ReportSection:
        """The statement as the privacy report's section (:mod:`lightning_privacy.reporting`): the value rows, the
        consistency check's findings, the audits, what the numbers do not cover, the approximations and the
        versions."""
        data = self._data
        rows = [*mechanism_rows(data), *guarantee_rows(data)]
        checked = consistency_lines(data)
        extras = [ReportTable("Consistency", ["finding"], [[s] for s in checked])] if checked else []
        if data["audits"]:
            extras.append(ReportTable("Audits", list(AUDIT_HEADER), [audit_cells(a) for a in data["audits"]]))
        extras += [
            ReportTable("What the numbers do not cover", ["not covered"], [[s] for s in data["not_covered"]]),
            ReportTable("Approximations", ["approximation"], [[s] for s in data["approximations"]]),
            ReportTable("Versions", ["package", "version"], version_cells(data)),
        ]
        warnings: Tuple[str, ...] = tuple(s for s in checked if s.startswith("INCONSISTENT"))
        warnings += tuple(s for s in data["approximations"] if "GDP" in s)
        return ReportSection("Privacy statement", rows, extras=extras, warnings=warnings)

    def to_text(self) -> str:
        """The statement as plain text for a terminal (``lightning-privacy statement CHECKPOINT``)."""
        data = self._data
        path = data["source"]["path"]
        head = f"Privacy statement of {path}" if path else "Privacy statement"
        lines = [head, "-" * len(head), data["summary"], ""]
        rows = [*mechanism_rows(data), *guarantee_rows(data)]
        width = max(len(q) for q, _, _ in rows)
        lines += [f"{q:<{width}}  {v}" for q, v, _ in rows]
        checked = consistency_lines(data)
        if checked:
            lines += ["", "Consistency:", *(f"  - {s}" for s in checked)]
        lines += ["", "Audits:"]
        if data["audits"]:
            for audit in data["audits"]:
                name, values, claim, verdict = audit_cells(audit)
                lines.append(f"  {name}: verdict {verdict}; claim tested: {claim}; {values.replace('`', '')}")
        else:
            lines.append("  none recorded")
        lines += ["", "Not covered:", *(f"  - {s}" for s in data["not_covered"])]
        lines += ["", "Approximations:", *(f"  - {s}" for s in data["approximations"])]
        lines += ["", "Versions: " + ", ".join(f"{a} {b}" for a, b in version_cells(data))]
        return "\n".join(lines).replace("`", "")

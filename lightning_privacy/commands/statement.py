"""``lightning-privacy statement CHECKPOINT``: a model's privacy statement for release, from its checkpoint alone.

Reads the checkpoint with ``torch.load(weights_only=True)`` (no model class, nothing in the file runs) and prints
:func:`lightning_privacy.statement.privacy_statement`: the DP-SGD mechanism (σ, q, steps, C, δ, accountant and
relation, whether the sampling and the noise were secret, gradient mode, training set size), ε, β*_MIA and the TPR
bounds at FPR 0.001 / 0.01 / 0.1, the audits the checkpoint holds with their verdicts, the versions, and what the
numbers do not cover. ``--json`` prints it as one JSON object (stable keys, ``format_version``), ``--markdown`` as a
model card's section with its YAML metadata block (Hugging Face's README.md); the default is text for a terminal.

Before it states a guarantee the statement checks the DPSGD state: every field it uses is well-formed, and σ, q, C
and the steps agree across the state, its key, its ledger and the checkpoint's ``global_step``, and with the digest
DPSGD saved (:mod:`lightning_privacy.statement.consistency`).

Exit status: 0 with the statement, also for a checkpoint without DP-SGD (the statement then says there is no
guarantee and states no ε); 3 for that checkpoint, or one whose DPSGD state took no step, under ``--require-dp`` (for
release pipelines); 2 for a missing or unreadable file or a malformed field (one ``error:`` line on stderr naming the
file, the field and its value, nothing on stdout), and 2 for an inconsistent DPSGD state, with or without
``--require-dp``: the statement is printed (its ``consistency`` says ``"inconsistent"`` and it states no guarantee),
then one ``error:`` line per disagreement, naming both values. The audits the checkpoint holds are checked too
(:mod:`lightning_privacy.statement.audit_checks`): an audit value changed after saving (its digest), an empirical ε
lower bound above the certified ε at its δ (a contradiction), or audits of a DP run whose privacy history is missing
give the same status 2, with an ``error: … audits and DP-SGD state disagree: …`` line each.
"""

from __future__ import annotations

import argparse
import sys

NAME = "statement"
HELP = "A checkpoint's privacy statement for release: mechanism, ε, β*_MIA, TPR bounds, audits, versions."
NO_DP_STATUS = 3  # --require-dp and the checkpoint holds no DP-SGD step
ERROR_STATUS = 2  # an unreadable file, a malformed field, or an inconsistent DPSGD state


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a Lightning checkpoint (.ckpt) of the model")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the statement as one JSON object")
    form.add_argument(
        "--markdown", action="store_true", help="print a model card's Markdown section with its YAML metadata block"
    )
    parser.add_argument(
        "--require-dp",
        action="store_true",
        help=f"exit with status {NO_DP_STATUS} (after printing the statement) when the checkpoint has no DP-SGD step",
    )


def run(args: argparse.Namespace) -> int:
    from lightning_privacy.statement import privacy_statement

    try:
        statement = privacy_statement(args.checkpoint)
    except (OSError, ValueError) as err:
        print(f"lightning-privacy statement: error: {_one_line(err)}", file=sys.stderr)
        return ERROR_STATUS
    except Exception as err:  # a field no check foresaw: still one line, never a traceback
        print(
            f"lightning-privacy statement: error: checkpoint {args.checkpoint!r}: could not be read "
            f"({type(err).__name__}: {_one_line(err)})",
            file=sys.stderr,
        )
        return ERROR_STATUS
    if args.json:
        print(statement.to_json())
    elif args.markdown:
        print(statement.to_markdown(), end="")
    else:
        print(statement.to_text())
    consistency = statement.consistency
    if consistency is not None and consistency["status"] != "consistent":
        audits = consistency.get("audit_problems", [])
        for problem in consistency["problems"]:
            what = "audits and DP-SGD state disagree" if problem in audits else "inconsistent DPSGD state"
            print(f"lightning-privacy statement: error: {args.checkpoint}: {what}: {problem}", file=sys.stderr)
        return ERROR_STATUS
    if args.require_dp and not statement.differentially_private:
        what = "holds no DP-SGD step" if consistency is None else "holds a DPSGD state that took no step"
        print(f"lightning-privacy statement: error: --require-dp: {args.checkpoint} {what}", file=sys.stderr)
        return NO_DP_STATUS
    return 0


def _one_line(err: BaseException) -> str:
    """An exception's message on one line (``str(err)`` of a KeyError is its quoted key; newlines are joined)."""
    return " ".join(str(err).split()) or type(err).__name__

"""``lightning-privacy audit epsilon-star``: Epsilon* of a saved model on its own data, or of two loss files.

From a checkpoint: ``--model pkg.module:Class`` and ``--datamodule pkg.module:Class`` (default: the
bundled :class:`~lightning_privacy.data.datamodule.AdultDataModule` and
:class:`~lightning_privacy.models.TabularMLP`), built with ``--datamodule-args`` (JSON). Members are
the datamodule's ``member_dataloader()`` if it has one, else one pass over its ``train_dataloader()``;
non-members its ``val_dataloader()`` (``--nonmembers val``, default) or ``test_dataloader()``. The
datamodule is rebuilt with the hyperparameters the checkpoint saved for it (a datamodule that calls
``self.save_hyperparameters()``, as Adult's does, so Adult's split is the training run's); options override
them, each change named in a warning. Where DPSGD recorded the size of its training set, members of another
size are refused. The checkpoint is read by torch's weights-only loader: a file that holds more than plain
weights is refused. The modules ``DPSGD(fix_modules=True)`` replaced in training are replaced the same way
before the weights are loaded (``--fix-modules`` for a checkpoint that does not record them).

From a folder ``save_pretrained`` wrote (a causal LM, PEFT adapters too, read offline): ``--model DIR`` with
``--datamodule`` naming the sequences (members from its ``train_dataloader()``, non-members from its
``val_dataloader()``) and ``--signal`` (e.g. ``causal_lm_signal``); no ``--checkpoint``, no ledger.

From files: ``--member-losses F --nonmember-losses F`` (``.npy``, or ``.csv``/``.txt`` with one value a
line; low loss = looks like a member), e.g. losses computed by another framework.

``--signal MODULE:FUNCTION`` scores a checkpoint's examples with ``FUNCTION(model, batch)`` (one loss per example)
instead of its logits, e.g. ``lightning_privacy.functional.sequence_loss:causal_lm_signal`` for a causal language
model; a datamodule whose batches are mappings (``{"input_ids": ...}``) needs it.

The audit is :func:`lightning_privacy.audits.audit_epsilon_star`; ``--json`` prints exactly one JSON
object on stdout. The result's warnings (Normal fits rejected by their KS test, losses that look
reversed, ...) are printed on stderr as ``warning:`` lines and are the JSON's ``"warnings"`` list.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "audit epsilon-star"
HELP = (
    "Epsilon* (Negoescu et al. 2023) of a saved model on its datamodule's members and non-members "
    "(default: Adult), or of member / non-member loss files."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lightning_privacy.commands import _audit_io as io

    source = parser.add_argument_group("what to audit (a checkpoint, or two loss files)")
    source.add_argument("--checkpoint", default=None, help="Lightning checkpoint (.ckpt) or state_dict file")
    source.add_argument("--member-losses", default=None, help="losses of members: .npy, or .csv/.txt one a line")
    source.add_argument("--nonmember-losses", default=None, help="losses of non-members (same formats)")
    io.add_model_arguments(parser, "model and data (with --checkpoint, or --model DIR)", pretrained=True)
    parser.add_argument(
        "--delta",
        type=float,
        default=None,
        help="delta of Epsilon* in (0, 0.5) (default: 1/(n ln n), n = member examples)",
    )
    parser.add_argument(
        "--signal",
        default=None,
        metavar="MODULE:FUNCTION",
        help="one membership loss per example from FUNCTION(model, batch) instead of the model's logits (with "
        "--checkpoint), e.g. lightning_privacy.functional.sequence_loss:causal_lm_signal for a causal language model",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _warn(message: str) -> None:
    print(f"lightning-privacy audit epsilon-star: warning: {message}", file=sys.stderr)


def audit(args: argparse.Namespace) -> dict:
    """The audit ``args`` ask for, as a dict of plain values (``ValueError`` with a one-line message)."""
    from lightning_privacy.audits import audit_epsilon_star, audit_epsilon_star_from_losses
    from lightning_privacy.commands import _audit_io as io

    if args.delta is not None and not 0.0 < args.delta < 0.5:
        raise ValueError(f"`--delta` must be in the open interval (0, 0.5), got {args.delta!r}")
    files = (args.member_losses, args.nonmember_losses)
    folder = io.is_pretrained_folder(args.model)
    if folder:
        if files != (None, None):
            raise ValueError(f"`--model` {args.model!r} is a model to score: give it or loss files, not both")
        io.check_pretrained_folder_options(args)
    elif args.checkpoint is None and None in files:
        raise ValueError("give `--checkpoint`, or both `--member-losses` and `--nonmember-losses`")
    if args.checkpoint is not None and files != (None, None):
        raise ValueError("give either `--checkpoint` or loss files, not both")
    if args.checkpoint is None and args.signal is not None and not folder:
        raise ValueError("`--signal` scores a checkpoint's examples: give `--checkpoint`, not loss files")
    if args.checkpoint is None and not folder:
        members = io.read_values(args.member_losses, "--member-losses")
        nonmembers = io.read_values(args.nonmember_losses, "--nonmember-losses")
        result = audit_epsilon_star_from_losses(members, nonmembers, delta=args.delta, warn=False)
        source = {"member_losses": args.member_losses, "nonmember_losses": args.nonmember_losses}
    else:
        signal_fn = io.load_signal(args.signal)
        dm_args = io.datamodule_args(args)
        if folder:  # the weights and nothing else: no DP-SGD state, so no ledger and no member count to check
            model, contents = io.load_pretrained(args.model, "--model"), {}
        else:
            model, contents = io.load_checkpoint_model(args, io.load_class(args.model, "--model"), warn=_warn)
        dm = io.datamodule(
            args.datamodule, stage_test=args.nonmembers == "test", contents=contents, warn=_warn, **dm_args
        )
        io.check_member_count(dm, contents)
        members, nonmembers = io.member_batches(dm), io.nonmember_batches(dm, args.nonmembers)
        io.refuse_mapping_members(members, signal_fn)  # a language model's batches need --signal
        from lightning_privacy.checkpoints import dpsgd_state, privacy_ledger

        saved = dpsgd_state(contents) or {}
        ledger = privacy_ledger(contents, delta=saved.get("delta", 1e-5))
        result = audit_epsilon_star(
            model, members, nonmembers, delta=args.delta, warn=False, ledger=ledger, signal_fn=signal_fn
        )
        source = {"checkpoint": args.checkpoint, "datamodule": type(dm).__name__, "nonmembers": args.nonmembers}
        if folder:
            source["model"] = args.model
    if "parametric" not in result.details:
        raise ValueError("; ".join(result.notes))
    return {**result.to_dict(), **source}


def _f(value, spec: str) -> str:
    """``value`` formatted, or ``nan`` for a value JSON could not hold (``None``)."""
    return "nan" if value is None else format(value, spec)


def _table(out: dict) -> str:
    """The audit as aligned text (the JSON of ``--json`` holds the same numbers)."""
    from lightning_privacy import names

    p, e = out["parametric"], out.get("empirical")
    where = f" ({out['nonmembers']} rows)" if "nonmembers" in out else ""
    rows = [
        ("members / non-members", f"{out['num_members']} / {out['num_nonmembers']}{where}"),
        ("delta", f"{out['delta']:.3g}"),
    ]
    for key in (names.EPSILON_STAR, names.EPSILON_STAR_EMPIRICAL, names.MIA_EPSILON_LOWER):
        if key in out:
            rows.append((key, _f(out[key], ".4f")))
    rows.append(
        (
            "Normal fits (members / non-members)",
            f"N({_f(p['member_mean'], '.4f')}, {_f(p['member_std'], '.4f')}^2) / "
            f"N({_f(p['nonmember_mean'], '.4f')}, {_f(p['nonmember_std'], '.4f')}^2)",
        )
    )
    rows.append(
        (
            "KS p-values (members / non-members)",
            f"{_f(p['ks_pvalue_member'], '.3g')} / {_f(p['ks_pvalue_nonmember'], '.3g')}"
            + (
                "  (fits rejected: epsilon_star not reliable, use the empirical one)"
                if out.get("fits_rejected")
                else ""
            ),
        )
    )
    for label, d in (("parametric", p), ("empirical", e)):
        if d is not None and d["ratio"] is not None:
            rows.append(
                (
                    f"{label}: threshold / FPR / FNR / ratio",
                    f"{d['threshold']:.4g} / {d['fpr']:.3g} / {d['fnr']:.3g} / {d['ratio']}",
                )
            )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    try:
        out = audit(args)
    except ValueError as err:
        print(f"lightning-privacy audit epsilon-star: error: {err}", file=sys.stderr)
        return 2
    for note in (*out.get("notes", []), *out.get("warnings", [])):
        print(f"lightning-privacy audit epsilon-star: warning: {note}", file=sys.stderr)
    print(json.dumps(out, indent=2, allow_nan=False) if args.json else _table(out))
    return 0

"""``lightning-privacy audit epsilon-star``: Epsilon* of a saved checkpoint on Adult (or its own data).

Members are the training rows of :class:`~lightning_privacy.data.datamodule.AdultDataModule` (the same
split as training: pass the same ``--val-fraction`` / ``--split-seed``), non-members its validation rows
(``--nonmembers val``, default) or the ``adult.test`` rows (``--nonmembers test``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

NAME = "audit epsilon-star"
HELP = "Epsilon* (Negoescu et al. 2023) of a saved model checkpoint: members = Adult train rows, non-members = val/test rows."
DEFAULT_MODEL = "lightning_privacy.models:TabularMLP"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="Lightning checkpoint (.ckpt) to audit")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="LightningModule class as module:Class (default: %(default)s)"
    )
    parser.add_argument(
        "--data-path", default=None, help="folder with adult.data / adult.test (default: the bundled copy)"
    )
    parser.add_argument(
        "--nonmembers", choices=("val", "test"), default="val", help="non-member rows (default: %(default)s)"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.1, help="validation share used in training (default: %(default)s)"
    )
    parser.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="seed of the train/validation split used in training (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=1024, help="evaluation batch size (default: %(default)s)")
    parser.add_argument(
        "--delta",
        type=float,
        default=None,
        help="delta of Epsilon* in (0, 0.5) (default: 1/(n ln n), n = training rows)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _load_class(spec: str):
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"`--model` must look like 'package.module:Class', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"`--model` {spec!r} cannot be imported: {err}") from err


def audit_checkpoint(args: argparse.Namespace) -> dict:
    """Load the checkpoint and data of ``args``, return the audit as a dict of plain values."""
    from lightning_privacy.audits import audit_epsilon_star
    from lightning_privacy.data.datamodule import AdultDataModule

    if args.delta is not None and not 0.0 < args.delta < 0.5:
        raise ValueError(f"`--delta` must be in the open interval (0, 0.5), got {args.delta!r}")
    if not Path(args.checkpoint).is_file():
        raise ValueError(f"`--checkpoint` {args.checkpoint!r} is not a file")
    model = _load_class(args.model).load_from_checkpoint(args.checkpoint, map_location="cpu")
    dm = AdultDataModule(
        path=args.data_path, batch_size=args.batch_size, val_fraction=args.val_fraction, seed=args.split_seed
    )
    dm.setup("fit")
    if args.nonmembers == "val" and len(dm.val_dataset) == 0:
        raise ValueError("`--nonmembers val` needs `--val-fraction` > 0; use `--nonmembers test`")
    population = dm.val_dataloader() if args.nonmembers == "val" else dm.test_dataloader()
    result = audit_epsilon_star(model, dm.member_dataloader(), population, delta=args.delta, warn=False)
    if "parametric" not in result.details:
        raise ValueError("; ".join(result.notes))
    return {**result.to_dict(), "nonmembers": args.nonmembers}


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
            f"{_f(p['ks_pvalue_member'], '.3g')} / {_f(p['ks_pvalue_nonmember'], '.3g')}",
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
        out = audit_checkpoint(args)
    except ValueError as err:
        print(f"lightning-privacy audit epsilon-star: error: {err}", file=sys.stderr)
        return 2
    for note in out.get("notes", []):
        print(f"lightning-privacy audit epsilon-star: warning: {note}", file=sys.stderr)
    print(json.dumps(out, indent=2) if args.json else _table(out))
    return 0

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
    import dataclasses

    import numpy as np
    import torch

    from lightning_privacy import names
    from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star_details
    from lightning_privacy.data.datamodule import AdultDataModule
    from lightning_privacy.functional.membership_loss import membership_losses_from_loader

    if args.delta is not None and not 0.0 < args.delta < 0.5:
        raise ValueError(f"`--delta` must be in the open interval (0, 0.5), got {args.delta!r}")
    if not Path(args.checkpoint).is_file():
        raise ValueError(f"`--checkpoint` {args.checkpoint!r} is not a file")
    model = _load_class(args.model).load_from_checkpoint(args.checkpoint, map_location="cpu")
    dm = AdultDataModule(
        path=args.data_path, batch_size=args.batch_size, val_fraction=args.val_fraction, seed=args.split_seed
    )
    dm.setup("fit")
    population = dm.val_dataloader() if args.nonmembers == "val" else dm.test_dataloader()
    if args.nonmembers == "val" and len(dm.val_dataset) == 0:
        raise ValueError("`--nonmembers val` needs `--val-fraction` > 0; use `--nonmembers test`")
    members = membership_losses_from_loader(model, dm.member_dataloader()).double().numpy()
    nonmembers = membership_losses_from_loader(model, population).double().numpy()
    delta = args.delta if args.delta is not None else default_delta(members.size)
    parametric = epsilon_star_details(members, nonmembers, delta=delta, method="parametric")
    empirical = epsilon_star_details(members, nonmembers, delta=delta, method="empirical")
    out = {
        names.EPSILON_STAR: parametric.epsilon_star,
        names.EPSILON_STAR_EMPIRICAL: empirical.epsilon_star,
        "delta": delta,
        "num_members": int(members.size),
        "num_nonmembers": int(nonmembers.size),
        "nonmembers": args.nonmembers,
        "parametric": dataclasses.asdict(parametric),
        "empirical": dataclasses.asdict(empirical),
    }
    try:
        from lightning_privacy.metrics.membership_epsilon import MembershipEpsilon
    except ImportError:  # pragma: no cover - only before the estimation issue landed
        MembershipEpsilon = None
    if MembershipEpsilon is not None:
        mia = MembershipEpsilon(delta=delta)
        scores = torch.from_numpy(-np.concatenate([members, nonmembers]))
        is_member = torch.cat(
            [torch.ones(members.size, dtype=torch.bool), torch.zeros(nonmembers.size, dtype=torch.bool)]
        )
        mia.update(scores, is_member)
        out[names.MIA_EPSILON_LOWER] = float(mia.compute()["epsilon_lower"])
    return out


def _table(out: dict) -> str:
    from lightning_privacy import names

    p, e = out["parametric"], out["empirical"]
    rows = [
        ("members / non-members", f"{out['num_members']} / {out['num_nonmembers']} ({out['nonmembers']} rows)"),
        ("delta", f"{out['delta']:.3g}"),
        (names.EPSILON_STAR, f"{out[names.EPSILON_STAR]:.4f}"),
        (names.EPSILON_STAR_EMPIRICAL, f"{out[names.EPSILON_STAR_EMPIRICAL]:.4f}"),
    ]
    if names.MIA_EPSILON_LOWER in out:
        rows.append((names.MIA_EPSILON_LOWER, f"{out[names.MIA_EPSILON_LOWER]:.4f}"))
    rows.append(
        (
            "Normal fits (members / non-members)",
            f"N({p['member_mean']:.4f}, {p['member_std']:.4f}^2) / N({p['nonmember_mean']:.4f}, {p['nonmember_std']:.4f}^2)",
        )
    )
    rows.append(
        ("KS p-values (members / non-members)", f"{p['ks_pvalue_member']:.3g} / {p['ks_pvalue_nonmember']:.3g}")
    )
    for label, d in (("parametric", p), ("empirical", e)):
        if d["ratio"] is not None:
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
    print(json.dumps(out, indent=2, default=float) if args.json else _table(out))
    return 0

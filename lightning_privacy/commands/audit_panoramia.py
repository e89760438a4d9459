"""``lightning-privacy audit panoramia``: PANORAMIA on a saved checkpoint (Adult models)."""

from __future__ import annotations

import argparse
import importlib
import json
import time

NAME = "audit panoramia"
HELP = "PANORAMIA audit of a saved Adult checkpoint with generated non-members (no retraining)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="Lightning checkpoint (.ckpt) of the target model")
    parser.add_argument(
        "--model-class",
        default="lightning_privacy.models.TabularMLP",
        help="dotted path of the LightningModule class (default: %(default)s)",
    )
    parser.add_argument("--data", default="adult", help="member data: only 'adult' (the AdultDataModule train split)")
    parser.add_argument("--data-path", default=None, help="folder with adult.data/adult.test (default: bundled copy)")
    parser.add_argument(
        "--val-fraction", type=float, default=0.1, help="validation share used in training (default: %(default)s)"
    )
    parser.add_argument(
        "--split-seed", type=int, default=0, help="seed of the AdultDataModule train/val split the model used"
    )
    parser.add_argument(
        "--member-fraction", type=float, default=1.0, help="share of the training rows the auditor holds"
    )
    parser.add_argument(
        "--audit-size", type=int, default=None, help="m, audit points (default: a third of the members)"
    )
    parser.add_argument("--generator-size", type=int, default=None, help="|D_G| (default: a third of the members)")
    parser.add_argument("--beta", type=float, default=0.05, help="1 - confidence of the bounds (default: %(default)s)")
    parser.add_argument("--helper-epochs", type=int, default=10)
    parser.add_argument(
        "--mia-features",
        choices=["target_loss", "calibrated"],
        default="target_loss",
        help="the paper's MIA (x + target loss) or helper-calibrated losses (default: %(default)s)",
    )
    parser.add_argument("--no-filter", action="store_true", help="do not filter obviously synthetic rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", default=None, help="write the curves to this image file")
    parser.add_argument("--output", default=None, help="write the numbers and the report to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    if args.data != "adult":
        raise SystemExit(f"error: --data must be 'adult' (the only bundled tabular set), got {args.data!r}")
    if not 0 < args.member_fraction <= 1:
        raise SystemExit(f"error: --member-fraction must be in (0, 1], got {args.member_fraction!r}")
    from lightning_privacy.audits import audit_panoramia
    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.generators import FilteredGenerator, TabularGenerator

    module_name, _, class_name = args.model_class.rpartition(".")
    model_class = getattr(importlib.import_module(module_name), class_name)
    model = model_class.load_from_checkpoint(args.checkpoint, map_location="cpu")
    dm = AdultDataModule(path=args.data_path, val_fraction=args.val_fraction, seed=args.split_seed)
    dm.setup("fit")
    generator = TabularGenerator(seed=args.seed)
    if not args.no_filter:
        generator = FilteredGenerator(generator, seed=args.seed)
    start = time.perf_counter()
    result = audit_panoramia(
        model,
        dm.train_table,
        encode=lambda rows: dm.to_dataset(rows).tensors,
        generator=generator,
        member_fraction=args.member_fraction,
        audit_size=args.audit_size,
        generator_size=args.generator_size,
        beta=args.beta,
        helper_epochs=args.helper_epochs,
        seed=args.seed,
        mia_features=args.mia_features,
        progress=not args.quiet,
    )
    seconds = time.perf_counter() - start
    text = result.summary()
    print(text)
    print(f"\naudit time: {seconds:.1f} s")
    if args.figure:
        result.figure().savefig(args.figure, dpi=120)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump({**result.to_dict(), "seconds": seconds, "report": text}, handle, indent=2)
    return 0

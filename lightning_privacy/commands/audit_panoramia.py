"""``lightning-privacy audit panoramia``: PANORAMIA on a saved checkpoint, with generated non-members.

Members come from ``--datamodule pkg.module:Class`` (default: the bundled Adult datamodule), built with
``--datamodule-args`` (JSON):

- a datamodule with raw rows (``train_table`` and ``to_dataset``, as Adult's) gives a table and the
  default tabular generator;
- any other datamodule is read once (``member_dataloader()`` if it has one, else
  ``train_dataloader()``): image-shaped inputs use the digits generator, flat float rows are audited as
  a numeric table with the default tabular generator.

``--generator pkg.module:Class`` (with ``--generator-args`` JSON) replaces the default generator. Without
it, inputs no default generator can imitate — integer token ids, inputs of more than 4 dimensions — are
refused on the first batch, before any work, with one line naming what is supported and ``--generator``
(exit status 2). The checkpoint is read by torch's weights-only loader: a file that holds more than plain
weights is refused. A result that carries no information (too few correct guesses at every recall level)
says so: ``warning:`` lines on stderr, the JSON's ``"warnings"`` list and the report's text.
As in ``audit epsilon-star``, the datamodule is rebuilt with the hyperparameters the checkpoint saved for it
(options override them, with a warning naming each change), members of another size than DPSGD's recorded
training set are refused, and the modules ``DPSGD(fix_modules=True)`` replaced are replaced before loading.
The audit is :func:`lightning_privacy.audits.audit_panoramia`; its phases show on a progress bar on
stderr (``--quiet``: none), and ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

NAME = "audit panoramia"
HELP = "PANORAMIA audit of a saved checkpoint with generated non-members (no retraining); default data: Adult"
DEFAULT_MODEL = "lightning_privacy.models:TabularMLP"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="Lightning checkpoint (.ckpt) or state_dict of the target")
    parser.add_argument(
        "--model", default=None, help=f"LightningModule class as module:Class (default: {DEFAULT_MODEL})"
    )
    parser.add_argument("--model-class", default=None, help="the same as a dotted path (older spelling of --model)")
    parser.add_argument("--model-args", default=None, help="JSON object of constructor arguments for --model")
    parser.add_argument("--datamodule", default=None, help="LightningDataModule class as module:Class (default: Adult)")
    parser.add_argument(
        "--datamodule-args",
        default=None,
        help="JSON object of constructor arguments (over the hyperparameters the checkpoint saved for its datamodule)",
    )
    parser.add_argument(
        "--fix-modules",
        action="store_true",
        help="replace the layers Opacus has a fixer for before loading, as DPSGD(fix_modules=True) did in training "
        "(needed only for checkpoints that do not record it)",
    )
    parser.add_argument("--generator", default=None, help="generator class as module:Class (fit(data) / sample(n))")
    parser.add_argument("--generator-args", default=None, help="JSON object of constructor arguments for --generator")
    parser.add_argument("--data", default="adult", help="member data: only 'adult' (the AdultDataModule train split)")
    parser.add_argument("--data-path", default=None, help="folder with adult.data/adult.test (default: bundled copy)")
    parser.add_argument(
        "--val-fraction", type=float, default=None, help="validation share used in training (default: saved, else 0.1)"
    )
    parser.add_argument(
        "--split-seed", type=int, default=None, help="seed of the Adult train/val split the model used (saved, else 0)"
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
    parser.add_argument("--json", action="store_true", help="print one JSON object (numbers and report) on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def _warn(message: str) -> None:
    print(f"lightning-privacy audit panoramia: warning: {message}", file=sys.stderr)


def _members(args: argparse.Namespace, dm) -> tuple:
    """``(members, encode, generator)`` for the datamodule: a table, image arrays or float rows."""
    from lightning_privacy.audits.panoramia import FloatRows, member_arrays
    from lightning_privacy.commands import _audit_io as io
    from lightning_privacy.generators import FilteredGenerator, TabularGenerator

    generator = None
    if args.generator is not None:
        try:
            generator = io.load_class(args.generator, "--generator")(
                **io.json_object(args.generator_args, "--generator-args")
            )
        except TypeError as err:
            raise ValueError(f"`--generator-args` do not fit {args.generator}: {err}") from None
    if hasattr(dm, "train_table") and callable(getattr(dm, "to_dataset", None)):
        members, encode = dm.train_table, (lambda rows: dm.to_dataset(rows).tensors)
        tabular = True
    else:  # inputs no default generator can imitate (token ids, ...) are refused on the first batch
        x, y = member_arrays(io.member_batches(dm), generator=generator, allow_flat=True)
        tabular = x.ndim < 3 and x.dtype.kind == "f"  # integer rows (token ids) stay arrays for --generator
        members, encode = (FloatRows.of(x, y), FloatRows.encode) if tabular else ((x, y), None)
    if generator is None and tabular:
        generator = TabularGenerator(seed=args.seed)
        if not args.no_filter:
            generator = FilteredGenerator(generator, seed=args.seed)
    return members, encode, generator


def audit(args: argparse.Namespace):
    """The audit ``args`` ask for (``ValueError`` with a one-line message)."""
    from lightning_privacy.audits import audit_panoramia
    from lightning_privacy.commands import _audit_io as io

    if args.model is not None and args.model_class is not None:
        raise ValueError("give `--model` or its older spelling `--model-class`, not both")
    spec = args.model or args.model_class or DEFAULT_MODEL
    model_class = io.load_class(spec, "--model" if args.model_class is None else "--model-class")
    dm_args = io.json_object(args.datamodule_args, "--datamodule-args")
    defaults, options = {}, {}
    if args.datamodule is None:  # Adult: the checkpoint's saved split, else these defaults; flags override both
        flags = {"path": args.data_path, "val_fraction": args.val_fraction, "seed": args.split_seed}
        names = {"path": "`--data-path`", "val_fraction": "`--val-fraction`", "seed": "`--split-seed`"}
        flags = {k: v for k, v in flags.items() if v is not None}
        defaults = {"path": None, "val_fraction": 0.1, "seed": 0}
        options = {k: names[k] for k in flags if k not in dm_args}
        dm_args = {**flags, **dm_args}
    model, contents = io.load_checkpoint_model(args, model_class, warn=_warn)
    dm = io.datamodule(args.datamodule, dm_args, contents=contents, defaults=defaults, options=options, warn=_warn)
    io.check_member_count(dm, contents)
    members, encode, generator = _members(args, dm)
    return audit_panoramia(
        model,
        members,
        encode=encode,
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


def run(args: argparse.Namespace) -> int:
    if args.data != "adult":
        raise SystemExit(f"error: --data must be 'adult' (the only bundled tabular set), got {args.data!r}")
    if not 0 < args.member_fraction <= 1:
        raise SystemExit(f"error: --member-fraction must be in (0, 1], got {args.member_fraction!r}")
    start = time.perf_counter()
    try:
        result = audit(args)
    except (ValueError, TypeError) as err:
        print(f"lightning-privacy audit panoramia: error: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    for warning in result.warnings:
        print(f"lightning-privacy audit panoramia: warning: {warning}", file=sys.stderr)
    text = result.summary()
    out = {**result.to_dict(), "seconds": seconds, "report": text}
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(text)
        print(f"\naudit time: {seconds:.1f} s")
    if args.figure:
        result.figure().savefig(args.figure, dpi=120)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=2, allow_nan=False)
    return 0

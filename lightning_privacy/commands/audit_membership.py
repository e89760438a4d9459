"""``lightning-privacy audit membership``: RMIA, LiRA, the LOSS attack or EZ-MIA on a saved checkpoint.

The model and data are loaded as in ``audit epsilon-star``: ``--model pkg.module:Class`` and ``--datamodule
pkg.module:Class`` (default: the bundled :class:`~lightning_privacy.models.TabularMLP` and
:class:`~lightning_privacy.data.datamodule.AdultDataModule`), the datamodule rebuilt with the hyperparameters the
checkpoint saved for it, the checkpoint read by torch's weights-only loader, the modules
``DPSGD(fix_modules=True)`` replaced replaced again. Members are the datamodule's ``member_dataloader()`` (else its
``train_dataloader()``), non-members its ``val_dataloader()`` (``--nonmembers val``) or ``test_dataloader()``.

RMIA and LiRA need a *population* (rows neither member nor non-member) and reference models trained on halves of it:

- the population is the datamodule's ``population_dataloader()`` if it has one; otherwise the non-member rows are
  split in two by a permutation seeded with ``--seed``: the first half is the population, the second the audited
  non-members (the LOSS attack gets the same non-members, so the three attacks' numbers compare);
- the references are ``--model`` built untrained with the checkpoint's saved hyperparameters (and
  ``--model-args``), trained by :func:`~lightning_privacy.references.train_references` for ``--reference-epochs``
  (default: the epochs the checkpoint completed) and cached in ``--references DIR`` (a folder of an earlier run:
  nothing is trained again) or ``--cache-dir`` (default: ``<checkpoint>.references/`` next to the checkpoint).

When the checkpoint holds DPSGD's state, its privacy ledger is rebuilt from the saved history
(:func:`lightning_privacy.checkpoints.privacy_ledger`): the TPR bounds of the accountant for this in/out game (the
add/remove relation) sit beside the attack's and the figure (``--figure``) draws the ROC inside the region the
accountant allows. Where the population, references and ledger came from is printed on stderr and recorded in the
JSON; the result's warnings (an attack point beyond the accountant's bound, scores that look reversed) are
``warning:`` lines on stderr and the JSON's ``"warnings"`` and ``"outside"`` lists. ``--json`` prints exactly one JSON
object on stdout; ``--output`` writes it with the scores.

A claim, checked: ``--claim-epsilon E --claim-delta D`` ((ε, δ)-DP), or ``--claim-noise-multiplier S
--claim-sample-rate Q --claim-steps T [--claim-delta D]`` (T steps of a Poisson subsampled Gaussian; δ 1e-5 by
default), or, without these, the checkpoint's own ledger is the guarantee tested. The JSON's ``"verdict"`` is
``"consistent"`` or ``"contradicted"`` at confidence 1 − ``--alpha``, with the ``"evidence"`` that decided it and the
``"claim"``; the text ends with the verdict and the figure draws the claim's curve.

``--signal MODULE:FUNCTION`` scores examples that are not classification rows (a language model's sequences). It is
checked against ``--attack`` (a score such as Min-K% only with ``--attack loss``), and a datamodule whose batches are
mappings (``{"input_ids": ..., "attention_mask": ...}``) needs it: both refused in one line before any reference trains.

``--attack ezmia`` (a fine-tuned causal LM against its base; no references, no ``--signal``): the base of a PEFT model
is the checkpoint's model with its adapters disabled; a full fine-tune needs ``--base-model``, a checkpoint or
``state_dict`` file of the same ``--model`` (the weights fine-tuning started from), or ``init``: ``--model`` built
from the checkpoint's hyperparameters with the weights its constructor gives (a constructor that loads a pretrained
model), refused when two builds differ (random initialisation is no base).

``--model DIR``, a folder ``save_pretrained`` wrote (a causal LM's ``config.json`` and weights, or a PEFT adapter
folder's ``adapter_config.json``), is read offline by ``transformers.AutoModelForCausalLM`` (``peft``'s
``AutoPeftModelForCausalLM``) with ``local_files_only=True``, the same call as for a hub name: no ``--checkpoint``,
``--datamodule`` required, ``--attack loss --signal ...`` or ``--attack ezmia`` (its base: the adapters disabled, or
``--base-model DIR``, the base's ``save_pretrained`` folder). A folder with neither file is refused naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

NAME = "audit membership"
HELP = (
    "Reference-model membership attack (RMIA, LiRA), the LOSS baseline or EZ-MIA (an LM against its base) on a saved "
    "checkpoint; default data: Adult"
)
PREFIX = "lightning-privacy audit membership"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lightning_privacy.commands import _audit_io as io

    parser.add_argument(
        "--checkpoint",
        default=None,
        help="Lightning checkpoint (.ckpt) or state_dict file (required unless --model is a save_pretrained folder)",
    )
    parser.add_argument(
        "--attack", choices=("rmia", "lira", "loss", "ezmia"), default="rmia", help="the attack (default: %(default)s)"
    )
    parser.add_argument(
        "--base-model",
        default=None,
        metavar="PATH|DIR|init",
        help="EZ-MIA's base for a full fine-tune: a checkpoint or state_dict file of --model (the weights fine-tuning "
        "started from), a causal LM's save_pretrained folder, or 'init' (--model as its constructor builds it, e.g. "
        "from_pretrained); PEFT models: not needed",
    )
    io.add_model_arguments(parser, pretrained=True)
    refs = parser.add_argument_group("reference models (RMIA, LiRA)")
    refs.add_argument(
        "--references",
        default=None,
        metavar="DIR",
        help="folder of references cached by an earlier run (loaded, none trained); an empty one is filled",
    )
    refs.add_argument(
        "--num-references",
        type=int,
        default=None,
        help="reference models to train (default: 2, or as many as --references holds)",
    )
    refs.add_argument(
        "--reference-epochs",
        type=int,
        default=None,
        help="epochs each reference trains (default: the epochs the checkpoint completed)",
    )
    refs.add_argument(
        "--cache-dir",
        default=None,
        help="where to store newly trained references (default: <checkpoint>.references/ next to the checkpoint)",
    )
    attack = parser.add_argument_group("attack")
    attack.add_argument("--gamma", type=float, default=2.0, help="RMIA's gamma >= 1 (default: %(default)s)")
    attack.add_argument(
        "--offline-a", type=float, default=None, help="RMIA's offline a in [0, 1] (default: fitted on the references)"
    )
    attack.add_argument(
        "--alpha", type=float, default=0.05, help="significance of the intervals and bound (default: %(default)s)"
    )
    attack.add_argument(
        "--delta",
        type=float,
        default=None,
        help="delta of the epsilon lower bound (default: the run's, saved by DPSGD, else 1e-5)",
    )
    attack.add_argument("--seed", type=int, default=0, help="seeds the population split and the references (0)")
    attack.add_argument(
        "--signal",
        default=None,
        metavar="MODULE:FUNCTION",
        help="one membership loss per example from FUNCTION(model, batch) instead of the model's logits, e.g. "
        "lightning_privacy.functional.sequence_loss:causal_lm_signal for a causal language model (RMIA and LiRA then "
        "read each sequence's likelihood), or ...:min_k_percent_signal (Min-K%%, --attack loss only)",
    )
    claim = parser.add_argument_group(
        "a claimed guarantee to test (default: the checkpoint's own DP-SGD ledger, if it has one)"
    )
    claim.add_argument(
        "--claim-epsilon", type=float, default=None, metavar="E", help="claimed epsilon (with --claim-delta)"
    )
    claim.add_argument(
        "--claim-delta", type=float, default=None, metavar="D", help="claimed delta (default with --claim-steps: 1e-5)"
    )
    claim.add_argument(
        "--claim-noise-multiplier", type=float, default=None, metavar="S", help="claimed DP-SGD noise multiplier"
    )
    claim.add_argument("--claim-sample-rate", type=float, default=None, metavar="Q", help="claimed Poisson sample rate")
    claim.add_argument("--claim-steps", type=int, default=None, metavar="T", help="claimed number of DP-SGD steps")
    out = parser.add_argument_group("output")
    out.add_argument("--figure", default=None, help="write the log-log ROC (inside the accountant's region) here")
    out.add_argument("--output", default=None, help="write the JSON (with every score) to this file")
    out.add_argument("--json", action="store_true", help="print one JSON object (without the scores) on stdout")
    out.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def _warn(message: str) -> None:
    print(f"{PREFIX}: warning: {message}", file=sys.stderr)


def _say(message: str) -> None:
    print(f"{PREFIX}: {message}", file=sys.stderr)


def _check_options(args: argparse.Namespace) -> None:
    """Refuse out-of-range values before anything is loaded (one line naming the flag)."""
    from lightning_privacy.commands import _audit_io as io

    if io.is_pretrained_folder(args.model):
        io.check_pretrained_folder_options(args)
        if args.attack in ("rmia", "lira"):
            raise ValueError(
                f"`--attack {args.attack}` trains reference models with a Lightning Trainer, which a save_pretrained "
                f"folder (`--model` {args.model!r}) cannot give: use `--attack ezmia` or `--attack loss --signal ...`"
            )
        if args.base_model == "init":
            raise ValueError(
                "`--base-model init` builds `--model`'s class, but `--model` is a save_pretrained folder: give the "
                "base model's folder as `--base-model DIR`"
            )
    elif args.checkpoint is None:
        raise ValueError(
            "`--checkpoint` is required (the audited weights), unless `--model` is a causal LM's save_pretrained folder"
        )
    if args.delta is not None and not 0.0 < args.delta < 1.0:
        raise ValueError(f"`--delta` must be in the open interval (0, 1), got {args.delta!r}")
    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"`--alpha` must be in the open interval (0, 1), got {args.alpha!r}")
    if args.gamma < 1.0:
        raise ValueError(f"`--gamma` must be >= 1, got {args.gamma!r}")
    if args.offline_a is not None and not 0.0 <= args.offline_a <= 1.0:
        raise ValueError(f"`--offline-a` must be in [0, 1], got {args.offline_a!r}")
    if args.num_references is not None and args.num_references < 1:
        raise ValueError(f"`--num-references` must be >= 1, got {args.num_references!r}")
    if args.reference_epochs is not None and args.reference_epochs < 1:
        raise ValueError(f"`--reference-epochs` must be >= 1, got {args.reference_epochs!r}")
    if args.seed < 0:
        raise ValueError(f"`--seed` must be >= 0, got {args.seed!r}")
    if args.references is not None and args.cache_dir is not None:
        raise ValueError("give `--references DIR` (an earlier run's folder) or `--cache-dir DIR`, not both")
    if args.attack in ("loss", "ezmia") and (args.references, args.num_references, args.reference_epochs) != (
        None,
        None,
        None,
    ):
        raise ValueError(f"`--attack {args.attack}` uses no reference models: drop `--references`/`--num-references`")
    if args.base_model is not None and args.attack != "ezmia":
        raise ValueError(
            f"`--base-model` is EZ-MIA's reference: it needs `--attack ezmia`, got `--attack {args.attack}`"
        )
    if args.attack == "ezmia" and args.signal is not None:
        raise ValueError(
            "`--attack ezmia` scores sequences with its own signal (the Error Zone score): drop `--signal`"
        )
    claimed(args)


_DP_SGD_FLAGS = {
    "--claim-noise-multiplier": "claim_noise_multiplier",
    "--claim-sample-rate": "claim_sample_rate",
    "--claim-steps": "claim_steps",
}


def claimed(args: argparse.Namespace) -> Optional[Any]:
    """The :class:`~lightning_privacy.claims.Claim` of the ``--claim-*`` options, ``None`` without them.

    Raises:
        ValueError: one line naming the flag: a mix of the two forms, a missing flag, a value out of range.
    """
    from lightning_privacy.claims import Claim

    given = {flag for flag, attr in _DP_SGD_FLAGS.items() if getattr(args, attr) is not None}
    if args.claim_epsilon is not None and given:
        raise ValueError(
            f"give `--claim-epsilon` (with `--claim-delta`) or {sorted(given)[0]} and the other DP-SGD flags, not both"
        )
    if args.claim_epsilon is not None:
        if args.claim_delta is None:
            raise ValueError("`--claim-epsilon` needs `--claim-delta` (the delta of the claimed (epsilon, delta)-DP)")
        if not 0.0 <= args.claim_delta < 1.0:
            raise ValueError(f"`--claim-delta` must be in [0, 1), got {args.claim_delta!r}")
        if not args.claim_epsilon >= 0.0 or args.claim_epsilon == float("inf"):
            raise ValueError(f"`--claim-epsilon` must be a finite number >= 0, got {args.claim_epsilon!r}")
        return Claim.epsilon_delta(args.claim_epsilon, args.claim_delta)
    if given:
        missing = [flag for flag, attr in _DP_SGD_FLAGS.items() if getattr(args, attr) is None]
        if missing:
            raise ValueError(f"`{missing[0]}` is missing: a DP-SGD claim needs {', '.join(_DP_SGD_FLAGS)}")
        checks = (
            (
                "--claim-noise-multiplier",
                args.claim_noise_multiplier,
                0.0 < args.claim_noise_multiplier < float("inf"),
                "> 0",
            ),
            ("--claim-sample-rate", args.claim_sample_rate, 0.0 < args.claim_sample_rate <= 1.0, "in (0, 1]"),
            ("--claim-steps", args.claim_steps, args.claim_steps >= 1, ">= 1"),
        )
        for flag, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"`{flag}` must be {allowed}, got {value!r}")
        delta = 1e-5 if args.claim_delta is None else args.claim_delta
        if not 0.0 < delta < 1.0:
            raise ValueError(f"`--claim-delta` must be in (0, 1) for a DP-SGD claim, got {delta!r}")
        return Claim.dp_sgd(
            noise_multiplier=args.claim_noise_multiplier,
            sample_rate=args.claim_sample_rate,
            steps=args.claim_steps,
            delta=delta,
        )
    if args.claim_delta is not None:
        raise ValueError("`--claim-delta` needs `--claim-epsilon` or the `--claim-noise-multiplier` flags")
    return None


# --- data --------------------------------------------------------------------------------------
def _split(loader: Any, seed: int, train_batch_size: Optional[int]) -> Tuple[Any, Any, Dict[str, Any]]:
    """``(population, nonmembers, record)``: the non-member rows halved by a permutation seeded with ``seed``.

    The population loader has the training batch size (the references train on it), the non-members the loader's.
    """
    import numpy as np
    from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        raise ValueError(
            "the non-member data is not a DataLoader over a map-style dataset, so it cannot be split into a "
            "population and audited non-members: give the datamodule a `population_dataloader()`"
        )
    n = len(dataset)
    if n < 4:
        raise ValueError(f"{n} non-member rows are too few to split into a population and audited non-members")
    order = np.random.default_rng(np.random.SeedSequence(seed)).permutation(n)
    half = n // 2
    first, second = sorted(order[:half].tolist()), sorted(order[half:].tolist())

    def part(rows, batch_size):
        return DataLoader(Subset(dataset, rows), batch_size=batch_size, shuffle=False, collate_fn=loader.collate_fn)

    batch_size = loader.batch_size or 256
    population_batch_size = train_batch_size or batch_size
    record = {"population_rows": len(first), "nonmember_rows": len(second), "split_seed": seed}
    record["population_batch_size"] = population_batch_size
    return part(first, population_batch_size), part(second, batch_size), record


def _training_batch_size(dm: Any, contents: Any) -> Optional[int]:
    """The batch size the target trained with: the checkpoint's saved datamodule ``batch_size``, else the train loader's.

    The audit commands read the data with an evaluation batch size (Adult: 1024); the references train like the target.
    """
    from lightning_privacy.commands import _audit_io as io

    saved = contents.get("datamodule_hyper_parameters") if isinstance(contents, dict) else None
    size = saved.get("batch_size") if isinstance(saved, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return getattr(io._loader(dm, "train_dataloader"), "batch_size", None)


def _data(args: argparse.Namespace, dm: Any, contents: Any) -> Tuple[Any, Any, Any, Dict[str, Any]]:
    """``(members, nonmembers, population, record)`` of the datamodule (see the module's docstring)."""
    from lightning_privacy.commands import _audit_io as io

    members, nonmembers = io.member_batches(dm), io.nonmember_batches(dm, args.nonmembers)
    population = io._loader(dm, "population_dataloader")
    if population is not None and getattr(population, "dataset", None) is getattr(nonmembers, "dataset", False):
        population = None  # e.g. Adult's population is its test split: not with `--nonmembers test`
    if population is not None:
        from torch.utils.data import DataLoader, Dataset, IterableDataset

        dataset = getattr(population, "dataset", None)
        record = {"source": f"{type(dm).__name__}.population_dataloader()"}
        if hasattr(dataset, "__len__"):
            record["population_rows"] = len(dataset)
        train_batch_size = _training_batch_size(dm, contents)
        if (
            train_batch_size
            and isinstance(population, DataLoader)
            and isinstance(dataset, Dataset)
            and not isinstance(dataset, IterableDataset)
        ):  # the references train on it: with the target's batch size
            population = DataLoader(
                dataset, batch_size=train_batch_size, shuffle=False, collate_fn=population.collate_fn
            )
        record["population_batch_size"] = population.batch_size
        _say(f"population: {record['source']}; non-members: all of {type(dm).__name__}.{args.nonmembers}_dataloader()")
        return members, nonmembers, population, record
    population, nonmembers, record = _split(nonmembers, args.seed, _training_batch_size(dm, contents))
    record = {"source": f"first half of {type(dm).__name__}.{args.nonmembers}_dataloader() (seeded split)", **record}
    _say(
        f"population: {type(dm).__name__} has no population_dataloader(), so the {args.nonmembers} rows are split "
        f"by a permutation seeded with --seed {args.seed}: {record['population_rows']} population rows, "
        f"{record['nonmember_rows']} audited non-members"
    )
    return members, nonmembers, population, record


# --- references ----------------------------------------------------------------------------------
def checkpoint_epochs(contents: Any) -> Optional[int]:
    """Epochs the checkpoint's run completed: the fit loop's processed epochs, else ``epoch + 1``; ``None``: unknown.

    ``checkpoint["epoch"]`` alone is ambiguous: a ``ModelCheckpoint`` at the end of the first epoch saves 0, a
    ``trainer.save_checkpoint`` after ``fit(max_epochs=1)`` saves 1; the loop's progress counts both as one.
    """
    if not isinstance(contents, dict):
        return None
    try:
        done = int(contents["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"])
    except (KeyError, TypeError, ValueError):
        done = None
    if done:
        return done
    epoch = contents.get("epoch")
    return int(epoch) + 1 if isinstance(epoch, int) else None


def _factory(args: argparse.Namespace, model_class: Any, contents: Any):
    """A function returning ``model_class`` untrained, built as the checkpoint's model was (modules replaced too)."""
    import inspect

    from lightning_privacy.checkpoints import fixable_module_names, fixed_modules, replace_module, replay_fixes
    from lightning_privacy.commands import _audit_io as io

    try:
        import lightning.pytorch as pl

        lightning_module = inspect.isclass(model_class) and issubclass(model_class, pl.LightningModule)
    except ImportError:  # pragma: no cover
        lightning_module = False
    if not lightning_module:
        raise ValueError(
            f"`--model` {args.model} is not a LightningModule: reference models are trained by a Lightning Trainer; "
            "use `--attack loss`, or audit_membership with references you trained"
        )
    kwargs = {**io.saved_model_args(model_class, contents), **io.json_object(args.model_args, "--model-args")}
    record = fixed_modules(contents)

    def build() -> Any:
        try:
            model = model_class(**kwargs)
        except TypeError as err:
            raise ValueError(
                f"`--model-args` (over the checkpoint's hyperparameters) do not fit {args.model}: {err}"
            ) from None
        if record:
            replay_fixes(model, record)
        elif args.fix_modules:
            for name in fixable_module_names(model):
                replace_module(model, name)
        return model

    build()  # fail here, before any training, if the class cannot be built
    return build


def _dp_recipe(contents: Any, delta: float) -> Optional[Dict[str, Any]]:
    """``DPSGD`` arguments training the references like the target (σ and C of the checkpoint), or ``None``.

    As the :class:`~lightning_privacy.MembershipAudit` callback: references of a DP-SGD target are trained with
    DP-SGD at the same σ, C, loss reduction and gradient mode (checkpoints from before DPSGD saved the last two:
    DPSGD's defaults).
    """
    from lightning_privacy.checkpoints import dpsgd_state

    state = dpsgd_state(contents)
    if state is None:
        return None
    sigma, norm = state.get("noise_multiplier"), state.get("max_grad_norm")
    if not isinstance(sigma, (int, float)) or sigma <= 0 or not isinstance(norm, (int, float)):
        return None
    recipe = {
        "noise_multiplier": float(sigma),
        "max_grad_norm": float(norm),
        "delta": delta,
        "accountant": str(state.get("accountant", "rdp")),
    }
    for key in ("loss_reduction", "grad_sample_mode"):  # saved since DPSGD records its recipe
        if isinstance(state.get(key), str):
            recipe[key] = state[key]
    return recipe


def _cache_folder(args: argparse.Namespace) -> Path:
    if args.references is not None:
        return Path(args.references)
    if args.cache_dir is not None:
        return Path(args.cache_dir)
    return Path(f"{args.checkpoint}.references")


def _references(args, model_class, contents, population, delta: float) -> Tuple[Any, Dict[str, Any]]:
    """The reference models (trained or loaded) and what the JSON records of them."""
    from lightning_privacy.references import train_references

    folder = _cache_folder(args)
    option = "--references" if args.references is not None else "--cache-dir"
    stored: Dict[str, Any] = {}
    meta = folder / "references.json"
    if meta.is_file():
        try:
            stored = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"`{option}` {str(folder)!r}: references.json cannot be read: {err}") from None
    elif args.references is not None and folder.exists() and not folder.is_dir():
        raise ValueError(f"`--references` {args.references!r} is not a folder")
    k = args.num_references or stored.get("num_references") or 2
    recipe = stored.get("recipe") if isinstance(stored.get("recipe"), dict) else {}
    if args.reference_epochs is not None:
        epochs, source = args.reference_epochs, "--reference-epochs"
    elif recipe.get("max_epochs"):
        epochs, source = recipe["max_epochs"], f"as cached in {folder}"
    else:
        epochs, source = checkpoint_epochs(contents), "the epochs the checkpoint completed"
    if epochs is None:
        raise ValueError(
            "the checkpoint does not record how many epochs it trained: give `--reference-epochs N` (the references "
            "train like the audited model)"
        )
    trainer_kwargs: Dict[str, Any] = {"max_epochs": int(epochs), "accelerator": "cpu"}
    dp = _dp_recipe(contents, delta)
    cached = [j for j in range(k) if (folder / f"reference_{j}.pt").is_file()] if stored else []
    if len(cached) == k:
        _say(f"references: loading {k} reference model(s) from {folder}")
    else:
        how = (
            ""
            if dp is None
            else f" with DP-SGD like the target's (sigma {dp['noise_multiplier']:g}, C {dp['max_grad_norm']:g})"
        )
        _say(
            f"references: training {k - len(cached)} reference model(s) for {epochs} epoch(s) ({source}){how} into "
            f"{folder} (reuse them with `--references {folder}`)"
        )
    factory = _factory(args, model_class, contents)
    try:
        with warnings.catch_warnings():  # the references train without validation data, on purpose
            warnings.filterwarnings("ignore", message=r".*`validation_step` but have no `val_dataloader`.*")
            refs = train_references(
                factory,
                population,
                num_references=k,
                trainer_kwargs=trainer_kwargs,
                cache_dir=str(folder),
                seed=args.seed,
                dp_sgd=dp,
                progress=False if args.quiet else None,
            )
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{option}` {str(folder)!r}: {err}") from None
    record = {
        "cache_dir": str(folder),
        "num_references": len(refs),
        "trained": refs.trained,
        "loaded": len(refs) - refs.trained,
        "epochs": int(epochs),
        "dp_sgd": dp,
        "training_seconds": list(refs.seconds),
    }
    _say(f"references: {refs.trained} trained, {len(refs) - refs.trained} loaded from {folder}")
    return refs, record


# --- the ledger ------------------------------------------------------------------------------------
def _ledger(contents: Any, delta: float) -> Tuple[Any, Optional[Dict[str, Any]]]:
    from lightning_privacy.checkpoints import privacy_ledger

    ledger = privacy_ledger(contents, delta=delta)
    if ledger is None or ledger.steps == 0:
        _say("ledger: the checkpoint holds no DP-SGD history, so the ROC is drawn without the accountant's region")
        return None, None
    record = {
        "source": "DPSGD state in the checkpoint",
        "accountant": ledger.mechanism,
        "steps": ledger.steps,
        "epsilon": ledger.epsilon(delta),
        "delta": delta,
    }
    _say(
        f"ledger: DP-SGD history of {ledger.steps} step(s) from the checkpoint ({ledger.mechanism} accountant, "
        f"epsilon {record['epsilon']:.4g} at delta {delta:g}); the attack is checked against its TPR bounds"
    )
    return ledger, record


# --- EZ-MIA's base -----------------------------------------------------------------------------------
def _ezmia_signal(args: argparse.Namespace, model_class: Any, model: Any, contents: Any) -> Any:
    """EZ-MIA's signal with its base (see the module's docstring); ``ValueError`` (one line) without one."""
    import torch

    from lightning_privacy.commands import _audit_io as io
    from lightning_privacy.functional.base_reference import ErrorZoneSignal

    base = None
    if io.is_pretrained_folder(args.base_model):
        base = io.load_pretrained(args.base_model, "--base-model")
        _say(f"base model: {args.base_model} (save_pretrained folder, read offline)")
    elif model_class is None and args.base_model is not None:
        raise ValueError(
            f"`--base-model` {args.base_model!r}: with `--model` a save_pretrained folder, the base is a "
            "save_pretrained folder too (no class to load a checkpoint file into)"
        )
    elif args.base_model == "init":
        build = _factory(args, model_class, contents)
        base, again = build(), build()
        if any(not torch.equal(a, b) for a, b in zip(base.state_dict().values(), again.state_dict().values())):
            raise ValueError(
                f"`--base-model init`: two builds of `--model` {args.model} have different weights (a random "
                "initialisation), so its constructor does not give the model fine-tuning started from: pass that "
                "model's checkpoint or state_dict file as `--base-model PATH`"
            )
        _say("base model: --model as its constructor builds it (--base-model init; two builds agree)")
    elif args.base_model is not None:
        try:
            kwargs = {**io.saved_model_args(model_class, contents), **io.json_object(args.model_args, "--model-args")}
            base = io.load_model(model_class, args.base_model, kwargs)  # a bare state_dict: built as the checkpoint's
        except ValueError as err:
            raise ValueError(str(err).replace("`--checkpoint`", "`--base-model`", 1)) from None
        _say(f"base model: {args.base_model}")
    signal = ErrorZoneSignal(None if base is None else base.eval())
    try:
        how = signal.check(model)
    except ValueError as err:
        raise ValueError(f"{err} (here: `--base-model PATH` or `--base-model init`)") from None
    if base is None:
        _say(f"base model: {how} (PEFT)")
    return signal


# --- the audit ---------------------------------------------------------------------------------------
def audit(args: argparse.Namespace) -> Tuple[Any, Dict[str, Any]]:
    """``(result, record)``: the attack ``args`` ask for and where its inputs came from (``ValueError``: one line)."""
    from lightning_privacy.audits import audit_membership
    from lightning_privacy.commands import _audit_io as io

    folder = io.is_pretrained_folder(args.model)
    model_class = None if folder else io.load_class(args.model, "--model")
    signal_fn = io.load_signal(args.signal)
    if signal_fn is not None and args.attack != "loss":  # refused here, not after the references trained
        from lightning_privacy.functional.sequence_loss import signal_kind

        if signal_kind(signal_fn) == "score":
            raise ValueError(
                f"`--attack {args.attack}` needs a likelihood Pr(x | θ) from every model, but `--signal` "
                f"{args.signal!r} gives a score (kind 'score', e.g. Min-K%): use it with `--attack loss`, or give RMIA "
                f"and LiRA a likelihood signal such as `--signal {io.SIGNAL_EXAMPLE}`"
            )
    dm_args = io.datamodule_args(args)
    if folder:  # a save_pretrained folder: the weights and nothing else (no DP-SGD state, no saved hyperparameters)
        model, contents = io.load_pretrained(args.model, "--model"), {}
        _say(f"model: {args.model} (save_pretrained folder, read offline)")
    else:
        model, contents = io.load_checkpoint_model(args, model_class, warn=_warn)
    dm = io.datamodule(args.datamodule, stage_test=args.nonmembers == "test", contents=contents, warn=_warn, **dm_args)
    io.check_member_count(dm, contents)
    members, nonmembers, population, population_record = _data(args, dm, contents)
    if args.attack == "ezmia":  # its own signal, against the base (refused here for a full fine-tune without one)
        signal_fn = _ezmia_signal(args, model_class, model, contents)
    io.refuse_mapping_members(members, signal_fn)  # a language model's batches without --signal: before any training
    delta = args.delta
    if delta is None:  # the run's δ where DPSGD saved it, else 1e-5
        from lightning_privacy.checkpoints import dpsgd_state

        saved = (dpsgd_state(contents) or {}).get("delta")
        delta = float(saved) if isinstance(saved, float) and 0.0 < saved < 1.0 else 1e-5
    ledger, ledger_record = _ledger(contents, delta)
    claim = claimed(args)
    if claim is not None:
        _say(f"claim: {claim.label} (epsilon {claim.epsilon:.4g} at delta {claim.delta:g}, add/remove), from --claim-*")
    elif ledger is not None:
        from lightning_privacy.claims import Claim

        claim = Claim.from_ledger(ledger)
        _say(f"claim: the checkpoint's ledger, {claim.label} (epsilon {claim.epsilon:.4g} at delta {claim.delta:g})")
    refs, refs_record = None, None
    if args.attack not in ("loss", "ezmia"):
        refs, refs_record = _references(args, model_class, contents, population, delta)
    result = audit_membership(
        model.eval(),
        members,
        nonmembers,
        attack=args.attack,
        references=refs,
        population_loader=population if args.attack == "rmia" else None,
        ledger=ledger,
        claim=claim,
        alpha=args.alpha,
        delta=delta,
        gamma=args.gamma,
        offline_a=args.offline_a,
        device="cpu",
        warn=False,
        signal_fn=signal_fn,
    )
    record = {
        "checkpoint": args.checkpoint,
        "model": args.model,
        "datamodule": type(dm).__name__,
        "nonmembers": args.nonmembers,
        "population": population_record,
        "references": refs_record,
        "ledger": ledger_record,
    }
    if args.attack == "ezmia":
        record["base_model"] = args.base_model or "the checkpoint's model with its adapters disabled"
    return result, record


def run(args: argparse.Namespace) -> int:
    import logging

    start = time.perf_counter()
    try:
        _check_options(args)  # before the slow imports
        import lightning.pytorch  # noqa: F401  (its loggers exist from here on)

        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no "GPU available" per reference
        result, record = audit(args)
    except ValueError as err:
        print(f"{PREFIX}: error: {err}", file=sys.stderr)
        return 2
    for message in (*result.outside, *result.warnings):
        _warn(message)
    if result.verdict is not None:
        _say(f"verdict: the claim {result.claim.label} is {result.claim_verdict.sentence()}")
    text = result.summary()
    full = {**result.to_dict(), **record, "seconds": time.perf_counter() - start, "report": text}
    shown = {k: v for k, v in full.items() if k not in ("scores", "is_member")}
    if args.json:
        print(json.dumps(shown, indent=2, allow_nan=False))
    else:
        print(text)
        if record["references"] is not None:
            r = record["references"]
            print(f"\nreferences: {r['num_references']} in {r['cache_dir']} ({r['trained']} trained by this run)")
    if args.figure:
        result.figure().savefig(args.figure, dpi=120)
        _say(f"figure: {args.figure}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(full, handle, indent=2, allow_nan=False)
    return 0

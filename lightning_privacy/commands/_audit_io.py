"""What the ``audit`` commands share: classes by name, JSON options, safe checkpoints, datamodules, loss files.

A checkpoint of a DP-SGD run loads into the user's class after the modules ``DPSGD(fix_modules=True)``
replaced in training are replaced the same way; its datamodule is rebuilt with the hyperparameters the
checkpoint saved for it; where DPSGD recorded the training-set size, members of another size are refused.

Every failure here is a ``ValueError`` with a one-line message naming the option and the value; the
commands print it as ``lightning-privacy audit ...: error: ...`` and exit with status 2 (no traceback).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

ADULT_DATAMODULE = "lightning_privacy.data.datamodule:AdultDataModule"


def _import(module_name: str) -> Any:
    """``importlib.import_module``, also finding a module in the current folder, as ``python -m`` would.

    A console script's ``sys.path`` starts at its own ``bin`` folder, so ``my_project:Net`` next to the
    user would not be found; the current folder is added (last, so it never shadows an installed package)
    only when the top-level module is missing.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def load_class(spec: str, option: str = "--model") -> Any:
    """The object named ``package.module:Name`` (``package.module.Name`` is accepted too).

    The module is imported from ``sys.path`` or, failing that, from the current folder.
    """
    module_name, sep, name = spec.partition(":")
    if not sep and "." in spec:  # the older dotted form, e.g. --model-class pkg.mod.Class
        module_name, _, name = spec.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"`{option}` must look like 'package.module:Class', got {spec!r}")
    try:
        return getattr(_import(module_name), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"`{option}` {spec!r} cannot be imported: {err}") from err


def json_object(text: Optional[str], option: str) -> dict:
    """A JSON object given on the command line (``None`` = ``{}``)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"`{option}` must be a JSON object, got {text!r}: {err}") from err
    if not isinstance(value, dict):
        raise ValueError(f"`{option}` must be a JSON object like '{{\"batch_size\": 256}}', got {text!r}")
    return value


# --- checkpoints -----------------------------------------------------------------------------
def read_checkpoint(path: str) -> Any:
    """The checkpoint's contents, read by torch's weights-only loader: tensors and plain values, nothing else.

    A file that holds more (pickled Python objects: classes, functions, ``os.system`` calls ...) is
    refused before anything in it runs: unpickling an untrusted file can execute arbitrary code.

    Raises:
        ValueError: a one-line refusal naming the file and the risk, or a file torch cannot read.
    """
    import pickle

    import torch

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"`--checkpoint` {path!r} is not a file")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported operand" in str(err):  # not a pickle stream at all (text, a truncated file, ...)
            raise ValueError(f"`--checkpoint` {path!r} is not a checkpoint torch can read") from None
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f" (it references `{found.group(1)}`)" if found else ""
        raise ValueError(
            f"refused `--checkpoint` {path!r}: it holds more than plain weights{what}, and loading it would let "
            "the file run code on this machine; audit only a checkpoint of tensors and plain values (e.g. "
            "`trainer.save_checkpoint(...)` of a model whose hyperparameters are plain, or "
            "`torch.save(model.state_dict(), ...)`)"
        ) from None
    except Exception as err:  # not a torch file at all (zip/pickle errors of many kinds)
        raise ValueError(f"`--checkpoint` {path!r} is not a checkpoint torch can read: {err}") from None


def load_checkpoint_model(args: Any, model_class: Any, *, warn: Any) -> Tuple[Any, Dict[str, Any]]:
    """The model of ``--checkpoint`` (with ``--model-args``, ``--fix-modules``) and the checkpoint's contents."""
    contents = read_checkpoint(args.checkpoint)
    try:
        model = load_model(
            model_class,
            args.checkpoint,
            json_object(args.model_args, "--model-args"),
            contents=contents,
            fix_modules=True if args.fix_modules else None,
            warn=warn,
        )
    except ValueError as err:
        if getattr(args, "model", None) != DEFAULT_MODEL:
            raise
        raise ValueError(
            f"`--checkpoint` {args.checkpoint!r} was not trained with the default module {DEFAULT_MODEL} ({err}): "
            "name its LightningModule with `--model module:Class` (and its data with `--datamodule module:Class`)"
        ) from None
    return model, contents


def load_model(
    model_class: Any,
    path: str,
    model_args: dict,
    *,
    contents: Any = None,
    fix_modules: Optional[bool] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> Any:
    """The model of a checkpoint, loaded weights-only (:func:`read_checkpoint`).

    A Lightning checkpoint (with ``state_dict``) goes through ``model_class.load_from_checkpoint`` with
    ``weights_only=True`` (its saved hyperparameters, overridden by ``model_args``); a bare
    ``state_dict`` is loaded into ``model_class(**model_args)``. The modules ``DPSGD(fix_modules=True)``
    replaced in training are replaced the same way first (:func:`lightning_privacy.checkpoints.build_model`),
    and ``warn`` gets one line naming them. ``contents``: the checkpoint already read.
    """
    from lightning_privacy.checkpoints import build_model, replaced_message

    contents = read_checkpoint(path) if contents is None else contents
    try:
        model, replaced = build_model(model_class, path, contents, model_args, fix_modules=fix_modules)
    except (TypeError, RuntimeError, KeyError, ValueError) as err:
        raise ValueError(f"`--checkpoint` {path!r} does not fit `--model` {model_class.__name__}: {err}") from None
    if replaced and warn is not None:
        warn(replaced_message(model_class, replaced))
    return model


def is_pretrained_folder(spec: Optional[str]) -> bool:
    """Whether ``spec`` (``--model`` or ``--base-model``) names a folder (a ``save_pretrained`` one, or refused)."""
    return spec is not None and spec != "init" and Path(spec).is_dir()


def check_pretrained_folder_options(args: Any) -> None:
    """``--model DIR`` (a save_pretrained folder) holds the weights: refuse ``--checkpoint`` beside it and a missing
    ``--datamodule`` (the sequences it is audited on), one line naming the flag."""
    if args.checkpoint is not None:
        raise ValueError(
            f"`--model` {args.model!r} is a folder (save_pretrained): it holds the weights, so drop `--checkpoint`"
        )
    if args.datamodule is None:
        raise ValueError(
            f"`--model` {args.model!r} is a folder (save_pretrained): name the sequences it is audited on with "
            "`--datamodule module:Class` (members from its train_dataloader(), non-members from its val_dataloader())"
        )


def load_pretrained(path: str, option: str = "--model") -> Any:
    """The causal LM a ``save_pretrained`` folder holds, read offline (``local_files_only=True``), in eval mode.

    A folder with ``adapter_config.json`` (PEFT adapters) goes through ``peft.AutoPeftModelForCausalLM`` (its base
    model, named in that file, must be a local folder or already cached), one with ``config.json`` through
    ``transformers.AutoModelForCausalLM``: the same call as for a hub name, so the hub path differs only in where
    the files come from. The model is returned as is: the sequence signals read its ``.logits``.

    Raises:
        ValueError: one line naming ``option`` and the folder: neither file in it, the library missing, or a
            folder the library cannot read.
    """
    folder = Path(path)
    if (folder / "adapter_config.json").is_file():
        what, module, name = "a PEFT adapter folder", "peft", "AutoPeftModelForCausalLM"
    elif (folder / "config.json").is_file():
        what, module, name = "a save_pretrained folder", "transformers", "AutoModelForCausalLM"
    else:
        raise ValueError(
            f"`{option}` {path!r} is a folder without config.json or adapter_config.json, so not one `save_pretrained` "
            "wrote: give a causal LM's save_pretrained folder (or PEFT adapters'), or a class as module:Class"
        )
    try:
        loader = getattr(importlib.import_module(module), name)
    except ImportError:
        raise ValueError(
            f'`{option}` {path!r} is {what}: reading it needs `{module}` (pip install -e ".[lm]")'
        ) from None
    try:
        model = loader.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"`{option}` {path!r} ({what}) cannot be loaded offline by {name}: {first}") from None
    return model.eval()


# --- data ------------------------------------------------------------------------------------
def _saved_init_args(cls: Any, contents: Any, key: str, name_key: str) -> dict:
    """The hyperparameters a checkpoint saved under ``key`` that ``cls.__init__`` takes (see below)."""
    saved = contents.get(key) if isinstance(contents, Mapping) else None
    if not isinstance(saved, Mapping):
        return {}
    saved = dict(saved)
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return saved
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = [n for i, (n, p) in enumerate(parameters.items()) if i > 0 and p.kind not in kinds]
    as_one = contents.get(name_key)
    if as_one in named:
        return {as_one: saved}
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return saved
    return {k: v for k, v in saved.items() if k in named}


def saved_datamodule_args(cls: Any, contents: Any) -> dict:
    """The datamodule hyperparameters a checkpoint saved (``self.save_hyperparameters()``) that ``cls`` takes.

    As Lightning's ``load_from_checkpoint``: names ``cls.__init__`` does not take are left out (unless it
    takes ``**kwargs``), and hyperparameters saved as one argument (``save_hyperparameters(hparams)``) are
    passed as that argument.
    """
    return _saved_init_args(cls, contents, "datamodule_hyper_parameters", "datamodule_hparams_name")


def saved_model_args(cls: Any, contents: Any) -> dict:
    """The module hyperparameters a checkpoint saved (``hyper_parameters``) that ``cls`` takes, as for a datamodule.

    ``cls(**saved_model_args(cls, contents))`` is the untrained model ``cls.load_from_checkpoint`` would fill.
    """
    return _saved_init_args(cls, contents, "hyper_parameters", "hparams_name")


def datamodule(
    spec: Optional[str],
    args: dict,
    *,
    stage_test: bool = False,
    contents: Any = None,
    defaults: Optional[dict] = None,
    reading: Optional[dict] = None,
    options: Optional[Mapping[str, str]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> Any:
    """The datamodule ``spec`` (default: Adult) as trained, prepared and set up.

    Built with ``defaults``, over them the hyperparameters the checkpoint ``contents`` saved for its
    datamodule (:func:`saved_datamodule_args`), over them ``reading`` (arguments that only change how the
    rows are read, such as Adult's evaluation batch size) and ``args``. Each of ``args`` that changes a
    saved value goes to ``warn``, named as ``options`` says (default: ``--datamodule-args``).
    """
    cls = load_class(spec or ADULT_DATAMODULE, "--datamodule")
    saved = saved_datamodule_args(cls, contents) if contents is not None else {}
    for key, value in args.items():
        if key in saved and value != saved[key] and warn is not None:
            option = (options or {}).get(key, "`--datamodule-args`")
            warn(
                f"{option} sets {key}={value!r} over {key}={saved[key]!r}, the checkpoint's saved datamodule "
                f"hyperparameter: the audit's members and non-members are those of {key}={value!r}"
            )
    try:
        dm = cls(**{**(defaults or {}), **saved, **(reading or {}), **args})
    except TypeError as err:
        where = " (with the checkpoint's saved datamodule hyperparameters)" if saved else ""
        raise ValueError(f"`--datamodule-args`{where} do not fit {cls.__name__}: {err}") from None
    for hook in ("prepare_data",):
        if callable(getattr(dm, hook, None)):
            getattr(dm, hook)()
    if callable(getattr(dm, "setup", None)):
        dm.setup("fit")
        if stage_test:
            dm.setup("test")
    return dm


def check_member_count(dm: Any, contents: Any) -> None:
    """Refuse members of another size than the training set the checkpoint's DPSGD recorded (if it did)."""
    from lightning_privacy.checkpoints import training_set_size

    trained = training_set_size(contents)
    hook = "member_dataloader" if _loader(dm, "member_dataloader") is not None else "train_dataloader"
    dataset = getattr(member_batches(dm), "dataset", None)
    if trained is None or not hasattr(dataset, "__len__") or len(dataset) == trained:
        return
    raise ValueError(
        f"the checkpoint was trained by DPSGD on {trained} examples, but {type(dm).__name__}.{hook}() gives "
        f"{len(dataset)} members: the audit would be about another member set; build the datamodule as in "
        "training (`--datamodule-args`; a datamodule that calls `self.save_hyperparameters()` is rebuilt with the "
        "checkpoint's saved ones)"
    )


def _loader(dm: Any, hook: str) -> Any:
    fn = getattr(dm, hook, None)
    if not callable(fn):
        return None
    try:
        loader = fn()
    except NotImplementedError:
        return None
    if isinstance(loader, (list, tuple)):  # several loaders: the first (an empty list: none)
        loader = loader[0] if loader else None
    return loader


def member_batches(dm: Any) -> Any:
    """The datamodule's ``member_dataloader()`` if it has one, else its ``train_dataloader()``."""
    loader = _loader(dm, "member_dataloader") or _loader(dm, "train_dataloader")
    if loader is None:
        raise ValueError(f"{type(dm).__name__} has neither member_dataloader() nor train_dataloader()")
    return loader


def nonmember_batches(dm: Any, which: str) -> Any:
    """The datamodule's ``val_dataloader()`` (``which="val"``) or ``test_dataloader()``."""
    loader = _loader(dm, f"{which}_dataloader")
    if loader is None or (hasattr(loader, "__len__") and len(loader) == 0):
        other = "test" if which == "val" else "val"
        raise ValueError(
            f"`--nonmembers {which}`: {type(dm).__name__}.{which}_dataloader() gives no data; use `--nonmembers {other}`"
        )
    return loader


SIGNAL_EXAMPLE = "lightning_privacy.functional.sequence_loss:causal_lm_signal"


def load_signal(spec: Optional[str]) -> Any:
    """The function of ``--signal MODULE:FUNCTION`` (``None`` without the flag); ``ValueError`` naming the flag."""
    if spec is None:
        return None
    signal_fn = load_class(spec, "--signal")
    if not callable(signal_fn):
        raise ValueError(f"`--signal` {spec!r} is not a function signal(model, batch) -> losses")
    return signal_fn


def refuse_mapping_members(members: Any, signal_fn: Any) -> None:
    """Without ``--signal``, refuse members whose batches are mappings (a language model's ``{"input_ids": ...}``),
    from their first batch: one line naming ``--signal``, before anything is trained or scored."""
    from lightning_privacy.audits._common import refuse_mapping_batches

    fix = (
        f"for a causal language model pass `--signal {SIGNAL_EXAMPLE}`, one loss per sequence, or "
        "`--signal MODULE:FUNCTION` of your own returning one loss per example"
    )
    refuse_mapping_batches(members, signal_fn=signal_fn, fix=fix)


def read_values(path: str, option: str) -> Any:
    """A 1-D float array from ``.npy`` (no pickles) or text (``.csv``/``.txt``: one value a line; ``#`` comments)."""
    import numpy as np

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"`{option}` {path!r} is not a file")
    try:
        if file.suffix == ".npy":
            values = np.load(file, allow_pickle=False)
        else:
            values = np.loadtxt(file, dtype=np.float64, delimiter=",", comments="#", ndmin=1)
    except ValueError as err:
        raise ValueError(f"`{option}` {path!r} is not one number a line (or a .npy array): {err}") from None
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"`{option}` {path!r} must hold one value per example, got shape {values.shape}")
    return values


# --- the checkpoint audits' model and data options ---------------------------------------------------
DEFAULT_MODEL = "lightning_privacy.models:TabularMLP"
ADULT_DEFAULTS = {"data_path": None, "batch_size": 1024, "val_fraction": 0.1, "split_seed": 0}
ADULT_KEYS = {"data_path": "path", "batch_size": "batch_size", "val_fraction": "val_fraction", "split_seed": "seed"}


def add_model_arguments(parser: Any, title: str = "model and data", *, pretrained: bool = False) -> None:
    """The options that say how to rebuild a checkpoint's model and data: ``--model``, ``--model-args``,
    ``--datamodule``, ``--datamodule-args``, ``--fix-modules``, ``--nonmembers`` and Adult's flags (read back by
    :func:`datamodule_args`); ``pretrained``: ``--model`` also takes a ``save_pretrained`` folder (its help says so)."""
    model = parser.add_argument_group(title)
    model.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="LightningModule class as module:Class (default: %(default)s)"
        + (
            ", or a causal LM's save_pretrained folder (PEFT adapters too; read offline, no --checkpoint)"
            if pretrained
            else ""
        ),
    )
    model.add_argument("--model-args", default=None, help="JSON object of constructor arguments for --model")
    model.add_argument(
        "--datamodule", default=None, help="LightningDataModule class as module:Class (default: Adult's)"
    )
    model.add_argument(
        "--datamodule-args",
        default=None,
        help="JSON object of constructor arguments (over the hyperparameters the checkpoint saved for its datamodule)",
    )
    model.add_argument(
        "--fix-modules",
        action="store_true",
        help="replace the layers Opacus has a fixer for before loading, as DPSGD(fix_modules=True) did in training "
        "(needed only for checkpoints that do not record it)",
    )
    model.add_argument(
        "--nonmembers", choices=("val", "test"), default="val", help="non-member data (default: %(default)s)"
    )
    adult = parser.add_argument_group("Adult (the default datamodule; the split defaults to the checkpoint's)")
    adult.add_argument("--data-path", default=None, help="folder with adult.data / adult.test (default: bundled)")
    adult.add_argument("--val-fraction", type=float, default=None, help="validation share used in training (0.1)")
    adult.add_argument("--split-seed", type=int, default=None, help="seed of the train/validation split (0)")
    adult.add_argument("--batch-size", type=int, default=None, help="evaluation batch size (1024)")


def datamodule_args(args: Any) -> dict:
    """Keyword arguments of :func:`datamodule` (beside the checkpoint) from the :func:`add_model_arguments` options."""
    given = json_object(args.datamodule_args, "--datamodule-args")
    adult_flags = {k: getattr(args, k) for k in ADULT_DEFAULTS if getattr(args, k) is not None}
    if args.datamodule is not None:
        if adult_flags:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in adult_flags)
            raise ValueError(f"{flags} only apply to the default Adult datamodule; use `--datamodule-args`")
        return {"args": given}
    # Adult: the split the checkpoint saved (else the defaults), under the flags; the evaluation batch size is the
    # flag's or 1024, not the training batch size the checkpoint saved
    batch_size = adult_flags.pop("batch_size", ADULT_DEFAULTS["batch_size"])
    return {
        "args": {**{ADULT_KEYS[k]: v for k, v in adult_flags.items()}, **given},
        "defaults": {ADULT_KEYS[k]: v for k, v in ADULT_DEFAULTS.items() if k != "batch_size"},
        "reading": {"batch_size": batch_size},
        "options": {ADULT_KEYS[k]: f"`--{k.replace('_', '-')}`" for k in adult_flags if ADULT_KEYS[k] not in given},
    }

"""What the ``audit`` commands share: classes by name, JSON options, safe checkpoints, datamodules, loss files.

Every failure here is a ``ValueError`` with a one-line message naming the option and the value; the
commands print it as ``lightning-privacy audit ...: error: ...`` and exit with status 2 (no traceback).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

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


def load_model(model_class: Any, path: str, model_args: dict) -> Any:
    """The model of a checkpoint, loaded weights-only (:func:`read_checkpoint`).

    A Lightning checkpoint (with ``state_dict``) goes through ``model_class.load_from_checkpoint`` with
    ``weights_only=True`` (its saved hyperparameters, overridden by ``model_args``); a bare
    ``state_dict`` is loaded into ``model_class(**model_args)``.
    """
    contents = read_checkpoint(path)
    try:
        if isinstance(contents, dict) and "state_dict" in contents and hasattr(model_class, "load_from_checkpoint"):
            return model_class.load_from_checkpoint(path, map_location="cpu", weights_only=True, **model_args)
        if isinstance(contents, dict) and "state_dict" in contents:
            contents = contents["state_dict"]
        model = model_class(**model_args)
        model.load_state_dict(contents)
    except (TypeError, RuntimeError, KeyError) as err:
        raise ValueError(f"`--checkpoint` {path!r} does not fit `--model` {model_class.__name__}: {err}") from None
    return model


# --- data ------------------------------------------------------------------------------------
def datamodule(spec: Optional[str], args: dict, *, stage_test: bool = False) -> Any:
    """The datamodule ``spec`` (default: Adult) built with ``args``, prepared and set up."""
    cls = load_class(spec or ADULT_DATAMODULE, "--datamodule")
    try:
        dm = cls(**args)
    except TypeError as err:
        raise ValueError(f"`--datamodule-args` do not fit {cls.__name__}: {err}") from None
    for hook in ("prepare_data",):
        if callable(getattr(dm, hook, None)):
            getattr(dm, hook)()
    if callable(getattr(dm, "setup", None)):
        dm.setup("fit")
        if stage_test:
            dm.setup("test")
    return dm


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

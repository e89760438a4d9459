"""Reading a checkpoint for a statement: ``torch.load(weights_only=True)``, tensors and plain values, nothing else."""

from __future__ import annotations

import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Mapping, Union

__all__ = ["read_checkpoint"]


def read_checkpoint(path: Union[str, os.PathLike]) -> Mapping[str, Any]:
    """A checkpoint's contents, read with ``torch.load(weights_only=True)``: tensors and plain values, nothing else.

    A file that holds pickled Python objects (classes, functions) is refused before anything in it runs. Large files
    are memory-mapped where torch can, so reading a statement does not load every weight.

    Raises:
        FileNotFoundError: no file at ``path`` (the message names it).
        ValueError: not a file torch can read, a file that holds more than plain values, or contents that are not a
            checkpoint (a dict); each message names the path.
    """
    import torch

    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r}: no such file")
    if not file.is_file():
        raise ValueError(f"checkpoint {str(path)!r} is not a file")
    try:
        with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the error below says enough
            warnings.simplefilter("ignore")
            try:
                contents = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:  # a file of torch's legacy format cannot be memory-mapped
                if "mmap" not in str(err):
                    raise
                contents = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported operand" in str(err) or "invalid load key" in str(err):
            raise ValueError(
                f"checkpoint {str(path)!r} is not a file torch can read (no checkpoint of torch.save)"
            ) from None
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f" (it references `{found.group(1)}`)" if found else ""
        raise ValueError(
            f"refused checkpoint {str(path)!r}: it holds more than tensors and plain values{what}, and loading it "
            "would let the file run code on this machine (torch.load(weights_only=True) refused it)"
        ) from None
    except Exception as err:  # not a torch file at all: zip and pickle errors of many kinds (KeyError(105) for text)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(
            f"checkpoint {str(path)!r} is not a file torch can read ({type(err).__name__}: {first})"
        ) from None
    if not isinstance(contents, Mapping):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(contents).__name__}, not a checkpoint (a dict)")
    return contents

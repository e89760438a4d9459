"""The parts of :func:`~lightning_privacy.callbacks.references.train_references` that need no Trainer: the data
checks, the balanced halves, the cache's recipe, the Trainer's defaults, each reference's DP-SGD seeds, and quiet
Lightning logs."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, Iterator, Mapping, Optional

import numpy as np


def _dataset(name: str, loader: Any):
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        raise TypeError(
            f"Expected argument `{name}` to be a DataLoader over a map-style dataset (reference models train on "
            f"subsets of it), but got {type(loader).__name__}."
        )
    return dataset


def _balanced_inside(rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(k, rows)``: each row is in exactly ⌊k/2⌋ references (one more with probability ½ for odd k)."""
    size = np.full(rows, k // 2) + (rng.random(rows) < 0.5 if k % 2 else 0)
    ranks = rng.random((rows, k)).argsort(axis=1).argsort(axis=1)
    return (ranks < size[:, None]).T


def _recipe(trainer_kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """What the cache compares of the training recipe: plain Trainer arguments and each callback's ``state_key``
    (e.g. DPSGD's σ and C); other values by type name."""
    out: Dict[str, Any] = {}
    for key, value in sorted(trainer_kwargs.items()):
        if key == "callbacks":
            callbacks = value if isinstance(value, (list, tuple)) else [value]
            out[key] = [getattr(cb, "state_key", type(cb).__qualname__) for cb in callbacks]
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = type(value).__qualname__
    return out


def _check_trainer_kwargs(trainer_kwargs: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if trainer_kwargs is None or not isinstance(trainer_kwargs, Mapping):
        raise ValueError(
            "Expected argument `trainer_kwargs` to be a dict with `max_epochs` or `max_steps` (reference models are "
            f"trained like the audited model), but got {trainer_kwargs!r}."
        )
    if "max_epochs" not in trainer_kwargs and "max_steps" not in trainer_kwargs:
        raise ValueError(
            "Expected `trainer_kwargs` to set `max_epochs` or `max_steps` (reference models are trained like the "
            f"audited model), but got keys {sorted(trainer_kwargs)}."
        )
    kwargs = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        devices=1,
        num_sanity_val_steps=0,
    )
    kwargs.update(trainer_kwargs)
    return kwargs


def _seed_dpsgd(callbacks: Any, seed: int, j: int) -> None:
    """Give reference j's DPSGD masks and noise of its own, from (seed, j), where the recipe leaves them to the OS.

    A reference is the auditor's model, not a release: nothing in it needs to stay secret, and seeding it makes the
    references (and the audit) the same on every run of the same seed, each reference with independent masks and noise.
    """
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]:
        # a DPSGD, or any callback with its two seeds (read as DPSGD's: None = drawn from the OS at every fit)
        seeded = all(hasattr(callback, name) for name in ("sampling_seed", "noise_seed"))
        if seeded and not getattr(callback, "secure_mode", False):
            sampling, noise = (int(v) for v in np.random.SeedSequence([seed, j, 3]).generate_state(2))
            if callback.sampling_seed is None:
                callback.sampling_seed = sampling
            if callback.noise_seed is None:
                callback.noise_seed = noise


@contextlib.contextmanager
def _quiet_lightning(quiet: bool) -> Iterator[None]:
    """Lightning's info lines (accelerator banners, tips, "`Trainer.fit` stopped") at WARNING level while ``quiet``."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in loggers]
    if quiet:
        for log in loggers:
            log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)

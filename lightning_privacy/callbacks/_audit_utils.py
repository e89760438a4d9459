"""Helpers shared by post-training audit callbacks.

- Writing: audits run in ``on_fit_end`` where ``self.log`` is forbidden, so scalars go to
  ``logger.log_metrics`` of every logger in ``trainer.loggers`` and histograms / figures / text to every
  TensorBoard-like logger (one whose ``experiment`` has ``add_histogram`` etc.), on global rank 0 only.
- Reading: deterministic, sharded passes over a dataset (each rank gets every ``world_size``-th example,
  no padding or duplicates), and the training / validation data of a running Trainer.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

__all__ = [
    "log_figure",
    "log_histogram",
    "log_scalars",
    "log_text",
    "member_loader",
    "population_loader",
    "sharded_loader",
    "tensorboard_experiments",
]

DEFAULT_BATCH_SIZE = 256


# --- writing ----------------------------------------------------------------------------------
def _step(trainer: pl.Trainer, step: Optional[int]) -> int:
    return int(trainer.global_step if step is None else step)


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
    """``logger.log_metrics(metrics, step)`` for every logger, on global rank 0; then ``logger.save()``."""
    if not trainer.is_global_zero or not metrics:
        return
    values = {key: float(value) for key, value in metrics.items()}
    for logger in trainer.loggers:
        logger.log_metrics(values, step=_step(trainer, step))
        logger.save()


def tensorboard_experiments(trainer: pl.Trainer) -> list:
    """The ``SummaryWriter``-like experiments of ``trainer.loggers`` (empty off global rank 0)."""
    if not trainer.is_global_zero:
        return []
    out = []
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None)
        if all(hasattr(experiment, fn) for fn in ("add_histogram", "add_figure", "add_text")):
            out.append(experiment)
    return out


def log_histogram(trainer: pl.Trainer, tag: str, values: Any, step: Optional[int] = None) -> None:
    """A histogram of ``values`` (array or tensor) on every TensorBoard logger, on global rank 0."""
    for experiment in tensorboard_experiments(trainer):
        experiment.add_histogram(tag, values, _step(trainer, step))
        experiment.flush()


def log_text(trainer: pl.Trainer, tag: str, text: str, step: Optional[int] = None) -> None:
    """Markdown ``text`` on every TensorBoard logger, on global rank 0."""
    for experiment in tensorboard_experiments(trainer):
        experiment.add_text(tag, text, _step(trainer, step))
        experiment.flush()


def log_figure(trainer: pl.Trainer, tag: str, figure: Any, step: Optional[int] = None, close: bool = True) -> None:
    """A matplotlib ``figure`` on every TensorBoard logger, on global rank 0; closed afterwards."""
    try:
        for experiment in tensorboard_experiments(trainer):
            experiment.add_figure(tag, figure, _step(trainer, step), close=False)
            experiment.flush()
    finally:
        if close:
            import matplotlib.pyplot as plt

            plt.close(figure)


# --- reading ----------------------------------------------------------------------------------
def sharded_loader(loader: Iterable, *, rank: int = 0, world_size: int = 1) -> Iterable:
    """A deterministic pass over ``loader``'s data, this rank's share only.

    With one process a plain ``DataLoader`` over a map-style dataset is rebuilt without shuffling or
    special samplers (e.g. a Poisson sampler); any other iterable is returned unchanged. With several
    processes rank ``r`` gets examples ``r, r + world_size, ...`` of the dataset (no padding, no
    duplicates), which needs a ``DataLoader`` over a map-style dataset.

    Raises:
        MisconfigurationException: if several processes share an iterable that is not a DataLoader
            over a map-style dataset.
    """
    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        if world_size > 1:
            raise MisconfigurationException(
                "Audits under multiple processes need a DataLoader over a map-style dataset to shard, but got "
                f"{type(loader).__name__} (dataset {type(dataset).__name__})"
            )
        return loader
    if world_size > 1:
        dataset = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(
        dataset,
        batch_size=loader.batch_size or DEFAULT_BATCH_SIZE,
        shuffle=False,
        collate_fn=loader.collate_fn,
        num_workers=0,
    )


def _first(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        return loaders[0] if loaders else None
    if isinstance(loaders, Mapping):
        return next(iter(loaders.values()), None)
    return loaders


def member_loader(trainer: pl.Trainer, given: Optional[Iterable] = None) -> Iterable:
    """The training data for an audit, in a fixed order, this rank's share.

    ``given``, else the datamodule's ``member_dataloader()``, else the dataset behind the Trainer's train
    loader (a DP-SGD Poisson loader is replaced by a plain sequential pass over its dataset), else the
    dataset behind the datamodule's ``train_dataloader()``.
    """
    source = given
    if source is None and callable(getattr(trainer.datamodule, "member_dataloader", None)):
        source = trainer.datamodule.member_dataloader()
    if source is None:
        source = _first(trainer.train_dataloader)
    if source is None and trainer.datamodule is not None:  # e.g. the train loop never ran
        source = _first(trainer.datamodule.train_dataloader())
    if source is None:
        raise MisconfigurationException("No training data to audit: pass `member_dataloader`")
    return sharded_loader(source, rank=trainer.global_rank, world_size=trainer.world_size)


def population_loader(trainer: pl.Trainer, given: Optional[Iterable] = None) -> Iterable:
    """Non-member (population) data for an audit: ``given``, else the validation data, this rank's share."""
    source = given
    if source is None:
        source = _first(trainer.val_dataloaders)
    if source is None and trainer.datamodule is not None:
        try:
            source = _first(trainer.datamodule.val_dataloader())
        except NotImplementedError:  # pragma: no cover - hook not overridden
            source = None
    if source is None:
        raise MisconfigurationException(
            "No non-member data to audit: pass `population_dataloader` or give the Trainer validation data"
        )
    return sharded_loader(source, rank=trainer.global_rank, world_size=trainer.world_size)

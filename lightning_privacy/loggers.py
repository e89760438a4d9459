"""Figures, histograms and text of the privacy callbacks, on every logger of a Trainer.

Scalars reach every Lightning logger through ``log_metrics``; figures, histograms and text have no common API, so
:func:`log_figure`, :func:`log_histogram` and :func:`log_text` write each to every logger of ``trainer.loggers`` by its
type, on global rank 0 (``<k>`` is the step, ``<tag>``'s ``/`` makes folders):

| logger | figure | histogram | text |
|---|---|---|---|
| ``TensorBoardLogger`` | ``add_figure(tag)`` (IMAGES) | ``add_histogram(tag)`` | ``add_text(tag)`` (TEXT) |
| ``MLFlowLogger`` | artifact ``figures/<tag>_step<k>.png`` | artifact ``histograms/<tag>_step<k>.png`` | artifact ``text/<tag>_step<k>.md`` |
| ``WandbLogger`` | ``wandb.Image`` under the key ``tag`` | ``wandb.Histogram`` | ``wandb.Html`` (the text, preformatted) |
| ``CSVLogger`` | ``<log_dir>/figures/<tag>_step<k>.png`` | ``<log_dir>/histograms/<tag>_step<k>.png`` | ``<log_dir>/text/<tag>_step<k>.md`` |

A histogram bins the finite values only; one with none (no values, or only NaN / ±inf) becomes its labelled figure
on every logger (TensorBoard's IMAGES, a ``wandb.Image``), and non-finite values left out are warned about once per
tag and Trainer: telemetry never ends a fit.

A logger whose ``experiment`` has TensorBoard's ``add_figure``, ``add_histogram`` and ``add_text`` counts as
TensorBoard. Any other logger gets the scalars only, and one warning per logger type and Trainer naming what it
cannot show. ``mlflow`` and ``wandb`` (the ``[loggers]`` extra) are used only where such a logger is present.
"""

from __future__ import annotations

import functools
import html
import io
import re
import tempfile
import weakref
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Optional, Set, Tuple

import lightning.pytorch as pl
import numpy as np
from lightning.fabric.loggers import CSVLogger as FabricCSVLogger
from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.figure import Figure

__all__ = ["log_figure", "log_histogram", "log_text", "shows_figures"]

TENSORBOARD, MLFLOW, WANDB, CSV = "tensorboard", "mlflow", "wandb", "csv"
#: The loggers' folders (MLflow artifacts, CSVLogger's log_dir) for each kind, and the files' suffixes.
FOLDERS = {"figure": ("figures", ".png"), "histogram": ("histograms", ".png"), "text": ("text", ".md")}

_WARNED: weakref.WeakKeyDictionary[pl.Trainer, Set[str]] = weakref.WeakKeyDictionary()


# --- the loggers --------------------------------------------------------------------------------------------------
def _store(logger: Logger) -> Optional[str]:
    """Which writer a logger gets: by type, else TensorBoard by its experiment's methods, else None."""
    if isinstance(logger, MLFlowLogger):
        return MLFLOW
    if isinstance(logger, WandbLogger):
        return WANDB
    if isinstance(logger, FabricCSVLogger):
        return CSV
    experiment = getattr(logger, "experiment", None)
    if all(hasattr(experiment, fn) for fn in ("add_histogram", "add_figure", "add_text")):
        return TENSORBOARD
    return None


def _warn_once(trainer: pl.Trainer, logger: Logger) -> None:
    name = type(logger).__name__
    warned = _WARNED.setdefault(trainer, set())
    if name in warned:
        return
    warned.add(name)
    rank_zero_warn(
        f"{name} gets lightning-privacy's scalars but not its figures, histograms and text (the monitor's and the "
        "audits' figures, the loss and gradient-norm histograms, the audit summaries and the privacy report): these "
        "are written to TensorBoardLogger, MLFlowLogger, WandbLogger and CSVLogger only. Add one of them to "
        "`Trainer(logger=[...])` to keep them."
    )


def _warn_non_finite(trainer: pl.Trainer, tag: str, step: int, left_out: int, total: int) -> None:
    """One warning per tag and Trainer: non-finite values were left out of a histogram."""
    warned = _WARNED.setdefault(trainer, set())
    if f"histogram:{tag}" in warned:
        return
    warned.add(f"histogram:{tag}")
    rank_zero_warn(
        f"The histogram {tag!r} at step {step} leaves out {left_out} non-finite value(s) (NaN or ±inf) of {total}: "
        + (
            "it shows the finite ones"
            if left_out < total
            else "there is nothing to bin, the loggers get a labelled figure"
        )
        + " (said once per tag; non-finite per-example gradient norms or losses mean the loss, the gradients or the "
        "weights turned NaN or infinite)."
    )


def _loggers(trainer: pl.Trainer) -> Iterator[Tuple[Logger, str]]:
    """``(logger, store)`` for each logger that shows figures, histograms and text (none off global rank 0); the
    others are warned about, once per type and Trainer."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        store = _store(logger)
        if store is None:
            _warn_once(trainer, logger)
        else:
            yield logger, store


def shows_figures(trainer: pl.Trainer) -> bool:
    """Whether a logger of ``trainer`` shows figures (global rank 0 only): draw a figure only then. Warns, once per
    type and Trainer, about each logger that shows none."""
    return bool(list(_loggers(trainer)))


# --- writing, one function per kind -------------------------------------------------------------------------------
def _step(trainer: pl.Trainer, step: Optional[int]) -> int:
    return int(trainer.global_step if step is None else step)


def log_figure(trainer: pl.Trainer, tag: str, figure: Figure, step: Optional[int] = None) -> None:
    """A ``matplotlib.figure.Figure`` on every logger of ``trainer`` (see the module's table), on global rank 0.

    The figure is not closed: it was built without pyplot (no global figure manager holds it), so it is freed with its
    last reference, and the caller may still save or show it. It is rendered to PNG once for all loggers but
    TensorBoard's.
    """
    step, png = _step(trainer, step), functools.cache(lambda: _png(figure))
    for logger, store in _loggers(trainer):
        if store == TENSORBOARD:
            logger.experiment.add_figure(tag, figure, step, close=False)
            logger.experiment.flush()
        elif store == WANDB:
            _wandb(logger, tag, step, lambda wandb: wandb.Image(_image(png())))
        else:
            _file(logger, store, _path("figure", tag, step), png())


def log_histogram(trainer: pl.Trainer, tag: str, values: Any, step: Optional[int] = None) -> None:
    """A histogram of ``values`` (array, tensor or sequence of numbers) on every logger of ``trainer`` (see the
    module's table), on global rank 0: MLflow and CSV get it drawn as a figure.

    Only the finite values are binned. Non-finite ones (NaN, ±inf: e.g. gradient norms after the loss turned NaN) are
    counted in the drawn figure's title and warned about once per tag and Trainer. With no finite value (none at all,
    or only non-finite ones) there is nothing to bin: every logger gets the same labelled figure instead (TensorBoard
    under IMAGES, W&B as an image, MLflow and CSV in the histogram's file), never an error.
    """
    step, array = _step(trainer, step), _array(values)
    finite = array[np.isfinite(array)]
    png = functools.cache(lambda: _png(_histogram_figure(tag, step, array)))
    loggers = list(_loggers(trainer))
    if loggers and finite.size < array.size:
        _warn_non_finite(trainer, tag, step, array.size - finite.size, array.size)
    for logger, store in loggers:
        if store == TENSORBOARD:
            if finite.size:
                logger.experiment.add_histogram(tag, finite, step)
            else:
                logger.experiment.add_figure(tag, _histogram_figure(tag, step, array), step, close=False)
            logger.experiment.flush()
        elif store == WANDB:
            if finite.size:
                _wandb(logger, tag, step, lambda wandb: wandb.Histogram(finite))
            else:
                _wandb(logger, tag, step, lambda wandb: wandb.Image(_image(png())))
        else:
            _file(logger, store, _path("histogram", tag, step), png())


def log_text(trainer: pl.Trainer, tag: str, text: str, step: Optional[int] = None) -> None:
    """Markdown ``text`` on every logger of ``trainer`` (see the module's table), on global rank 0."""
    step = _step(trainer, step)
    for logger, store in _loggers(trainer):
        if store == TENSORBOARD:
            logger.experiment.add_text(tag, text, step)
            logger.experiment.flush()
        elif store == WANDB:
            page = f'<pre style="white-space: pre-wrap">{html.escape(text)}</pre>'
            _wandb(logger, tag, step, lambda wandb: wandb.Html(page))
        else:
            _file(logger, store, _path("text", tag, step), text.encode("utf-8"))


# --- the writers --------------------------------------------------------------------------------------------------
def _path(kind: str, tag: str, step: int) -> PurePosixPath:
    """``<folder>/<tag>_step<k><suffix>``: the tag's ``/`` make folders, other characters unsafe in a file name
    become ``_``."""
    folder, suffix = FOLDERS[kind]
    parts = [re.sub(r"[^\w.\-]", "_", part) for part in tag.split("/") if part not in ("", ".", "..")]
    parts = parts or ["untitled"]
    return PurePosixPath(folder, *parts[:-1], f"{parts[-1]}_step{step}{suffix}")


def _file(logger: Logger, store: str, path: PurePosixPath, data: bytes) -> None:
    """``data`` as the MLflow run's artifact ``path``, or the file ``path`` under CSVLogger's ``log_dir``."""
    if store == CSV:
        target = Path(logger.log_dir, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return
    with tempfile.TemporaryDirectory() as folder:  # MLflow copies a local file into the run's artifacts
        local = Path(folder, path.name)
        local.write_bytes(data)
        logger.experiment.log_artifact(logger.run_id, str(local), str(path.parent))


def _wandb(logger: Logger, tag: str, step: int, make: Callable[[Any], Any]) -> None:
    """``make(wandb)`` under the key ``tag``, at ``trainer/global_step`` = ``step`` (as WandbLogger logs metrics)."""
    import wandb

    logger.log_metrics({tag: make(wandb)}, step=step)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi)
    return buffer.getvalue()


def _image(png: bytes) -> Any:
    from PIL import Image  # matplotlib's own dependency

    return Image.open(io.BytesIO(png))


def _array(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a tensor
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=float).ravel()


def _histogram_figure(tag: str, step: int, values: np.ndarray) -> Figure:
    """The drawn histogram: finite values in up to 64 bins, the number left out (non-finite) said; with no finite
    value, an empty plot that says why."""
    finite = values[np.isfinite(values)]
    figure = Figure(figsize=(6, 3.6), layout="constrained")
    axes = figure.subplots()
    axes.hist(finite, bins=int(min(64, max(1, np.sqrt(finite.size)))), color="C0")
    left_out = values.size - finite.size
    axes.set_title(f"{tag} at step {step}" + (f" ({left_out} non-finite values not shown)" if left_out else ""))
    if not finite.size:
        empty = f"all {values.size} values non-finite (NaN or ±inf)" if values.size else "no values"
        axes.text(0.5, 0.5, f"nothing to draw: {empty}", transform=axes.transAxes, ha="center", va="center")
    axes.set_xlabel("value")
    axes.set_ylabel(f"count (of {finite.size})")
    axes.grid(alpha=0.3)
    return figure

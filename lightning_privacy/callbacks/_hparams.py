"""One HPARAMS session per run: the model's hyperparameters, the run's privacy settings and privacy metric columns;
the privacy settings in every other logger's hyperparameters.

TensorBoard's HPARAMS tab reads a run's session from the FIRST ``_hparams_/session_start_info`` and
``_hparams_/experiment`` summaries in its event file; a later session in the same run is ignored (checked on
tensorboard 2.21: the plugin keeps the summary metadata of a tag's first event). Lightning writes its session after
every callback's ``on_fit_start``, with the module's and datamodule's hyperparameters and ``hp_metric`` only.
:func:`write_privacy_hparams` therefore writes the one session in ``on_fit_start``: the same hyperparameters plus
the privacy settings, and as metric columns every key that a privacy callback of this run logs (declared by the
callbacks' ``hparams_metric_keys``) plus ``hp_metric`` (so ``default_hp_metric`` users lose nothing). The metric
values are the scalar series the callbacks log anyway; HPARAMS shows each series' last value. Nothing is written at
an earlier step than a series already has.

Every other logger gets the privacy settings through its own ``log_hyperparams``, beside the model's
hyperparameters that Lightning logs after ``on_fit_start``: MLflow's params, W&B's config, the CSV logger's
``hparams.yaml`` (so runs can be compared by C, δ or the accountant in each tool).
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, Mapping

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

from lightning_privacy import _compat

__all__ = ["flat_hparams", "write_privacy_hparams"]


def flat_hparams(params: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested mappings flattened to ``a/b`` keys; values kept if TensorBoard can show them, else their ``str``.

    Example:
        >>> flat_hparams({"lr": 0.1, "net": {"hidden": (64, 32)}, "opt": None})
        {'lr': 0.1, 'net/hidden': '(64, 32)', 'opt': 'None'}
    """
    out: Dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, prefix=f"{name}/"))
        elif isinstance(value, (bool, str)) or (isinstance(value, numbers.Real) and not hasattr(value, "shape")):
            out[name] = value
        else:
            try:  # a one-element tensor or array
                out[name] = value.item()
            except (AttributeError, ValueError, RuntimeError):
                out[name] = str(value)
    return out


def _model_hparams(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Dict[str, Any]:
    """What Lightning's own session would hold: the module's and the datamodule's initial hyperparameters."""
    params: Dict[str, Any] = {}
    if getattr(pl_module, "_log_hyperparams", True):
        params.update(pl_module.hparams_initial)
    datamodule = trainer.datamodule
    if datamodule is not None and getattr(datamodule, "_log_hyperparams", True):
        params.update(datamodule.hparams_initial)
    params.pop("_class_path", None)  # LightningCLI's internal key, as Lightning drops it
    return params


def write_privacy_hparams(trainer: pl.Trainer, pl_module: pl.LightningModule, privacy: Mapping[str, Any]) -> None:
    """Write the run's privacy settings to every logger (global rank 0, in ``on_fit_start``): the one HPARAMS session
    of each TensorBoard logger, ``log_hyperparams`` of each other one (MLflow params, W&B config, CSV hparams.yaml).

    A logger that refuses them (e.g. an MLflow run resumed with a setting of another value: MLflow's params are
    immutable) is warned about, naming the logger and its error; the fit goes on.

    Args:
        trainer: the running Trainer.
        pl_module: the module being trained.
        privacy: the privacy settings, e.g. ``{"dp/noise_multiplier": 1.0, ...}``.
    """
    if not trainer.is_global_zero:
        return
    settings = flat_hparams(privacy)
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            continue
        try:
            logger.log_hyperparams(settings)
        except Exception as err:  # telemetry must not end the fit; the report and the statement hold the settings
            rank_zero_warn(
                f"{type(logger).__name__} did not take the privacy settings as hyperparameters "
                f"({type(err).__name__}: {err}); they are still in the privacy report and the statement."
            )
    loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
    if not loggers:
        return
    from torch.utils.tensorboard.summary import hparams

    params = flat_hparams({**_model_hparams(trainer, pl_module), **privacy})
    metric_keys = ["hp_metric"]
    for callback in trainer.callbacks:
        for key in getattr(callback, "hparams_metric_keys", ()):
            if key not in metric_keys:
                metric_keys.append(key)
    experiment, start, end = hparams(params, dict.fromkeys(metric_keys, 0.0))
    for logger in loggers:
        logger.hparams.update(settings)  # so hparams.yaml records them too
        writer = _compat.tensorboard_file_writer(logger)
        if writer is None:
            continue
        for summary in (experiment, start, end):
            writer.add_summary(summary, trainer.global_step)
        writer.flush()

"""A logger is taken for TensorBoard only when its experiment has all three of ``add_figure``, ``add_histogram`` and
``add_text`` (issue 47, item 5: ``all`` → ``any`` in ``loggers._store`` took a logger with one of them for
TensorBoard, and the first call of another kind then failed inside the fit)."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger
from matplotlib.figure import Figure

from lightning_privacy.loggers import log_figure, log_histogram, log_text, shows_figures

METHODS = ("add_figure", "add_histogram", "add_text")


class _Experiment:
    """An experiment object with only some of TensorBoard's writer methods; it records their calls."""

    def __init__(self, methods):
        self.calls = []
        for name in methods:
            setattr(self, name, lambda *args, _name=name, **kwargs: self.calls.append((_name, args[0])))

    def flush(self):
        self.calls.append(("flush", None))


class _DuckLogger(Logger):
    def __init__(self, methods):
        super().__init__()
        self._experiment = _Experiment(methods)

    @property
    def experiment(self):
        return self._experiment

    @property
    def name(self):
        return "duck"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def _trainer(logger):
    return pl.Trainer(logger=logger, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


def _log_everything(trainer):
    figure = Figure()
    figure.add_subplot().plot([0, 1])
    log_figure(trainer, "audit/figure", figure, step=1)
    log_histogram(trainer, "dp/histogram", torch.tensor([1.0, 2.0, 3.0]), step=1)
    log_text(trainer, "privacy/text", "hello", step=1)


@pytest.mark.parametrize("method", METHODS)
def test_a_logger_with_only_one_of_tensorboards_methods_is_not_taken_for_tensorboard(method):
    logger = _DuckLogger([method])
    trainer = _trainer(logger)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not shows_figures(trainer)
        _log_everything(trainer)  # nothing reaches it, and nothing fails
    assert logger.experiment.calls == []
    ours = [str(w.message) for w in caught if "gets lightning-privacy's scalars but not" in str(w.message)]
    assert len(ours) == 1 and ours[0].startswith("_DuckLogger gets")


def test_a_logger_with_all_three_of_tensorboards_methods_is_written_to_as_tensorboard():
    logger = _DuckLogger(METHODS)
    trainer = _trainer(logger)
    assert shows_figures(trainer)
    _log_everything(trainer)
    assert [c for c in logger.experiment.calls if c[0] != "flush"] == [
        ("add_figure", "audit/figure"),
        ("add_histogram", "dp/histogram"),
        ("add_text", "privacy/text"),
    ]

"""OutputPerturbation: noise law, bookkeeping, errors, and the same noise on every rank."""

import pickle

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import OutputPerturbation
from lightning_privacy.analysis import privacy_profile as pp
from lightning_privacy.models import LogisticRegressionModule, TabularMLP
from tests._launch import run_ddp


def _data(n=120, d=3, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.normal(size=(n, d))
    labels = (raw @ rng.normal(size=d) > 0).astype(np.int64)
    x = pp.UnitBallScaler.fit(raw).transform(raw)
    return x, labels, DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(labels)), batch_size=n)


def _trainer(callbacks, **kw):
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        accelerator="cpu",
        **kw,
    )


def test_adds_noise_to_the_optimum():
    x, y, loader = _data()
    cb = OutputPerturbation(epsilon=2.0, seed=1)
    model = LogisticRegressionModule(3, regularization=0.5)
    _trainer([cb]).fit(model, loader)
    optimum = pp.fit_logistic_regression(x, y, regularization=0.5)
    np.testing.assert_allclose(cb.base_weights, optimum, atol=1e-10)
    assert cb.beta == pytest.approx(len(y) * 0.5 * 2.0 / 2)
    np.testing.assert_allclose(model.weights.numpy(), cb.base_weights + cb.noise, rtol=1e-12)
    np.testing.assert_allclose(cb.noise, pp.sample_output_noise(3, beta=cb.beta, seed=1))


def test_seeded_noise_is_reproducible_and_fresh_otherwise():
    _, _, loader = _data()
    noises = []
    for seed in (7, 7, None):
        cb = OutputPerturbation(epsilon=1.0, seed=seed, dataset_size=1000, regularization=1.0)
        _trainer([cb]).fit(LogisticRegressionModule(3), loader)
        assert cb.beta == pytest.approx(500.0)
        noises.append(cb.noise)
    np.testing.assert_array_equal(noises[0], noises[1])
    assert not np.allclose(noises[0], noises[2])


def test_errors():
    with pytest.raises(MisconfigurationException, match="`epsilon` must be a finite number > 0, got -1"):
        OutputPerturbation(epsilon=-1)
    with pytest.raises(MisconfigurationException, match="`dataset_size` must be a positive int"):
        OutputPerturbation(epsilon=1.0, dataset_size=2.5)
    _, _, loader = _data()
    with pytest.raises(MisconfigurationException, match="does not support this model.*`linear` attribute"):
        _trainer([OutputPerturbation(epsilon=1.0)]).fit(TabularMLP(3), loader)


def test_warns_about_checkpoints_and_pickles(tmp_path):
    _, _, loader = _data()
    cb = OutputPerturbation(epsilon=1.0, seed=0)
    trainer = _trainer([cb, ModelCheckpoint(dirpath=tmp_path)], enable_checkpointing=True)
    with pytest.warns(UserWarning, match="checkpoints saved during training hold the weights"):
        trainer.fit(LogisticRegressionModule(3), loader)
    assert "base_weights" not in str(cb.state_dict())  # the un-noised model never lands in a checkpoint
    assert pickle.loads(pickle.dumps(cb)).epsilon == 1.0


def _ddp_worker():
    """One rank of a torchrun launch (tests/_launch.py): unseeded output perturbation, the rank's final weights."""
    _, _, loader = _data(n=64)
    model = LogisticRegressionModule(3, max_iter=5)
    trainer = _trainer(
        [OutputPerturbation(epsilon=1.0, seed=None)], strategy="ddp", devices=2, use_distributed_sampler=False
    )
    trainer.fit(model, loader)
    return model.weights.numpy()


@pytest.mark.slow
def test_same_noise_on_every_rank(tmp_path):
    w0, w1 = run_ddp("tests.callbacks.test_output_perturbation:_ddp_worker", tmp_path)
    np.testing.assert_array_equal(w0, w1)

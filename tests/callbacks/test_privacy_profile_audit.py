"""PrivacyProfileAudit: agrees with the numpy analysis, warns off the optimum, logs, rejects bad models."""

import pickle
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import OutputPerturbation, PrivacyProfileAudit, names
from lightning_privacy.analysis import privacy_profile as pp
from lightning_privacy.functional.privacy_profile import linear_head_inputs, logistic_per_example_gradients
from lightning_privacy.models import LogisticRegressionModule, TabularMLP

N, D = 150, 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(N, D))
    raw[0] *= 20.0
    labels = (raw @ rng.normal(size=D) + 0.5 * rng.normal(size=N) > 0).astype(np.int64)
    x = pp.UnitBallScaler.fit(raw).transform(raw)
    return x, labels, TensorDataset(torch.from_numpy(x), torch.from_numpy(labels))


def _trainer(callbacks, logger=False, **kw):
    return pl.Trainer(
        max_epochs=1,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        accelerator="cpu",
        **kw,
    )


def test_matches_numpy_analysis_and_logs_to_tensorboard(data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y, dataset = data
    audit = PrivacyProfileAudit(epsilon=0.5, top_k=4, num_samples=32, feature_names=["a", "b", "c"])
    logger = TensorBoardLogger(tmp_path, name="run")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*PrivacyProfileAudit.*")  # converged: no warning
        _trainer([audit], logger=logger).fit(LogisticRegressionModule(D), DataLoader(dataset, batch_size=N))

    base = pp.fit_logistic_regression(x, y, regularization=1.0)
    wc = pp.worst_case_neighbours(base, pp.logistic_gradients(base, x, y), regularization=1.0)
    beta = pp.noise_scale(epsilon=0.5, dataset_size=N, regularization=1.0)
    expected = pp.privacy_profile(base, wc, base, beta=beta)
    np.testing.assert_array_equal(audit.profile.indices[-20:], expected.indices[-20:])
    np.testing.assert_allclose(audit.profile.losses, expected.losses, rtol=1e-6)
    assert audit.gradient_norm < 1e-10
    assert [r["row"] for r in audit.top_rows] == expected.indices[::-1][:4].tolist()
    assert set(audit.top_rows[0]) == {"row", "loss", "a", "b", "c"}
    np.testing.assert_allclose([audit.top_rows[0][c] for c in "abc"], x[audit.top_rows[0]["row"]])
    ta = pp.transition_analysis(base, wc, dataset_size=N, regularization=1.0, num_samples=32, seed=0)
    assert audit.transition.recommended_range == pytest.approx(ta.recommended_range)

    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "images": 0, "histograms": 0}).Reload()
    tags = events.Tags()
    for key in (
        names.PROFILE_MAX_LOSS,
        names.PROFILE_EPSILON_LOW,
        names.PROFILE_EPSILON_HIGH,
        names.PROFILE_GRADIENT_NORM,
    ):
        assert key in tags["scalars"]
    assert events.Scalars(names.PROFILE_EPSILON_LOW)[0].value == pytest.approx(ta.epsilon_low, rel=1e-6)
    assert names.PROFILE_LOSSES in tags["histograms"]
    assert names.PROFILE_FIGURE in tags["images"]
    assert any(names.PROFILE_TOP_ROWS in t for t in tags["tensors"])


def test_uses_output_perturbation_base_and_epsilon(data):
    x, y, dataset = data
    perturbation = OutputPerturbation(epsilon=2.0, seed=3)
    audit = PrivacyProfileAudit(num_samples=16)
    model = LogisticRegressionModule(D)
    _trainer([audit, perturbation]).fit(model, DataLoader(dataset, batch_size=N))  # order does not matter
    base = perturbation.base_weights
    released = model.weights.numpy()
    assert not np.allclose(base, released)
    wc = pp.worst_case_neighbours(base, pp.logistic_gradients(base, x, y), regularization=1.0)
    expected = pp.privacy_profile(base, wc, released, beta=perturbation.beta)
    np.testing.assert_allclose(audit.profile.losses, expected.losses, rtol=1e-6)
    assert audit.profile.beta == pytest.approx(perturbation.beta)


def test_warns_when_not_converged(data):
    _, _, dataset = data
    audit = PrivacyProfileAudit(num_samples=16)
    model = LogisticRegressionModule(D, optimizer="sgd", lr=0.01)
    with pytest.warns(UserWarning, match="not at the optimum of the regularised objective"):
        _trainer([audit], max_steps=2).fit(model, DataLoader(dataset, batch_size=32))
    assert audit.gradient_norm > 1e-4


def test_per_row_gradients_match_numpy_and_autograd(data):
    x, y, _ = data
    w = torch.randn(D, dtype=torch.float64)
    grads = logistic_per_example_gradients(w, torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_allclose(grads.numpy(), pp.logistic_gradients(w.numpy(), x, y), rtol=1e-12)
    f = w.clone().requires_grad_()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(torch.from_numpy(x) @ f, torch.from_numpy(y).double())
    (auto,) = torch.autograd.grad(loss, f)
    np.testing.assert_allclose(grads.mean(0).numpy(), auto.numpy(), rtol=1e-10)


class _FrozenBody(pl.LightningModule):
    """A deeper network: frozen random features under a trainable binary head (bias=False)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(D, 8, dtype=torch.float64), nn.Tanh())
        self.body.requires_grad_(False)
        self.head = nn.Linear(8, 1, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.head.weight)

    def forward(self, x):
        return self.head(self.body(x.double()) / np.sqrt(8)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self(x), y.double())
        return loss + 0.5 * 0.1 * self.head.weight.pow(2).sum()

    def configure_optimizers(self):
        return torch.optim.LBFGS(
            self.head.parameters(),
            max_iter=200,
            tolerance_grad=1e-14,
            tolerance_change=0.0,
            line_search_fn="strong_wolfe",
        )


def test_last_layer_of_a_deeper_network(data):
    x, y, dataset = data
    audit = PrivacyProfileAudit(layer="head", regularization=0.1, num_samples=16)
    model = _FrozenBody()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*PrivacyProfileAudit.*")
        _trainer([audit]).fit(model, DataLoader(dataset, batch_size=N))
    h = (model.body(torch.from_numpy(x)) / np.sqrt(8)).numpy()
    h2, _ = linear_head_inputs(model, model.head, DataLoader(dataset, batch_size=64))
    np.testing.assert_allclose(h2.numpy(), h, rtol=1e-12)
    base = pp.fit_logistic_regression(h, y, regularization=0.1)
    np.testing.assert_allclose(model.head.weight.detach()[0].numpy(), base, atol=1e-9)
    wc = pp.worst_case_neighbours(base, pp.logistic_gradients(base, h, y), regularization=0.1)
    expected = pp.privacy_profile(base, wc, base, beta=1.0)
    np.testing.assert_allclose(audit.profile.losses, expected.losses, rtol=1e-5)


@pytest.mark.parametrize(
    "model, kw, match",
    [
        (TabularMLP(D), {}, "`linear` attribute"),
        (TabularMLP(D, hidden=(4,)), {"layer": "net.2", "regularization": 1.0}, "out_features=1"),
        (TabularMLP(D, hidden=(4,)), {"layer": "net.1", "regularization": 1.0}, "must be an nn.Linear"),
        (TabularMLP(D, hidden=(4,)), {"layer": "net.9", "regularization": 1.0}, "is not a submodule"),
    ],
)
def test_unsupported_models(data, model, kw, match):
    _, _, dataset = data
    with pytest.raises(MisconfigurationException, match=match):
        _trainer([PrivacyProfileAudit(**kw)]).fit(model, DataLoader(dataset, batch_size=N))


def test_bias_and_missing_regularization_rejected(data):
    _, _, dataset = data

    class WithBias(LogisticRegressionModule):
        def __init__(self):
            super().__init__(D)
            self.linear = nn.Linear(D, 1, dtype=torch.float64)

    with pytest.raises(MisconfigurationException, match="bias=False"):
        _trainer([PrivacyProfileAudit()]).fit(WithBias(), DataLoader(dataset, batch_size=N))
    model = _FrozenBody()
    with pytest.raises(MisconfigurationException, match="pass `regularization`"):
        _trainer([PrivacyProfileAudit(layer="head")]).fit(model, DataLoader(dataset, batch_size=N))


def test_argument_errors_and_pickle():
    with pytest.raises(MisconfigurationException, match="`epsilon` must be a number > 0 or None, got 0"):
        PrivacyProfileAudit(epsilon=0)
    with pytest.raises(MisconfigurationException, match="`top_k` must be a positive int, got 0"):
        PrivacyProfileAudit(top_k=0)
    assert pickle.loads(pickle.dumps(PrivacyProfileAudit(top_k=3))).top_k == 3


def test_unit_ball_check_in_module():
    x = torch.tensor([[3.0, 0.0], [0.0, 0.1]], dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, torch.tensor([1, 0])), batch_size=2)
    with pytest.raises(ValueError, match="norm 3"):
        _trainer([]).fit(LogisticRegressionModule(2), loader)


def test_warns_on_rows_outside_the_unit_ball(data):
    x, y, _ = data
    loader = DataLoader(TensorDataset(torch.from_numpy(3 * x), torch.from_numpy(y)), batch_size=N)
    audit = PrivacyProfileAudit(num_samples=16)
    with pytest.warns(UserWarning, match="a row has norm 3 > 1"):
        _trainer([audit]).fit(LogisticRegressionModule(D, check_unit_ball=False), loader)
    assert audit.profile is not None

"""MembershipAudit in a Trainer: the same numbers as audit_membership, DP-SGD's ledger behind the ROC, what
TensorBoard's own server shows, refusals that name the fix."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, MembershipAudit, names
from lightning_privacy.audits import audit_membership
from lightning_privacy.data.adult import AdultEncoder, load_adult
from lightning_privacy.models import TabularMLP
from lightning_privacy.references import recipe_like, train_references
from tests._tensorboard import TensorBoardView

pytestmark = pytest.mark.filterwarnings("ignore")
QUIET = dict(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


@pytest.fixture(scope="module")
def data():
    table = load_adult("train")
    x = torch.from_numpy(AdultEncoder().fit(table).transform(table)).float()
    y = torch.from_numpy(table.labels)
    idx = torch.from_numpy(np.random.default_rng(5).permutation(len(y))[:1200])
    return x[idx], y[idx]


def _loader(data, rows, shuffle=False):
    x, y = data
    return DataLoader(TensorDataset(x[rows], y[rows]), batch_size=64, shuffle=shuffle)


def _model():
    return TabularMLP(104, hidden=(128, 128), lr=1e-3, optimizer="adam")


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    population = _loader(data, slice(800, 1200))
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, sampling_seed=0)
    callback = MembershipAudit("rmia", num_references=2, population=population, cache_dir=str(root / "refs"))
    torch.manual_seed(0)
    model = _model()
    trainer = pl.Trainer(max_epochs=3, logger=TensorBoardLogger(root), callbacks=[dp, callback], **QUIET)
    trainer.fit(model, _loader(data, slice(0, 400), True), _loader(data, slice(400, 800)))
    return trainer, model, dp, callback, population, root


def test_the_callback_logs_what_audit_membership_computes(fitted, data):
    trainer, model, dp, callback, population, root = fitted
    assert callback.references.trained == 2 and len(callback.references) == 2
    direct = audit_membership(
        model,
        _loader(data, slice(0, 400)),
        _loader(data, slice(400, 800)),
        attack="rmia",
        references=callback.references,
        population_loader=population,
        ledger=dp.ledger,
        claim=dp.ledger,  # the callback's default claim: DP-SGD's own ledger
        warn=False,
    )
    np.testing.assert_array_equal(callback.result.scores, direct.scores)
    assert callback.results == direct.metrics()
    assert set(callback.results) == {
        names.membership_key("rmia", q)
        for q in ("auc", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "tpr_at_fpr_0.1", "epsilon_lower", "claim_contradicted")
    }
    # DP-SGD's ledger: its add/remove bound (the in/out game) beside each point, and no point above it
    assert callback.result.relation == "add_remove"
    assert callback.result.ledger_tpr_bounds == tuple(
        float(dp.ledger.tpr_bounds(p.fpr_high, relation="add_remove")) for p in callback.result.tpr
    )
    assert callback.result.outside == ()
    assert callback.result.verdict == "consistent" and callback.results[names.RMIA_CLAIM_CONTRADICTED] == 0.0
    # the references were trained like the target (3 epochs, DP-SGD at σ = 1, C = 1) and cached: the same recipe
    # trains none, another recipe is refused
    factory, recipe = recipe_like(trainer, model)  # what the callback passed to train_references
    assert recipe["max_epochs"] == 3 and recipe["callbacks"][0].noise_multiplier == 1.0
    assert type(factory()) is TabularMLP and dict(factory().hparams) == dict(model.hparams)
    again = train_references(
        factory,
        population,
        num_references=2,
        trainer_kwargs=recipe,
        cache_dir=str(root / "refs"),
    )
    assert again.trained == 0
    with pytest.raises(ValueError, match="recipe"):
        train_references(
            lambda: TabularMLP(**model.hparams),
            population,
            num_references=2,
            trainer_kwargs=dict(max_epochs=3),
            cache_dir=str(root / "refs"),
        )


def test_tensorboard_shows_the_scalars_the_figure_and_the_summary(fitted):
    trainer, _, _, callback, _, root = fitted
    view = TensorBoardView(root)
    (run,) = view.scalar_tags()
    for key, value in callback.results.items():
        ((step, shown),) = view.scalars(run, key)
        assert step == trainer.global_step and shown == pytest.approx(value, abs=1e-6)
    images = view.get("/data/plugin/images/tags")
    assert names.MEMBERSHIP_FIGURE in images[run]
    texts = view.get("/data/plugin/text/tags")
    assert any(tag.startswith(names.MEMBERSHIP_SUMMARY) for tag in texts[run])


def test_refusals_name_the_fix(data):
    with pytest.raises(MisconfigurationException, match="attack"):
        MembershipAudit("shadow-models")

    class NoHparams(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(104, 2)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = MembershipAudit("rmia", population=_loader(data, slice(800, 1000)))
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[callback], **QUIET)
    with pytest.raises(MisconfigurationException, match="nonmember_dataloader"):
        trainer.fit(NoHparams(), _loader(data, slice(0, 200), True))
    callback = MembershipAudit(
        "rmia", population=_loader(data, slice(800, 1000)), nonmember_dataloader=_loader(data, slice(200, 400))
    )
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[callback], **QUIET)
    with pytest.raises(MisconfigurationException, match="save_hyperparameters"):
        trainer.fit(NoHparams(), _loader(data, slice(0, 200), True))


def test_the_population_defaults_to_the_datamodules(data):
    callback = MembershipAudit("lira", num_references=1)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[callback], **QUIET)
    with pytest.raises(MisconfigurationException, match="population"):  # plain loaders: nowhere to take it from
        trainer.fit(_model(), _loader(data, slice(0, 200), True), _loader(data, slice(200, 400)))

    class WithPopulation(pl.LightningDataModule):
        def train_dataloader(self):
            return _loader(data, slice(0, 200), True)

        def val_dataloader(self):
            return _loader(data, slice(200, 400))

        def population_dataloader(self):
            return _loader(data, slice(400, 800))

    callback = MembershipAudit("lira", num_references=1)
    pl.Trainer(max_epochs=1, logger=False, callbacks=[callback], **QUIET).fit(_model(), datamodule=WithPopulation())
    assert callback.references.inside_population.shape == (1, 400) and callback.result.variant == "offline"


def test_the_loss_attack_needs_no_references(data):
    callback = MembershipAudit("loss")
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[callback], **QUIET)
    trainer.fit(_model(), _loader(data, slice(0, 200), True), _loader(data, slice(200, 400)))
    assert callback.references is None and set(callback.results) >= {names.LOSS_AUC, names.LOSS_EPSILON_LOWER}


def test_dp_sgd_references_are_trained_with_the_targets_clipping_norm(data, tmp_path):
    """Pins the references' recipe on the target's C (not C = 1): the cache records DPSGD with the target's σ and C,
    and the references' DPSGD carries its δ, loss reduction and gradient mode."""
    dp = DPSGD(noise_multiplier=1.3, max_grad_norm=0.7, delta=1e-6, grad_sample_mode="ghost", sampling_seed=0)
    callback = MembershipAudit("lira", num_references=1, population=_loader(data, slice(800, 1000)), cache_dir=tmp_path)
    torch.manual_seed(0)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[dp, callback], **QUIET)
    model = _PerExample(104, hidden=(16,))
    trainer.fit(model, _loader(data, slice(0, 200), True), _loader(data, slice(200, 400)))
    assert callback.references.trained == 1
    recipe = json.loads((tmp_path / "references.json").read_text())["recipe"]
    assert recipe["callbacks"] == [DPSGD(noise_multiplier=1.3, max_grad_norm=0.7).state_key]
    (reference_dp,) = recipe_like(trainer, model)[1]["callbacks"]
    assert (reference_dp.max_grad_norm, reference_dp.noise_multiplier, reference_dp.delta) == (0.7, 1.3, 1e-6)
    assert (reference_dp.loss_reduction, reference_dp.grad_sample_mode) == ("mean", "ghost")


class _PerExample(TabularMLP):
    """Returns one loss per example (what DPSGD's ghost clipping needs)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, reduction="none")

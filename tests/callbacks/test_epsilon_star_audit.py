"""EpsilonStarAudit: values equal the analysis on the model's losses; logging; DP-SGD; configuration."""

import csv
import pickle
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import default_delta, epsilon_star
from lightning_privacy.callbacks import epsilon_star_audit as module
from lightning_privacy.callbacks.epsilon_star_audit import EpsilonStarAudit
from lightning_privacy.functional.membership_loss import membership_loss
from lightning_privacy.models import TabularMLP
from tests._launch import run_ddp


def _data(n_train=300, n_val=200, features=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_val, features, generator=gen)
    y = ((x[:, 0] + 0.5 * torch.randn(n_train + n_val, generator=gen)) > 0).long()
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def _trainer(tmp_path, callbacks, max_epochs=2, loggers=True):
    return pl.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        default_root_dir=tmp_path,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=[TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")] if loggers else False,
    )


def _losses(model, dataset):
    model.eval()
    with torch.no_grad():
        x, y = dataset.tensors
        return membership_loss(model(x), y).double().numpy()


def test_audit_matches_analysis_and_writes_every_logger(tmp_path):
    torch.manual_seed(0)
    train, val = _data()
    model = TabularMLP(8, hidden=(32,), lr=0.2)
    audit = EpsilonStarAudit(every_n_epochs=1)
    trainer = _trainer(tmp_path, [audit], max_epochs=2)
    trainer.fit(model, DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=64))

    members, nonmembers = _losses(model, train), _losses(model, val)
    delta = default_delta(len(train))
    assert audit.details["parametric"].delta == pytest.approx(delta)
    assert audit.results[names.EPSILON_STAR] == pytest.approx(epsilon_star(members, nonmembers, delta=delta), rel=1e-6)
    assert audit.results[names.EPSILON_STAR_EMPIRICAL] == pytest.approx(
        epsilon_star(members, nonmembers, delta=delta, method="empirical"), rel=1e-6
    )
    assert audit.details["parametric"].num_members == 300 and audit.details["parametric"].num_nonmembers == 200
    assert names.MIA_EPSILON_LOWER in audit.results and audit.results[names.MIA_EPSILON_LOWER] >= 0.0

    # CSV: two per-epoch audits; none more at fit end (the last epoch's audit measured the same model)
    rows = list(csv.DictReader(open(next(Path(tmp_path, "csv").rglob("metrics.csv")))))
    logged = [float(r[names.EPSILON_STAR]) for r in rows if r.get(names.EPSILON_STAR)]
    assert len(logged) == 2 and logged[-1] == pytest.approx(audit.results[names.EPSILON_STAR], rel=1e-6)
    assert any(r.get(names.MIA_EPSILON_LOWER) for r in rows)

    # TensorBoard: scalars, histograms, the figure and the summary text
    events = EventAccumulator(
        str(next(Path(tmp_path, "tb").rglob("events.out.*")).parent), size_guidance={"images": 0}
    ).Reload()
    tags = events.Tags()
    assert names.EPSILON_STAR in tags["scalars"] and names.EPSILON_STAR_EMPIRICAL in tags["scalars"]
    assert {module.MEMBER_LOSSES_TAG, module.NONMEMBER_LOSSES_TAG} <= set(tags["histograms"])
    assert module.FIGURE_TAG in tags["images"]
    assert f"{module.SUMMARY_TAG}/text_summary" in tags["tensors"]


def test_audit_with_dpsgd_uses_a_plain_pass_over_the_training_set(tmp_path):
    from lightning_privacy.callbacks.dpsgd import DPSGD

    torch.manual_seed(0)
    train, val = _data(n_train=256, n_val=128)
    model = TabularMLP(8, hidden=(16,), lr=0.1)
    audit = EpsilonStarAudit(delta=1e-4, log_figure=False)
    trainer = _trainer(tmp_path, [DPSGD(noise_multiplier=1.0, max_grad_norm=1.0), audit], max_epochs=1, loggers=False)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, batch_size=64))
    details = audit.details["parametric"]
    assert (details.num_members, details.num_nonmembers, details.delta) == (256, 128, 1e-4)
    want = epsilon_star(_losses(model, train), _losses(model, val), delta=1e-4)
    assert audit.results[names.EPSILON_STAR] == pytest.approx(want, rel=1e-6)


def test_explicit_loaders_and_custom_forward(tmp_path):
    torch.manual_seed(0)
    train, val = _data()
    population, _ = _data(n_train=150, n_val=1, seed=5)
    members = TensorDataset(train.tensors[0][:100], train.tensors[1][:100])
    model = TabularMLP(8, hidden=(16,))
    calls = []

    def forward(module, batch):
        calls.append(len(batch[0]))
        return module(batch[0]), batch[1]

    audit = EpsilonStarAudit(
        member_dataloader=DataLoader(members, batch_size=50),
        population_dataloader=DataLoader(population, batch_size=50),
        forward_fn=forward,
    )
    trainer = _trainer(tmp_path, [audit], max_epochs=1, loggers=False)
    trainer.fit(model, DataLoader(train, batch_size=32))  # no validation data at all
    assert audit.details["empirical"].num_members == 100 and audit.details["empirical"].num_nonmembers == 150
    assert sum(calls) == 250
    assert audit.results[names.EPSILON_STAR] == pytest.approx(
        epsilon_star(_losses(model, members), _losses(model, population), delta=default_delta(100)), rel=1e-6
    )


def test_missing_population_data_raises(tmp_path):
    train, _ = _data()
    trainer = _trainer(tmp_path, [EpsilonStarAudit()], max_epochs=1, loggers=False)
    with pytest.raises(MisconfigurationException, match="population_dataloader"):
        trainer.fit(TabularMLP(8, hidden=(4,)), DataLoader(train, batch_size=32))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"delta": 0.5}, "`delta`"),
        ({"delta": 0.0}, "`delta`"),
        ({"delta": "1e-5"}, "`delta`"),
        ({"every_n_epochs": 0}, "`every_n_epochs`"),
        ({"every_n_epochs": 1.5}, "`every_n_epochs`"),
        ({"mia_alpha": 1.0}, "`mia_alpha`"),
    ],
)
def test_bad_configuration_raises_at_construction(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        EpsilonStarAudit(**kwargs)


def test_pickles():
    audit = pickle.loads(pickle.dumps(EpsilonStarAudit(delta=1e-5, every_n_epochs=3)))
    assert (audit.delta, audit.every_n_epochs) == (1e-5, 3)


def test_summary_and_figure_from_details():
    from lightning_privacy.analysis.epsilon_star import epsilon_star_details

    rng = np.random.default_rng(0)
    members, nonmembers = rng.gamma(2, 5, 500), rng.gamma(3, 5, 500)
    d = epsilon_star_details(members, nonmembers, delta=1e-4)
    figure = module.transformed_fit_figure(d, members, nonmembers)
    assert len(figure.axes) == 1 and len(figure.axes[0].lines) == 3
    audit = EpsilonStarAudit()
    audit.details, audit.results = {"parametric": d}, {names.EPSILON_STAR: d.epsilon_star}
    text = audit.summary()
    assert names.EPSILON_STAR in text and "KS p-values" in text


def _ddp_worker(root):
    """One rank of a torchrun launch (tests/_launch.py): the audit under DDP; the trained weights back."""
    torch.manual_seed(0)
    train, val = _data(n_train=301, n_val=151)
    model = TabularMLP(8, hidden=(16,))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        limit_train_batches=2,
        callbacks=[EpsilonStarAudit(log_histograms=False, log_figure=False)],
        logger=CSVLogger(root, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, DataLoader(train, batch_size=32), DataLoader(val, batch_size=32))
    return model.state_dict()


@pytest.mark.slow
def test_two_process_ddp_audit_equals_single_process_value(tmp_path):
    # each rank scores every 2nd example; the metric gathers them; rank 0 writes the CSV row
    state = run_ddp("tests.callbacks.test_epsilon_star_audit:_ddp_worker", tmp_path, root=str(tmp_path))[0]
    train, val = _data(n_train=301, n_val=151)
    model = TabularMLP(8, hidden=(16,))
    model.load_state_dict(state)
    rows = list(csv.DictReader(open(next(Path(tmp_path, "csv").rglob("metrics.csv")))))
    logged = {k: float(v) for r in rows for k, v in r.items() if v and k.startswith("audit/")}
    members, nonmembers = _losses(model, train), _losses(model, val)  # rank 0's weights (DDP keeps the ranks equal)
    delta = default_delta(301)
    assert logged[names.EPSILON_STAR] == pytest.approx(epsilon_star(members, nonmembers, delta=delta), rel=1e-6)
    assert logged[names.EPSILON_STAR_EMPIRICAL] == pytest.approx(
        epsilon_star(members, nonmembers, delta=delta, method="empirical"), rel=1e-6
    )


def _skewed_losses(pl_module, batch):
    """The model's losses times a heavy log-normal factor: the Normal fits of φ are rejected by the KS test at every
    audit, with p-values that move with the model."""
    x, y = batch
    return membership_loss(pl_module(x), y) * torch.exp(2.0 * x[:, 1])


def test_each_warning_once_per_fit_and_the_table_to_the_loggers_not_the_console(tmp_path, caplog):
    """Three audits (every epoch) whose fits the KS test rejects: one KS warning per fit (issued again in the next
    fit), one console line per audit and no Markdown table there, the table with its warning in every audit's text."""
    import logging
    import warnings

    train, val = _data()
    audit = EpsilonStarAudit(every_n_epochs=1, signal_fn=_skewed_losses)
    for fit in range(2):
        torch.manual_seed(fit)
        t = _trainer(tmp_path / f"fit{fit}", [audit], max_epochs=3)
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            caplog.clear()
            t.fit(TabularMLP(8, hidden=(8,), lr=0.1), DataLoader(train, batch_size=64), DataLoader(val, batch_size=64))
        ks = [str(w.message) for w in caught if "the Normal fits of Epsilon* are rejected" in str(w.message)]
        assert len(ks) == 1 and ks[0].startswith("EpsilonStarAudit: the Normal fits of Epsilon* are rejected (KS p = ")
        console = [r.getMessage() for r in caplog.records if r.getMessage().startswith("EpsilonStarAudit")]
        assert [line.split(":")[0] for line in console] == [f"EpsilonStarAudit at step {s}" for s in (5, 10, 15)]
        assert all("not reliable" in line and "|" not in line for line in console), console
        assert not any("| quantity | value |" in r.getMessage() for r in caplog.records)
        texts = sorted((Path(t.loggers[1].log_dir) / "text").rglob("summary_step*.md"))
        assert len(texts) == 3
        pvalues = set()
        for text in texts:
            body = text.read_text(encoding="utf-8")
            assert "| quantity | value |" in body and "the Normal fits of Epsilon* are rejected (KS p = " in body
            pvalues.add(body.split("KS p = ")[1].split(")")[0])
        assert len(pvalues) >= 2  # warnings that differ in their numbers: issued once all the same

import pickle

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import RDPAccountant
from opacus.grad_sample import GradSampleHooks
from opacus.optimizers import DPOptimizer
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, BayesSecurityMonitor, names
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.models import TabularMLP
from tests.callbacks._tiny import BATCH, N, TinyDataModule, tiny_dataset, tiny_loader, tiny_module, trainer

P = BATCH / N
STEPS_PER_EPOCH = N // BATCH


def test_logs_every_key_each_epoch_matching_the_analysis(tmp_path):
    monitor = BayesSecurityMonitor()
    t = trainer([DPSGD(noise_multiplier=1.5), monitor], tmp_path, max_epochs=3)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    steps = 3 * STEPS_PER_EPOCH
    m = {k: float(v) for k, v in t.callback_metrics.items()}
    closed = bs.mia_bayes_security(sample_rate=P, noise_multiplier=1.5, steps=steps)
    exact = bs.mia_bayes_security_exact(sample_rate=P, noise_multiplier=1.5, steps=steps)
    assert m[names.MIA_BAYES_SECURITY_CLOSED_FORM] == pytest.approx(closed, abs=1e-6)
    assert m[names.MIA_BAYES_SECURITY] == pytest.approx(exact, abs=2e-3)  # composed per epoch, pessimistic
    assert m[names.MIA_ADVANTAGE] == pytest.approx(1 - m[names.MIA_BAYES_SECURITY], abs=1e-6)
    # tight TPR bounds: below Prop. 9's line, increasing in the FPR
    tpr = [m[names.MIA_TPR_BOUND_FPR_0_001], m[names.MIA_TPR_BOUND_FPR_0_01], m[names.MIA_TPR_BOUND_FPR_0_1]]
    assert tpr == sorted(tpr)
    for fpr, bound in zip((0.001, 0.01, 0.1), tpr):
        assert fpr <= bound <= bs.tpr_upper_bound(bayes_security=m[names.MIA_BAYES_SECURITY], fpr=fpr) + 1e-9
    assert m[names.DP_STEPS] == steps and m[names.DP_NOISE_MULTIPLIER] == 1.5
    assert m[names.DP_SAMPLE_RATE] == pytest.approx(P)
    assert m[names.DP_EPSILON] > 0
    assert [e["epoch"] for e in monitor.epochs] == [0, 1, 2]
    assert [e["safe"] for e in monitor.epochs] == sorted((e["safe"] for e in monitor.epochs), reverse=True)
    assert monitor.final[names.MIA_BAYES_SECURITY_EXACT] == monitor.final[names.MIA_BAYES_SECURITY]
    assert monitor.final[names.MIA_BAYES_SECURITY] == monitor.ledger.bayes_security()


def test_the_ledger_is_what_is_logged_at_every_epoch_end(tmp_path):
    """Issue "One home per concern": dpsgd.ledger.bayes_security() equals the logged value at each epoch end."""
    from lightning.pytorch.callbacks import Callback

    class Reader(Callback):  # after the monitor in the callback list: sees what it logged this epoch
        def __init__(self):
            self.pairs = []

        def on_train_epoch_end(self, trainer, pl_module):
            logged = float(trainer.callback_metrics[names.MIA_BAYES_SECURITY])
            self.pairs.append((logged, dpsgd.ledger.bayes_security(), dpsgd.ledger.steps))

    dpsgd, reader = DPSGD(noise_multiplier=1.2), Reader()
    trainer([dpsgd, BayesSecurityMonitor(), reader], tmp_path, max_epochs=3).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    assert [steps for *_, steps in reader.pairs] == [STEPS_PER_EPOCH * (e + 1) for e in range(3)]
    for logged, ledger, _ in reader.pairs:  # float32 in the logger, rounded down
        assert ledger - 1e-7 <= logged <= ledger


def test_closed_form_overstating_is_flagged_and_never_logged_as_the_value(tmp_path):
    # small p (1/64), σ < 1: the closed form overstates security (at large p it can understate it)
    monitor = BayesSecurityMonitor()
    t = trainer([DPSGD(noise_multiplier=0.6), monitor], tmp_path, max_epochs=2)
    with pytest.warns(UserWarning, match="overstates security"):
        t.fit(tiny_module(), train_dataloaders=DataLoader(tiny_dataset(), batch_size=4))
    m = {k: float(v) for k, v in t.callback_metrics.items()}
    exact = bs.mia_bayes_security_exact(sample_rate=4 / N, noise_multiplier=0.6, steps=2 * N // 4)
    closed = bs.mia_bayes_security(sample_rate=4 / N, noise_multiplier=0.6, steps=2 * N // 4)
    assert closed > exact
    assert m[names.MIA_BAYES_SECURITY] == pytest.approx(exact, abs=2e-3)  # never more security than computed
    assert m[names.MIA_BAYES_SECURITY_CLOSED_FORM] == pytest.approx(closed)
    assert all(e["safe"] < e["closed"] for e in monitor.epochs)


def test_early_stopping_on_the_logged_key(tmp_path):
    stopper = EarlyStopping(monitor=names.MIA_BAYES_SECURITY, mode="max", divergence_threshold=0.5, patience=1000)
    monitor = BayesSecurityMonitor()
    t = trainer([DPSGD(noise_multiplier=1.0), monitor, stopper], tmp_path, max_epochs=50)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    betas = [e["safe"] for e in monitor.epochs]
    first_below = next(i for i, b in enumerate(betas) if b < 0.5)
    assert t.current_epoch == first_below + 1 == len(betas)  # stopped right after the first epoch below 0.5
    assert first_below > 1
    assert float(t.callback_metrics[names.MIA_BAYES_SECURITY]) < 0.5 <= betas[first_below - 1]


class _OwnOpacus(TabularMLP):
    """A user's own Opacus set-up inside configure_optimizers (no DPSGD callback)."""

    def configure_optimizers(self):
        self.hooks = GradSampleHooks(self)
        self.accountant = RDPAccountant()
        opt = DPOptimizer(
            torch.optim.SGD(self.parameters(), lr=0.1),
            noise_multiplier=2.0,
            max_grad_norm=1.0,
            expected_batch_size=BATCH,
        )
        opt.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate=P))
        return opt


def test_works_with_a_users_own_opacus_setup(tmp_path):
    model = _OwnOpacus(8, hidden=(16,))
    t = trainer([BayesSecurityMonitor()], tmp_path, max_epochs=1)
    t.fit(model, train_dataloaders=tiny_loader())
    kw = dict(sample_rate=P, noise_multiplier=2.0, steps=t.global_step)
    assert float(t.callback_metrics[names.MIA_BAYES_SECURITY_CLOSED_FORM]) == pytest.approx(
        bs.mia_bayes_security(**kw), abs=1e-6
    )
    assert float(t.callback_metrics[names.MIA_BAYES_SECURITY]) == pytest.approx(
        bs.mia_bayes_security_exact(**kw), abs=2e-3
    )


def test_non_private_training_is_a_clear_error(tmp_path):
    with pytest.raises(MisconfigurationException, match="not private"):
        trainer([BayesSecurityMonitor()], tmp_path).fit(tiny_module(), train_dataloaders=tiny_loader())


def test_resume_gives_the_same_privacy_metrics(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer(
        [DPSGD(noise_multiplier=1.2), BayesSecurityMonitor(), ckpt],
        tmp_path,
        max_epochs=2,
        enable_checkpointing=True,
    ).fit(tiny_module(), datamodule=TinyDataModule())
    resumed = trainer([DPSGD(noise_multiplier=1.2), BayesSecurityMonitor()], tmp_path, max_epochs=4)
    resumed.fit(tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt"))
    straight = trainer([DPSGD(noise_multiplier=1.2), BayesSecurityMonitor()], tmp_path, max_epochs=4)
    straight.fit(tiny_module(), datamodule=TinyDataModule())
    for key in (names.MIA_BAYES_SECURITY, names.DP_STEPS, names.DP_EPSILON, names.MIA_TPR_BOUND_FPR_0_01):
        assert float(resumed.callback_metrics[key]) == pytest.approx(float(straight.callback_metrics[key]), rel=1e-6)


def test_fit_end_figure_and_hparams_reach_tensorboard(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    t = trainer([DPSGD(noise_multiplier=1.5), BayesSecurityMonitor()], tmp_path, max_epochs=2, logger=logger)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0}).Reload()
    assert names.BAYES_SECURITY_FIGURE in events.Tags()["images"]
    assert names.MIA_BAYES_SECURITY in events.Tags()["scalars"]
    assert names.MIA_BAYES_SECURITY_CLOSED_FORM in events.Tags()["scalars"]
    # nothing is written at an earlier step than a series already has (TensorBoard would purge the series); our
    # keys once per epoch (Lightning's own "epoch" is written with each log_metrics call: at val and at train end)
    for tag in events.Tags()["scalars"]:
        steps = [e.step for e in events.Scalars(tag)]
        assert steps == sorted(steps), (tag, steps)
        if tag.startswith(("privacy/", "dp/")):
            assert steps == sorted(set(steps)) and len(steps) == 2, (tag, steps)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"exact": "sometimes"}, "`exact` must be one of"),
        ({"delta": 1.5}, "`delta`"),
        ({"relation": "swap"}, "`relation`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        BayesSecurityMonitor(**kwargs)


def test_state_is_plain():
    monitor = BayesSecurityMonitor()
    monitor.epochs = [{"epoch": 0, "closed": 0.9, "safe": 0.89}]
    state = pickle.loads(pickle.dumps(monitor.state_dict()))
    other = BayesSecurityMonitor()
    other.load_state_dict(state)
    assert other.epochs == monitor.epochs


@pytest.mark.slow
def test_every_logged_value_is_safe_at_a_large_sample_rate(tmp_path):
    """p = 0.05, σ = 1, 20 epochs: where the closed form overstates at every epoch, every logged β* is ≤ the true
    value — checked against dp_accounting's optimistic PLD (an upper bound on the true β*), composed epoch by epoch
    in the test."""
    from torch.utils.data import TensorDataset

    from tests.test_ledger import dp_accounting_betas

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=g)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    monitor = BayesSecurityMonitor()
    t = trainer([DPSGD(noise_multiplier=1.0), monitor], tmp_path, max_epochs=20)
    t.fit(tiny_module(), train_dataloaders=DataLoader(data, batch_size=20))
    assert t.global_step == 400
    upper = dp_accounting_betas([(1.0, 0.05, 20)] * 20, pessimistic=False)
    for record, bound in zip(monitor.epochs, upper):
        assert record["safe"] <= bound < record["closed"]
    logged = float(t.callback_metrics[names.MIA_BAYES_SECURITY])  # float32: rounded down, never up
    assert monitor.epochs[-1]["safe"] - 1e-7 <= logged <= monitor.epochs[-1]["safe"]

import pickle

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import DPOptimizer
from torch import nn

from lightning_privacy import DPSGD
from lightning_privacy._compat import PoissonDataSource
from lightning_privacy.analysis.bayes_security import mia_bayes_security_exact
from tests.callbacks._tiny import BATCH, N, TinyDataModule, TinyWithLoader, tiny_loader, tiny_module, trainer


@pytest.mark.parametrize("source", ["datamodule", "module_hook", "fit_argument"])
def test_trains_from_every_loader_source(source, tmp_path):
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0)
    t = trainer([dp], tmp_path)
    if source == "datamodule":
        t.fit(tiny_module(), datamodule=TinyDataModule())
    elif source == "module_hook":
        t.fit(TinyWithLoader(8, hidden=(16,)))
    else:
        t.fit(tiny_module(), train_dataloaders=tiny_loader())
    assert isinstance(t.fit_loop._data_source, PoissonDataSource)
    assert isinstance(t.optimizers[0], DPOptimizer)
    assert dp.sample_rate == pytest.approx(BATCH / N)
    # the accountant counts exactly the optimizer steps that happened
    assert dp.steps == t.global_step == 2 * (N // BATCH)
    assert [tuple(h) for h in dp.accountant.history] == [(1.0, BATCH / N, t.global_step)]
    assert 0 < dp.epsilon() < 50


class _RecordBatchSize(pl.Callback):
    def __init__(self):
        self.sizes = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.sizes.append(len(batch[0]))


def test_clipping_bounds_each_update_and_batches_are_poisson(tmp_path):
    torch.manual_seed(0)
    model = tiny_module()
    c, lr = 0.01, 0.5
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    recorder = _RecordBatchSize()
    t = trainer([DPSGD(noise_multiplier=1e-9, max_grad_norm=c), recorder], tmp_path, max_epochs=1, max_steps=1)
    t.fit(model, train_dataloaders=tiny_loader())
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    # one step moves the weights by lr * ||sum of clipped grads|| / expected batch <= lr * C * B / E[B]
    assert torch.linalg.norm(after - before) <= lr * c * recorder.sizes[0] / BATCH * (1 + 1e-4)
    # Poisson: batch sizes vary (a fixed-size loader would always give 32)
    t2 = trainer([DPSGD(noise_multiplier=1.0), recorder], tmp_path, max_epochs=3)
    t2.fit(tiny_module(), train_dataloaders=tiny_loader())
    assert len(set(recorder.sizes)) > 3


def test_planned_noise_meets_target_exactly(tmp_path):
    dp = DPSGD(target_bayes_security=0.95, epochs=2)
    trainer([dp], tmp_path).fit(tiny_module(), train_dataloaders=tiny_loader())
    steps = 2 * (N // BATCH)
    exact = mia_bayes_security_exact(sample_rate=BATCH / N, noise_multiplier=dp.noise_multiplier, steps=steps)
    assert exact >= 0.95
    assert (
        mia_bayes_security_exact(sample_rate=BATCH / N, noise_multiplier=dp.noise_multiplier * 0.99, steps=steps) < 0.95
    )
    assert dp.ledger.bayes_security() >= 0.95  # the value the monitor logs meets the target too


def test_planned_noise_meets_an_epsilon_target(tmp_path):
    from opacus.accountants.utils import get_noise_multiplier

    dp = DPSGD(target_epsilon=3.0, epochs=2, delta=1e-5, accountant="rdp")  # (the default PLD: test_accountant.py)
    trainer([dp], tmp_path).fit(tiny_module(), train_dataloaders=tiny_loader())
    assert dp.steps == 2 * (N // BATCH)
    assert dp.epsilon() <= 3.0
    reference = get_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=BATCH / N, steps=dp.steps, accountant="rdp"
    )
    assert dp.noise_multiplier == pytest.approx(reference, rel=0.01)  # Opacus' own search, within its tolerance


def test_resume_continues_the_history(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = DPSGD(noise_multiplier=1.3)
    trainer([first, ckpt], tmp_path, max_epochs=2, enable_checkpointing=True).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    resumed = DPSGD(noise_multiplier=1.3)
    t = trainer([resumed], tmp_path, max_epochs=4)
    t.fit(tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt"))
    straight = DPSGD(noise_multiplier=1.3)
    trainer([straight], tmp_path, max_epochs=4).fit(tiny_module(), datamodule=TinyDataModule())
    assert resumed.steps == straight.steps == t.global_step == 4 * (N // BATCH)
    assert resumed.epsilon() == pytest.approx(straight.epsilon())


def test_resume_without_privacy_state_fails_closed(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer([ckpt], tmp_path, max_epochs=1, enable_checkpointing=True).fit(tiny_module(), datamodule=TinyDataModule())
    with pytest.raises(RuntimeError, match="restart accounting at 0"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path, max_epochs=2).fit(
            tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt")
        )


def test_state_dict_is_plain_and_strict():
    dp = DPSGD(noise_multiplier=1.0)
    dp.accountant.history = [(1.0, 0.01, 5)]
    state = dp.state_dict()
    pickle.loads(pickle.dumps(state))
    torch.save(state, "/dev/null")
    other = DPSGD(noise_multiplier=1.0)
    other.load_state_dict(state)
    assert other.steps == 5
    assert other.ledger.bayes_security() == dp.ledger.bayes_security()
    with pytest.raises(RuntimeError, match="missing"):
        other.load_state_dict({"version": 2})
    # a checkpoint from before the ledger (version 1: the history only) still resumes
    old = DPSGD(noise_multiplier=1.0)
    old.load_state_dict({"version": 1, "accountant": "rdp", "history": [[1.0, 0.01, 5]], "max_grad_norm": 1.0})
    assert old.steps == 5 and old.ledger.bayes_security() == pytest.approx(dp.ledger.bayes_security(), abs=1e-12)
    with pytest.raises(RuntimeError, match="max_grad_norm"):
        DPSGD(noise_multiplier=1.0, max_grad_norm=2.0).load_state_dict(state)
    assert (
        dp.state_key
        == "DPSGD{'noise_multiplier': 1.0, 'max_grad_norm': 1.0, 'target_bayes_security': None, 'epochs': None}"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of `noise_multiplier`"),
        ({"target_epsilon": 1.0, "target_bayes_security": 0.9, "epochs": 3}, "exactly one"),
        ({"target_epsilon": -1.0, "epochs": 3}, "`target_epsilon` must be a positive"),
        ({"target_epsilon": 1.0}, "`epochs` must be a positive int"),
        ({"noise_multiplier": 1.0, "target_bayes_security": 0.9, "epochs": 3}, "exactly one"),
        ({"noise_multiplier": -1.0}, "`noise_multiplier` must be a positive"),
        ({"noise_multiplier": float("nan")}, "`noise_multiplier` must be a positive"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 0}, "`max_grad_norm` must be a positive"),
        ({"target_bayes_security": 1.2, "epochs": 3}, "`target_bayes_security` must be in"),
        ({"target_bayes_security": 0.9}, "`epochs` must be a positive int"),
        ({"noise_multiplier": 1.0, "epochs": 3}, "`epochs` is only used"),
        ({"noise_multiplier": 1.0, "delta": 2.0}, "`delta` must be"),
        ({"noise_multiplier": 1.0, "accountant": "moments"}, "`accountant` must be one of"),
        ({"noise_multiplier": 1.0, "loss_reduction": "max"}, "`loss_reduction`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        DPSGD(**kwargs)


def test_gradient_accumulation_is_rejected(tmp_path):
    with pytest.raises(MisconfigurationException, match="accumulate_grad_batches"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path, accumulate_grad_batches=2).fit(
            tiny_module(), train_dataloaders=tiny_loader()
        )


class _TwoOptimizers(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 2), nn.Linear(8, 2)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)


def test_several_optimizers_are_rejected(tmp_path):
    with pytest.raises(MisconfigurationException, match="exactly one optimizer"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path).fit(_TwoOptimizers(), train_dataloaders=tiny_loader())


class _WithBatchNorm(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_batchnorm_is_rejected_with_the_fix(tmp_path):
    with pytest.raises(MisconfigurationException, match="ModuleValidator.fix"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path).fit(_WithBatchNorm(), train_dataloaders=tiny_loader())


def test_ddp_needs_use_distributed_sampler_false(tmp_path):
    t = trainer([], tmp_path, strategy="ddp", devices=2)
    with pytest.raises(MisconfigurationException, match="use_distributed_sampler=False"):
        DPSGD(noise_multiplier=1.0).setup(t, tiny_module(), "fit")
    t = trainer([], tmp_path, strategy="ddp", devices=2, use_distributed_sampler=False)
    DPSGD(noise_multiplier=1.0).setup(t, tiny_module(), "fit")  # accepted


def test_several_train_loaders_are_rejected(tmp_path):
    with pytest.raises(MisconfigurationException, match="single torch DataLoader"):
        trainer([DPSGD(noise_multiplier=1.0)], tmp_path).fit(
            tiny_module(), train_dataloaders={"a": tiny_loader(), "b": tiny_loader()}
        )


def test_poisson_swap_fails_loudly_if_lightning_changes_its_data_source(tmp_path):
    from lightning_privacy.dpsgd.loaders import install_poisson_sampling

    t = trainer([], tmp_path)
    t.fit_loop._data_source = object()  # what a Lightning refactor would look like to us
    with pytest.raises(RuntimeError, match="not supported by DPSGD's Poisson sampling"):
        install_poisson_sampling(t, DPSGD(noise_multiplier=1.0))

"""DPSGD's noise is as secret as its sampling, and every strategy counts each optimizer step once.

- ``seed_everything`` fixes torch's global generator; the noise must not follow it (an adversary who knows a published
  seed could subtract the noise from the released model), and must not consume it (dropout draws stay the same).
- Saving an FSDP2 optimizer's state calls ``optimizer.step()`` with zero gradients and lr 0 (torch's
  ``_init_optim_state``); DP-SGD must not count that as a step or draw noise for it.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import opacus.optimizers.optimizer as opacus_optimizer
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, names
from lightning_privacy.report import privacy_report
from tests._launch import run_ddp
from tests.callbacks._tiny import trainer
from tests.callbacks.test_dpsgd_sampling import _module, _RootShardedMLP, _ShardedMLP, id_dataset, seeded_loader


class CaptureNoise(Callback):
    """The noise each optimizer step added: the noised gradient (unscaled) minus the clipped sum before noise."""

    def __init__(self, dpsgd: DPSGD) -> None:
        dpsgd.register_before_noise_hook(self._before)
        self.noise, self._sums, self._optimizer = [], None, None

    def _before(self, optimizer) -> None:
        self._optimizer = optimizer
        self._sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        opt = self._optimizer
        scale = opt.expected_batch_size if opt.loss_reduction == "mean" else 1
        self.noise.append(torch.cat([(p.grad * scale - s).flatten() for p, s in zip(opt.params, self._sums)]))


def _fit(seed=None, *, noise_seed=None, epochs=1, sigma=1.0):
    pl.seed_everything(0, verbose=False)  # what most training scripts do
    dpsgd = DPSGD(noise_multiplier=sigma, sampling_seed=seed, noise_seed=noise_seed)
    capture = CaptureNoise(dpsgd)
    model = _module()
    t = trainer([dpsgd, capture], max_epochs=epochs)
    t.fit(model, train_dataloaders=seeded_loader(256, 32))
    return torch.cat(capture.noise), torch.cat([p.detach().flatten() for p in model.parameters()]), t, dpsgd


def _corr(a, b) -> float:
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def test_the_default_noise_does_not_follow_seed_everything():
    """The issue: two fits with seed_everything(0) and the same batches ended with weights correlated 0.9999998."""
    noise_a, weights_a, *_ = _fit(seed=3, epochs=5)
    noise_b, weights_b, *_ = _fit(seed=3, epochs=5)
    assert noise_a.numel() == noise_b.numel() == 40 * 58  # 40 steps × 58 coordinates
    assert abs(_corr(noise_a, noise_b)) < 0.1  # independent: |r| has sd 1/√2320 ≈ 0.02, so 0.1 is ~5 sd
    assert float(noise_a.std()) == pytest.approx(1.0, rel=0.15)  # σ·C = 1
    assert not torch.equal(weights_a, weights_b)


def test_a_noise_seed_makes_the_noise_reproducible_and_another_changes_it():
    noise_a, weights_a, _, dpsgd = _fit(seed=3, noise_seed=11)
    noise_b, weights_b, *_ = _fit(seed=3, noise_seed=11)
    noise_c, *_ = _fit(seed=3, noise_seed=12)
    assert torch.equal(noise_a, noise_b) and torch.equal(weights_a, weights_b)
    assert abs(_corr(noise_a, noise_c)) < 0.1
    assert dpsgd.state_dict()["noise_seed"] == 11  # a fixed seed is saved, as sampling_seed is


def test_the_default_noise_seed_is_never_saved_and_hparams_say_which_seeds_were_fixed():
    _, _, t, dpsgd = _fit(seed=3)
    state = dpsgd.state_dict()
    assert state["noise_seed"] is None and state["sampling_seed"] == 3
    settings = dpsgd.privacy_settings()
    assert settings[names.DP_NOISE_SEED].startswith("secret") and settings[names.DP_SAMPLING_SEED].startswith("fixed")
    report = privacy_report(t)
    assert "| noise seed | secret (OS entropy per fit)" in report
    assert "| sampling seed | fixed (reproducible, not secret)" in report


def test_the_global_random_stream_is_the_same_with_and_without_dpsgds_noise(monkeypatch):
    """Dropout and augmentation draws (torch's global stream) are unchanged by turning the noise on or off."""
    _fit(seed=3)
    with_noise = torch.get_rng_state()
    private = torch.Generator().manual_seed(0)  # "noise off" for the global stream, still σ·C for the self-check

    def elsewhere(std, reference, generator=None, secure_mode=False):
        return torch.randn(reference.shape, generator=private, dtype=reference.dtype) * std

    monkeypatch.setattr(opacus_optimizer, "_generate_noise", elsewhere)
    _fit(seed=3)
    assert torch.equal(torch.get_rng_state(), with_noise)


def test_a_resumed_run_with_a_noise_seed_ends_with_the_uninterrupted_runs_weights(tmp_path):
    """The noise of step t is a function of (seed, rank, t): a resume continues it, as the sampling masks do."""

    def run(epochs, ckpt_path=None):
        torch.manual_seed(0)
        model = _module()
        callbacks = [
            DPSGD(noise_multiplier=1.0, sampling_seed=5, noise_seed=6),
            ModelCheckpoint(tmp_path, save_last=True),
        ]
        t = trainer(callbacks, tmp_path, max_epochs=epochs, enable_checkpointing=True)
        t.fit(model, train_dataloaders=seeded_loader(256, 32), ckpt_path=ckpt_path)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    straight = run(2)
    run(1)
    resumed = run(2, ckpt_path=tmp_path / "last.ckpt")
    torch.testing.assert_close(resumed, straight, rtol=0, atol=1e-6)


def test_noise_seed_is_validated_and_refused_with_secure_mode():
    with pytest.raises(MisconfigurationException, match="noise_seed"):
        DPSGD(noise_multiplier=1.0, noise_seed=-1)
    with pytest.raises(MisconfigurationException, match=r"`noise_seed=3`.*secure_mode=True"):
        DPSGD(noise_multiplier=1.0, noise_seed=3, secure_mode=True)


def test_a_state_initialising_step_is_not_taken_counted_or_noised():
    """torch.distributed.checkpoint's ``_init_optim_state`` on a DP optimizer: the wrapped optimizer steps, DP-SGD not."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    from lightning_privacy.dpsgd.noise import NoiseSource
    from lightning_privacy.dpsgd.optimizers import _DPOptimizer

    param = torch.nn.Parameter(torch.ones(5))
    counted = []
    optimizer = _DPOptimizer(
        torch.optim.Adam([param], lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1
    )
    optimizer.before_noise_hooks, optimizer.noise_source, optimizer.noise_step = [], NoiseSource(0), lambda: 0
    optimizer.attach_step_hook(lambda opt: counted.append(1))
    _init_optim_state(optimizer)
    assert counted == [] and torch.equal(param.detach(), torch.ones(5))
    assert set(optimizer.state[param]) >= {"exp_avg", "exp_avg_sq"}  # Adam's state exists, as torch intended
    assert optimizer.param_groups[0]["lr"] == 0.1


# ---------------------------------------------------------------------------------------------- DDP / FSDP2 (torchrun)
def _checkpointing_worker(fsdp, out: str):
    from lightning.pytorch.strategies import ModelParallelStrategy

    torch.set_num_threads(1)
    pl.seed_everything(0)
    dpsgd = DPSGD(noise_multiplier=1.0, sampling_seed=4, grad_sample_mode="ghost")
    model = {False: _module, True: _ShardedMLP, "root": _RootShardedMLP}[fsdp]()
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1) if fsdp else "ddp"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = pl.Trainer(
            callbacks=[dpsgd, ModelCheckpoint(dirpath=out, monitor="val_loss", save_last=True)],  # + the default one
            max_epochs=2,
            strategy=strategy,
            devices=2,
            accelerator="cpu",
            use_distributed_sampler=False,
            default_root_dir=out,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,  # Lightning's default sanity check (issue 55: it broke FSDP2 at the root)
        )
        t.fit(model, train_dataloaders=seeded_loader(256, 32), val_dataloaders=DataLoader(id_dataset(128), 64))
    return {
        "rank": t.global_rank,
        "global_step": t.global_step,
        "steps": dpsgd.steps,
        "epsilon": dpsgd.epsilon(),
        "view_warnings": [str(w.message)[:120] for w in caught if "view tensor" in str(w.message)],
    }


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True, "root"], ids=["ddp", "fsdp2", "fsdp2-root"])
def test_validation_and_checkpoints_count_no_step_that_never_happened(tmp_path, fsdp):
    """The issue: FSDP2 with validation and checkpointing recorded 17 steps for 16 and aborted a 2-epoch fit."""
    ranks = run_ddp(
        "tests.callbacks.test_dpsgd_noise:_checkpointing_worker", tmp_path / "run", fsdp=fsdp, out=str(tmp_path / "ck")
    )
    single = DPSGD(noise_multiplier=1.0)
    single.ledger.step(noise_multiplier=1.0, sample_rate=1 / 8, steps=16)
    for r in ranks:
        assert r["global_step"] == r["steps"] == 16, r
        # (the PLD is composed in the chunks the run read it in: equal to 1e-8 of the one-chunk value; 17 steps: +3 %)
        assert r["epsilon"] == pytest.approx(single.epsilon(), rel=1e-6)
        assert r["view_warnings"] == [], r["view_warnings"][:3]
    assert (tmp_path / "ck" / "last.ckpt").exists()


# ---------------------------------------------------------------------------------------------- a user's mistakes
def test_a_module_left_in_eval_mode_trains_with_one_warning_naming_the_switched_layers(tmp_path):
    """The issue: ``model.eval()`` before ``fit`` ended in Opacus' "No activations detected for Linear"."""
    model = _module()
    model.eval()
    dpsgd = DPSGD(noise_multiplier=1.0, sampling_seed=0)
    with pytest.warns(
        UserWarning, match=r"DPSGD put 3 module\(s\) into train mode.*`_MLP`, `net.0`, `net.2`"
    ) as record:
        trainer([dpsgd], tmp_path, max_epochs=1).fit(model, train_dataloaders=seeded_loader(256, 32))
    assert dpsgd.steps == 8 and model.net[0].training and model.net[2].training
    assert "`net.1`" in str([w.message for w in record if "DPSGD put" in str(w.message)][0])  # the ReLU stays eval

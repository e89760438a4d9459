"""fp16 mixed precision's loss scaling (``precision="16-mixed"``, a ``GradScaler``) is divided out before clipping.

The backward pass differentiates the scaled loss, so per-example gradients and ghost norms are ``scale`` times the
examples' own; the scaler unscales ``p.grad`` before the optimizer step. Before the fix hooks and auto mode clipped
the scaled per-example gradients (at C / scale: every example's contribution came out at norm C, 14× the float32
update at C = 100 here) and ghost mode divided the clipped sum by the scale (1 / 111 of the float32 update at C = 1).
On the CPU Lightning runs ``"16-mixed"`` as bf16, so the plugin is given with a CPU ``GradScaler``, which scales as
CUDA's does.
"""

from __future__ import annotations

import re
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision

from lightning_privacy import DPSGD
from tests.callbacks._tiny import tiny_loader, tiny_module
from tests.callbacks.test_dpsgd_ghost import MLP

SCALE = 1024.0


def _update(mode: str, clip: float, fp16: bool):
    """The weights' change over one epoch, and the scaler's scale at the end (None without one)."""
    torch.manual_seed(0)
    module = MLP() if mode == "ghost" else tiny_module()  # (ghost: per-example losses)
    before = [p.detach().clone() for p in module.parameters()]
    dp = DPSGD(noise_multiplier=0.01, max_grad_norm=clip, grad_sample_mode=mode, sampling_seed=0, noise_seed=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE) if fp16 else None
    plugins = [MixedPrecision("16-mixed", "cpu", scaler=scaler)] if fp16 else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (ghost under 16-mixed warns of 16-bit rounding: test_dpsgd_ghost)
        trainer = pl.Trainer(max_epochs=1, callbacks=[dp], accelerator="cpu", plugins=plugins, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(module, tiny_loader())
    assert trainer.global_step > 4
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(module.parameters(), before)])
    return change, None if scaler is None else float(scaler.get_scale())


@pytest.mark.parametrize("clip", [1.0, 100.0])  # most examples clipped; none clipped in float32
@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional", "auto"])
def test_under_fp16_loss_scaling_every_mode_trains_the_float32_update(mode, clip):
    expected, _ = _update(mode, clip, fp16=False)
    got, scale = _update(mode, clip, fp16=True)
    assert scale is not None and scale >= SCALE  # (the loss was scaled by 1024 or more at every step)
    cosine = float(torch.nn.functional.cosine_similarity(got, expected, dim=0))
    assert cosine > 0.999 and float(got.norm()) == pytest.approx(float(expected.norm()), rel=1e-2)


def test_without_the_scale_divided_out_the_update_is_what_the_changelog_says(monkeypatch):
    """The bug, put back: the loss scale not divided out (hooks' optimizer, ghost's norms) gives the updates the
    changelog and this file's docstring quote."""
    from pathlib import Path

    from lightning_privacy.dpsgd import ghost_mode, install

    monkeypatch.setattr(install, "loss_scale", lambda trainer: 1.0)
    monkeypatch.setattr(ghost_mode, "loss_scale", lambda trainer: 1.0)
    hooks = float(_update("hooks", 100.0, fp16=True)[0].norm()) / float(_update("hooks", 100.0, fp16=False)[0].norm())
    ghost = float(_update("ghost", 1.0, fp16=False)[0].norm()) / float(_update("ghost", 1.0, fp16=True)[0].norm())
    assert hooks > 5 and ghost > 50
    changelog = " ".join((Path(__file__).parents[2] / "CHANGELOG.md").read_text(encoding="utf-8").split())
    doc = " ".join(__doc__.split())
    quoted = [  # (the quotes round what this machine measured; another CPU's float16 rounding moves the last digit)
        float(re.search(r"\((\d+)× the float32 update at C = 100", changelog).group(1)),
        float(re.search(r"\(its update 1 / (\d+) of float32's at C = 1\)", changelog).group(1)),
        float(re.search(r"(\d+)× the float32 update at C = 100", doc).group(1)),
        float(re.search(r"\(1 / (\d+) of the float32 update at C = 1\)", doc).group(1)),
    ]
    assert quoted == pytest.approx([hooks, ghost, hooks, ghost], rel=0.05)


def _fit_with_scaler(mode: str, scaler):
    torch.manual_seed(0)
    module = MLP() if mode == "ghost" else tiny_module()
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0, noise_seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(max_epochs=2, callbacks=[dp], accelerator="cpu", logger=False,
                             plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)], enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(module, tiny_loader())
    return trainer, dp


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional"])
def test_a_step_the_scaler_would_skip_stops_the_fit_before_it_is_skipped(mode):
    """The GradScaler skips a step whose gradient overflowed (its scale too large): nothing noised, nothing
    accounted, and whether it happens depends on the examples' gradients outside the noise. Before, the fit went on
    and stopped at the epoch's end with "the privacy accounting is wrong (was the DPOptimizer's step hook
    replaced?)"; now it stops at that step, saying why and what to do."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    overflowing = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    with pytest.raises(MisconfigurationException, match=r"a gradient overflowed float16 .* so DPSGD stops") as raised:
        _fit_with_scaler(mode, overflowing)
    assert "precision='bf16-mixed'" in str(raised.value) and "growth_interval" in str(raised.value)


def test_the_scaler_the_message_suggests_trains_every_step_accounted():
    trainer, dp = _fit_with_scaler("hooks", torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=10**9))
    assert trainer.global_step == dp.ledger.steps > 8


def _ddp_overflow_worker(root: str):
    """Rank 1's loss alone overflows (× 1e35 at the scaler's 2¹⁶): each rank returns what stopped it."""
    torch.set_num_threads(1)
    pl.seed_everything(0)

    class OneRankOverflows(type(tiny_module())):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            return out * (1e35 if self.global_rank == 1 else 1.0)

    module = tiny_module()
    module.__class__ = OneRankOverflows  # (the tiny module, its training step's loss overflowing on rank 1)
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="hooks", sampling_seed=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    trainer = pl.Trainer(max_epochs=1, callbacks=[dp], accelerator="cpu", strategy="ddp", devices=2, logger=False,
                         plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)], use_distributed_sampler=False,
                         default_root_dir=root, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, tiny_loader())
    except Exception as error:  # noqa: BLE001 (what stopped this rank, returned to the test)
        return {"rank": trainer.global_rank, "stopped": str(error)}
    return {"rank": trainer.global_rank, "stopped": None}


@pytest.mark.slow
def test_under_ddp_one_rank_s_overflow_stops_every_rank_at_that_step(tmp_path):
    """DPSGD replaces DDP's gradient sync, so each rank checks its own gradient: one rank's overflow is all-reduced,
    and every rank stops at the same step (a rank left running would wait in the next collective)."""
    from tests._launch import run_ddp

    ranks = run_ddp("tests.callbacks.test_dpsgd_fp16:_ddp_overflow_worker", tmp_path, root=str(tmp_path))
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["stopped"] is not None and "a gradient overflowed float16" in r["stopped"] for r in ranks)
    assert ranks[0]["stopped"] == ranks[1]["stopped"]  # (the same step on both)

"""16-bit and 64-bit parameters (``precision="bf16-true"``, ``"64-true"``): every mode trains, clips, sums and noises
in float32 at least (the noised gradient rounded to the parameters' dtype after the noise), and the neighbour check
runs on batches in the parameters' dtype.

Before: under ``"bf16-true"`` hooks and auto mode (the default) stopped at their first step with a false self-check
("the gradient … is not the sum of its per-sample gradients clipped"): Opacus clipped, summed and noised in the
parameters' bfloat16 (norms rounded to 8 significant bits, so a clipped gradient could exceed C, and a Gaussian
drawn with 8 significant bits); functional and ghost mode clipped with bfloat16 norms and rounded the clipped sum to
bfloat16 before the noise (a rounding of the whole sum, up to 2⁻⁹ of it, not bounded by C). And the neighbour
check re-collated the step's rows in the loader's float32 and never ran under ``"bf16-true"`` or ``"64-true"``
("mat1 and mat2 must have the same dtype").
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_privacy import DPSGD
from tests.callbacks._tiny import tiny_loader, tiny_module
from tests.callbacks.test_dpsgd_ghost import MLP


def _fit(mode: str, precision: str):
    torch.manual_seed(0)
    module = MLP() if mode == "ghost" else tiny_module()  # (ghost: per-example losses)
    before = [p.detach().clone().double() for p in module.parameters()]
    dp = DPSGD(noise_multiplier=0.5, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0, noise_seed=0)
    sums = []
    dp.register_before_noise_hook(lambda opt: sums.append([opt.summed(p).detach().clone() for p in opt.params]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = pl.Trainer(max_epochs=1, callbacks=[dp], accelerator="cpu", precision=precision, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(module, tiny_loader())
    change = torch.cat([(p.detach().double() - b).flatten() for p, b in zip(module.parameters(), before)])
    said = [str(w.message) for w in record if "neighbour check is not run" in str(w.message)]
    return trainer, dp, sums, change, said, module


@pytest.mark.parametrize("mode", ["hooks", "auto", "functional", "ghost"])
def test_bf16_parameters_train_with_float32_clipped_sums_and_noise(mode):
    trainer, dp, sums, change, said, module = _fit(mode, "bf16-true")
    assert next(module.parameters()).dtype == torch.bfloat16
    assert trainer.global_step == dp.steps == len(sums) > 4  # (every step clipped, self-checked and noised)
    assert all(s.dtype == torch.float32 for step in sums for s in step)  # (never rounded to bf16 before the noise)
    assert not said and dp.neighbours.steps >= 2 and dp.neighbours.max_ratio <= 1 + 5e-2  # (the premise, checked)
    *_, expected, _, _ = _fit(mode, "32-true")
    cosine = float(torch.nn.functional.cosine_similarity(change, expected, dim=0))
    assert cosine > 0.99, cosine  # (bf16 weights: the float32 fit's update up to their rounding)


@pytest.mark.parametrize("mode", ["hooks", "functional"])
def test_float64_parameters_get_their_neighbour_check(mode):
    trainer, dp, sums, _, said, module = _fit(mode, "64-true")
    assert next(module.parameters()).dtype == torch.float64 and all(s.dtype == torch.float64 for s in sums[0])
    assert not said and dp.neighbours.steps >= 2 and dp.neighbours.max_ratio <= 1 + 1e-4


def _ddp_worker(root: str, mode: str, precision: str = "bf16-true"):
    torch.set_num_threads(1)
    pl.seed_everything(0)  # every rank: the same initial weights
    module = MLP() if mode == "ghost" else tiny_module()
    dp = DPSGD(noise_multiplier=0.5, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = pl.Trainer(max_epochs=1, callbacks=[dp], accelerator="cpu", precision=precision, logger=False,
                             strategy="ddp", devices=2, use_distributed_sampler=False, default_root_dir=root,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(module, tiny_loader())
    said = [str(w.message) for w in record if "rounding" in str(w.message)]  # (any warning of 16-bit rounding)
    weights = torch.cat([p.detach().double().flatten() for p in module.parameters()])
    return {"rank": trainer.global_rank, "steps": trainer.global_step, "said": said, "weights": weights,
            "rounded": dp.rounded_steps}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "precision"), [("hooks", "bf16-true"), ("functional", "bf16-true"),
                                                 ("ghost", "bf16-mixed")])  # fmt: skip
def test_under_ddp_16_bit_training_is_in_step_and_nothing_is_said_about_rounding(tmp_path, mode, precision):
    """Under DDP the ranks add their float32 clipped sums (16-bit parameters: :class:`optimizers._WideReduction`;
    one warning was given while Opacus' all-reduce added the ranks' 16-bit gradients), and ghost clipping's
    book-keeping under bf16 autocast forms each rank's sum in float32: the fit trains, in step on both ranks, no
    warning of 16-bit rounding is given and no step is counted as rounded for the privacy statement."""
    from tests._launch import run_ddp

    target = "tests.callbacks.test_dpsgd_16_bit_parameters:_ddp_worker"
    ranks = run_ddp(target, tmp_path, root=str(tmp_path), mode=mode, precision=precision)
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # one model
    assert not ranks[0]["said"] and not ranks[1]["said"] and ranks[0]["rounded"] == ranks[1]["rounded"] == 0


def test_the_sum_check_takes_16_bit_rounding_of_a_cancelling_gradient_for_what_it_is():
    """16-bit parameters: autograd's bfloat16 sum of examples' gradients that cancel rounds at ~2⁻⁸ of their size,
    which the sum check once took for a bypass (a DDP run of bf16 hooks, `net.2.bias` 19 % off a norm of 0.0018);
    a gradient no example accounts for, at the examples' own size, is still one."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from lightning_privacy.dpsgd import exactness

    g = torch.Generator().manual_seed(0)
    per_example = torch.randn(32, 50, generator=g)
    per_example = (per_example / per_example.norm(dim=1, keepdim=True)).to(torch.bfloat16)  # norm 1 each
    per_example[16:] = -per_example[:16]  # ... and they cancel in the batch: the exact sum is 0
    param = torch.nn.Parameter(torch.zeros(50, dtype=torch.bfloat16))
    param.grad = (torch.randn(50, generator=g) * 2.0**-8).to(torch.bfloat16)  # autograd's 16-bit rounding of it
    names = {id(param): "net.2.bias"}
    exactness.check_summed_gradients([param], [per_example], names, loss_reduction="sum", rtol=5e-2)
    param.grad = torch.full((50,), 1.0, dtype=torch.bfloat16)  # a gradient of norm 7 that no example accounts for
    with pytest.raises(MisconfigurationException, match="`net.2.bias` that DP-SGD clips sum to a gradient"):
        exactness.check_summed_gradients([param], [per_example], names, loss_reduction="sum", rtol=5e-2)


def _reduce_worker(rank: int, world_size: int):
    """One rank's step of each DDP optimizer (hooks; ghost and functional) and reduction on bfloat16 parameters whose
    clipped sums do not fit 8 bits: ``{(class, reduction): (p.grad after the step's reduction, float32 sums)}``."""
    from types import SimpleNamespace

    from lightning_privacy.dpsgd import optimizers

    out = {}
    for cls_name in ("_DistributedDPOptimizer", "_DistributedGhostDPOptimizer"):
        for reduction in ("sum", "mean"):
            g = torch.Generator().manual_seed(rank)  # the ranks' examples differ
            params = [torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)) for shape in ((64,), (8, 5))]
            optimizer = getattr(optimizers, cls_name)(
                torch.optim.SGD(params, lr=1.0), noise_multiplier=0.0, max_grad_norm=1e6, expected_batch_size=3.0,
                loss_reduction=reduction,
            )  # fmt: skip
            optimizer.noise_source = SimpleNamespace(generator=lambda step, device: torch.Generator().manual_seed(0))
            optimizer.noise_step, optimizer.before_noise_hooks = (lambda: 0), []
            summed = []
            for p in params:
                sample = (1 + torch.rand((6, *p.shape), generator=g)).to(torch.bfloat16)  # 6 examples, exact in bf16
                summed.append(sample.float().sum(0))
                if cls_name == "_DistributedDPOptimizer":
                    p.grad_sample = sample
                else:  # (ghost/functional: the clipped sum arrives in float32 beside the rounded .grad)
                    optimizers.hand_over(p, summed[-1].clone())  # (the optimizer sums into it in place)
            assert optimizer.pre_step()
            optimizer.reduce_gradients()
            assert all(p.grad.dtype == torch.bfloat16 for p in params)
            out[cls_name, reduction] = ([p.grad.float().tolist() for p in params], [t.tolist() for t in summed])
    return out  # (plain numbers: a tensor would be shared through this process's memory, gone when it exits)


def test_under_ddp_16_bit_parameters_are_rounded_once_after_the_ranks_float32_sum():
    """Under DDP a 16-bit parameter's gradient is the ranks' float32 clipped sums added, divided as the reduction
    says, and rounded once (hooks and the clipped-sum optimizers, "sum" and "mean"); before, each rank's sum was
    rounded to bfloat16 and the roundings added (Opacus' all-reduce of ``p.grad``), a rounding of a rank's sum that no
    example's bound C covers."""
    from tests._ddp import run_distributed

    ranks = run_distributed(_reduce_worker)
    assert len(ranks[0]) == 4
    for key in ranks[0]:
        divisor = 3.0 * 2 if key[1] == "mean" else 1.0  # (the ranks' expected batch, times the world size)
        for j in range(2):
            grads = [torch.tensor(r[key][0][j]) for r in ranks]  # (bfloat16 values, held exactly in float32)
            sums = [torch.tensor(r[key][1][j], dtype=torch.float32) for r in ranks]
            total = ((sums[0] + sums[1]) / divisor).to(torch.bfloat16).float()
            assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], total), (key, j)  # one rounding
            rounded_first = sum((s / divisor).to(torch.bfloat16) for s in sums).float()  # (what Opacus' reduce gave)
            assert not torch.equal(rounded_first, total)  # (the test tells the two apart)

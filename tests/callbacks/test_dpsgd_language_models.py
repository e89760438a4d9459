"""Hugging Face language models under DP-SGD at an expected batch of one or two rows: empty Poisson batches never
reach the model (GPT-2 and Llama fail on a batch of 0 rows), each is a noise-only step counted once, and every model
trains on exactly clipped per-sequence gradients or is refused before its first step."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import exactness
from tests._launch import run_ddp
from tests.callbacks._language_models import PaddedSequences, TinyCausalLM

pytest.importorskip("transformers")
pytest.importorskip("peft")

CASES = [(k, lora, m) for k in ("gpt2", "llama") for lora in (True, False) for m in ("hooks", "ghost")]


def _trainer(dpsgd, **kwargs):
    return pl.Trainer(
        max_epochs=1, callbacks=[dpsgd], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kwargs,
    )  # fmt: skip


def test_a_hugging_face_model_fails_on_a_batch_of_zero_rows():
    """Why empty batches must not reach the model (if transformers learns to take them, this test says so)."""
    model = TinyCausalLM("gpt2", lora=False)
    with pytest.raises(RuntimeError, match="0 elements"):
        model(torch.zeros(0, 12, dtype=torch.long), torch.zeros(0, 12, dtype=torch.long))


@pytest.mark.parametrize(("kind", "lora", "mode"), CASES)
def test_a_tiny_language_model_trains_at_one_row_per_step_or_is_refused_before_it(kind, lora, mode):
    model = TinyCausalLM(kind, lora)
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=3)
    data = DataLoader(PaddedSequences(32), batch_size=1)  # q = 1/32: an expected batch of one sequence
    if kind == "gpt2" and not lora and mode == "ghost":  # GPT-2's output layer is its token embedding
        with pytest.raises(MisconfigurationException, match=r"cannot clip tied parameters.*wte\.weight"):
            _trainer(dpsgd).fit(model, data)
        assert dpsgd.steps == 0 and model.rows_seen == []
        return
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer = _trainer(dpsgd)
    trainer.fit(model, data)
    assert dpsgd.steps == trainer.global_step == 32  # every step counted once, empty ones included
    assert len(model.rows_seen) < 32 and min(model.rows_seen) > 0  # empty batches skipped the model
    record = dpsgd.exactness
    assert record.steps == 2 and record.examples >= 2
    assert record.reference.startswith(exactness.PER_EXAMPLE_REFERENCE)
    assert record.max_relative_error < 1e-5
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)  # frozen stay


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_padding_row_of_llamas_embedding_gets_no_gradient_in_a_full_fine_tune(mode):
    model = TinyCausalLM("llama", lora=False)
    embed = model.model.model.embed_tokens
    assert embed.padding_idx == 0
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=1)
    rows = []  # the padding row of every step's clipped sum, before the noise

    def padding_row(optimizer):
        rows.append(next(optimizer.summed(p)[0].clone() for p in optimizer.params if p is embed.weight))

    dpsgd.register_before_noise_hook(padding_row)
    _trainer(dpsgd).fit(model, DataLoader(PaddedSequences(32), batch_size=8))
    assert len(rows) == 4 and all(torch.count_nonzero(r) == 0 for r in rows)  # Opacus alone: nonzero (padded rows)


class _ShardedCausalLM(TinyCausalLM):
    """Lightning's FSDP2 convention: ``configure_model`` shards each transformer block, then the whole model."""

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for module in self.model.modules():
            if type(module).__name__ in ("GPT2Block", "LlamaDecoderLayer"):
                fully_shard(module, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def _ddp_worker(kind, lora, mode, fsdp=False, sigma=1.0, batch=2):
    from lightning.pytorch.strategies import ModelParallelStrategy

    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = (_ShardedCausalLM if fsdp else TinyCausalLM)(kind, lora)
    dpsgd = DPSGD(noise_multiplier=sigma, grad_sample_mode=mode, sampling_seed=5, noise_seed=5)
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1) if fsdp else "ddp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = _trainer(dpsgd, strategy=strategy, devices=2, use_distributed_sampler=False)
        t.fit(model, DataLoader(PaddedSequences(64), batch_size=batch))  # batch 2: ~1 row per rank per step
    trained = [(n, p.detach()) for n, p in model.named_parameters() if p.requires_grad]
    return {
        "steps": dpsgd.steps,
        "global_step": t.global_step,
        "rows": model.rows_seen,
        "checked": dpsgd.exactness.steps,
        "weights": torch.cat([(p.full_tensor() if fsdp else p).flatten() for _, p in trained]),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "lora", "mode"), [("gpt2", True, "hooks"), ("llama", False, "ghost")])
def test_under_ddp_empty_local_batches_never_reach_the_model(tmp_path, kind, lora, mode):
    ranks = run_ddp(
        "tests.callbacks.test_dpsgd_language_models:_ddp_worker", tmp_path / "ddp", kind=kind, lora=lora, mode=mode
    )
    assert [r["steps"] for r in ranks] == [r["global_step"] for r in ranks] == [32, 32]
    assert all(len(r["rows"]) < 32 and min(r["rows"]) > 0 for r in ranks)  # each rank skipped its empty batches
    assert all(r["checked"] == 2 for r in ranks)
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # the ranks stayed in step


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "lora"), [("gpt2", True), ("llama", False)])
def test_under_fsdp2_an_empty_rank_adds_nothing_and_empty_batches_never_reach_the_model(tmp_path, kind, lora):
    """FSDP2: a rank whose batch is empty runs the placeholder row with its loss times zero (every rank joins the
    module's collectives); the fit takes the same steps on the same batches as DDP, which skips the model, and ends
    at DDP's weights (σ tiny: the noise, drawn on sharded parameters, differs between the two strategies)."""
    kwargs = dict(kind=kind, lora=lora, mode="ghost", sigma=1e-6)
    fsdp = run_ddp("tests.callbacks.test_dpsgd_language_models:_ddp_worker", tmp_path / "fsdp", fsdp=True, **kwargs)
    ddp = run_ddp("tests.callbacks.test_dpsgd_language_models:_ddp_worker", tmp_path / "ddp", **kwargs)
    assert [r["steps"] for r in fsdp] == [r["global_step"] for r in fsdp] == [32, 32]
    for f, d in zip(fsdp, ddp):
        assert min(f["rows"]) > 0  # no batch of zero rows reached the model
        real = d["rows"]  # DDP's training_step calls: the rank's non-empty batches (DDP skips the model otherwise)
        assert len(real) < 32 and len(f["rows"]) == 32  # FSDP2 ran every step, the empty ones on one placeholder row
        assert f["rows"].count(1) >= 32 - len(real)
        # an empty rank's shard once kept the other ranks' unclipped first-pass sum (6e-4 away from DDP after 32 steps)
        torch.testing.assert_close(f["weights"], d["weights"], atol=1e-5, rtol=0)
    assert torch.equal(fsdp[0]["weights"], fsdp[1]["weights"])

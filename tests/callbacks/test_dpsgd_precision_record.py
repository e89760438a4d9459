"""DPSGD records the Trainer's precision and counts the steps whose clipped sum bounded each example by C only up to
16-bit rounding (ghost clipping under 16-bit precision where book-keeping does not make the sum exact, or a step whose
sum a second 16-bit pass formed); the privacy statement says how many of its steps those were, and a resumed fit
continues the count. Before, a statement of a bf16 ghost fit read as if every step were exact."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_privacy import DPSGD, privacy_statement
from lightning_privacy.dpsgd.bookkeeping import BookKeeping
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer
from tests.callbacks.test_dpsgd_ghost import MLP

ROUNDED = "steps (ghost clipping, precision"


def _fit(precision, mode="ghost", *, tmp_path=None, epochs=1, dp=None, ckpt_path=None, module=None):
    torch.manual_seed(0)
    dp = dp or DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0)
    module = module or (MLP() if mode == "ghost" else tiny_module())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([dp], tmp_path, max_epochs=epochs, precision=precision)
        t.fit(module, tiny_loader(), ckpt_path=ckpt_path)
    return t, dp, module


def _sentences(statement):
    return [s for s in statement.to_dict()["not_covered"] if ROUNDED in s]


def test_a_float32_fit_records_its_precision_and_no_rounded_step():
    t, dp, _ = _fit("32-true", "hooks")
    assert dp.precision == "32-true" and dp.rounded_steps == 0 and t.global_step > 0
    statement = privacy_statement(t)
    assert statement.to_dict()["mechanism"]["precision"] == {"precision": "32-true", "rounded_steps": 0}
    assert not _sentences(statement) and not any(
        "precision is not recorded" in s for s in statement.to_dict()["not_covered"]
    )
    assert "| precision | 32-true | each example bounded by C up to float32 rounding" in statement.to_markdown()


def test_ghost_with_16_bit_parameters_rounds_every_step_and_the_statement_says_how_many():
    t, dp, _ = _fit("bf16-true")
    assert dp.rounded_steps == t.global_step > 0  # (setup: ghost under bf16-true is bounded up to 16-bit rounding)
    statement = privacy_statement(t)
    [said] = _sentences(statement)
    assert said.startswith(f"{t.global_step} of the {t.global_step} steps (ghost clipping, precision 'bf16-true')")
    assert "only up to 16-bit rounding" in said
    assert f"| precision | bf16-true | {t.global_step} step(s) bounded by C only up to 16-bit rounding" in (
        statement.to_markdown()
    )


def test_book_kept_bf16_autocast_counts_only_the_steps_a_second_16_bit_pass_formed(monkeypatch):
    """bf16 autocast with Linear layers: book-keeping's float32 sums are exact; on every other step it is refused
    (as when a layer runs twice), a second 16-bit backward pass forms the sum, and only those steps count."""
    refused = []
    ready = BookKeeping.ready

    def every_other(self, batch_size):
        answer = ready(self, batch_size) and len(refused) % 2 == 1
        refused.append(not answer)
        return answer

    monkeypatch.setattr(BookKeeping, "ready", every_other)
    t, dp, _ = _fit("bf16-mixed")
    assert t.global_step >= 4 and dp.rounded_steps == sum(refused) == (len(refused) + 1) // 2
    [said] = _sentences(privacy_statement(t))
    assert said.startswith(f"{dp.rounded_steps} of the {t.global_step} steps (ghost clipping, precision 'bf16-mixed')")


def test_book_kept_bf16_autocast_rounds_no_step():
    t, dp, _ = _fit("bf16-mixed")
    assert dp.precision == "bf16-mixed" and dp.rounded_steps == 0 and t.global_step > 0
    assert not _sentences(privacy_statement(t))


@pytest.mark.parametrize("mode", ["hooks", "functional"])
def test_modes_that_clip_each_per_example_gradient_in_float32_round_no_step(mode):
    t, dp, _ = _fit("bf16-true", mode)
    assert dp.rounded_steps == 0 and t.global_step > 0


def test_a_resumed_fit_continues_the_count_and_records_both_precisions(tmp_path):
    t, dp, module = _fit("bf16-true", tmp_path=tmp_path)
    first = t.global_step
    path = tmp_path / "bf16.ckpt"
    t.save_checkpoint(path)
    saved = privacy_statement(path).to_dict()["mechanism"]["precision"]
    assert saved == {"precision": "bf16-true", "rounded_steps": first}  # (from the file alone)
    again = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", sampling_seed=0)
    t2, dp2, _ = _fit("32-true", tmp_path=tmp_path, epochs=2, dp=again, ckpt_path=path, module=MLP())
    assert t2.global_step > first and dp2.rounded_steps == first  # (the float32 steps are not rounded)
    assert dp2.precision == "bf16-true, then 32-true"
    [said] = _sentences(privacy_statement(t2))
    assert said.startswith(
        f"{first} of the {t2.global_step} steps (ghost clipping, precision 'bf16-true, then 32-true')"
    )


def test_a_checkpoint_without_a_precision_record_says_it_is_not_recorded(tmp_path):
    t, _, _ = _fit("32-true", "hooks", tmp_path=tmp_path)
    path = tmp_path / "model.ckpt"
    t.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    key = next(k for k in checkpoint["callbacks"] if k.startswith("DPSGD"))
    state = checkpoint["callbacks"][key]
    del state["precision"], state["digest"]  # (as an older version saved it)
    statement = privacy_statement(checkpoint)
    assert any("The training precision is not recorded" in s for s in statement.to_dict()["not_covered"])
    assert "| precision | not recorded |" in statement.to_markdown()


@pytest.mark.parametrize(("mode", "precision"), [("ghost", "bf16-true"), ("hooks", "32-true")])
def test_a_deepcopy_of_the_module_at_fit_end_does_not_reach_the_dp_optimizer(mode, precision):
    """The step counter reaches DPSGD through a weak reference: the module holds its backward, and PANORAMIA deep-
    copies the module at fit end. A strong one made that copy reach the DP optimizer, whose copy failed, and torch's
    ``Optimizer.__setstate__`` patched the class's ``step`` for every later fit of the process."""
    import copy

    from lightning.pytorch.callbacks import Callback

    from lightning_privacy.dpsgd import optimizers

    copies = []

    class CopyAtEnd(Callback):
        def on_fit_end(self, trainer, pl_module):
            copies.append(copy.deepcopy(pl_module))

    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0)
    module = MLP() if mode == "ghost" else tiny_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([dp, CopyAtEnd()], max_epochs=1, precision=precision)
        t.fit(module, tiny_loader())
    assert len(copies) == 1 and dp.rounded_steps == (t.global_step if mode == "ghost" else 0)
    for cls in (optimizers._DPOptimizer, optimizers._GhostDPOptimizer):
        assert not getattr(cls.step, "hooked", False)  # (torch's profiling wrapper was never put on the class)


def test_a_dpsgd_reused_for_another_module_starts_its_record_afresh():
    """Like the ledger: another module's privacy starts at 0, and so does its count (a count above the new ledger's
    steps would make the statement of the second model inconsistent)."""
    t, dp, _ = _fit("bf16-true")
    assert dp.rounded_steps == t.global_step > 0
    t2, dp2, _ = _fit("32-true", dp=dp, module=MLP())
    assert dp2 is dp and dp.precision == "32-true" and dp.rounded_steps == 0 and dp.ledger.steps == t2.global_step
    statement = privacy_statement(t2)
    assert statement.to_dict()["consistency"]["status"] == "consistent" and not _sentences(statement)


def test_a_resume_from_a_checkpoint_without_the_record_says_the_earlier_steps_are_not_recorded(tmp_path):
    t, _, _ = _fit("32-true", tmp_path=tmp_path)
    path = tmp_path / "old.ckpt"
    t.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    state = checkpoint["callbacks"][next(k for k in checkpoint["callbacks"] if k.startswith("DPSGD"))]
    del state["precision"], state["digest"]  # (as an older version saved it)
    torch.save(checkpoint, path)
    again = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", sampling_seed=0)
    t2, dp, _ = _fit("32-true", tmp_path=tmp_path, epochs=2, dp=again, ckpt_path=path, module=MLP())
    assert dp.precision == "not recorded, then 32-true" and dp.rounded_steps == 0 and t2.global_step > t.global_step
    notes = privacy_statement(t2).to_dict()["not_covered"]
    assert any(s.startswith("The training precision of the steps before a resume is not recorded") for s in notes)

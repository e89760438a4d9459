"""EZ-MIA (``attack="ezmia"``): a fine-tuned language model against its own base, per sequence, in ``audit_membership``
and ``MembershipAudit``: a PEFT model's base is itself with the adapters disabled, a full fine-tune needs
``base_model`` (refused naming it, before training in the callback); an over-fitted LoRA fine-tune's members are found
about as well as by LOSS, an un-fine-tuned model's are not (AUC 0.5)."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Subset

from lightning_privacy import names
from lightning_privacy.audits import audit_membership
from lightning_privacy.callbacks.membership_audit import MembershipAudit
from lightning_privacy.functional.base_reference import ErrorZoneSignal
from lightning_privacy.functional.sequence_loss import causal_lm_signal

pytest.importorskip("peft")
from tests.callbacks._language_models import PaddedSequences, TinyCausalLM  # noqa: E402

N = 16
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _split(seed: int):
    data = PaddedSequences(2 * N, seed=seed)
    return Subset(data, range(N)), Subset(data, range(N, 2 * N))


def _over_fit(model, members, steps: int, lr: float):
    """Full-batch Adam on the members' mean token loss (no DP): the model memorises them."""
    batch = next(iter(DataLoader(members, batch_size=N)))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        causal_lm_signal(model, batch).mean().backward()
        opt.step()
    return model.eval()


def _audit(model, members, nonmembers, **kwargs):
    loaders = DataLoader(members, batch_size=8), DataLoader(nonmembers, batch_size=8)
    return audit_membership(model, *loaders, warn=False, **kwargs)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_over_fitted_lora_fine_tunes_members_are_found_about_as_well_as_by_loss(seed):
    members, nonmembers = _split(seed)
    torch.manual_seed(seed)
    model = _over_fit(TinyCausalLM("llama", lora=True, seed=seed), members, steps=250, lr=0.05)
    ez = _audit(model, members, nonmembers, attack="ezmia")
    loss = _audit(model, members, nonmembers, attack="loss", signal_fn=causal_lm_signal)
    # measured (seeds 0-3): EZ-MIA 0.92-0.99, LOSS 0.98-1.0 — a randomly initialised base predicts every sequence
    # alike, so LOSS is already calibrated here; a real pretrained base is where the reference earns its keep
    assert ez.auc >= 0.85 and ez.auc >= loss.auc - 0.1, (ez.auc, loss.auc)
    assert ez.attack == "ezmia" and ez.variant == "base: adapters disabled" and ez.scores.shape == (2 * N,)
    assert set(ez.metrics()) == {
        names.EZMIA_AUC, names.EZMIA_TPR_AT_FPR_0_001, names.EZMIA_TPR_AT_FPR_0_01, names.EZMIA_TPR_AT_FPR_0_1,
        names.EZMIA_EPSILON_LOWER,
    }  # fmt: skip
    assert any(note.startswith("EZ-MIA") for note in ez.notes)
    section = ez.report_section()
    assert "EZ-MIA (Ilić et al. 2026)" in section.rows[0][2] and "EZMIA" in ez.summary()


def test_an_un_fine_tuned_models_scores_say_nothing():
    members, nonmembers = _split(0)
    fresh = TinyCausalLM("llama", lora=True, seed=0)  # LoRA's B starts at 0: the model is its base
    result = _audit(fresh, members, nonmembers, attack="ezmia")
    assert result.auc == 0.5 and np.all(result.scores == 0.5)
    assert result.epsilon["epsilon_lower"] == 0.0
    full = TinyCausalLM("llama", lora=False, seed=0)
    same = _audit(full, members, nonmembers, attack="ezmia", base_model=TinyCausalLM("llama", lora=False, seed=0))
    assert same.auc == 0.5 and same.variant == "base: base_model"


def test_a_full_fine_tune_needs_its_base_model_and_finds_its_members_with_it():
    members, nonmembers = _split(2)
    torch.manual_seed(2)
    model = _over_fit(TinyCausalLM("gpt2", lora=False, seed=2), members, steps=150, lr=0.01)
    with pytest.raises(ValueError, match=r"holds no PEFT adapters \(full fine-tuning\), so pass `base_model=`"):
        _audit(model, members, nonmembers, attack="ezmia")
    result = _audit(
        model, members, nonmembers, attack="ezmia", base_model=TinyCausalLM("gpt2", lora=False, seed=2), claim=(0.05, 0)
    )
    assert result.auc >= 0.95 and result.variant == "base: base_model"
    assert result.verdict == "contradicted"  # a false claim of ε = 0.05 on a model that memorised its members


def test_arguments_that_do_not_fit_the_attack_are_named():
    members, nonmembers = _split(0)
    model = TinyCausalLM("llama", lora=True, seed=0)
    with pytest.raises(ValueError, match="`base_model` is EZ-MIA's reference: it needs attack='ezmia'"):
        _audit(model, members, nonmembers, attack="loss", signal_fn=causal_lm_signal, base_model=model)
    with pytest.raises(ValueError, match="attack='ezmia' scores sequences with its own signal"):
        _audit(model, members, nonmembers, attack="ezmia", signal_fn=causal_lm_signal)
    own = _audit(model, members, nonmembers, attack="ezmia", signal_fn=ErrorZoneSignal(min_error_tokens=1))
    assert own.auc == 0.5


def test_membership_audit_runs_ezmia_at_fit_end_and_refuses_a_full_fine_tune_without_base_before_training():
    members, nonmembers = _split(3)
    audit = MembershipAudit(attack="ezmia", nonmember_dataloader=DataLoader(nonmembers, batch_size=8), claim=(0.05, 0))
    torch.manual_seed(3)
    model = TinyCausalLM("llama", lora=True, seed=3)
    model.configure_optimizers = lambda: torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=60, callbacks=[audit], **QUIET).fit(model, DataLoader(members, batch_size=N))
    assert audit.result.attack == "ezmia" and audit.references is None  # no reference model trained
    assert audit.results[names.EZMIA_AUC] >= 0.85 and audit.result.verdict == "contradicted"  # measured: 0.97

    with pytest.raises(MisconfigurationException, match="attack='ezmia'"):
        MembershipAudit(attack="loss", base_model=model)
    full = TinyCausalLM("llama", lora=False, seed=3)
    refuse = MembershipAudit(attack="ezmia", nonmember_dataloader=DataLoader(nonmembers, batch_size=8))
    with pytest.raises(MisconfigurationException, match="MembershipAudit: .* so pass `base_model=`"):
        pl.Trainer(max_epochs=1, callbacks=[refuse], **QUIET).fit(full, DataLoader(members, batch_size=N))
    assert full.rows_seen == []  # refused before the first training step

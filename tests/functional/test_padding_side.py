"""Sequence scores do not depend on the padding side (issue 49): a sequence scores the same alone, right-padded and
left-padded in a batch, for every language-model signal, on a tiny GPT-2 and Llama from transformers.

Before: under left padding the first real token counted as a target predicted from a pad, and the model was called
without ``position_ids``, so GPT-2's positions started at the first pad (its logits moved by up to 14.6); and EZ-MIA
skipped the first *counted* target, where the authors' ``ignore_bos`` skips position 0 (a prefix masked by labels
−100 then lost one more token)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_privacy.functional.base_reference import (
    BaseLossDifferenceSignal,
    ErrorZoneSignal,
    error_zone_parts,
)
from lightning_privacy.functional.sequence_loss import CausalLMSignal, causal_lm_signal, min_k_percent_signal

pytest.importorskip("transformers")

from tests.callbacks._language_models import PAD, VOCAB, hugging_face_model  # noqa: E402

LENGTHS = (9, 4, 6, 12)


def _sequences(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]


def _batch(sequences, side):
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), PAD)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        where = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, where], mask[i, where] = s, 1
    return {"input_ids": ids, "attention_mask": mask}


def _models(kind):
    torch.manual_seed(1)
    model = hugging_face_model(kind).eval()
    torch.manual_seed(2)
    base = hugging_face_model(kind).eval()
    return model, base


SIGNALS = {
    "mean": lambda base: causal_lm_signal,
    "sum": lambda base: CausalLMSignal(reduction="sum"),
    "min_k": lambda base: min_k_percent_signal,
    "ezmia": lambda base: ErrorZoneSignal(base_model=base),
    "base_loss": lambda base: BaseLossDifferenceSignal(base_model=base),
}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_a_sequence_scores_the_same_alone_right_padded_and_left_padded(kind, name):
    model, base = _models(kind)
    signal = SIGNALS[name](base)
    sequences = _sequences()
    with torch.no_grad():
        alone = torch.cat([signal(model, _batch([s], "right")) for s in sequences])
        for side in ("right", "left"):
            got = signal(model, _batch(sequences, side))
            assert torch.allclose(got, alone, rtol=1e-4, atol=1e-5), (side, got, alone)
    if name == "mean":  # the counted targets: each sequence's length − 1, on both sides
        for side in ("right", "left"):
            assert causal_lm_signal.num_tokens(_batch(sequences, side)).tolist() == [n - 1 for n in LENGTHS]


def _lora(model):
    """``model`` (GPT-2) wrapped by PEFT's LoRA: ``PeftModelForCausalLM.forward`` takes ``position_ids`` only through
    ``**kwargs``, and the wrapper passes them on to GPT-2."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, lora_dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (peft's note on Conv1D's fan_in_fan_out)
        wrapped = get_peft_model(model, config)
    for name, param in wrapped.named_parameters():  # (LoRA's B starts at zero: make the adapters change the logits)
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    return wrapped.eval()


@pytest.mark.parametrize("name", ["mean", "sum"])
def test_a_peft_lora_wrapper_scores_the_same_left_and_right_padded(name):
    pytest.importorskip("peft")
    wrapped = _lora(_models("gpt2")[0])
    signal = SIGNALS[name](None)
    sequences = _sequences()
    with torch.no_grad():
        alone = torch.cat([signal(wrapped, _batch([s], "right")) for s in sequences])
        right = signal(wrapped, _batch(sequences, "right"))
        left = signal(wrapped, _batch(sequences, "left"))
        with wrapped.disable_adapter():
            bare = torch.cat([signal(wrapped, _batch([s], "right")) for s in sequences])
    assert torch.allclose(right, alone, rtol=1e-4, atol=1e-5), (right, alone)
    assert torch.allclose(left, alone, rtol=1e-4, atol=1e-5), (left, alone)
    assert not torch.allclose(bare, alone, rtol=1e-3)  # (the adapters are live: the scores are LoRA's)


def test_left_padding_without_position_ids_would_move_gpt2_s_scores():
    """The failure mode the position ids prevent (GPT-2 learns absolute positions): the same left-padded batch scored
    by a wrapper that hides ``position_ids`` differs from the unpadded scores."""
    model, _ = _models("gpt2")

    def without_positions(input_ids, attention_mask=None):
        return model(input_ids=input_ids, attention_mask=attention_mask)

    sequences = _sequences()
    with torch.no_grad():
        alone = torch.cat([causal_lm_signal(model, _batch([s], "right")) for s in sequences])
        moved = causal_lm_signal(without_positions, _batch(sequences, "left"))
    assert not torch.allclose(moved, alone, rtol=1e-3)


def test_ezmia_skips_position_0_as_ignore_bos_and_not_into_a_prefix_masked_by_labels():
    torch.manual_seed(0)
    logits, base = torch.randn(2, 8, VOCAB), torch.randn(2, 8, VOCAB)
    ids = torch.randint(1, VOCAB, (2, 8))
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt masked by labels: targets 1 and 2 (positions 0 and 1) are not scored
    skipped = error_zone_parts(logits, base, labels, skip_first=True, min_error_tokens=1)
    kept = error_zone_parts(logits, base, labels, skip_first=False, min_error_tokens=1)
    assert skipped.tokens.tolist() == kept.tokens.tolist() == [5, 5]  # position 0 was masked already
    plain = error_zone_parts(logits, base, ids, skip_first=True, min_error_tokens=1)
    assert plain.tokens.tolist() == [6, 6]  # 7 targets, position 0 skipped

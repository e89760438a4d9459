"""EZ-MIA's Error Zone score against a by-hand computation: per sequence, padding masked, the first target left out, the
error zone of the fine-tuned model's top-1 mistakes, the fallback to every token for a zone too small, and the base of
a PEFT model taken with its adapters disabled (no copy)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_privacy.functional.base_reference import (
    ErrorZoneSignal,
    adapter_models,
    error_zone_parts,
    error_zone_scores,
)


def _by_hand(logits, base_logits, ids, mask, min_error_tokens=2, skip_first=True):
    """Loops over sequences and positions, with math.log of softmax probabilities."""
    scores = []
    for b in range(ids.shape[0]):
        targets = [t for t in range(1, ids.shape[1]) if mask[b, t]]
        if skip_first:
            targets = targets[1:]
        deltas, wrong = [], []
        for t in targets:
            p_ft = torch.softmax(logits[b, t - 1].double(), -1)
            p_base = torch.softmax(base_logits[b, t - 1].double(), -1)
            true = int(ids[b, t])
            deltas.append(math.log(p_ft[true]) - math.log(p_base[true]))
            wrong.append(int(p_ft.argmax()) != true)
        zone = [d for d, w in zip(deltas, wrong) if w]
        if len(zone) < min_error_tokens:
            zone = deltas
        up = sum(d for d in zone if d > 0)
        down = sum(-d for d in zone if d < 0)
        if up > 0 and down > 0:
            scores.append(up / (up + down))
        else:
            scores.append(1 + up if up > 0 else -down if down > 0 else 0.5)
    return scores


@pytest.mark.parametrize("min_error_tokens, skip_first", [(2, True), (1, False), (5, True)])
def test_the_score_is_the_by_hand_share_of_upward_shifts_at_the_error_positions(min_error_tokens, skip_first):
    g = torch.Generator().manual_seed(0)
    B, T, V = 6, 9, 5
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor([9, 7, 4, 9, 5, 8])[:, None]).long()
    ids = ids * mask
    logits, base = torch.randn(B, T, V, generator=g) * 2, torch.randn(B, T, V, generator=g)
    parts = error_zone_parts(logits, base, ids, mask, min_error_tokens=min_error_tokens, skip_first=skip_first)
    expected = _by_hand(logits, base, ids, mask, min_error_tokens, skip_first)
    torch.testing.assert_close(parts.score.double(), torch.tensor(expected, dtype=torch.double), rtol=0, atol=1e-6)
    assert parts.tokens.tolist() == [int(m.sum()) - 1 - int(skip_first) for m in mask]
    # the paper's ratio P⁺/P⁻ is the same ordering: score = r / (1 + r) where it is finite and positive
    both = (parts.positive > 0) & (parts.negative > 0)
    ratio = parts.positive / parts.negative
    torch.testing.assert_close(parts.score[both], (ratio / (1 + ratio))[both])


def test_float64_logits_score_in_float64_and_16_bit_logits_in_float32():
    """The scores keep the logits' precision, float32 at least: float64 agrees with the by-hand loop to 1e-12."""
    g = torch.Generator().manual_seed(1)
    B, T, V = 4, 8, 5
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    logits, base = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2, torch.randn(B, T, V, generator=g)
    wide = error_zone_parts(logits, base.double(), ids, mask).score
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide, torch.tensor(_by_hand(logits, base, ids, mask), dtype=torch.float64), rtol=0,
                               atol=1e-12)  # fmt: skip
    assert error_zone_parts(logits.bfloat16(), base.bfloat16(), ids, mask).score.dtype == torch.float32


def test_padding_is_masked_so_a_sequence_scores_alike_however_much_padding_its_batch_added():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 7, (1, 6), generator=g)
    logits, base = torch.randn(1, 6, 7, generator=g), torch.randn(1, 6, 7, generator=g)
    alone = error_zone_scores(logits, base, ids, torch.ones(1, 6, dtype=torch.long))
    padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    pad_logits = torch.cat([logits, 100 * torch.randn(1, 4, 7, generator=g)], dim=1)  # garbage after the sequence
    pad_base = torch.cat([base, -100 * torch.randn(1, 4, 7, generator=g)], dim=1)
    mask = (torch.arange(10) < 6).long()[None]
    torch.testing.assert_close(error_zone_scores(pad_logits, pad_base, padded_ids, mask), alone)
    labels = padded_ids.masked_fill(mask == 0, -100)  # or the padding's labels set to ignore_index
    torch.testing.assert_close(error_zone_scores(pad_logits, pad_base, labels), alone)


def test_degenerate_zones_score_as_their_limits_not_as_the_published_codes_zero():
    ids = torch.tensor([[0, 1, 2, 3, 1]])
    base = torch.zeros(1, 5, 4)  # uniform
    perfect = torch.full((1, 5, 4), -5.0)
    perfect[0, torch.arange(4), ids[0, 1:]] = 5.0  # every next token top-1 and far above the base
    parts = error_zone_parts(perfect, base, ids)
    assert parts.errors.item() == 0 and parts.fallback.item() and parts.negative.item() == 0
    assert parts.score.item() == pytest.approx(1 + parts.positive.item())  # memorised: above every finite ratio
    weaker = error_zone_parts(perfect / 2, base, ids)
    assert 1 < weaker.score.item() < parts.score.item()  # all upward too, by less: ranked below
    assert error_zone_scores(base, base, ids).item() == 0.5  # no shift at all: balanced
    assert error_zone_scores(-perfect, base, ids).item() < 0  # every shift downward: below every positive ratio


def test_bad_arguments_are_named():
    x = torch.zeros(1, 3, 4)
    with pytest.raises(ValueError, match="`logits` and `base_logits` of the same shape"):
        error_zone_scores(x, torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="`min_error_tokens`"):
        error_zone_scores(x, x, torch.zeros(1, 3, dtype=torch.long), min_error_tokens=0)
    with pytest.raises(ValueError, match="no scored token"):  # two tokens, the first target left out: nothing left
        error_zone_scores(x, x, torch.zeros(1, 3, dtype=torch.long), torch.tensor([[1, 1, 0]]))
    with pytest.raises(TypeError, match="`base_model`"):
        ErrorZoneSignal(base_model=3)


def test_a_peft_models_base_is_itself_with_adapters_disabled_and_they_come_back_on():
    pytest.importorskip("peft")
    from tests.callbacks._language_models import PaddedSequences, TinyCausalLM

    data = PaddedSequences(8, seed=3)
    batch = {"input_ids": data.ids, "attention_mask": data.mask}
    model = TinyCausalLM("llama", lora=True, seed=0)
    assert [type(m).__name__ for m in adapter_models(model)] == ["PeftModel"]  # the outermost one only
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # the adapters now change the model
    with torch.no_grad():
        before = model(**batch)
        scores = ErrorZoneSignal()(model, batch)
        after = model(**batch)
        # the base = the model before fine-tuning: a fresh LoRA model (lora_B = 0) of the same seed
        explicit = ErrorZoneSignal(base_model=TinyCausalLM("llama", lora=True, seed=0))(model, batch)
    torch.testing.assert_close(after, before)  # adapters enabled again
    torch.testing.assert_close(scores, explicit)
    assert scores.shape == (8,) and scores.std() > 0.1

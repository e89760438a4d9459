"""The one-run black-box canary audit of LM fine-tuning: random-token canaries inserted with probability 1/2 (seeded),
scored by the fine-tuned model against its base; a tiny LoRA fine-tune without DP memorises them (a positive ε lower
bound, a false claim of ε = 0.05 contradicted), the same under DP-SGD at ε ≈ 1.9 stays consistent with its ledger."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.audits.lm_canaries import (
    audit_language_model_canaries,
    canary_scores,
    language_model_canaries,
)
from lightning_privacy.functional.sequence_loss import causal_lm_signal, causal_lm_token_losses

pytest.importorskip("peft")
from tests.callbacks._language_models import LENGTH, PAD, VOCAB, PaddedSequences, TinyCausalLM  # noqa: E402

M = 64
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _canaries(seed: int = 0):
    return language_model_canaries(M, vocab_size=VOCAB, length=LENGTH, seed=seed, exclude_token_ids=[PAD])


def _fine_tune(canaries, dpsgd=None, epochs: int = 30):
    """LoRA on 32 sequences plus the included canaries, batch 16, Adam; with DPSGD if given."""
    torch.manual_seed(0)
    model = TinyCausalLM("llama", lora=True, seed=0)
    model.configure_optimizers = lambda: torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 0.05)
    data = DataLoader(canaries.with_canaries(PaddedSequences(32, seed=1)), batch_size=16, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=epochs, callbacks=[dpsgd] if dpsgd else [], **QUIET).fit(model, data)
    return model.eval()


def test_the_canaries_and_their_inclusion_are_drawn_from_the_seed():
    a, b, c = _canaries(0), _canaries(0), _canaries(1)
    assert torch.equal(a.input_ids, b.input_ids) and np.array_equal(a.included, b.included)
    assert not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape == (M, LENGTH) and bool((a.input_ids != PAD).all()) and bool((a.attention_mask == 1).all())
    assert 16 < a.included.sum() < 48  # Bernoulli(1/2)
    train = a.with_canaries(PaddedSequences(32, seed=1))
    assert len(train) == 32 + int(a.included.sum())
    inserted = [train[32 + i]["input_ids"] for i in range(len(a.inserted()))]
    assert all(torch.equal(x, a.input_ids[j]) for x, j in zip(inserted, np.flatnonzero(a.included)))
    padded = language_model_canaries(3, vocab_size=10, length=4, pad_to=6, pad_token_id=9, exclude_token_ids=[9])
    assert padded.input_ids[:, 4:].eq(9).all() and padded.attention_mask.sum(1).tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="`length` to be an int >= 3"):
        language_model_canaries(4, vocab_size=10, length=2)
    with pytest.raises(ValueError, match="`exclude_token_ids` leaves no token"):
        language_model_canaries(4, vocab_size=2, length=3, exclude_token_ids=[0, 1])


def test_the_loss_difference_score_is_the_bases_loss_minus_the_fine_tuned_ones():
    canaries = _canaries()
    model = TinyCausalLM("llama", lora=True, seed=0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    batch = {"input_ids": canaries.input_ids, "attention_mask": canaries.attention_mask}
    with torch.no_grad():
        fine_tuned = causal_lm_signal(model, batch)
        base = causal_lm_signal(TinyCausalLM("llama", lora=True, seed=0), batch)  # lora_B = 0: the base
    scores = canary_scores(model, canaries, batch_size=10)
    np.testing.assert_allclose(scores, (base - fine_tuned).double().numpy(), atol=1e-5)
    np.testing.assert_allclose(canary_scores(model, canaries, score="loss"), -fine_tuned.double().numpy(), atol=1e-6)
    full = TinyCausalLM("llama", lora=False, seed=0)
    with pytest.raises(ValueError, match="so pass `base_model=`"):
        canary_scores(full, canaries)
    assert canary_scores(full, canaries, score="loss").shape == (M,)  # needs no base
    with pytest.raises(ValueError, match="`score`"):
        canary_scores(model, canaries, score="zlib")


@pytest.mark.parametrize("score", ["loss_difference", "ezmia"])
def test_a_fine_tune_without_dp_memorises_its_canaries_and_contradicts_a_small_claim(score):
    canaries = _canaries()
    model = _fine_tune(canaries)
    result = audit_language_model_canaries(model, canaries, delta=1e-5, claim=(0.05, 1e-5), score=score)
    # measured: ε ≥ 0.80 (binomial) and 1.23 (Gaussian f-DP) for either score; the ceiling for m = 64 is 2.33
    assert 0.3 < result.epsilon_lower <= result.ceiling and result.verdict == "contradicted"
    assert result.kind == f"language-model canaries ({score})" and result.num_canaries == M
    assert result.num_included == int(canaries.included.sum())


def test_a_dp_fine_tune_stays_consistent_with_its_ledger():
    canaries = _canaries()
    dpsgd = DPSGD(noise_multiplier=6.0, sampling_seed=0, noise_seed=0)
    model = _fine_tune(canaries, dpsgd)
    epsilon = dpsgd.epsilon(1e-5)
    assert 1.0 < epsilon < 3.0  # measured: 1.85
    result = audit_language_model_canaries(model, canaries, delta=1e-5, claim=dpsgd.ledger, accountant_epsilon=epsilon)
    assert result.verdict == "consistent" and result.epsilon_lower <= epsilon  # measured: 0.0 at this size


SECRET = (29, 30, 31)  # new tokens: the fine-tuning data below never uses them


def _data_without_the_new_tokens():
    data = PaddedSequences(32, seed=1)
    data.ids = torch.where(data.ids >= min(SECRET), data.ids - 10, data.ids)
    assert not torch.isin(data.ids, torch.tensor(SECRET)).any()
    return data


def _new_token_canaries(seed: int = 0):
    return language_model_canaries(
        M, vocab_size=VOCAB, length=LENGTH, seed=seed, exclude_token_ids=[PAD], secret_token_ids=SECRET, secret_length=4
    )


def test_new_token_canaries_end_in_a_secret_of_new_tokens_and_only_the_secret_is_scored():
    canaries, plain = _new_token_canaries(), _canaries()
    assert canaries.scored_from == LENGTH - 4 and plain.scored_from == 0
    assert canaries.secret_tokens_shared  # 3 ids for 64 canaries × 4 tokens
    own = language_model_canaries(5, vocab_size=40, length=6, secret_token_ids=range(30, 40), secret_length=2)
    assert not own.secret_tokens_shared and own.input_ids[:, 4:].unique().numel() == 10  # no token in two secrets
    assert torch.isin(canaries.input_ids[:, -4:], torch.tensor(SECRET)).all()
    assert not torch.isin(canaries.input_ids[:, :-4], torch.tensor([PAD, *SECRET])).any()
    assert np.array_equal(canaries.included, plain.included)  # the same seed draws the same inclusion
    assert torch.equal(canaries.dataset()[0]["labels"][: LENGTH - 4], torch.full((LENGTH - 4,), -100))
    assert "labels" not in canaries.inserted("all")[0]  # loss_on="all": training sees every token
    assert torch.equal(canaries.inserted()[0]["labels"][: LENGTH - 4], torch.full((LENGTH - 4,), -100))  # default
    model = TinyCausalLM("llama", lora=True, seed=0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    base = TinyCausalLM("llama", lora=True, seed=0)  # lora_B = 0: the base
    ids, mask = canaries.input_ids, canaries.attention_mask
    with torch.no_grad():
        by_hand = []
        for m in (base, model):  # the mean loss of the 4 secret tokens, from the per-token losses
            per_token, _ = causal_lm_token_losses(m(input_ids=ids, attention_mask=mask), ids, mask)
            by_hand.append(per_token[:, LENGTH - 5 :].mean(1))
    np.testing.assert_allclose(canary_scores(model, canaries), (by_hand[0] - by_hand[1]).double().numpy(), atol=1e-5)
    for bad, match in (
        (dict(secret_length=2), "`secret_length` .* pass `secret_token_ids`"),
        (dict(secret_token_ids=[31], secret_length=None), "need `secret_length`"),
        (dict(secret_token_ids=[32], secret_length=1), r"`secret_token_ids` to be ids in \[0, 32\)"),
        (dict(secret_token_ids=[0, 31], secret_length=1), r"share \[0\]"),
        (dict(secret_token_ids=[31], secret_length=LENGTH - 1), "`secret_length` <= length - 2"),
    ):
        with pytest.raises(ValueError, match=match):
            language_model_canaries(4, vocab_size=VOCAB, length=LENGTH, exclude_token_ids=[PAD], **bad)


def test_loss_on_the_secret_gives_the_inserted_canaries_the_secret_s_loss_alone():
    """Panda et al.'s recipe: with ``loss_on="secret"`` an inserted canary's training loss is its secret's mean token
    loss (checked by hand), the data's rows keep their loss (labels = their ids) and one batch mixes both."""
    canaries = _new_token_canaries()
    data = _data_without_the_new_tokens()
    train = canaries.with_canaries(data)  # new-token canaries: loss_on="secret" by default
    n = len(data)
    assert len(train) == n + int(canaries.included.sum())
    assert torch.equal(train[0]["labels"], data[0]["input_ids"])  # the data's rows: every token, as before
    first = train[n]  # the first inserted canary
    j = int(np.flatnonzero(canaries.included)[0])
    assert torch.equal(first["input_ids"], canaries.input_ids[j])
    assert (first["labels"][: LENGTH - 4] == -100).all() and torch.equal(
        first["labels"][-4:], canaries.input_ids[j, -4:]
    )
    assert "labels" not in canaries.with_canaries(data, loss_on="all")[n] and "labels" not in _canaries().inserted()[0]
    batch = next(iter(DataLoader(train, batch_size=len(train), shuffle=False)))
    model = TinyCausalLM("llama", lora=False, seed=0).eval()
    with torch.no_grad():
        losses = causal_lm_signal(model, batch)
        per_token, _ = causal_lm_token_losses(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]),
            batch["input_ids"],
            batch["attention_mask"],
        )
        plain = causal_lm_signal(model, {k: batch[k] for k in ("input_ids", "attention_mask")})
    # canaries (the rows after the data): the mean of the 4 secret tokens' losses (predicted from positions T-5 … T-2)
    torch.testing.assert_close(losses[n:], per_token[n:, LENGTH - 5 :].mean(1))
    assert not torch.allclose(losses[n:], plain[n:])  # the prefix's loss is gone from their training loss
    torch.testing.assert_close(losses[:n], plain[:n])  # the data's unchanged
    with pytest.raises(ValueError, match="loss_on='secret' is for new-token canaries"):
        _canaries().with_canaries(data, loss_on="secret")
    with pytest.raises(ValueError, match="`loss_on`"):
        canaries.inserted(loss_on="prefix")
    with pytest.raises(TypeError, match="mappings with `input_ids`"):
        canaries.with_canaries([torch.zeros(LENGTH, dtype=torch.long)], loss_on="secret")[0]


def test_new_token_canaries_are_memorised_by_a_full_fine_tune_and_contradict_a_small_claim():
    canaries = _new_token_canaries()
    torch.manual_seed(0)
    model = TinyCausalLM("llama", lora=False, seed=0)
    base = TinyCausalLM("llama", lora=False, seed=0).eval()
    model.configure_optimizers = lambda: torch.optim.Adam(model.parameters(), 0.01)
    data = DataLoader(canaries.with_canaries(_data_without_the_new_tokens()), batch_size=16, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=30, **QUIET).fit(model, data)
    result = audit_language_model_canaries(model.eval(), canaries, delta=1e-5, base_model=base, claim=(0.05, 1e-5))
    assert 0.3 < result.epsilon_lower <= result.ceiling and result.verdict == "contradicted"


def test_repetitions_insert_every_included_canary_k_times():
    """``repetitions=k``: each included canary k times, in order (Panda et al.'s repetitions; the audit is then of
    groups of k: ``tests/analysis/test_group_privacy.py``), with either loss."""
    plain, secret = _canaries(), _new_token_canaries()
    data = PaddedSequences(32, seed=1)
    included = int(plain.included.sum())
    train = plain.with_canaries(data, repetitions=3)
    assert len(train) == 32 + 3 * included and len(plain.inserted(repetitions=3)) == 3 * included
    order = np.repeat(np.flatnonzero(plain.included), 3)
    assert all(torch.equal(train[32 + i]["input_ids"], plain.input_ids[j]) for i, j in enumerate(order))
    labelled = secret.with_canaries(_data_without_the_new_tokens(), repetitions=2)
    n = len(_data_without_the_new_tokens())
    assert len(labelled) == n + 2 * int(secret.included.sum()) and "labels" in labelled[n]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="`repetitions` to be an int >= 1"):
            plain.inserted(repetitions=bad)

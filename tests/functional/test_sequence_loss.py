"""Per-sequence membership signals for language models: checked against a token loop and a direct numpy Min-K%,
padding and ignored labels left out, token logits refused where examples were expected, and a membership audit per
sequence on a memorising LM."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_privacy.audits import audit_membership
from lightning_privacy.functional.membership_loss import membership_losses_from_loader
from lightning_privacy.functional.sequence_loss import (
    CausalLMSignal,
    MinKPercentSignal,
    causal_lm_losses,
    causal_lm_signal,
    min_k_percent_signal,
    signal_kind,
)

V, T = 20, 12


class TinyLM(torch.nn.Module):
    """Embedding → GRU → vocabulary logits; called as Hugging Face causal LMs are (keywords, ``.logits``)."""

    def __init__(self, hf_output: bool = True) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = torch.nn.Embedding(V, 32), torch.nn.GRU(32, 64, batch_first=True), None
        self.head = torch.nn.Linear(64, V)
        self.hf_output = hf_output

    def forward(self, input_ids, attention_mask=None):
        logits = self.head(self.rnn(self.embed(input_ids))[0])
        return SimpleNamespace(logits=logits) if self.hf_output else logits


class Sequences(Dataset):
    """Random token sequences of lengths 6..T, right-padded with 0, as a tokenizer's collator gives them."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, V, (n, T), generator=g)
        lengths = torch.randint(6, T + 1, (n,), generator=g)
        self.mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        self.ids = self.ids * self.mask

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


def test_the_loss_is_each_sequences_mean_token_loss_over_its_counted_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, T, V, generator=g)
    data = Sequences(3, seed=1)
    labels = data.ids.clone()
    labels[2, 3] = -100  # a token left out by its label
    got = causal_lm_losses(logits, labels, data.mask)
    for b in range(3):
        terms = []
        for t in range(T - 1):
            if data.mask[b, t + 1] and labels[b, t + 1] != -100:
                terms.append(-torch.log_softmax(logits[b, t], dim=0)[labels[b, t + 1]])
        assert float(got[b]) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-6)
    padded = torch.cat([logits, torch.randn(3, 4, V, generator=g)], dim=1)  # more padding changes nothing
    more_ids = torch.cat([labels, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    more_mask = torch.cat([data.mask, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(causal_lm_losses(padded, more_ids, more_mask), got)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_the_losses_keep_the_logits_precision_float32_at_least(dtype):
    """float64 logits give float64 losses equal to a float64 loop to 1e-12 (they were float32 once, so a float64
    exactness test could not use them); 16-bit logits are widened to float32, not summed in 16 bits."""
    g = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(2, T, V, generator=g, dtype=torch.float64)).to(dtype)
    data = Sequences(2, seed=4)
    got = causal_lm_losses(logits, data.ids, data.mask)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    wide = logits.double()  # the same values, exactly
    want = [
        torch.stack(
            [-torch.log_softmax(wide[b, t], 0)[data.ids[b, t + 1]] for t in range(T - 1) if data.mask[b, t + 1]]
        ).mean()
        for b in range(2)
    ]
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got.double(), torch.stack(want), rtol=tolerance, atol=tolerance)


def test_a_sequence_without_a_scored_token_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"sequence\(s\) \[1\] .* no scored token"):
        causal_lm_losses(torch.zeros(2, 3, V), torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [1, 0, 0]]))
    with pytest.raises(ValueError, match=r"`logits` of shape \[B, T, V\]"):
        causal_lm_losses(torch.zeros(6, V), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="input_ids"):
        causal_lm_signal(TinyLM(), (torch.ones(2, 3, dtype=torch.long),))


def test_token_logits_where_examples_were_expected_are_refused_naming_the_fix():
    """The issue: a forward_fn returning [B·T, V] token logits ran silently as B·T "examples", padding included."""
    model, loader = TinyLM(), DataLoader(Sequences(8, seed=2), batch_size=4)

    def per_token(m, batch):
        logits = m(**batch).logits
        return logits.reshape(-1, V), batch["input_ids"].reshape(-1)

    with pytest.raises(
        ValueError, match=r"forward_fn gave \[48\] losses for a batch of 4 examples.*signal_fn=causal_lm"
    ):
        membership_losses_from_loader(model, loader, forward_fn=per_token)
    losses = membership_losses_from_loader(TinyLM(hf_output=False), loader, signal_fn=causal_lm_signal)
    assert losses.shape == (8,) and bool(torch.isfinite(losses).all())
    with pytest.raises(ValueError, match="not both"):
        membership_losses_from_loader(model, loader, forward_fn=per_token, signal_fn=causal_lm_signal)


def test_a_memorising_language_model_is_audited_per_sequence():
    members, nonmembers = Sequences(64, seed=3), Sequences(64, seed=4)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(members, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    for _ in range(40):  # memorise the member sequences
        for batch in loader:
            optimizer.zero_grad()
            causal_lm_signal(model, batch).mean().backward()
            optimizer.step()
    member_loader, nonmember_loader = DataLoader(members, batch_size=32), DataLoader(nonmembers, batch_size=32)
    result = audit_membership(
        model, member_loader, nonmember_loader, attack="loss", signal_fn=causal_lm_signal, warn=False
    )
    assert result.to_dict()["num_members"] == 64 and result.to_dict()["num_nonmembers"] == 64  # sequences, not tokens
    assert result.metrics()["audit/loss_auc"] > 0.95
    assert result.metrics()["audit/loss_epsilon_lower"] > 1.0


def test_the_summed_loss_is_the_mean_times_the_counted_tokens_and_the_signals_say_what_they_are():
    data = Sequences(5, seed=6)
    logits = torch.randn(5, T, V, generator=torch.Generator().manual_seed(1))
    mean = causal_lm_losses(logits, data.ids, data.mask)
    total = causal_lm_losses(logits, data.ids, data.mask, reduction="sum")
    counts = causal_lm_signal.num_tokens({"input_ids": data.ids, "attention_mask": data.mask})
    assert counts.tolist() == (data.mask[:, 1:].sum(dim=1)).tolist()
    torch.testing.assert_close(total, mean * counts)
    assert (signal_kind(causal_lm_signal), signal_kind(CausalLMSignal("sum")), signal_kind(min_k_percent_signal)) == (
        "mean_token_nll",
        "nll",
        "score",
    )
    with pytest.raises(ValueError, match=r"`reduction` to be 'mean' or 'sum', but got 'max'"):
        CausalLMSignal("max")
    with pytest.raises(ValueError, match=r"`k` to be a fraction in \(0, 1\], but got 0"):
        MinKPercentSignal(k=0)
    bad = lambda model, batch: None
    bad.kind = "likelihood"
    with pytest.raises(ValueError, match=r"`kind` of `signal_fn` to be one of .* but got 'likelihood'"):
        signal_kind(bad)


def test_min_k_percent_is_the_mean_log_probability_of_the_least_likely_tokens_padding_excluded():
    """Shi et al. 2024: Min-K%(x) = mean of the k% lowest token log-probabilities; the signal is its negative."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, T, V)) * 3
    ids = rng.integers(1, V, size=(3, T))
    mask = np.ones((3, T), dtype=np.int64)
    mask[1, 7:] = 0  # 6 scored tokens
    mask[2, 3:] = 0  # 2 scored tokens: ⌊0.2 · 2⌋ = 0 → 1 token
    ids = ids * mask
    logp = logits - np.log(np.exp(logits).sum(axis=2, keepdims=True))
    for k in (0.2, 0.5, 1.0):
        signal = MinKPercentSignal(k=k)
        got = signal.losses(torch.tensor(logits), torch.tensor(ids), torch.tensor(mask))
        for b in range(3):
            n = int(mask[b, 1:].sum())
            token_logp = np.array([logp[b, t, ids[b, t + 1]] for t in range(T - 1) if mask[b, t + 1]])
            assert token_logp.size == n
            lowest = np.sort(token_logp)[: max(1, int(k * n))]
            assert float(got[b]) == pytest.approx(-lowest.mean(), rel=1e-5)
    # k = 1 is the mean token loss; padding tokens with huge losses change nothing
    full = MinKPercentSignal(k=1.0).losses(torch.tensor(logits), torch.tensor(ids), torch.tensor(mask))
    torch.testing.assert_close(full, causal_lm_losses(torch.tensor(logits), torch.tensor(ids), torch.tensor(mask)))
    noisy = logits.copy()
    noisy[1, 6:, :] = rng.normal(size=(T - 6, V)) * 50
    again = MinKPercentSignal(k=0.2).losses(torch.tensor(noisy), torch.tensor(ids), torch.tensor(mask))
    before = MinKPercentSignal(k=0.2).losses(torch.tensor(logits), torch.tensor(ids), torch.tensor(mask))
    assert float(again[1]) == pytest.approx(float(before[1]), rel=1e-6)
    # through a model and the loader, one number per sequence
    losses = membership_losses_from_loader(
        TinyLM(), DataLoader(Sequences(10, seed=5), batch_size=4), signal_fn=min_k_percent_signal
    )
    assert losses.shape == (10,) and bool(torch.isfinite(losses).all())


def _dynamically_padded(rows, with_mask):
    """Pad a batch to its longest sequence with token 0, as Hugging Face's DataCollatorWithPadding does."""
    ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return {"input_ids": ids, "attention_mask": (ids != 0).long()} if with_mask else {"input_ids": ids}


def test_padding_without_attention_mask_warns_once_and_makes_the_score_depend_on_the_batch_size():
    """The issue: without `attention_mask` a batch's padding counts as tokens, so the same sequence scores differently
    at another batch size (each batch padded to its longest sequence). Measured on this GRU LM after 5 epochs on 64
    sequences: the same sequence's mean token loss differs by up to 1.33 nats between batch sizes 1, 8 and 64 (0.14
    untrained, 5.1 once it memorises them; the issue saw 0.76); with `attention_mask`, by less than 1e-6."""
    data = Sequences(64, seed=3)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(5):
        for batch in DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)):
            optimizer.zero_grad()
            causal_lm_signal(model, batch).mean().backward()
            optimizer.step()
    sequences = [data.ids[i][: int(data.mask[i].sum())] for i in range(len(data))]

    def scores(batch_size, with_mask, signal):
        loader = DataLoader(sequences, batch_size=batch_size, collate_fn=lambda r: _dynamically_padded(r, with_mask))
        return membership_losses_from_loader(model, loader, signal_fn=signal)

    def spread(runs):
        return max(float((a - b).abs().max()) for a in runs for b in runs)

    signal = CausalLMSignal(pad_token_id=0)
    with pytest.warns(UserWarning) as caught:
        unmasked = [scores(size, False, signal) for size in (1, 8, 64)]
    padding = [w for w in caught if "pad token id 0" in str(w.message)]
    assert len(padding) == 1  # once, not once per batch
    assert str(padding[0].message) == (
        "causal_lm_signal: the batch holds the pad token id 0 (from `pad_token_id`) but no `attention_mask`, so "
        "padding counts as tokens and each sequence's score depends on how much padding its batch added (the batch "
        "size, its longest sequence): put the tokenizer's `attention_mask` in the batch"
    )
    assert 1.0 < spread(unmasked) < 1.7  # measured: 1.33 nats
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with the mask: no warning, and the batch size changes nothing
        masked = [scores(size, True, CausalLMSignal(pad_token_id=0)) for size in (1, 8, 64)]
        assert spread(masked) < 1e-6
        # without a known pad token id (no argument, a model without `config`) nothing is said
        scores(8, False, CausalLMSignal())
    with pytest.warns(UserWarning, match=r"min_k_percent_signal: the batch holds the pad token id 0"):
        scores(8, False, MinKPercentSignal(pad_token_id=0))
    with pytest.raises(TypeError, match=r"`pad_token_id` to be an int token id or None, but got 0.5"):
        CausalLMSignal(pad_token_id=0.5)


def test_the_pad_token_id_is_read_from_a_hugging_face_models_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=16, n_layer=1, n_head=2, pad_token_id=0)

    class Wrapper(torch.nn.Module):  # as a LightningModule holds its Hugging Face model
        def __init__(self):
            super().__init__()
            self.model = transformers.GPT2LMHeadModel(config)

        def forward(self, input_ids, attention_mask=None):
            return self.model(input_ids=input_ids, attention_mask=attention_mask)

    data = Sequences(4, seed=7)
    with pytest.warns(UserWarning, match=r"pad token id 0 \(from the model's `config.pad_token_id`\)"):
        CausalLMSignal()(Wrapper(), {"input_ids": data.ids})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CausalLMSignal()(Wrapper(), {"input_ids": data.ids, "attention_mask": data.mask})


def test_mapping_batches_without_a_signal_name_causal_lm_signal():
    """The issue: the default forward read a language model's batch as (x, y) and failed with `KeyError: 0`."""
    loader = DataLoader(Sequences(8, seed=2), batch_size=4)
    with pytest.raises(
        ValueError,
        match=r"^the batches are mappings with keys \['attention_mask', 'input_ids'\], not the \(x, y\) pairs .*: "
        r"for a causal language model pass `signal_fn=causal_lm_signal`",
    ):
        membership_losses_from_loader(TinyLM(), loader)

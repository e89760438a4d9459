"""The language-model example's synthetic sequences are a function of their seeds alone (not of torch's global state)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import dp_lora_language_model as lm  # noqa: E402


def _draw(global_seed: int, seed: int):
    torch.manual_seed(global_seed)  # what the caller's script did before: must not matter
    return lm.MarkovSequences(50, seed=seed, successors=16)


def test_sequences_depend_on_their_seeds_only():
    a, b = _draw(0, seed=1), _draw(123, seed=1)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.attention_mask, b.attention_mask)
    assert not torch.equal(a.input_ids, _draw(0, seed=2).input_ids)  # another seed, other sequences
    assert int(a.attention_mask.sum(1).min()) >= 16 and int((a.input_ids * (1 - a.attention_mask)).sum()) == 0

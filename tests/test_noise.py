"""NoiseSource: the noise's randomness is secret by default, reproducible from an int, and never torch's global one."""

import numpy as np
import pytest
import torch

from lightning_privacy import _compat
from lightning_privacy.dpsgd.noise import NoiseSource


def test_cpu_generator_state_layout_fails_loudly_if_torch_changes_it():
    """Guards ``_compat.cpu_generator_from_words``: the 624 words written are the MT19937 state torch draws from."""
    words = np.random.default_rng(0).integers(0, 2**32, size=624, dtype=np.uint64).astype(np.uint32)
    a, b = _compat.cpu_generator_from_words(words), _compat.cpu_generator_from_words(words)
    assert torch.equal(torch.randn(100, generator=a), torch.randn(100, generator=b))
    other = words.copy()
    other[400] ^= 1  # one bit deep in the state changes the stream: all 19,968 bits count
    assert not torch.equal(
        torch.randn(100, generator=_compat.cpu_generator_from_words(words)),
        torch.randn(100, generator=_compat.cpu_generator_from_words(other)),
    )
    with pytest.raises(ValueError, match="624"):
        _compat.cpu_generator_from_words(words[:10])


def test_torchs_cpu_manual_seed_keeps_only_32_bits_which_is_why_the_state_is_written_whole():
    g = torch.Generator()
    first = torch.randn(5, generator=g.manual_seed(1))
    assert torch.equal(first, torch.randn(5, generator=g.manual_seed(1 + 2**32)))  # if torch fixes this, fine


def test_a_fixed_seed_gives_the_same_noise_per_rank_and_step_and_independent_noise_otherwise():
    def draw(seed, rank, step):
        return torch.randn(10_000, generator=NoiseSource(seed, rank=rank).generator(step))

    base = draw(3, 0, 5)
    assert torch.equal(base, draw(3, 0, 5))
    for other in (draw(3, 1, 5), draw(3, 0, 6), draw(4, 0, 5)):
        assert abs(float(torch.corrcoef(torch.stack([base, other]))[0, 1])) < 0.05
    assert float(base.std()) == pytest.approx(1.0, abs=0.03)


def test_the_default_seed_is_fresh_per_source_and_ignores_torchs_global_seed():
    draws = []
    for _ in range(2):
        torch.manual_seed(0)  # what seed_everything(0) does
        state = torch.get_rng_state()
        draws.append(torch.randn(10_000, generator=NoiseSource(None).generator(0)))
        assert torch.equal(torch.get_rng_state(), state)  # the global stream is not consumed
    assert abs(float(torch.corrcoef(torch.stack(draws))[0, 1])) < 0.05


def test_secure_mode_draws_fresh_state_every_step_and_refuses_a_seed():
    source = NoiseSource(None, secure=True)
    a, b = (torch.randn(1000, generator=source.generator(0)) for _ in range(2))
    assert not torch.equal(a, b)  # the same step index twice: fresh OS entropy each time
    with pytest.raises(ValueError, match="secure=True"):
        NoiseSource(1, secure=True)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed_is_named(seed):
    with pytest.raises(ValueError, match="`seed`"):
        NoiseSource(seed)


def test_repr_never_shows_the_seed():
    assert repr(NoiseSource(123456789)) == "NoiseSource(fixed, rank=0)"
    assert "secret" in repr(NoiseSource(None, rank=1))

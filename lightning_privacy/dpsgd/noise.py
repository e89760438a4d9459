"""The randomness of DP-SGD's Gaussian noise: secret by default, apart from torch's global generator.

DP-SGD's guarantee assumes the adversary does not know the noise. Opacus draws it from torch's global generator
unless ``secure_mode`` is on, so a script that calls ``seed_everything(0)`` — and publishes it — publishes the noise
too: whoever knows the seed can subtract it from the released model. :class:`NoiseSource` gives every step its own
generator instead:

- ``seed=None`` (the default of ``DPSGD(noise_seed=...)``): a 128-bit seed drawn from the operating system's entropy
  at every fit, by each rank for itself, never written to a checkpoint (a resumed run draws fresh noise). It is
  independent of torch's global generator and of ``seed_everything``, and the noise draws nothing from the global
  stream, so dropout or augmentation draws are the same with DP-SGD's noise on or off.
- an int: the noise of step ``t`` on rank ``r`` is a function of ``(seed, r, t)`` (NumPy's
  ``SeedSequence(seed, spawn_key=(r, t))``), the same after a resume — and known to whoever knows the seed. For tests
  and debugging only, like ``sampling_seed``.
- ``secure=True`` (``DPSGD(secure_mode=True)``): every step's state comes from ``os.urandom``, nothing to replay.

Under DDP only rank 0 adds noise; under FSDP2 every rank noises its own shard, and each rank's stream is independent
of the others' (``r`` in the spawn key, or each rank's own OS draw).

A CPU generator gets its whole 19,968-bit MT19937 state from the seed (``manual_seed`` keeps only 32 bits on the CPU,
so a seeded CPU generator has just 2³² streams — few enough to search); a CUDA generator (Philox) gets a 64-bit seed.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

from lightning_privacy import _compat
from lightning_privacy.dpsgd.sampling import draw_seed

__all__ = ["NoiseSource"]


class NoiseSource:
    """Generators for the noise of each optimizer step (see the module docstring).

    Args:
        seed: ``None`` for a fresh secret seed from the OS (drawn here), or an int for reproducible noise.
        rank: this process's global rank (its noise stream is independent of the other ranks').
        secure: fresh OS entropy for every step (``seed`` must then be ``None``).

    Attributes:
        fixed: whether the noise is reproducible from a seed the caller gave.

    Example::

        >>> a, b = NoiseSource(7).generator(3), NoiseSource(7).generator(3)
        >>> torch.equal(torch.randn(4, generator=a), torch.randn(4, generator=b))  # same (seed, rank, step)
        True
        >>> c = NoiseSource(7, rank=1).generator(3)
        >>> torch.equal(torch.randn(4, generator=NoiseSource(7).generator(3)), torch.randn(4, generator=c))
        False
        >>> NoiseSource(None).fixed, NoiseSource(7).fixed
        (False, True)
    """

    def __init__(self, seed: Optional[int] = None, *, rank: int = 0, secure: bool = False) -> None:
        if isinstance(seed, bool) or not (seed is None or (isinstance(seed, int) and seed >= 0)):
            raise ValueError(f"`seed` must be None or a non-negative int, got {seed!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"`rank` must be a non-negative int, got {rank!r}")
        if secure and seed is not None:
            raise ValueError(f"`seed={seed!r}` makes the noise reproducible, which `secure=True` rules out")
        self.fixed = seed is not None
        self.secure = bool(secure)
        self.rank = rank
        self._seed = None if secure else (seed if seed is not None else draw_seed())

    def __repr__(self) -> str:  # never shows a secret seed
        kind = "secure" if self.secure else ("fixed" if self.fixed else "secret")
        return f"NoiseSource({kind}, rank={self.rank})"

    def generator(self, step: int, device: Any = "cpu") -> torch.Generator:
        """A generator on ``device`` for the noise of optimizer step ``step`` (0-based, counted over the run)."""
        device = torch.device(device)
        if self.secure:
            entropy: Any = int.from_bytes(os.urandom(32), "little")
            sequence = np.random.SeedSequence(entropy)
        else:
            sequence = np.random.SeedSequence(self._seed, spawn_key=(self.rank, int(step)))
        if device.type == "cpu":
            return _compat.cpu_generator_from_words(sequence.generate_state(_compat.MT19937_WORDS, np.uint32))
        generator = torch.Generator(device=device)
        generator.manual_seed(int(sequence.generate_state(1, np.uint64)[0]))
        return generator

"""The randomness of DP-SGD's Gaussian noise: moved to :mod:`lightning_privacy.dpsgd.noise` (re-exported here)."""

from lightning_privacy.dpsgd.noise import NoiseSource

__all__ = ["NoiseSource"]

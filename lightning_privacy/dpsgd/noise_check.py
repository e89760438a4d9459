"""DPSGD's self-check of the noise: the noise added to the clipped sum has standard deviation σ·C.

:class:`NoiseCheck` reads the noise back from the parameters (:func:`noise_readback`: ``p.grad · scale`` minus the
clipped sum it was added to) and tests its variance with a two-sided χ² test over as many steps as it takes to see
:data:`NOISE_MIN_COORDINATES` coordinates, at :data:`NOISE_FALSE_ALARM` per fit. It raises
``MisconfigurationException`` when the noise is off, or, when the weights or the clipped sum were not finite (a loss
or gradients turned NaN or infinite), a sentence naming those instead of the noise. The other self-checks are in
:mod:`lightning_privacy.dpsgd.checks`.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

__all__ = ["NOISE_FALSE_ALARM", "NOISE_MIN_COORDINATES", "NoiseCheck", "check_noise", "local_tensor", "noise_readback"]

# The noise check is a two-sided χ² test of the noise's variance at this false-alarm rate per fit; it waits for this
# many noise coordinates (over as many steps as that takes) so that noise off by a factor of two in standard deviation
# is missed with probability < 1e-12 (at 256 coordinates: 7.8e-16 for half the noise, 1.5e-13 for double).
NOISE_FALSE_ALARM = 1e-9
NOISE_MIN_COORDINATES = 256


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 ``DTensor``, or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def noise_readback(
    params: Sequence[torch.Tensor], summed_before_noise: Sequence[torch.Tensor], *, scale: float
) -> Tuple[float, int, float]:
    """``(Σ noise², coordinates, Σ summed²)`` of the noise read back as ``p.grad · scale − summed`` (float64).

    Runs in the optimizer's step hook, after Opacus' noise → scale; ``scale`` undoes the mean reduction and
    ``summed_before_noise`` is what the noise was added to.
    """
    noise_sq, count, total_sq = 0.0, 0, 0.0
    for param, summed in zip(params, summed_before_noise):
        summed = local_tensor(summed).to(torch.float64)
        noise = local_tensor(param.grad).to(torch.float64).reshape(summed.shape) * scale - summed
        noise_sq += float(noise.pow(2).sum())
        count += noise.numel()
        total_sq += float(summed.pow(2).sum())
    return noise_sq, count, total_sq


def _non_finite(tensors: Sequence[torch.Tensor]) -> int:
    """How many NaN or ±inf values ``tensors`` hold (this rank's shards)."""
    return sum(int((~torch.isfinite(local_tensor(t).detach())).sum()) for t in tensors)


class NoiseCheck:
    """The noise added has standard deviation σ·C: a χ² test over the noise of as many steps as it needs.

    ``add`` records one step's noise (:func:`noise_readback`); once :data:`NOISE_MIN_COORDINATES` coordinates are in
    (or at fit end, with fewer), :meth:`check` tests ``Σ noise² / (σC)² ~ χ²(n)`` two-sided at
    :data:`NOISE_FALSE_ALARM`. The noise is read back in the parameters' precision: the bounds on the standard
    deviation are widened by 16 machine epsilons of the gradients' and the noise's scale. ``divisor``: FSDP2 averages
    the ranks' clipped sums and each rank adds σ·C/W to its shard (Opacus' FSDP optimizer), so there the expected
    standard deviation is σ·C/``divisor``.

    Non-finite weights or clipped sums make the noise unreadable (NaN − NaN): they are counted by :meth:`add`, and a
    failed test then names them, and the first step each was seen at, instead of blaming the noise.
    """

    def __init__(self, *, max_grad_norm: float, noise_multiplier: float, divisor: int = 1) -> None:
        self.expected_std = float(noise_multiplier) * float(max_grad_norm) / divisor
        self.divisor = divisor
        self.noise_sq, self.count, self.total_sq, self.eps, self.steps = 0.0, 0, 0.0, 0.0, 0
        self.done = False
        #: non-finite values seen in the weights / the clipped sums, and the first step (or check step) of each
        self.non_finite_counts = {"weights": 0, "sums": 0}
        self.first_non_finite: dict = {}

    @property
    def ready(self) -> bool:
        return self.count >= NOISE_MIN_COORDINATES

    def add(
        self,
        params: Sequence[torch.Tensor],
        summed_before_noise: Sequence[torch.Tensor],
        *,
        scale: float,
        step: Optional[int] = None,
        unit: float = 1.0,
    ) -> None:
        """Record one step's noise; ``step``: the Trainer's step, named if the weights or the sum are not finite;
        ``unit``: the step's noise multiplied by it first (a step at another clipping norm C_t, in units of the C
        the expected standard deviation is for)."""
        noise_sq, count, total_sq = noise_readback(params, summed_before_noise, scale=scale)
        noise_sq, total_sq = noise_sq * unit**2, total_sq * unit**2
        for what, tensors in (("weights", params), ("sums", summed_before_noise)):
            found = _non_finite(tensors) if not math.isfinite(noise_sq + total_sq) or what == "weights" else 0
            if found:
                self.non_finite_counts[what] += found
                self.first_non_finite.setdefault(what, self.steps if step is None else step)
        self.noise_sq, self.count, self.total_sq = (
            self.noise_sq + noise_sq,
            self.count + count,
            self.total_sq + total_sq,
        )
        self.eps = max([self.eps] + [torch.finfo(p.dtype).eps for p in params if p.dtype.is_floating_point])
        self.steps += 1

    def bounds(self) -> Tuple[float, float]:
        """The accepted range of the noise's standard deviation over the coordinates recorded so far."""
        from scipy.stats import chi2

        n = max(1, self.count)
        rounding = 16 * self.eps * (math.sqrt(self.total_sq / n) + self.expected_std)
        low = self.expected_std * math.sqrt(chi2.ppf(NOISE_FALSE_ALARM / 2, n) / n) - rounding
        high = self.expected_std * math.sqrt(chi2.isf(NOISE_FALSE_ALARM / 2, n) / n) + rounding
        return low, high

    def check(self) -> None:
        """Test the noise recorded so far (once); raises ``MisconfigurationException`` when it is off."""
        if self.done or self.count == 0:
            return
        self.done = True
        std = math.sqrt(self.noise_sq / self.count)
        low, high = self.bounds()
        if math.isfinite(std) and low <= std <= high:
            return
        if any(self.non_finite_counts.values()):
            raise MisconfigurationException(self._non_finite_sentence())
        if not low <= std <= high:
            raise MisconfigurationException(
                f"DP-SGD self-check: the noise added to the gradients has standard deviation {std:.4g} over "
                f"{self.count} coordinates ({self.steps} step{'s' if self.steps != 1 else ''}), but noise_multiplier × max_grad_norm = "
                f"{self.expected_std * self.divisor:.4g}{f' (/{self.divisor} ranks under FSDP)' if self.divisor > 1 else ''} (accepted: {max(low, 0.0):.4g} to {high:.4g}, a χ² test with false-alarm "
                f"rate {NOISE_FALSE_ALARM:g}); the gradients are not noised as configured."
            )

    def _non_finite_sentence(self) -> str:
        """What was not finite, by count and first step: the weights, the clipped sum (a NaN or infinite loss or
        gradient), never the noise."""
        parts = []
        if self.non_finite_counts["sums"]:
            parts.append(
                f"the clipped sum of the per-example gradients held {self.non_finite_counts['sums']} non-finite value(s) "
                f"(NaN or ±inf), first at step {self.first_non_finite['sums']}: the loss or the gradients were NaN "
                "or infinite"
            )
        if self.non_finite_counts["weights"]:
            parts.append(
                f"the weights held {self.non_finite_counts['weights']} non-finite value(s), first at step "
                f"{self.first_non_finite['weights']}"
            )
        return (
            f"DP-SGD self-check: the training is not finite, so the noise added to the gradients cannot be read back "
            f"over the {self.steps} step{'s' if self.steps != 1 else ''} checked: {'; '.join(parts)}. This is the "
            "model's loss or weights, not the noise (a learning rate too high, a log or a division of 0, float16 "
            "overflow: Trainer(detect_anomaly=True) names the operation)."
        )


def check_noise(
    params: Sequence[torch.Tensor],
    summed_before_noise: Sequence[torch.Tensor],
    *,
    max_grad_norm: float,
    noise_multiplier: float,
    scale: float,
) -> None:
    """One step's noise tested on its own (:class:`NoiseCheck` with a single step)."""
    check = NoiseCheck(max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier)
    check.add(params, summed_before_noise, scale=scale)
    check.check()

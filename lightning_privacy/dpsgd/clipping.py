"""How each example's (or person's) gradient is bounded before DP-SGD's noise: the clipping rule.

- ``"fixed"`` (the default): Opacus' ``min(1, C / (‖gᵢ‖ + 1e-6))·gᵢ``, norm at most C; noise σC.
- ``"quantile"``: Andrew et al.'s adaptive clipping ("Differentially Private Learning with Adaptive Clipping", NeurIPS
  2021, arXiv 1905.03871): clipped to C_t as ``"fixed"``, and after each step C_{t+1} = C_t·exp(−η(b̃_t − γ)), where
  b̃_t = (#{i: ‖gᵢ‖ ≤ C_t} + N(0, σ_b²)) / n̄ is the noised fraction of the step's examples under C_t (n̄ the public
  expected batch size), γ the target quantile and η the learning rate (:class:`QuantileClipping`). The count is
  released from the same sampled batch as the gradient: with centred indicators (sensitivity ½) the pair is one
  Gaussian mechanism of noise multiplier z = (z_Δ⁻² + (2σ_b)⁻²)^(−½) (their Theorem 1), so the ledger records z and
  the gradient's own noise is z_Δ = (z⁻² − (2σ_b)⁻²)^(−½) ≥ z (:func:`split_noise_multiplier`); σ_b defaults to
  n̄/20 (the paper's choice).
- ``"automatic"``: Bu et al.'s AUTO-S ("Automatic Clipping: Differentially Private Deep Learning Made Easier and
  Stronger", NeurIPS 2023, arXiv 2206.07136): every gradient scaled by ``1 / (‖gᵢ‖ + γ)`` (γ = ``stability``), so each
  contribution has norm below 1 whatever its size: sensitivity 1, noise σ·1, the same accounting as a fixed C = 1; the
  learning rate absorbs what C did. No clipping norm to tune.

The rule is one small object every engine reads (:func:`~lightning_privacy.dpsgd.functional.clip_factors`, the hooks
optimizer, the self-checks, the neighbour check), so the same function of the norms is applied and checked everywhere.
No Lightning import here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

import torch

__all__ = [
    "AUTOMATIC",
    "FIXED",
    "QUANTILE",
    "RULES",
    "ClippingRule",
    "QuantileClipping",
    "combined_noise_multiplier",
    "split_noise_multiplier",
]

FIXED, AUTOMATIC, QUANTILE = "fixed", "automatic", "quantile"
RULES = (FIXED, AUTOMATIC, QUANTILE)


@dataclasses.dataclass(frozen=True)
class ClippingRule:
    """A clipping rule and its parameter (``stability`` γ of automatic clipping).

    Example::

        >>> norms = torch.tensor([0.5, 4.0])
        >>> ClippingRule().factors(norms, 1.0).tolist()
        [1.0, 0.25]
        >>> [round(f, 4) for f in ClippingRule("automatic", stability=0.01).factors(norms, 1.0).tolist()]
        [1.9608, 0.2494]
    """

    rule: str = FIXED
    stability: float = 0.01
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_multiplier: Optional[float] = None  # σ_b of the count; None: the expected batch size / 20

    def factors(self, norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
        """Each gradient's scale factor from its norm: ``min(1, C / (n + 1e-6))`` or ``1 / (n + γ)``."""
        if self.rule == AUTOMATIC:
            return 1.0 / (norms + self.stability)
        return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)

    @property
    def automatic(self) -> bool:
        return self.rule == AUTOMATIC

    @property
    def quantile(self) -> bool:
        return self.rule == QUANTILE

    def record(self) -> Dict[str, Any]:
        """Plain values for checkpoints and the statement."""
        if self.quantile:
            return {
                "rule": self.rule, "target_quantile": self.target_quantile, "learning_rate": self.learning_rate,
                "count_noise_multiplier": self.count_noise_multiplier,
            }  # fmt: skip
        return {"rule": self.rule, **({"stability": self.stability} if self.automatic else {})}


def split_noise_multiplier(z: float, count_noise_multiplier: float) -> float:
    """The gradient's noise multiplier z_Δ that, with the count's σ_b, makes one Gaussian of multiplier ``z``:
    z_Δ = (z⁻² − (2σ_b)⁻²)^(−½) (Andrew et al., Theorem 1). Raises ``ValueError`` when 2σ_b ≤ z (the count would
    take the whole budget).

    Example::

        >>> z_gradient = split_noise_multiplier(1.0, 3.2)  # σ_b = 3.2: 1.2 % more noise on the gradient
        >>> round(z_gradient, 4), round(combined_noise_multiplier(z_gradient, 3.2), 12)
        (1.0124, 1.0)
    """
    if not 2 * count_noise_multiplier > z:
        raise ValueError(
            f"the count's noise σ_b = {count_noise_multiplier:g} leaves no budget for the gradient at noise multiplier "
            f"{z:g} (2σ_b must exceed it): give a larger count_noise_multiplier, or more noise in all"
        )
    return (z**-2 - (2 * count_noise_multiplier) ** -2) ** -0.5


def combined_noise_multiplier(z_gradient: float, count_noise_multiplier: float) -> float:
    """The one Gaussian the gradient (z_Δ) and the count (σ_b, sensitivity ½) make together."""
    return (z_gradient**-2 + (2 * count_noise_multiplier) ** -2) ** -0.5


class QuantileClipping:
    """The adaptive clipping norm of one run (see the module docstring): ``clip`` is C_t, :meth:`update` takes the
    step's count of examples (or people) whose norm was ≤ C_t and moves C geometrically towards the target quantile.

    Args:
        rule: the quantile :class:`ClippingRule`.
        clip: C_0 (``max_grad_norm``).
        expected_batch_size: n̄, the public constant the count is divided by.
        noise_multiplier: z, the whole mechanism's (the ledger's).
        generator: the count noise's secret generator.

    Example::

        >>> rule = ClippingRule("quantile", target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=1e-9)
        >>> q = QuantileClipping(rule, clip=1.0, expected_batch_size=10, noise_multiplier=1e-12,
        ...                      generator=torch.Generator().manual_seed(0))
        >>> round(q.update(10), 4)  # every example under C: C shrinks by exp(−0.2·0.5)
        0.9048
    """

    def __init__(
        self, rule: ClippingRule, *, clip: float, expected_batch_size: float, noise_multiplier: float,
        generator: torch.Generator,
    ) -> None:  # fmt: skip
        self.rule, self.clip, self.expected = rule, float(clip), float(expected_batch_size)
        self.count_noise = float(rule.count_noise_multiplier or self.expected / 20)
        self.noise_multiplier = float(noise_multiplier)
        self.gradient_noise = split_noise_multiplier(self.noise_multiplier, self.count_noise)
        self.generator = generator
        self.last_fraction: Optional[float] = None

    def update(self, count: int) -> float:
        """C_{t+1} from this step's count under C_t (its noise drawn here); returns the new C."""
        noise = float(torch.randn((), generator=self.generator, dtype=torch.float64)) * self.count_noise
        self.last_fraction = (count + noise) / self.expected
        self.clip *= math.exp(-self.rule.learning_rate * (self.last_fraction - self.rule.target_quantile))
        return self.clip

"""How each example's (or person's) gradient is bounded before DP-SGD's noise: the clipping rule.

- ``"fixed"`` (the default): Opacus' ``min(1, C / (‖gᵢ‖ + 1e-6))·gᵢ``, norm at most C; noise σC.
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
from typing import Any, Dict

import torch

__all__ = ["AUTOMATIC", "FIXED", "RULES", "ClippingRule"]

FIXED, AUTOMATIC = "fixed", "automatic"
RULES = (FIXED, AUTOMATIC)


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

    def factors(self, norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
        """Each gradient's scale factor from its norm: ``min(1, C / (n + 1e-6))`` or ``1 / (n + γ)``."""
        if self.rule == AUTOMATIC:
            return 1.0 / (norms + self.stability)
        return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)

    @property
    def automatic(self) -> bool:
        return self.rule == AUTOMATIC

    def record(self) -> Dict[str, Any]:
        """Plain values for checkpoints and the statement."""
        return {"rule": self.rule, **({"stability": self.stability} if self.automatic else {})}

    def sentence(self, max_grad_norm: float) -> str:
        """What the rule does, for the report and the statement."""
        if self.automatic:
            return (
                f"automatic (Bu et al.'s AUTO-S): each gradient scaled by 1/(‖g‖ + {self.stability:g}), norm below 1; "
                "noise σ·1"
            )
        return f"fixed: each gradient clipped to norm C = {max_grad_norm:g}; noise σC"

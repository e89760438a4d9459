"""``MembershipEpsilon``: attack scores and membership labels as torchmetrics state, a lower bound on ε on compute."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from lightning_privacy.analysis.estimation import (
    METHODS,
    SELECTIONS,
    SIDED,
    _check_alpha,
    _check_choice,
    _check_delta,
    epsilon_lower_bound,
)

__all__ = ["MembershipEpsilon"]


class MembershipEpsilon(Metric):
    """Lower bound on ε from membership-inference scores (Zanella-Béguelin et al. 2023, Section 4).

    Accumulates attack scores (higher = more likely a member) and membership labels; across processes
    both are concatenated (``dist_reduce_fx="cat"``), so ``compute()`` — a collective call: run it on
    every rank — sees every rank's trials in rank order, and every rank gets the same answer (the
    holdout split is seeded). The value comes from
    :func:`lightning_privacy.analysis.estimation.epsilon_lower_bound`.

    Args:
        delta: the δ of (ε, δ)-DP, in [0, 1).
        alpha: significance in (0, 1).
        method: ``"bayes"`` (default), ``"jeffreys"`` or ``"clopper_pearson"``.
        selection: ``"holdout"`` (default), ``"bonferroni"`` or ``"none"`` (optimistic: no correction
            for choosing the best of many thresholds).
        seed: seed of the holdout split.
        sided: ``"two"`` (default, equal-tailed interval) or ``"one"``.
        kwargs: passed to :class:`torchmetrics.Metric`.

    ``compute()`` returns a dict of Python values: ``epsilon_lower``, ``interval_low``,
    ``interval_high``, ``threshold``, ``tp``, ``fp``, ``tn``, ``fn``, ``optimistic`` (bool) and the
    settings (``method``, ``selection``, ``alpha``, ``alpha_per_test``, ``delta``, ``n_thresholds``).

    Note:
        Every rank must call :meth:`update` at least once before a synced compute (an empty tensor is
        fine): a rank with no state would leave the others waiting in the gather.

    Example::

        >>> gen = torch.Generator().manual_seed(0)
        >>> metric = MembershipEpsilon(delta=1e-5, method="clopper_pearson")
        >>> member = torch.arange(1000) < 500
        >>> metric.update(torch.randn(1000, generator=gen) + 2.0 * member, member)
        >>> out = metric.compute()
        >>> out["optimistic"], out["epsilon_lower"] > 0.5, out["tp"] + out["fn"]
        (False, True, 250)
        >>> MembershipEpsilon(delta=1.0)
        Traceback (most recent call last):
        ...
        ValueError: Expected argument `delta` to be in [0, 1), but got 1.0.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    scores: list
    is_member: list

    def __init__(
        self,
        *,
        delta: float,
        alpha: float = 0.05,
        method: str = "bayes",
        selection: str = "holdout",
        seed: int = 0,
        sided: str = "two",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.delta = _check_delta(delta)
        self.alpha = _check_alpha(alpha)
        self.method = _check_choice("method", method, METHODS)
        self.selection = _check_choice("selection", selection, SELECTIONS)
        self.sided = _check_choice("sided", sided, SIDED)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Expected argument `seed` to be an int, but got {seed!r}.")
        self.seed = seed
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("is_member", default=[], dist_reduce_fx="cat")

    def update(self, scores: Tensor, is_member: Tensor) -> None:
        """Add attack scores with their membership labels.

        Args:
            scores: floating tensor, higher = more likely a member.
            is_member: bool or 0/1 tensor of the same shape.
        """
        if not isinstance(scores, Tensor) or not scores.is_floating_point():
            raise TypeError(
                f"Expected argument `scores` to be a floating-point tensor, but got {type(scores).__name__}."
            )
        is_member = torch.as_tensor(is_member, device=scores.device)
        if is_member.shape != scores.shape:
            raise ValueError(
                f"Expected `scores` and `is_member` of the same shape, but got {tuple(scores.shape)} and "
                f"{tuple(is_member.shape)}."
            )
        if torch.isnan(scores).any():
            raise ValueError("Expected argument `scores` to contain no NaN, but it does.")
        if is_member.dtype != torch.bool:
            if not torch.all((is_member == 0) | (is_member == 1)):
                raise ValueError("Expected argument `is_member` to hold only 0/1 or True/False.")
            is_member = is_member.bool()
        self.scores.append(scores.detach().reshape(-1).double())
        self.is_member.append(is_member.reshape(-1))

    @staticmethod
    def _array(state: Any, dtype) -> np.ndarray:
        if isinstance(state, list):
            state = dim_zero_cat(state) if state else torch.empty(0)
        return state.detach().cpu().numpy().astype(dtype).reshape(-1)

    def compute(self) -> dict:
        """The bound, interval, threshold and confusion counts over all trials seen (all ranks)."""
        scores = self._array(self.scores, np.float64)
        member = self._array(self.is_member, bool)
        result = epsilon_lower_bound(
            scores,
            member,
            delta=self.delta,
            alpha=self.alpha,
            method=self.method,
            selection=self.selection,
            sided=self.sided,
            seed=self.seed,
        )
        return result.as_dict()

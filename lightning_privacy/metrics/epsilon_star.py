"""``EpsilonStar``: member and non-member losses as torchmetrics state, Epsilon* on compute."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from lightning_privacy.analysis.epsilon_star import (
    EpsilonStarDetails,
    _check_delta,
    _check_method,
    default_delta,
    epsilon_star_details,
)

__all__ = ["EpsilonStar"]


class EpsilonStar(Metric):
    """Epsilon* (Negoescu et al. 2023) of one trained model from per-example membership losses.

    Holds the member (training) and non-member (population) losses; across processes they are
    concatenated (``dist_reduce_fx="cat"``), so ``compute()`` — a collective call: run it on every rank —
    sees every rank's losses. The value comes from
    :func:`lightning_privacy.analysis.epsilon_star.epsilon_star_details`.

    Args:
        delta: delta of Equation 7, in ``(0, 0.5)``; ``None`` (default) uses the paper's
            ``1 / (n ln n)`` with ``n`` = the number of member losses seen (all ranks) — pass ``delta``
            explicitly when the members are only a sample of the training set.
        method: ``"parametric"`` (default) or ``"empirical"``.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Note:
        Every rank must call :meth:`update` at least once before a synced compute (an empty tensor is
        fine): a rank with no state at all would leave the other ranks waiting in the gather.

    Example::

        >>> gen = torch.Generator().manual_seed(0)
        >>> metric = EpsilonStar(delta=1e-5)
        >>> metric.update(torch.randn(2000, generator=gen), torch.ones(2000, dtype=torch.bool))
        >>> metric.update(torch.randn(2000, generator=gen) + 1.0, torch.zeros(2000, dtype=torch.bool))
        >>> round(float(metric.compute()), 2)
        5.07
        >>> EpsilonStar(delta=0.5)
        Traceback (most recent call last):
        ...
        ValueError: Expected argument `delta` to be in the open interval (0, 0.5), but got 0.5
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    member_losses: list
    nonmember_losses: list

    def __init__(self, *, delta: Optional[float] = None, method: str = "parametric", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delta = None if delta is None else _check_delta(delta)
        self.method = _check_method(method)
        self.add_state("member_losses", default=[], dist_reduce_fx="cat")
        self.add_state("nonmember_losses", default=[], dist_reduce_fx="cat")

    def update(self, losses: Tensor, is_member: Tensor) -> None:
        """Add losses (low = looks like a member) with their membership flags.

        Args:
            losses: ``(N,)`` floating tensor.
            is_member: ``(N,)`` bool (or 0/1) tensor, ``True`` for training examples.
        """
        if not isinstance(losses, Tensor) or not losses.is_floating_point():
            raise TypeError(
                f"Expected argument `losses` to be a floating-point tensor, but got {type(losses).__name__}"
            )
        is_member = torch.as_tensor(is_member, device=losses.device)
        if losses.ndim != 1 or is_member.shape != losses.shape:
            raise ValueError(
                f"Expected 1-D `losses` and `is_member` of the same shape, but got {tuple(losses.shape)} and "
                f"{tuple(is_member.shape)}"
            )
        if is_member.dtype != torch.bool:
            if not torch.all((is_member == 0) | (is_member == 1)):
                raise ValueError("Expected argument `is_member` to hold only 0/1 or True/False")
            is_member = is_member.bool()
        losses = losses.detach()
        self.member_losses.append(losses[is_member])
        self.nonmember_losses.append(losses[~is_member])

    def _arrays(self) -> tuple:
        def cat(state: Any) -> np.ndarray:
            if isinstance(state, list):
                state = dim_zero_cat(state) if state else torch.empty(0)
            return state.detach().cpu().double().numpy().reshape(-1)

        return cat(self.member_losses), cat(self.nonmember_losses)

    def _details(self, members: np.ndarray, nonmembers: np.ndarray, method: str) -> EpsilonStarDetails:
        delta = self.delta if self.delta is not None else default_delta(int(members.size))
        return epsilon_star_details(members, nonmembers, delta=delta, method=method)

    def compute(self) -> Tensor:
        """Epsilon* of all losses seen (all ranks), as a float64 scalar tensor."""
        members, nonmembers = self._arrays()
        return torch.tensor(self._details(members, nonmembers, self.method).epsilon_star, dtype=torch.float64)

    def gathered_losses(self) -> tuple:
        """``(member_losses, nonmember_losses)`` of all ranks as float64 CPU tensors (collective call)."""
        with self.sync_context(should_sync=True, should_unsync=True):
            members, nonmembers = self._arrays()
        return torch.from_numpy(members), torch.from_numpy(nonmembers)

    def compute_details(self, method: Optional[str] = None) -> EpsilonStarDetails:
        """The full :class:`~lightning_privacy.analysis.epsilon_star.EpsilonStarDetails` (collective call).

        Args:
            method: ``"parametric"`` or ``"empirical"``; ``None`` uses the metric's ``method``.
        """
        method = self.method if method is None else _check_method(method)
        members, nonmembers = self.gathered_losses()
        return self._details(members.numpy(), nonmembers.numpy(), method)

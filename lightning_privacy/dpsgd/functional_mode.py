"""``grad_sample_mode="functional"``: each example's whole gradient by ``torch.func``, on that example alone.

``training_step`` becomes: the clipped sum of the examples' own gradients
(:class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`; on the checked steps the parameters' swap and each
example's loss alone against its loss in the batch are checked first), then the batch's ``training_step`` once, for
what it logs and returns; ``backward`` puts the clipped sum in ``p.grad`` for the optimizer to noise.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy.dpsgd import functional
from lightning_privacy.dpsgd.modes import PER_EXAMPLE_LOSS, Mode, distributed, loss_scale, not_a_loss
from lightning_privacy.dpsgd.optimizers import hand_over

__all__ = ["FunctionalMode"]


class FunctionalMode(Mode):
    """Functional mode (see the module docstring); ``engine``: its
    :class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`."""

    name = "functional"

    def __init__(self, owner: Any, engine: functional.FunctionalClipping) -> None:
        super().__init__(owner)
        self.engine = engine
        self.sums: Optional[List[torch.Tensor]] = None  # this step's clipped sum, for its backward

    def step(self, batch: Any, args: tuple, kwargs: Dict[str, Any], *, checking: Optional[bool] = None) -> Any:
        """The clipped sum of the examples' own gradients, then the batch's ``training_step`` once, with gradients
        on (a step may differentiate inside, as an input-gradient penalty does; nothing is differentiated from it)."""
        owner = self.owner
        self.sums, owner.last_norms = self.clipped_sum(batch, args, kwargs, checking=checking)
        with torch.enable_grad(), owner.no_per_step_sync():
            out = owner._original_step(*args, **kwargs)
        loss = out.get(PER_EXAMPLE_LOSS, out.get("loss")) if isinstance(out, dict) else out
        if not isinstance(loss, torch.Tensor):
            raise not_a_loss(loss)
        loss = loss.detach()
        if owner._sampled_batch is not None:  # (mixing: the sampled examples' losses alone against the batch's)
            sampled_batch, owner._sampled_batch = owner._sampled_batch, None
            try:
                owner.sampled.check_losses(
                    sampled_batch, owner.rows_step(args, kwargs), loss if loss.ndim == 1 else None,
                    int(owner.last_rows or 0),
                )  # fmt: skip
            finally:
                owner.sampled.end_step()
        if distributed():  # DDP's reducer waits for every parameter's gradient: a zero that reaches each one
            loss = loss + torch.stack([p.sum() for p in owner.trainable]).sum() * 0.0
        return {**out, "loss": loss} if isinstance(out, dict) else loss

    def clipped_sum(
        self, batch: Any, args: tuple, kwargs: Dict[str, Any], *, checking: Optional[bool] = None
    ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """The batch's clipped sum and its examples' norms; on the checked steps (``checking``, default the
        self-checked ones) the parameters' swap and the examples' losses alone are checked first."""
        owner, engine = self.owner, self.engine
        step = owner.rows_step(args, kwargs)
        before = engine.fallback
        checking = owner.should_check() if checking is None else checking
        if checking:  # (before any gradient: a model that mixes examples, or hides a parameter, is refused at once)
            functional.check_parameters_swapped(engine, batch, step)
            error = functional.check_losses_alone(
                engine, batch, step, loss_reduction=owner.loss_reduction, rtol=owner.rtol
            )
        result = engine.clipped_sum(batch, step)
        if checking:
            owner.record.add(f"{functional.FUNCTIONAL_REFERENCE} ({result.how})", int(owner.last_rows or 0), error)
        if engine.fallback is not None and before is None:
            rank_zero_warn(
                f"DPSGD(grad_sample_mode='functional'): torch.func.vmap cannot run `training_step` because of "
                f"{engine.fallback}; each example's gradient is now computed by its own forward and backward pass "
                "(exact, one pass per example, slower)."
            )
        return result.sums, result.norms

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """``p.grad`` is the step's clipped sum (under DDP after a zero backward for the reducer; under a GradScaler
        multiplied by its scale, which the step divides out)."""
        owner = self.owner
        sums, self.sums = self.sums, None
        if sums is None:
            raise MisconfigurationException(
                "DPSGD(grad_sample_mode='functional'): `backward` ran without DPSGD's `training_step` before it; call "
                "the module's `training_step` through the Trainer (automatic optimization)."
            )
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            owner._original(loss.sum() if loss.ndim else loss, *args, **kwargs)
        scale = loss_scale(owner.pl_module.trainer)
        for param, total in zip(self.engine.params, sums):
            hand_over(param, total if scale == 1.0 else total * scale)

    def redo(self, batch: Any, step_args: tuple, step_kwargs: Dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """A step another mode computed, computed again here before its noise (``auto``'s switch): its checks, its
        clipped sum in ``p.grad``."""
        for param in self.owner.trainable:
            param.grad = None
        self.sums, self.owner.last_norms = self.clipped_sum(batch, step_args, step_kwargs, checking=True)
        self.backward(None, *args, **kwargs)

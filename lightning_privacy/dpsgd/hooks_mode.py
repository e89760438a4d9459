"""``grad_sample_mode="hooks"``: Opacus' per-example hooks, clipped by the ``DPOptimizer``.

``training_step`` returns the usual reduced loss, or the per-example losses (shape ``[batch_size]``, or a dict's
``"per_example_loss"`` beside its ``"loss"``), which DPSGD reduces with ``loss_reduction``; the backward pass leaves
each trainable parameter's per-example gradients in ``p.grad_sample`` for the optimizer to clip. On the steps DPSGD
self-checks, the exactness check (:mod:`lightning_privacy.dpsgd.exactness`) compares them with every example's
gradient by autograd (per-example losses) or their sum with the batch's gradient (a reduced loss); on those steps and
the sampled later ones a few examples are also compared with their gradients computed alone
(:mod:`lightning_privacy.dpsgd.sampled_exactness`). A mismatch stops the fit before the step's noise.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_privacy.dpsgd import exactness
from lightning_privacy.dpsgd.checks import _grad_sample, check_per_sample_gradients
from lightning_privacy.dpsgd.modes import PerLayerMode, not_a_loss, reduce_losses

__all__ = ["HooksMode"]


class HooksMode(PerLayerMode):
    """Opacus' per-example gradients of every trainable parameter (see the module docstring)."""

    name = "hooks"

    def per_layer_backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        owner = self.owner
        per_example = isinstance(loss, torch.Tensor) and loss.ndim == 1
        if per_example:
            reduced = reduce_losses(loss, owner.loss_reduction)
        elif isinstance(loss, torch.Tensor) and loss.ndim == 0:
            reduced = loss
        else:
            raise not_a_loss(loss)
        checking = owner.should_check()
        owner._original(reduced, *args, **({**kwargs, "retain_graph": True} if checking and per_example else kwargs))
        if owner._sampled_batch is not None:
            self._compare_alone(loss if per_example else None)
        if not checking:
            return
        params = [p for p in owner.trainable if getattr(p, "grad_sample", None) is not None]
        samples = [_grad_sample(p) for p in params]
        if len({int(s.shape[0]) for s in samples}) > 1:
            return  # (the per-sample gradient check names the parameters whose batch differs)
        owner.hooks.disable_hooks()
        try:
            if per_example:
                exactness.check_per_example_gradients(
                    loss,
                    params,
                    samples,
                    owner.param_names,
                    rtol=owner.rtol,
                    record=owner.record,
                    **owner.sampled_rows(),
                )
            else:
                exactness.check_summed_gradients(
                    params, samples, owner.param_names, loss_reduction=owner.loss_reduction, rtol=owner.rtol,
                    record=owner.record,
                )  # fmt: skip
        finally:
            owner.hooks.enable_hooks()

    def _compare_alone(self, losses: Any) -> None:
        """A checked step: a few examples' per-example gradients against their gradients computed alone."""
        owner = self.owner
        rows = int(owner.last_rows or 0)
        check_per_sample_gradients(owner.trainable, owner.param_names)  # (one per example, before indexing them)

        def got(j: int, index: torch.Tensor) -> torch.Tensor:
            param = owner.sampled.engine.params[j]
            if getattr(param, "grad_sample", None) is None:
                return torch.zeros(len(index), *param.shape, dtype=param.dtype, device=param.device)
            sample = _grad_sample(param)[-rows:]  # (this batch's rows)
            return sample[index.to(sample.device)]

        owner.check_sampled(
            got, what="the per-example gradient that DP-SGD clips", norms_only=False,
            losses=None if losses is None else losses.detach(),
        )  # fmt: skip

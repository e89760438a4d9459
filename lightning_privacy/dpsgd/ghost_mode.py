"""``grad_sample_mode="ghost"``: ghost clipping's norms, then the clipped sum.

``training_step`` must return the per-example losses (shape ``[batch_size]``, e.g.
``F.cross_entropy(logits, y, reduction="none")``), as a tensor or as the ``"loss"`` of a dict; a reduced loss has
lost what ghost clipping needs and is refused, naming what was returned.

Ghost clipping (Li et al. 2022; Bu et al. 2023) as in Opacus' ``DPTensorFastGradientClipping.backward``: a first
backward pass of the reduced loss lets Opacus' fast-gradient-clipping hooks compute each example's gradient norm
``‖∇ℓᵢ‖`` layer by layer, without storing per-example gradients (Linear and Embedding by the ghost-norm identity;
other layers materialise their own per-example gradients one layer at a time); the coefficients
``cᵢ = min(1, C / (‖∇ℓᵢ‖ + 1e-6))`` then weight a second pass, with the hooks off, of ``Σᵢ cᵢ·ℓᵢ`` whose gradient is
the clipped sum that the ``DPOptimizerFastGradientClipping`` noises. Where every trainable layer ran once and has a
known per-example gradient form, the second pass is replaced by book-keeping (Bu et al. 2023,
:mod:`lightning_privacy.dpsgd.bookkeeping`): the clipped sum formed from the first pass's layer inputs and output
gradients. On the steps DPSGD self-checks, the exactness check (:mod:`lightning_privacy.dpsgd.exactness`) compares the
norms with every example's whole gradient by autograd, and book-keeping's sum with the second pass's; a mismatch stops
the fit before its first optimizer step, naming the parameter.

Under FSDP2 a rank whose Poisson batch is empty runs the module, with Opacus' hooks off, on a placeholder row whose
loss is multiplied by zero (every rank must join the module's collectives): its gradient is exactly zero.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import _compat
from lightning_privacy.dpsgd import exactness
from lightning_privacy.dpsgd.bookkeeping import BookKeeping
from lightning_privacy.dpsgd.checks import odd_batch_message
from lightning_privacy.dpsgd.functional import clip_factors
from lightning_privacy.dpsgd.modes import (
    EXAMPLE,
    PerLayerMode,
    describe,
    distributed,
    loss_scale,
    reduce_losses,
    zero_missing_grads,
)
from lightning_privacy.dpsgd.optimizers import hand_over

__all__ = ["GhostMode"]


class GhostMode(PerLayerMode):
    """Ghost clipping (see the module docstring); ``one_pass``: book-keeping where the module allows (not sharded)."""

    name = "ghost"

    def __init__(self, owner: Any, *, one_pass: bool = True) -> None:
        super().__init__(owner)
        self.bookkeeping = None
        if one_pass and not owner.sharded:
            keeper = BookKeeping(owner.pl_module, loss_reduction=owner.loss_reduction)
            self.bookkeeping = keeper if keeper.supported else None
            if not keeper.supported:
                keeper.remove()
        self.skipping = False  # FSDP2: this batch is empty; the placeholder row runs with the hooks off
        self.warned = False  # a 16-bit step without book-keeping was said

    def step(self, batch: Any, args: tuple, kwargs: Dict[str, Any]) -> Any:
        try:
            return super().step(batch, args, kwargs)
        except NotImplementedError as err:
            if "Parameter tying is not supported" in str(err):
                raise MisconfigurationException(self.called_twice_message()) from err
            raise

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        try:
            super().backward(loss, *args, **kwargs)
        except NotImplementedError as err:  # (Opacus' words for it name no layer and no fix)
            if "Parameter tying is not supported" in str(err):
                raise MisconfigurationException(self.called_twice_message()) from err
            raise

    def start_batch(self, *, empty: bool) -> None:
        """Book-keeping forgets the last step; under FSDP2 an empty batch runs without hooks."""
        owner = self.owner
        self.forget_captures()
        if not owner.sharded:
            return
        if self.skipping:  # the last empty batch had no backward (training_step returned None)
            owner.hooks.enable_hooks()
        self.skipping = empty
        if empty:
            owner.hooks.disable_hooks()

    def forget_captures(self) -> None:
        if self.bookkeeping is not None:
            self.bookkeeping.start()

    def remove(self) -> None:
        if self.bookkeeping is not None:
            self.bookkeeping.remove()
            self.bookkeeping = None

    def per_layer_backward(self, losses: Any, *args: Any, **kwargs: Any) -> None:
        owner = self.owner
        if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
            raise MisconfigurationException(
                "DPSGD(grad_sample_mode='ghost') clips each example's gradient through that example's own loss, so "
                f"`training_step` must return one loss per example, a tensor of shape [batch_size] ({EXAMPLE}; "
                f"or a dict whose 'loss' is one); it returned {describe(losses)}. DPSGD reduces them with "
                f"loss_reduction={owner.loss_reduction!r}; log their mean yourself. Or use grad_sample_mode='auto' "
                "(the default), which takes a reduced loss."
            )
        params = owner.hooks.trainable_parameters
        if self.skipping:
            self.skipping = False
            try:
                self.empty_sharded(losses, params, *args, **kwargs)
            finally:
                owner.hooks.enable_hooks()
            return
        for param in params:  # Opacus never resets them: a stale norm would clip this batch with the last one's
            _compat.clear_norm_sample(param)
        keeper = self.bookkeeping
        # one pass: no weight gradients in the first pass (not under DDP, whose reducer waits for every parameter's)
        targets = keeper.first_pass_targets() if keeper is not None and not distributed() else None
        if keeper is not None:
            keeper.capturing = True
        try:
            reduced = reduce_losses(losses, owner.loss_reduction)
            if targets is not None:  # (what LightningModule.backward does, differentiating the layers' outputs only)
                torch.autograd.grad(reduced, targets, retain_graph=True)
            else:
                owner._original(reduced, *args, retain_graph=True, **kwargs)
        finally:
            if keeper is not None:
                keeper.capturing = False
        # (Opacus' FSDP hooks keep the norms on the modules, one per parameter, and raise themselves when one is missing)
        norms = {} if owner.sharded else {p: _compat.norm_sample(p) for p in params}
        missing = [owner.name_of(p) for p, norm in norms.items() if norm is None]
        if missing:
            raise MisconfigurationException(
                f"DP-SGD (ghost clipping): trainable parameter(s) {', '.join(f'`{n}`' for n in missing[:5])} got no "
                "per-example gradient norm in this step: unused in the forward pass, or in a layer Opacus cannot "
                "handle. Freeze them (requires_grad=False) or replace the layer."
            )
        sizes = {owner.name_of(p): int(norm.shape[0]) for p, norm in norms.items()}
        if len(set(sizes.values())) > 1:
            raise MisconfigurationException(odd_batch_message(sizes, what="gradient norms"))
        for param in params:
            param.grad = None
        # the rule's factors of the norms (fixed: Opacus' min(1, C/(‖g‖ + 1e-6)), as its get_clipping_coef), each norm
        # raised by the bound on what book-keeping's "split" 16-bit products move it (bookkeeping.SIXTEEN_BIT_PRODUCTS)
        # and divided by fp16's loss scale (the pass differentiated the scaled loss; the scaler unscales the sum)
        norm_sample, scale = owner.hooks.get_norm_sample(), loss_scale(owner.pl_module.trainer)
        kept = keeper is not None and keeper.ready(len(losses))  # (book-keeping can form this batch's sums)
        overshoot = keeper.split_overshoot() if kept else None
        if overshoot is not None:
            norm_sample = norm_sample + overshoot.to(norm_sample.device)
        coefficients = clip_factors(norm_sample / scale, owner.hooks.max_grad_norm, owner.clipping_rule)
        owner.last_norms = owner.hooks.per_sample_gradient_norms.detach() / scale
        if coefficients.shape != losses.shape:
            raise MisconfigurationException(
                f"DPSGD(grad_sample_mode='ghost'): `training_step` returned {losses.shape[0]} per-example losses but "
                f"the model's layers saw {coefficients.shape[0]} examples; return one loss per example of the batch "
                f"({EXAMPLE})."
            )
        # formed now, before the checks below run forward passes of their own that the keeper's hooks would also record
        sums = keeper.clipped_sums(coefficients) if kept else None  # (None: the second pass forms them)
        if owner._sampled_batch is not None:
            owner.check_sampled(
                lambda j, index: norms[owner.sampled.engine.params[j]].reshape(-1)[index.to(losses.device)],
                what="the norm that ghost clipping clipped with", norms_only=True, losses=losses.detach(),
            )  # fmt: skip
        owner.hooks.disable_hooks()
        try:
            checking = not owner.sharded and owner.should_check()
            if checking:
                exactness.check_ghost_norms(
                    losses, params, norms, owner.param_names, rtol=owner.rtol, record=owner.record,
                    **owner.sampled_rows(),
                )  # fmt: skip
            second_pass = sums is None or not all(p in sums for p in params)  # (the second pass's sum is trained)
            sixteen_bit_pass = second_pass and keeper is not None and keeper.captured_16_bit()
            if sixteen_bit_pass and not self.warned:
                self.say_16_bit_second_pass()
            if sixteen_bit_pass or owner.rounds_16_bit:  # (a step bounded only up to 16-bit rounding: the statement)
                owner.on_rounded_step()
            if not second_pass and not checking:
                for param in params:
                    hand_over(param, sums[param])
                return
            owner._original((coefficients.to(device=losses.device) * losses).sum(), *args, **kwargs)
            differing = keeper.disagreeing(sums, params) if sums is not None and checking else None
            if differing is not None:  # nothing is trained through a disagreement
                raise MisconfigurationException(self.disagreement_message(differing, sums[differing]))
            if not second_pass:  # checked: train on it, as on every other step
                for param in params:  # (under 16-bit the second pass's own rounding is not what the norms bound)
                    hand_over(param, sums[param])
        finally:
            owner.hooks.enable_hooks()
            if keeper is not None:
                keeper.clear()

    def say_16_bit_second_pass(self) -> None:
        """Once per fit, on rank 0: setup said float32 rounding (bf16 autocast), but a second 16-bit pass formed this
        step's clipped sum."""
        self.warned = True
        if distributed() and torch.distributed.get_rank() != 0:
            return
        warnings.warn(
            f"DPSGD(grad_sample_mode='ghost'): at step {self.owner.pl_module.trainer.global_step} book-keeping could "
            "not form the clipped sum (a layer ran other than once, or saw another batch size), so a second 16-bit "
            "backward pass did: on such steps each example's contribution is bounded by max_grad_norm only up to "
            "16-bit rounding (said once per fit).",
            stacklevel=2,
        )

    def disagreement_message(self, param: torch.Tensor, kept: torch.Tensor) -> str:
        grad = param.grad.to(torch.float64)
        error = float((kept.to(torch.float64) - grad).norm())
        size = max(float(grad.norm()), 1e-30)
        return (
            f"DP-SGD self-check (ghost clipping): book-keeping's clipped sum for `{self.owner.name_of(param)}` is "
            f"{error:.4g} away from the second backward pass's ({error / size:.1%} of its norm), so that parameter's "
            "gradient is not what its layer's per-example hooks see (the parameter used outside its layer, or a layer "
            "whose gradient is not what its type suggests): move that use into the layer, untie or freeze the "
            "parameter (`requires_grad_(False)`), or use grad_sample_mode='hooks'; DPSGD stops rather than train on "
            "either sum."
        )

    def called_twice_message(self) -> str:
        """The layer Opacus found called twice (its recorded inputs), named."""
        twice = [
            f"`{name}` ({type(m).__name__})" for name, m in self.owner._layers if len(getattr(m, "activations", ())) > 1
        ]
        layer = ", ".join(twice) if twice else "a Linear or Embedding layer"
        return (
            f"DPSGD(grad_sample_mode='ghost'): {layer} ran more than once in one step (called twice in the forward "
            "pass, or re-run in the backward pass by gradient checkpointing, `torch.utils.checkpoint`), and ghost "
            "clipping computes one gradient norm per call of a Linear or Embedding layer that it cannot combine into "
            "the example's norm, so use grad_sample_mode='functional' (or 'auto'), which differentiates each "
            "example's loss itself, or grad_sample_mode='hooks' for a layer called twice without checkpointing."
        )

    def empty_sharded(self, losses: torch.Tensor, params: List[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        """FSDP2, an empty batch: the placeholder row's loss times zero, backward as often as a non-empty step on
        another rank (its FSDP reduce-scatters), so this rank adds an exactly zero gradient and no example."""
        owner = self.owner
        if losses.numel() != 1 or not bool(torch.isfinite(losses.detach()).all()):
            raise MisconfigurationException(
                "DPSGD under FSDP2: this rank's Poisson batch was empty, and the placeholder row it runs the sharded "
                f"module on (the dataset's first example, loss multiplied by zero) gave the loss(es) "
                f"{losses.detach().flatten().tolist()[:4]}; one finite loss is needed for its gradient to be exactly "
                "zero."
            )
        zero = losses.sum() * 0.0
        if zero.requires_grad:
            owner._original(zero, *args, retain_graph=True, **kwargs)
            for param in params:  # the first pass's reduce-scatter left the other ranks' unclipped sum in this shard
                param.grad = None
            owner._original(zero, *args, **kwargs)
        zero_missing_grads(params)
        owner.last_norms = losses.detach().new_zeros(0)
        owner.last_rows = 0  # no example of this step's batch

"""``grad_sample_mode="auto"``: start in Opacus' hooks where they may be exact, verify, and switch to functional mode.

``auto`` (DPSGD's default) decides in two stages:

1. **Before any data** (:func:`lightning_privacy.dpsgd.strategies.resolve_grad_sample_mode`): a static obstacle to
   Opacus' per-layer hooks (a tied or raw parameter, a layer without an exact Opacus sampler, a sequence-first layer,
   gradient checkpointing, :func:`~lightning_privacy.dpsgd.functional.hooks_obstacles`) sends the fit straight to
   functional mode. Otherwise it starts in hooks mode, the cheaper one. (Ghost clipping is not the start: it needs
   one loss per example, which only the first ``training_step`` shows, and its per-layer norms cannot be compared
   with an example's whole gradient without another backward pass.)
2. **While training in hooks mode** every step is verified, before its noised update:

   - every step: each trainable parameter got a per-example gradient for each example of the batch (a parameter
     used outside its layer, or a layer called on a tensor whose first dimension is not the batch — Hugging Face's
     position ids of shape ``[1, T]`` — fails this), and the hooks' forward and backward ran without an error;
   - the self-checked first steps: the exactness check (:mod:`lightning_privacy.dpsgd.exactness`), and — with a
     reduced loss, where that check sees only the sum — a few examples' per-example gradients against their
     gradients computed alone (:mod:`lightning_privacy.dpsgd.sampled_exactness`, dropout off);
   - sampled later steps (``exactness_rate``): the same comparison.

   On a disagreement the step is **redone in functional mode** — each example's clipped gradient by ``torch.func`` on
   that example alone, over the same batch — before its noise: nothing computed by the hooks is released. The fit
   stays in functional mode: Opacus' hooks are removed, the DP optimizer becomes the one that noises a clipped sum
   (the same Opacus state; only its class changes), and the switch's step and reason are kept
   (:class:`AutoSwitch`), warned once, logged as ``dp/auto_switch_step``, saved in the checkpoint and shown in the
   report and the privacy statement. A resumed fit that had switched starts in functional mode.

Under DDP every rank decides together (one boolean all-reduce at every step's backward while the fit is in hooks
mode: a rank's hooks can fail on any step), so all ranks switch at the same step. Explicit modes do not switch: they refuse, naming ``auto``.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Dict, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy.dpsgd import optimizers
from lightning_privacy.dpsgd.functional_mode import FunctionalMode
from lightning_privacy.dpsgd.hooks_mode import HooksMode
from lightning_privacy.dpsgd.modes import distributed, first_sentence, opacus_hooks_backward, zero_missing_grads

__all__ = ["AutoMode", "AutoSwitch", "Switched", "hooks_gap"]


@dataclasses.dataclass
class Switched:
    """``auto``'s switch from hooks to functional mode: at which optimizer step of the run (the ledger's count, over
    resumed fits) and why (what the verification found)."""

    step: int
    reason: str
    start: str = "hooks"

    def state_dict(self) -> Dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "from": self.start}

    @classmethod
    def from_state(cls, saved: Optional[Dict[str, Any]]) -> Optional[Switched]:
        if not saved:
            return None
        return cls(step=int(saved["step"]), reason=str(saved["reason"]), start=str(saved.get("from", "hooks")))

    def sentence(self) -> str:
        return f"switched from {self.start} at step {self.step}: {self.reason}"


def hooks_gap(params: Any, rows: Optional[int], names: Dict[int, str]) -> Optional[str]:
    """Why the hooks' per-example gradients of this step cannot be what DP-SGD clips (``None``: they may be): a
    trainable parameter without one, or with another number of examples than the batch's ``rows``."""
    for param in params:
        sample = getattr(param, "grad_sample", None)
        name = names.get(id(param), f"<parameter of shape {tuple(param.shape)}>")
        if sample is None:
            return (
                f"`{name}` got no per-example gradient from Opacus' hooks (used outside its layer, e.g. in "
                "`training_step` or by `F.linear(x, layer.weight)`)"
            )
        count = len(sample) if isinstance(sample, list) else int(sample.shape[0])
        if rows is not None and count != rows:
            return (
                f"`{name}`'s per-example gradients from Opacus' hooks count {count} examples, the batch {rows} (a "
                "layer called on a tensor whose first dimension is not the batch, e.g. position ids of shape [1, T])"
            )
    return None


class AutoSwitch:
    """What ``auto`` changes outside the backward pass when it switches (see the module docstring).

    Args:
        dp: the DPSGD callback of the fit (its mode, reason, hooks, self-checks and exactness record).
        trainer: the fit's Trainer (its DP optimizer).
    """

    def __init__(self, dp: Any, trainer: Any) -> None:
        # (weak references: a copy of the module, e.g. an audit's reference model, copies DPSGD's stand-ins for its
        # backward and training_step, and must not copy the fit's Trainer and optimizer with them)
        self._dp, self._trainer = weakref.ref(dp), weakref.ref(trainer)

    @property
    def dp(self) -> Any:
        return self._dp()

    @property
    def trainer(self) -> Any:
        return self._trainer()

    def engine(self, module: Any) -> Any:
        """Functional mode's per-example engine for the rest of the fit (DPSGD's C and chunk size)."""
        from lightning_privacy.dpsgd.functional import FunctionalClipping

        chunk_size = getattr(self.dp, "functional_chunk_size", None)
        clip = getattr(getattr(self.dp, "quantile", None), "clip", None) or self.dp.max_grad_norm  # (C_t: adaptive)
        engine = FunctionalClipping(module, max_grad_norm=clip, chunk_size=chunk_size)
        engine.units = getattr(self.dp, "_units_of_batch", None)  # (user-level sampling: one clip per person)
        engine.rule = getattr(self.dp, "clipping", None)  # (the clipping rule: fixed or automatic)
        return engine

    def switch(self, reason: str) -> Switched:
        """Leave hooks mode for good: remove Opacus' hooks, make the DP optimizer noise a clipped sum, record why."""
        dp = self.dp
        switched = Switched(step=int(dp.ledger.steps), reason=reason)
        if dp._hooks is not None:
            dp._hooks.cleanup()
            dp._hooks = None
        for param in self.trainer.lightning_module.parameters():
            if hasattr(param, "grad_sample"):
                param.grad_sample = None
        for optimizer in self.trainer.strategy.optimizers:
            optimizers.to_clipped_sum(optimizer)
        dp.grad_sample_mode = "functional"
        dp.grad_sample_mode_reason = switched.sentence()
        dp.grad_sample_mode_switch = switched
        record = dp.exactness  # the hooks' mismatch is the reason; what is compared from here is functional mode's
        for field in ("steps", "examples", "batch_examples", "max_relative_error"):
            setattr(record, field, type(getattr(record, field))())
        record.reference = "not run"
        rank_zero_warn(
            f"DPSGD(grad_sample_mode='auto') switched from Opacus' hooks to functional mode at step {switched.step}, "
            f"before that step's noised update (nothing the hooks computed was released): {reason}. Each example's "
            "gradient is now computed alone by torch.func (exact; slower than hooks). To start there, pass "
            "DPSGD(grad_sample_mode='functional')."
        )
        return switched


def collectively(trainer: Any, needed: bool) -> bool:
    """Under several processes: whether any rank needs the switch (every rank calls this on the same steps)."""
    if trainer.world_size > 1 and distributed():
        return bool(trainer.strategy.reduce_boolean_decision(needed, all=False))
    return needed


class AutoMode(HooksMode):
    """``auto`` while it trains in hooks mode: every step verified, and on a disagreement redone in functional mode,
    which the fit keeps (see the module docstring)."""

    def __init__(self, owner: Any, switch: AutoSwitch) -> None:
        super().__init__(owner)
        self.switcher = switch
        self.inputs: Any = None  # this step's batch and training_step arguments, for a redo in functional mode
        self.reason: Optional[str] = None  # the hooks' forward pass failed on this step (switched already)

    def step(self, batch: Any, args: tuple, kwargs: Dict[str, Any]) -> Any:
        self.inputs = (batch, args, kwargs)
        try:
            out = self.forward(args, kwargs)
        except Exception as err:  # noqa: BLE001 (the hooks' forward failed: functional mode takes the step and the fit)
            self.reason = f"the forward pass under Opacus' hooks failed ({first_sentence(err)})"
            self.inputs = None
            return self.switch(self.reason).step(batch, args, kwargs, checking=True)
        return self.with_per_example_loss(out)

    def finish(self, loss: Any, *args: Any, **kwargs: Any) -> bool:
        """The step's backward, verified (an empty batch's too: every rank decides together), then the decision."""
        owner = self.owner
        reason, self.reason = self.reason, None
        if owner._empty_step:
            owner.empty_skipped(loss, *args, **kwargs)
        elif owner.impl is not self:  # (switched in the forward pass: functional mode has this step)
            owner.check_rows(loss)
            owner.impl.backward(loss, *args, **kwargs)
        else:
            owner.check_rows(loss)
            reason = self.verified(loss, *args, **kwargs)
        self.decide(reason, *args, **kwargs)
        return True

    def verified(self, loss: Any, *args: Any, **kwargs: Any) -> Optional[str]:
        """The hooks' backward and its checks; why they cannot be trusted on this step (``None``: they can) — an
        error, a parameter without per-example gradients for the batch, a mismatch."""
        owner = self.owner
        try:
            with opacus_hooks_backward():
                self.per_layer_backward(loss, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 (said as the reason; functional mode redoes the step)
            if isinstance(err, MisconfigurationException) and "DPSGD expects `training_step`" in str(err):
                raise  # (what training_step returned: no mode trains it)
            gap = hooks_gap(owner.trainable, owner.last_rows, owner.param_names)
            if gap is None and isinstance(err, MisconfigurationException):  # (a check's finding, without its advice)
                return first_sentence(err).split(", so ")[0]
            return gap or f"Opacus' hooks' backward pass failed ({first_sentence(err)})"
        gap = hooks_gap(owner.trainable, owner.last_rows, owner.param_names)
        if gap is not None:
            return gap
        pending = None if owner.sampled is None else owner.sampled.pending
        if pending is not None:
            owner.sampled.pending = None
            return first_sentence(pending).split(", so ")[0]
        return None

    def decide(self, reason: Optional[str], *args: Any, **kwargs: Any) -> None:
        """Every rank decides together whether to leave hooks mode; if so this step is redone in functional mode
        before its noise (a rank whose forward failed switched already; an empty batch has nothing to redo)."""
        owner = self.owner
        if not collectively(owner.pl_module.trainer, reason is not None) or owner.impl is not self:
            self.inputs = None
            return
        functional_mode = self.switch(reason or "another process's per-example gradients could not be verified")
        inputs, self.inputs = self.inputs, None
        if inputs is None or not owner.last_rows:
            zero_missing_grads(owner.trainable)
            owner.last_norms = torch.zeros(0)
            return
        functional_mode.redo(*inputs, *args, **kwargs)

    def switch(self, reason: str) -> FunctionalMode:
        """Functional mode from here on (:meth:`AutoSwitch.switch` outside the backward)."""
        owner = self.owner
        self.switcher.switch(reason)
        if owner.sampled is not None:
            owner.sampled.pending = None  # (what the hooks got wrong on this step: the reason, not raised)
        owner.hooks = None
        mode = FunctionalMode(owner, self.switcher.engine(owner.pl_module))
        mode.engine.per_example = owner.per_example
        owner.impl = mode
        return mode

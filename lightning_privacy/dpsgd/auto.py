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

Under DDP every rank decides together (a collective call on the checked steps, and on any step where a rank's hooks
failed), so all ranks switch at the same step. Explicit modes do not switch: they refuse, naming ``auto``.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Dict, Optional

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_privacy.dpsgd import optimizers

__all__ = ["AutoSwitch", "Switched", "hooks_gap"]


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
        return FunctionalClipping(module, max_grad_norm=self.dp.max_grad_norm, chunk_size=chunk_size)

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
        if dp._checks is not None:
            dp._checks.grad_sample_mode = "functional"
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
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        return bool(trainer.strategy.reduce_boolean_decision(needed, all=False))
    return needed

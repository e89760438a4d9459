"""The interface every per-example mode implements, and what the modes share.

:class:`~lightning_privacy.dpsgd.backward.PerExampleBackward` stands in for the module's ``training_step`` and
``backward``; for a batch with examples it hands both to its mode, one object per fit (what ``auto`` swaps):

- :class:`~lightning_privacy.dpsgd.hooks_mode.HooksMode` — Opacus' per-example hooks, clipped by the ``DPOptimizer``;
- :class:`~lightning_privacy.dpsgd.ghost_mode.GhostMode` — ghost clipping's norms, then the clipped sum;
- :class:`~lightning_privacy.dpsgd.functional_mode.FunctionalMode` — each example's whole gradient by ``torch.func``;
- :class:`~lightning_privacy.dpsgd.auto.AutoMode` — hooks, verified every step, switched to functional on a
  disagreement.

A mode reads the fit's shared state (the module, the hooks, the checks, the batch's rows) from its ``owner``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, List

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

__all__ = ["EXAMPLE", "PER_EXAMPLE_LOSS", "Mode", "PerLayerMode", "opacus_hooks_backward"]

PER_EXAMPLE_LOSS = "per_example_loss"  # training_step's dict key for the per-example losses (beside "loss")

EXAMPLE = (
    "e.g. `F.cross_entropy(logits, y, reduction='none')`, or for a language model one loss per sequence from "
    "`lightning_privacy.functional.sequence_loss.causal_lm_losses`"
)
REENTRANT = (
    "DPSGD(grad_sample_mode={mode!r}): the model runs reentrant `torch.utils.checkpoint` (use_reentrant=True), which "
    "torch cannot differentiate with `torch.autograd.grad` as DP-SGD's per-example computations and checks do, so use "
    "`use_reentrant=False` with grad_sample_mode='functional' (or 'auto'), or turn gradient checkpointing off."
)
DIFFERENTIATES = (
    "DPSGD(grad_sample_mode={mode!r}): `training_step` runs a backward pass of its own (`torch.autograd.grad`, e.g. "
    "an input-gradient penalty), which fires Opacus' per-layer hooks before DP-SGD's backward pass and leaves them "
    "without the layers' inputs, so use grad_sample_mode='auto' (the default) or 'functional', which differentiate "
    "each example's whole loss, penalty included."
)
# torch/utils/hooks.py, BackwardHook: a full backward hook fired on a module none of whose inputs needs a gradient
FULL_BACKWARD_HOOK_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


@contextlib.contextmanager
def opacus_hooks_backward() -> Iterator[None]:
    """A backward pass through Opacus' per-example hooks, without torch's "Full backward hook is firing…" warning.

    Opacus registers a full backward hook on every trainable layer; on the first one (whose input is data and needs
    no gradient) torch warns that the hook's ``grad_input`` will be ``None``. Opacus' hooks
    (``capture_backprops_hook``) read only ``grad_output``, which torch still passes, so the warning says nothing
    about the run. Only that message is ignored, and only during the backward passes DPSGD runs (the filters are
    restored after), so a user's own hooks elsewhere still warn.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FULL_BACKWARD_HOOK_WARNING, category=UserWarning)
        yield


def describe(loss: Any) -> str:
    if not isinstance(loss, torch.Tensor):
        return f"a {type(loss).__name__}"
    if loss.ndim == 0:
        return "a reduced loss (a tensor of shape [])"
    return f"a tensor of shape {list(loss.shape)}"


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def loss_scale(trainer: Any) -> float:
    """The scale fp16 mixed precision's ``GradScaler`` multiplied this step's loss by before the backward pass
    (``precision="16-mixed"``), else 1: per-example gradients and norms from that pass are that many times the
    examples' own, and the scaler divides ``p.grad`` by it before the optimizer step."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0


def zero_missing_grads(params: List[torch.Tensor]) -> None:
    """A zero gradient for every parameter the backward pass left without one (an empty batch's step)."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


def first_sentence(err: BaseException) -> str:
    """An error's first line, as part of a sentence (``auto``'s reason for a switch)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.rstrip(".")


def reduce_losses(loss: torch.Tensor, loss_reduction: str) -> torch.Tensor:
    return loss.mean() if loss_reduction == "mean" else loss.sum()


def not_a_loss(loss: Any) -> MisconfigurationException:
    return MisconfigurationException(
        "DPSGD expects `training_step` to return a reduced loss or one loss per example (shape "
        f"[batch_size]: {EXAMPLE}); it returned {describe(loss)}."
    )


class Mode:
    """One way of clipping each example's gradient (see the module docstring); ``owner`` is the fit's
    :class:`~lightning_privacy.dpsgd.backward.PerExampleBackward`."""

    name = ""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def step(self, batch: Any, args: tuple, kwargs: Dict[str, Any]) -> Any:
        """``training_step`` on a batch with examples (``batch``: what the per-example passes take; ``args`` and
        ``kwargs``: Lightning's call); returns what Lightning takes the loss from."""
        raise NotImplementedError

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """``backward`` of that step: the clipped sum (or the per-example gradients the optimizer clips)."""
        raise NotImplementedError

    def finish(self, loss: Any, *args: Any, **kwargs: Any) -> bool:
        """After an empty or a non-empty step's backward; ``True`` if this mode took the backward itself (auto)."""
        return False

    def start_batch(self, *, empty: bool) -> None:
        """At every batch's start."""

    def forget_captures(self) -> None:
        """After passes that are not the step's own (the neighbour check): drop what hooks captured of them."""

    def remove(self) -> None:
        """At the fit's end."""


class PerLayerMode(Mode):
    """Hooks and ghost mode: ``training_step`` runs the batch through Opacus' per-layer hooks."""

    def step(self, batch: Any, args: tuple, kwargs: Dict[str, Any]) -> Any:
        try:
            out = self.forward(args, kwargs)
        except IndexError as err:  # (Opacus' hooks, when training_step runs a backward pass of its own)
            if "pop from empty list" in str(err):
                raise MisconfigurationException(DIFFERENTIATES.format(mode=self.name)) from err
            raise
        return self.with_per_example_loss(out)

    def forward(self, args: tuple, kwargs: Dict[str, Any]) -> Any:
        owner = self.owner
        with owner.no_per_step_sync():
            return owner._original_step(*args, **kwargs)

    def with_per_example_loss(self, out: Any) -> Any:
        """Every trainable layer ran in train mode; a ``"per_example_loss"`` put where Lightning takes the loss."""
        self.owner.check_train_mode()
        if isinstance(out, dict) and PER_EXAMPLE_LOSS in out:
            losses = out[PER_EXAMPLE_LOSS]
            if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
                raise MisconfigurationException(
                    f"`training_step` returned {PER_EXAMPLE_LOSS!r} as {describe(losses)}; DPSGD expects one loss per "
                    f"example, a tensor of shape [batch_size] ({EXAMPLE})."
                )
            out = {**out, "loss": losses}
        return out

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """The mode's backward, Opacus' and torch's errors that name no layer and no fix put in words."""
        try:
            with opacus_hooks_backward():
                self.per_layer_backward(loss, *args, **kwargs)
        except RuntimeError as err:  # (torch's words for it name no layer and no fix)
            if "use_reentrant=True" in str(err):
                raise MisconfigurationException(REENTRANT.format(mode=self.name)) from err
            raise
        except IndexError as err:  # (Opacus' hooks, after training_step ran a backward pass of its own)
            if "pop from empty list" in str(err):
                raise MisconfigurationException(DIFFERENTIATES.format(mode=self.name)) from err
            raise

    def per_layer_backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

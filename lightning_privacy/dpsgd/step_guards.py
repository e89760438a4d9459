"""Guards every DPSGD step runs whatever the mode: the trainable set unchanged since the fit's start, no per-step
``sync_dist`` log under DDP, trainable layers in train mode, one loss per example, FSDP2's placeholder row.

A mixin of :class:`~lightning_privacy.dpsgd.backward.PerExampleBackward` (its ``pl_module``, ``sharded``,
``last_rows``, ``_layers`` and ``_trainable_names``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Set, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy.dpsgd.modes import EXAMPLE, distributed

__all__ = ["StepGuards"]


class StepGuards:
    """The guards (see the module docstring)."""

    pl_module: Any
    sharded: bool
    last_rows: Any
    _layers: List[Tuple[str, Any]]
    _trainable_names: Set[str]

    def _check_trainable_unchanged(self) -> None:
        """Every step: the trainable parameters are those of the fit's start (Opacus' hooks and the DP optimizer
        took them then: a parameter unfrozen since would be updated without clipping or noise)."""
        for name, param in self.pl_module.named_parameters():
            if param.requires_grad != (name in self._trainable_names):
                became = "trainable" if param.requires_grad else "frozen"
                raise MisconfigurationException(
                    f"DPSGD: parameter `{name}` became {became} during the fit (at global step "
                    f"{self.pl_module.trainer.global_step}; e.g. a fine-tuning scheduler's unfreezing), but DP-SGD's "
                    "per-example gradients, clipping and noise cover the parameters trainable when the fit started, so "
                    f"{'its updates would be neither clipped nor noised' if param.requires_grad else 'its step would break'}"
                    ": set `requires_grad` before `trainer.fit`, or end the fit and start another with the new "
                    "trainable set (the ledger composes both fits' steps on the same module)."
                )

    @contextlib.contextmanager
    def no_per_step_sync(self) -> Iterator[None]:
        """Under DDP, refuse ``self.log(..., sync_dist=True)`` of a per-step value inside ``training_step``.

        Such a log all-reduces at the call, but a rank whose Poisson batch is empty skips ``training_step`` (the
        module never sees an empty batch), so the other ranks would wait in an all-reduce it never joins: the ranks
        fall out of step ("Connection closed by peer", or a hang). FSDP2 runs every rank's step (the placeholder row).
        """
        module = self.pl_module
        if self.sharded or not distributed() or torch.distributed.get_world_size() < 2:
            yield
            return
        log, own = module.log, vars(module).get("log")

        def guarded(name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("sync_dist") and kwargs.get("on_step", True) is not False:
                raise MisconfigurationException(
                    f"DPSGD under DDP: `self.log({name!r}, ..., sync_dist=True)` in training_step all-reduces at every "
                    "step, but a rank whose Poisson batch is empty skips training_step, so the ranks would fall out "
                    "of step. Log the rank's own value (no sync_dist), or log it with on_step=False, on_epoch=True."
                )
            return log(name, value, *args, **kwargs)

        module.log = guarded
        try:
            yield
        finally:
            if own is None:
                del module.log  # (the class's method again)
            else:
                module.log = own

    def _placeholder(self) -> Any:
        """FSDP2: the train loader's placeholder (its dataset's first example, one row), on the module's device."""
        trainer = self.pl_module.trainer
        placeholder = getattr(trainer.train_dataloader, "placeholder", None)
        if placeholder is None:
            raise MisconfigurationException(
                "DPSGD under FSDP2: this rank's Poisson batch is empty and the train loader has no placeholder row "
                f"to run the sharded module on (got a {type(trainer.train_dataloader).__name__}, not DPSGD's "
                "PoissonDataLoader)."
            )
        return trainer.strategy.batch_to_device(placeholder)

    def check_train_mode(self) -> None:
        """Every trainable layer ran in train mode (Opacus records no input of a layer in eval mode)."""
        for name, module in self._layers:
            if not module.training:
                raise MisconfigurationException(
                    f"DPSGD: trainable layer `{name or type(module).__name__}` ({type(module).__name__}) is in eval "
                    "mode during training (`model.eval()` or `.train(False)` inside the fit, e.g. in "
                    "`on_train_epoch_start`), and Opacus' hooks record no per-example input for a layer in eval mode, "
                    "so its gradient cannot be clipped: keep trainable layers in train mode, or freeze the layer "
                    "(`requires_grad_(False)`) to keep it in eval mode."
                )

    def check_rows(self, losses: Any) -> None:
        if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
            return
        if self.last_rows is not None and losses.shape[0] != self.last_rows:
            raise MisconfigurationException(
                f"DPSGD: `training_step` returned {losses.shape[0]} per-example losses for a batch of {self.last_rows} "
                f"examples; DP-SGD clips each example's gradient through that example's own loss, so return one loss "
                f"per example ({EXAMPLE}), not one per token."
            )

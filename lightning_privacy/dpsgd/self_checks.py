"""When and where DPSGD runs its self-checks (the checks are in ``checks`` and ``noise_check``), on every strategy.

- Clipping, on the first :data:`SELF_CHECK_STEPS` optimizer steps of a fit that hold examples (an empty Poisson batch,
  on every rank, does not count), on every rank: the exactness check (:mod:`lightning_privacy.dpsgd.exactness`, in the backward pass),
  per-sample gradients for every trainable parameter and their clipped sum (hooks mode), the clipped sum's bound
  (ghost mode; under FSDP2 the reduce-scattered average, all-reduced).
- Noise, over as many steps as the χ² test needs (:data:`~lightning_privacy.dpsgd.noise_check.NOISE_MIN_COORDINATES` coordinates), where it
  is added: the one process, rank 0 under DDP (Opacus' distributed optimizers), every rank's shard under FSDP2. A fit
  shorter than that is tested at its end on what was recorded.
- Collectively: under several processes every rank raises when any rank's check failed, so none waits forever in
  the next collective call.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl
import torch
import torch.distributed
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy.dpsgd import checks, noise_check, strategies

SELF_CHECK_STEPS = 2  # optimizer steps of each fit on which DPSGD re-derives clipping


class SelfChecks:
    """One fit's self-checks (see the module docstring)."""

    def __init__(
        self,
        trainer: pl.Trainer,
        optimizer: Any,
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        loss_reduction: str,
        param_names: Dict[int, str],
        backward: Any,
    ) -> None:
        self.trainer, self.max_grad_norm = trainer, max_grad_norm
        #: the C this step must be clipped to (DPSGD's: C, or quantile clipping's C_t), read at every check
        self.current_clip: Callable[[], float] = lambda: self.max_grad_norm
        self.loss_reduction, self.param_names, self.backward = loss_reduction, param_names, backward
        self.distributed, self.fsdp = strategies.is_distributed(trainer), strategies.is_fsdp(trainer)
        self.clipping_steps_left = SELF_CHECK_STEPS
        self._step_had_rows = True
        self.noise = noise_check.NoiseCheck(
            max_grad_norm=max_grad_norm,
            noise_multiplier=float(noise_multiplier),
            divisor=trainer.world_size if self.fsdp else 1,
        )
        coordinates = sum(p.numel() for p in optimizer.params)  # FSDP2: each rank checks its ~1/W shard
        coordinates = coordinates // trainer.world_size if self.fsdp else coordinates
        self.noise_steps_left = max(1, math.ceil(noise_check.NOISE_MIN_COORDINATES / max(1, coordinates)))

    @property
    def grad_sample_mode(self) -> str:
        """The mode the backward runs in now (``auto`` may switch from hooks to functional mid-fit)."""
        return self.backward.mode

    @property
    def checking_clipping(self) -> bool:
        return self.clipping_steps_left > 0

    @property
    def exactness_compared(self) -> bool:
        """Some rank compared examples in this fit's exactness check (not run under FSDP2): the same answer on every
        rank, because the self-checked steps are counted collectively. A rank whose own batches were empty on both
        self-checked steps compared nothing, yet must log ``dp/exactness_error`` with the others: a log with
        ``sync_dist=True`` is a collective call, and one rank logging alone desynchronised DDP (the other rank left
        the fit one all-reduce early, and the first saw "Connection closed by peer")."""
        return not self.fsdp and self.clipping_steps_left < SELF_CHECK_STEPS

    def collectively(self, check: Callable[[], None]) -> None:
        """Run a check; under several processes every rank raises when any rank's check failed."""
        error: Optional[MisconfigurationException] = None
        try:
            check()
        except MisconfigurationException as err:
            error = err
        if self.distributed and self.trainer.strategy.reduce_boolean_decision(error is not None, all=False):
            error = error or MisconfigurationException(
                "DP-SGD self-check failed on another rank (its message is in that rank's output)."
            )
        if error is not None:
            raise error

    def per_sample_gradients(self, optimizer: Any) -> None:
        """Hooks mode, before the optimizer step: every trainable parameter has per-sample gradients."""
        if self.checking_clipping and self.grad_sample_mode == "hooks":
            self.collectively(lambda: checks.check_per_sample_gradients(optimizer.params, self.param_names))

    def before_noise(self, optimizer: Any) -> bool:
        """Clipping on the first steps; True while the noise check needs this step (keep the clipped sum)."""
        if self.checking_clipping:
            self.collectively(lambda: self._clipping(optimizer))
            rows = float(self.backward.last_rows or 0)
            if self.distributed:  # (every rank checks the same steps: a collective call, as the check's)
                rows = float(self.trainer.strategy.reduce(torch.tensor(rows), reduce_op="sum"))
            self._step_had_rows = rows > 0
        sampled = getattr(self.backward, "sampled", None)
        if sampled is not None and sampled.active:  # a sampled later step (the same steps on every rank)
            sampled.active = False
            self.collectively(sampled.raise_pending)
        noises_here = not self.distributed or self.fsdp or self.trainer.is_global_zero
        return self.noise_steps_left > 0 and noises_here

    def _clipping(self, optimizer: Any) -> None:
        if self.grad_sample_mode == "hooks":
            rule = getattr(optimizer, "clipping_rule", None)  # (C: the callback's, never the optimizer's own attribute)
            checks.check_clipping(optimizer.params, self.param_names, max_grad_norm=self.current_clip(), rule=rule)
            return
        # ghost mode: no per-sample gradients (the norms were checked in the backward); the sum's bound
        batch = self.backward.last_norms.numel() if self.backward.last_norms is not None else 0
        checks.check_clipped_sum_bound(
            [optimizer.summed(p) for p in optimizer.params],
            max_grad_norm=self.current_clip(),
            batch_size=batch,
            averaged_over=self.trainer.world_size if self.fsdp else 1,
            all_reduce=torch.distributed.all_reduce if self.fsdp else None,
        )

    def after_step(self, optimizer: Any) -> None:
        """In the optimizer's step hook: count the step, record its noise, test it when enough is in."""
        if self._step_had_rows:  # (a step of empty batches everywhere compared nothing)
            self.clipping_steps_left = max(0, self.clipping_steps_left - 1)
        if self.noise_steps_left == 0:
            return
        self.noise_steps_left -= 1
        if optimizer.summed_before_noise is not None:
            scale = optimizer.expected_batch_size * optimizer.accumulated_iterations
            scale = float(scale) if self.loss_reduction == "mean" else 1.0
            unit = self.max_grad_norm / self.current_clip()  # (the noise in units of the first C: adaptive C)
            self.noise.add(
                optimizer.params, optimizer.summed_before_noise, scale=scale, step=self.trainer.global_step, unit=unit
            )
        optimizer.summed_before_noise = None
        if self.noise_steps_left == 0:
            self.collectively(self.noise.check)

    def at_train_end(self) -> None:
        """A fit shorter than the noise check: test what was recorded."""
        if self.noise_steps_left > 0:
            self.noise_steps_left = 0
            self.collectively(self.noise.check)

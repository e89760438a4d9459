"""DPSGD's DP optimizers: Opacus' classes with the mixins that make them DPSGD's (no Trainer needed).

- :class:`_StateInitialisationStep`: a ``step()`` that only creates optimizer state (torch.distributed.checkpoint's
  ``_init_optim_state`` under FSDP2) goes to the wrapped optimizer, neither counted nor noised;
- :class:`_BeforeNoiseHooks`: DPSGD's self-check and the registered hooks (canaries) on the clipped sum, then the noise;
- :class:`_SecretNoise`: every step's noise from the fit's :class:`~lightning_privacy.dpsgd.noise.NoiseSource`;
- :class:`_NoiseIntoGradient`: the noise added to the clipped sum in place, chunk by chunk (no per-step allocation);
- :class:`_GhostSumWithoutCopy`: ghost clipping's clipped sum taken over from ``p.grad`` instead of copied;
- :class:`_ClipInParameterPrecision`: hooks mode clips per-sample gradients in their parameter's dtype.
- :class:`_WideReduction`: under DDP, 16-bit parameters' noised sums are added across the ranks in float32.

Which class a fit uses (one process, DDP, FSDP2; hooks or ghost) is decided by
:func:`lightning_privacy.dpsgd.strategies.dp_optimizer_class`.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
from opacus.optimizers import (
    DistributedDPOptimizer,
    DistributedDPOptimizerFastGradientClipping,
    DPOptimizer,
    DPOptimizerFastGradientClipping,
)
from opacus.optimizers.fsdpoptimizer_fast_gradient_clipping import FSDPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _generate_noise, _mark_as_processed

from lightning_privacy.dpsgd import users
from lightning_privacy.dpsgd.clipping import ClippingRule
from lightning_privacy.dpsgd.products import wide


class _BeforeNoiseHooks:
    """Mixin for Opacus' DP optimizers: run DPSGD's check and the registered hooks on the clipped sum, then noise."""

    before_noise_hooks: List[Callable[[DPOptimizer], None]]
    check_before_noise: Optional[Callable[[DPOptimizer], bool]] = None  # True: keep the sum for the noise check
    summed_before_noise: Optional[List[torch.Tensor]] = None

    def summed(self, param: torch.Tensor) -> torch.Tensor:
        """The clipped sum the noise is added to (``p.summed_grad``; FSDP2 keeps it elsewhere)."""
        return param.summed_grad

    def add_noise(self) -> None:
        keep = self.check_before_noise(self) if self.check_before_noise is not None else False
        for hook in self.before_noise_hooks:  # e.g. CanaryAudit's canaries
            hook(self)
        self.summed_before_noise = [self.summed(p).detach().clone() for p in self.params] if keep else None
        super().add_noise()


#: a 16-bit parameter's clipped sum in float32, beside its rounded ``.grad`` (:func:`hand_over`)
WIDE_SUM = "_dp_wide_sum"
#: under DDP, a 16-bit parameter's noised sum in float32, beside its rounded ``.grad`` (:class:`_WideReduction`)
WIDE_GRAD = "_dp_wide_grad"


def hand_over(param: torch.Tensor, total: torch.Tensor) -> None:
    """Give the noising optimizer ``total``, ``param``'s clipped sum of this step (ghost and functional modes): as its
    ``.grad``, and, where ``param`` is 16-bit and ``total`` wider, the sum itself beside it (``.grad`` must have the
    parameter's dtype; rounding the sum before the noise would move each example's contribution by up to 2⁻⁹ of
    the whole sum), which :class:`_GhostSumWithoutCopy` noises instead."""
    param.grad = total.to(param.dtype)
    setattr(param, WIDE_SUM, total if total.dtype != param.dtype else None)


class _ClipInParameterPrecision:
    """Mixin for the hooks-mode optimizers: clip per-sample gradients in their parameter's dtype, float32 at least
    (and, under user-level sampling, per person: :attr:`units_of_batch`).

    Under bf16/16-mixed autocast Opacus' hooks produce 16-bit per-sample gradients, and ``DPOptimizer`` would compute
    their norms, the clipped sum and the noise in 16 bits (norms off by ≈ 0.4 %, so a clipped gradient could exceed C).
    Upcast first: clipping is then exact for the per-sample gradients as computed, and sum and noise are full width.
    16-bit parameters (``precision="bf16-true"``) are clipped, summed and noised in float32 too; the noised gradient is
    rounded to their dtype after the noise (:class:`_NoiseIntoGradient`), a post-processing.
    Under fp16's loss scaling (``precision="16-mixed"``) they are also divided by the step's scale
    (:attr:`loss_scale`) first: the backward pass differentiated the scaled loss, and the clipped sum is written to
    ``p.grad`` after the scaler has unscaled it, so clipping the scaled gradients would clip at C / scale.
    """

    params: List[torch.Tensor]
    #: user-level DP with user-level sampling: the step's (person of each row, rows per person, reduction), read at
    #: every clip; each person's per-example gradients are then summed (or averaged) into one before the norm
    units_of_batch: Optional[Callable[[], Any]] = None
    #: the clipping rule (:mod:`lightning_privacy.dpsgd.clipping`); ``None`` or fixed: Opacus' own clipping
    clipping_rule: Any = None
    #: fp16's loss scale of this step (:func:`lightning_privacy.dpsgd.modes.loss_scale`), read at every clip
    loss_scale: Optional[Callable[[], float]] = None

    def clip_and_accumulate(self) -> None:
        scale = self.loss_scale() if self.loss_scale is not None else 1.0
        for p in self.params:
            sample, dtype = getattr(p, "grad_sample", None), wide(p.dtype)
            if isinstance(sample, torch.Tensor) and (sample.dtype != dtype or scale != 1.0):
                p.grad_sample = sample.to(dtype) / scale if scale != 1.0 else sample.to(dtype)
            elif isinstance(sample, list):
                p.grad_sample = [g.to(dtype) / scale for g in sample]
        units = self.units_of_batch() if self.units_of_batch is not None else None
        if units is not None:  # one "sample" per person: Opacus' clipping then clips each person's whole gradient
            index, counts, reduction = units
            for p in self.params:
                if getattr(p, "grad_sample", None) is not None:
                    p.grad_sample = users.fold(self._get_flat_grad_sample(p), index, counts, reduction)
        rule = self.clipping_rule
        narrow = any(wide(p.dtype) != p.dtype for p in self.params)  # (Opacus would clip in the parameters' 16 bits)
        if (rule is None or rule.rule == "fixed") and not narrow:
            super().clip_and_accumulate()
            return
        # another rule's factors (dpsgd.clipping), applied as Opacus applies its own: Σᵢ factorᵢ·gᵢ into summed_grad
        rule = rule or ClippingRule()
        samples = [self._get_flat_grad_sample(p).to(wide(p.dtype)) for p in self.params]
        rows = len(samples[0]) if samples else 0
        norms = (
            torch.stack([g.reshape(rows, -1).norm(2, dim=-1) for g in samples], dim=1).norm(2, dim=1)
            if rows
            else torch.zeros(0, device=samples[0].device if samples else None)
        )
        factors = rule.factors(norms, self.max_grad_norm)
        self.last_norms = norms  # (quantile clipping counts the examples under C from them after the step)
        for p, sample in zip(self.params, samples):
            _check_processed_flag(p.grad_sample)
            grad = torch.einsum("i,i...", factors.to(sample.device, sample.dtype), sample)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)


class _SecretNoise:
    """Mixin: every step's noise comes from the fit's :class:`~lightning_privacy.dpsgd.noise.NoiseSource`.

    Before Opacus adds the noise of step ``t`` (``noise_step()``, the steps recorded so far), ``self.generator`` is
    replaced by the source's generator for ``t`` on the parameters' device: the noise never comes from torch's global
    generator (which ``seed_everything`` makes public) and draws nothing from it. With ``secure_mode`` the source
    gives fresh OS entropy every step and Opacus draws four Gaussians per coordinate (against floating-point attacks).
    """

    noise_source: Any = None  # set by DPSGD at fit start
    noise_step: Optional[Callable[[], int]] = None
    generator: Optional[torch.Generator]
    params: List[torch.Tensor]

    def add_noise(self) -> None:
        if self.noise_source is None or self.noise_step is None:
            raise RuntimeError("DPSGD's DP optimizer has no noise source: it adds noise only inside a DPSGD fit")
        device = self.params[0].device if self.params else torch.device("cpu")
        self.generator = self.noise_source.generator(self.noise_step(), device)
        super().add_noise()


NOISE_CHUNK = 1 << 16  # elements of noise drawn at a time into a small reused buffer (a multiple of 16)


class _NoiseIntoGradient:
    """Mixin: Opacus' ``add_noise`` without its three fresh parameter-sized tensors per step, same numbers.

    Opacus' ``_generate_noise`` allocates a tensor of zeros and one of noise, then ``summed_grad + noise`` a third; on
    the CPU a large allocation is fresh memory from the operating system every time (page faults), which cost about as
    much as drawing the noise (``benchmarks/results/dpsgd_overhead.txt``). Here, on the CPU, the noise is drawn in
    chunks of ``NOISE_CHUNK`` into one small buffer that stays in the cache and added to the clipped sum in place,
    which then becomes ``p.grad``. The draws are Opacus' bit for bit: ``torch.normal(0, σC, size)`` runs
    ``Tensor.normal_``, whose CPU kernel turns one uniform number per element, in order, into Gaussians sixteen at
    a time (recomputing the last sixteen when the size is not a multiple of sixteen), so chunks of a multiple of
    sixteen elements with a last chunk of at least sixteen draw exactly the full tensor's numbers; and
    ``sum + noise`` commutes. A fixed ``noise_seed`` therefore gives the same model as Opacus' code. Where that
    argument does not hold — a CUDA tensor (Philox offsets), a non-contiguous sum, fewer than sixteen elements — the
    noise is drawn whole into ``p.grad``'s memory when it can hold it, or into a new tensor. Secure mode (four draws per
    coordinate) and FSDP2 (a sharded ``DTensor``) keep Opacus' own code; under DDP only rank 0 noises, as in Opacus.
    A 16-bit clipped sum (16-bit parameters, ``precision="bf16-true"``) is noised in float32 — a Gaussian drawn in
    bfloat16 would have 8 significant bits — and the noised gradient rounded to the parameter's dtype.
    """

    params: List[torch.Tensor]
    noise_multiplier: float
    max_grad_norm: float
    secure_mode: bool
    generator: Optional[torch.Generator]
    _noise_buffer: Optional[torch.Tensor] = None

    def add_noise(self) -> None:
        distributed = isinstance(self, (DistributedDPOptimizer, DistributedDPOptimizerFastGradientClipping))
        quiet = distributed and getattr(self, "rank", 0) != 0  # (only rank 0 noises)
        narrow = any(p.dtype != wide(p.dtype) or p.summed_grad.dtype != p.dtype for p in self.params)  # (16-bit)
        if (self.secure_mode or quiet) and not narrow:
            super().add_noise()  # type: ignore[misc]
            return
        # (ghost clipping's adaptive clipping noises with an adjusted multiplier, accounts with the original one)
        std = getattr(self, "_adjusted_noise_multiplier", self.noise_multiplier) * self.max_grad_norm
        for p in self.params:
            summed = p.summed_grad
            _check_processed_flag(summed)
            full = summed.to(wide(summed.dtype))  # (the same tensor unless 16-bit)
            if std == 0 or quiet:
                noised = full  # (Opacus: sum + zeros, the same values)
            elif self.secure_mode:
                noised = full + _generate_noise(std, full, self.generator, secure_mode=True)
            elif self._chunkable(full):
                self._add_in_chunks(full.view(-1), std)
                noised = full
            else:
                noised = self._whole(p, full, std)
            p.grad = noised.view_as(p).to(p.dtype)  # (16-bit parameters: rounded after the noise)
            if distributed and p.grad.dtype != noised.dtype:  # (... and under DDP after the ranks' sum: _WideReduction)
                setattr(p, WIDE_GRAD, noised.view_as(p))
            _mark_as_processed(summed)

    @staticmethod
    def _chunkable(summed: torch.Tensor) -> bool:
        return (
            type(summed) is torch.Tensor
            and summed.device.type == "cpu"
            and summed.is_contiguous()
            and summed.numel() >= 16
        )

    def _add_in_chunks(self, flat: torch.Tensor, std: float) -> None:
        size = NOISE_CHUNK + 16  # (the last chunk may be up to 15 elements longer)
        buffer = self._noise_buffer
        if buffer is None or buffer.dtype != flat.dtype or buffer.numel() < size:
            buffer = self._noise_buffer = torch.empty(size, dtype=flat.dtype)
        start, total = 0, flat.numel()
        while start < total:
            length = NOISE_CHUNK if total - start - NOISE_CHUNK >= 16 else total - start
            flat[start : start + length].add_(buffer[:length].normal_(0, std, generator=self.generator))
            start += length

    def _whole(self, p: torch.Tensor, summed: torch.Tensor, std: float) -> torch.Tensor:
        out = p.grad
        if not (
            type(out) is torch.Tensor
            and out.shape == p.shape
            and out.dtype == summed.dtype
            and out.device == summed.device
            and out.is_contiguous()
            and out.data_ptr() != summed.data_ptr()
        ):
            out = torch.empty(p.shape, dtype=summed.dtype, device=summed.device)
        return out.normal_(0, std, generator=self.generator).add_(summed.view_as(p))


class _WideReduction:
    """Mixin for the DDP optimizers: 16-bit parameters' gradients are added across the ranks in float32.

    Opacus' ``reduce_gradients`` all-reduces ``p.grad``, which for 16-bit parameters (``precision="bf16-true"``) is
    each rank's noised (rank 0) or un-noised (the others) sum rounded to the parameter's dtype: a rank's clipped sum
    rounded before another rank's noise, a rounding of up to 2⁻⁹ of the whole sum that no example's bound C covers.
    Here :class:`_NoiseIntoGradient` keeps the float32 sum beside the rounded ``.grad`` (``WIDE_GRAD``), it is
    scaled as ``.grad`` is, the ranks add it in float32, and the result is rounded once, after the noise and the sum.
    """

    params: List[torch.Tensor]
    loss_reduction: str
    expected_batch_size: Optional[float]
    accumulated_iterations: int
    world_size: int

    def scale_grad(self) -> None:
        super().scale_grad()  # type: ignore[misc]
        if self.loss_reduction == "mean":
            for p in self.params:
                full = getattr(p, WIDE_GRAD, None)
                if full is not None:
                    full /= self.expected_batch_size * self.accumulated_iterations

    def reduce_gradients(self) -> None:
        for p in self.params:
            full = getattr(p, WIDE_GRAD, None)
            setattr(p, WIDE_GRAD, None)
            if not p.requires_grad:
                continue
            total = p.grad if full is None else full
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
            if self.loss_reduction == "mean":
                total /= self.world_size
            if full is not None:
                p.grad = full.to(p.dtype)  # (rounded once: after the noise and the ranks' sum)


class _GhostSumWithoutCopy:
    """Mixin for the ghost-clipping optimizers: the second backward's gradient *is* the clipped sum; take it over.

    Opacus' ``DPOptimizerFastGradientClipping.accumulate`` deep-copies ``p.grad`` into ``p.summed_grad`` (a fresh
    tensor and a copy per parameter and step) and leaves ``p.grad``, which ``add_noise`` then replaces. Here the
    first sum of a step becomes ``p.summed_grad`` itself and ``p.grad`` is cleared (so the noise gets its own tensor,
    and no ``zero_grad(set_to_none=False)`` can zero the sum through an alias); a later sum is added as in Opacus.
    """

    params: List[torch.Tensor]

    def accumulate(self) -> None:
        for p in self.params:
            total = getattr(p, WIDE_SUM, None)  # (a 16-bit parameter's sum in float32: hand_over)
            total = p.grad.detach() if total is None else total
            if p.summed_grad is not None:
                p.summed_grad.add_(total.to(p.summed_grad.dtype))
            else:
                p.summed_grad = total
            p.grad = None
            setattr(p, WIDE_SUM, None)


class _StateInitialisationStep:
    """Mixin: a ``step()`` that only initialises optimizer state is passed to the wrapped optimizer, not taken.

    Saving an FSDP2 optimizer's state (``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``, which
    Lightning's ``ModelParallelStrategy`` uses at every checkpoint) calls ``_init_optim_state``: when the state is
    empty — always for plain SGD — it sets every gradient to zeros, every learning rate to 0 and calls
    ``optimizer.step(closure=None)``. Opacus' DP optimizer would take that as a training step: count it in the
    accountant (a step that never happened) and draw noise for it. Lightning itself always steps with a closure, so
    a closure-less step with every learning rate 0 and every gradient zero is handed to the original optimizer
    (which creates its state, as torch intends) without clipping, noise or accounting.
    """

    original_optimizer: torch.optim.Optimizer

    def _initialises_state(self, closure: Any) -> bool:
        if closure is not None:
            return False
        groups = self.original_optimizer.param_groups
        if not groups or any(float(group.get("lr", 1.0)) != 0.0 for group in groups):
            return False
        grads = [p.grad for group in groups for p in group["params"] if p.requires_grad]
        return all(g is not None and not bool(torch.any(g != 0)) for g in grads)

    def step(self, closure: Any = None) -> Any:
        if self._initialises_state(closure):
            return self.original_optimizer.step()
        return super().step(closure)


class _DPOptimizer(
    _StateInitialisationStep,
    _BeforeNoiseHooks,
    _SecretNoise,
    _NoiseIntoGradient,
    _ClipInParameterPrecision,
    DPOptimizer,
):
    pass


class _DistributedDPOptimizer(
    _StateInitialisationStep,
    _BeforeNoiseHooks,
    _SecretNoise,
    _NoiseIntoGradient,
    _ClipInParameterPrecision,
    _WideReduction,
    DistributedDPOptimizer,
):
    pass


class _GhostDPOptimizer(
    _StateInitialisationStep,
    _BeforeNoiseHooks,
    _SecretNoise,
    _NoiseIntoGradient,
    _GhostSumWithoutCopy,
    DPOptimizerFastGradientClipping,
):
    pass


class _DistributedGhostDPOptimizer(
    _StateInitialisationStep,
    _BeforeNoiseHooks,
    _SecretNoise,
    _NoiseIntoGradient,
    _GhostSumWithoutCopy,
    _WideReduction,
    DistributedDPOptimizerFastGradientClipping,
):
    pass


class _FSDPGhostDPOptimizer(
    _StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, FSDPOptimizerFastGradientClipping
):
    def summed(self, param: torch.Tensor) -> torch.Tensor:
        """FSDP2: the ranks' reduce-scattered average of clipped sums, this rank's shard (a ``DTensor``)."""
        return self.grad_state[param]["summed_grad"]


#: the optimizer that noises a clipped sum (ghost and functional modes) for each hooks-mode one
_CLIPPED_SUM = {_DPOptimizer: _GhostDPOptimizer, _DistributedDPOptimizer: _DistributedGhostDPOptimizer}


def to_clipped_sum(optimizer: Any) -> None:
    """Make a hooks-mode DP optimizer (``optimizer``, or the one a Lightning optimizer wraps) the ghost/functional one,
    in place: ``grad_sample_mode="auto"``'s switch to functional mode (:mod:`lightning_privacy.dpsgd.auto`).

    Both are Opacus ``DPOptimizer``\\ s built from the same arguments with the same state (the wrapped optimizer, σ, C,
    the expected batch size, the step hook, the noise source; the distributed ones also the rank and world size); they
    differ only in their methods: per-sample clipping of ``p.grad_sample`` or the clipped sum taken from ``p.grad``.
    Changing the instance's class keeps every reference to it (Lightning's, the self-checks', the audits') valid, and
    takes effect in the running ``step``: its ``pre_step`` is looked up after the closure (training step and backward).
    """
    inner = getattr(optimizer, "_optimizer", optimizer)  # (Lightning's LightningOptimizer wraps it)
    if type(inner) in _CLIPPED_SUM.values():
        return
    target = _CLIPPED_SUM.get(type(inner))
    if target is None:
        raise TypeError(f"no clipped-sum DP optimizer for {type(inner).__name__}")
    inner.__class__ = target

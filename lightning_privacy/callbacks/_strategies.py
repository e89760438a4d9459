"""What DPSGD does differently on one process and under DDP, in one place.

Supported strategies, by exact type (a subclass can change how gradients or optimizers are handled, as DeepSpeed's
does by bypassing the DP optimizer):

- ``SingleDeviceStrategy`` — one process.
- ``ModelParallelStrategy`` with a tensor-parallel size of 1 — FSDP2: the module's ``configure_model`` applies
  ``fully_shard`` over ``self.device_mesh["data_parallel"]`` (Lightning's convention). Ghost clipping only, through
  Opacus' FSDP classes (``GradSampleHooksFastGradientClippingFSDP``, ``FSDPOptimizerFastGradientClipping``): each
  rank clips its examples, FSDP's reduce-scatter averages the clipped sums, and every rank adds noise of standard
  deviation σ·C/W to its shard (mean reduction only: the average needs that divisor).
- ``DDPStrategy`` launched by a script (``strategy="ddp"``, ``torchrun``, SLURM): each rank draws its share of one
  Poisson batch per step; per-sample clipping happens locally, the noise is added once (on rank 0) and the DP
  optimizer all-reduces the noised sum itself, so DDP's own gradient all-reduce is replaced by a no-op communication
  hook. ``ddp_spawn``/``ddp_fork``/``ddp_notebook`` are refused: the processes they start take the callbacks' state
  (the privacy ledger) with them, and the main process would report a run it never saw (ε = 0).

Everything else — DeepSpeed, XLA, FSDP1 (``FSDPStrategy``), tensor parallelism, subclasses — is refused in ``setup`` with a
message naming what works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import (
    DistributedDPOptimizer,
    DistributedDPOptimizerFastGradientClipping,
    DPOptimizer,
    DPOptimizerFastGradientClipping,
)
from opacus.optimizers.fsdpoptimizer_fast_gradient_clipping import FSDPOptimizerFastGradientClipping

from lightning_privacy import _compat
from lightning_privacy.noise import NoiseSource
from lightning_privacy.sampling import draw_seed

__all__ = [
    "Sampling",
    "check_strategy",
    "disable_ddp_gradient_sync",
    "check_fsdp_settings",
    "dp_optimizer_class",
    "fsdp_outputs_without_hook_views",
    "full_tensors",
    "grad_sample_hooks",
    "is_fsdp",
    "is_distributed",
    "resolve_noise",
    "resolve_sampling",
]

SUPPORTED = (
    "Trainer(strategy='auto') on one device, Trainer(strategy='ddp', use_distributed_sampler=False) launched as a "
    "script (also under torchrun or SLURM), or ModelParallelStrategy(tensor_parallel_size=1) (FSDP2) with "
    "DPSGD(grad_sample_mode='ghost')"
)


@dataclasses.dataclass
class Sampling:
    """The sampling randomness of one fit: the seed (None with secure mode) and this rank's place."""

    seed: Optional[int] = None
    rank: int = 0
    world_size: int = 1


def check_strategy(trainer: pl.Trainer) -> None:
    """Refuse every strategy but :data:`SUPPORTED`, naming it and what works."""
    strategy = trainer.strategy
    name = type(strategy).__name__
    if type(strategy) is SingleDeviceStrategy:
        return
    if type(strategy) is DDPStrategy:
        start_method = _compat.ddp_start_method(strategy)
        if start_method != "popen":
            raise MisconfigurationException(
                f"DPSGD does not support DDP with start_method={start_method!r} (ddp_spawn/ddp_fork/"
                "ddp_notebook): the processes it starts keep the privacy ledger, and the main process would report a "
                f"run it never saw (ε = 0). Use {SUPPORTED}."
            )
        name = "DDP"
    elif type(strategy) is ModelParallelStrategy:
        tensor_parallel = strategy.device_mesh["tensor_parallel"].size()
        if tensor_parallel != 1:
            raise MisconfigurationException(
                f"DPSGD under ModelParallelStrategy supports data parallelism (FSDP2) only, got a tensor-parallel size "
                f"of {tensor_parallel}: per-example clipping of tensor-parallel layers is not available in Opacus. Use "
                "ModelParallelStrategy(data_parallel_size=W, tensor_parallel_size=1)."
            )
    else:
        raise MisconfigurationException(
            f"DPSGD does not support {name}: DP-SGD needs every example's gradient clipped and the noise added once "
            f"by Opacus' DP optimizer, which this strategy does not guarantee. Use {SUPPORTED}."
        )
    if _compat.uses_distributed_sampler(trainer):
        raise MisconfigurationException(
            f"DPSGD under {name} needs `Trainer(use_distributed_sampler=False)`: Lightning's "
            "DistributedSampler would replace the Poisson sampling that the privacy analysis assumes."
        )


def is_fsdp(trainer: pl.Trainer) -> bool:
    """FSDP2 through Lightning's ModelParallelStrategy."""
    return type(trainer.strategy) is ModelParallelStrategy


def check_fsdp_settings(*, grad_sample_mode: str, loss_reduction: str) -> None:
    """What DPSGD needs under FSDP2: ghost clipping and mean reduction (see the module docstring)."""
    if grad_sample_mode != "ghost":
        raise MisconfigurationException(
            "DPSGD under ModelParallelStrategy (FSDP2) needs grad_sample_mode='ghost' (Opacus' FSDP support computes "
            f"per-example norms, not per-example gradients), got {grad_sample_mode!r}."
        )
    if loss_reduction != "mean":
        raise MisconfigurationException(
            "DPSGD under ModelParallelStrategy (FSDP2) needs loss_reduction='mean': FSDP averages the ranks' clipped "
            f"sums and Opacus divides the noise by the number of ranks accordingly; got {loss_reduction!r}."
        )


def full_tensors(named: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """``{name: tensor}`` with FSDP2's sharded tensors all-gathered (a collective call: every rank must make it).

    Gathered parameters are detached and keep ``requires_grad`` (which layers train); other tensors are the live ones.
    """
    from torch.distributed.tensor import DTensor

    out: Dict[str, torch.Tensor] = {}
    for name, tensor in named:
        if isinstance(tensor, DTensor):
            out[name] = tensor.full_tensor().detach().requires_grad_(tensor.requires_grad)
        else:
            out[name] = tensor
    return out


def is_distributed(trainer: pl.Trainer) -> bool:
    """More than one data-parallel process."""
    return trainer.world_size > 1


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


class _ClipInParameterPrecision:
    """Mixin for the hooks-mode optimizers: clip per-sample gradients in their parameter's dtype.

    Under bf16/16-mixed autocast Opacus' hooks produce 16-bit per-sample gradients, and ``DPOptimizer`` would compute
    their norms, the clipped sum and the noise in 16 bits (norms off by ≈ 0.4 %, so a clipped gradient could exceed C).
    Upcast first: clipping is then exact for the per-sample gradients as computed, and sum and noise are full width.
    """

    params: List[torch.Tensor]

    def clip_and_accumulate(self) -> None:
        for p in self.params:
            sample = getattr(p, "grad_sample", None)
            if isinstance(sample, torch.Tensor) and sample.dtype != p.dtype:
                p.grad_sample = sample.to(p.dtype)
            elif isinstance(sample, list):
                p.grad_sample = [g.to(p.dtype) for g in sample]
        super().clip_and_accumulate()


class _SecretNoise:
    """Mixin: every step's noise comes from the fit's :class:`~lightning_privacy.noise.NoiseSource`.

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


class _DPOptimizer(_StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, _ClipInParameterPrecision, DPOptimizer):
    pass


class _DistributedDPOptimizer(
    _StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, _ClipInParameterPrecision, DistributedDPOptimizer
):
    pass


class _GhostDPOptimizer(_StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, DPOptimizerFastGradientClipping):
    pass


class _DistributedGhostDPOptimizer(
    _StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, DistributedDPOptimizerFastGradientClipping
):
    pass


class _FSDPGhostDPOptimizer(
    _StateInitialisationStep, _BeforeNoiseHooks, _SecretNoise, FSDPOptimizerFastGradientClipping
):
    def summed(self, param: torch.Tensor) -> torch.Tensor:
        """FSDP2: the ranks' reduce-scattered average of clipped sums, this rank's shard (a ``DTensor``)."""
        return self.grad_state[param]["summed_grad"]


def grad_sample_hooks(trainer: pl.Trainer, module: Any, *, grad_sample_mode: str, **kwargs: Any) -> Any:
    """Opacus' per-example hooks for the mode and the strategy."""
    from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
    from opacus.grad_sample.grad_sample_module_fast_gradient_clipping_fsdp import (
        GradSampleHooksFastGradientClippingFSDP,
    )

    if grad_sample_mode == "hooks":
        kwargs.pop("max_grad_norm", None)
        return GradSampleHooks(module, batch_first=True, **kwargs)
    cls = GradSampleHooksFastGradientClippingFSDP if is_fsdp(trainer) else GradSampleHooksFastGradientClipping
    return cls(module, batch_first=True, **kwargs)


def _clone_hook_views(module: Any, args: Any, output: Any) -> Any:
    from torch.utils._pytree import tree_map_only

    def plain(t: torch.Tensor) -> torch.Tensor:
        hooked = t._base is not None and type(t.grad_fn).__name__ == "BackwardHookFunctionBackward"
        return t.clone() if hooked else t

    return tree_map_only(torch.Tensor, plain, output)


def fsdp_outputs_without_hook_views(module: Any) -> List[Any]:
    """Under FSDP2, give every sharded module's output as a plain tensor instead of Opacus' hook view.

    Opacus' per-example hooks are full backward hooks: a hooked layer returns its output through
    ``BackwardHookFunction``, i.e. as a view. An FSDP2 module whose output is such a view (its last layer's) warns at
    every forward that an in-place op on the view would drop its pre-backward hook — a warning that only DP-SGD
    causes. A forward hook that runs before FSDP's (``prepend=True``) clones exactly those views (the logits, not
    the parameters). Returns the hook handles.
    """
    from torch.distributed.fsdp import FSDPModule

    return [
        m.register_forward_hook(_clone_hook_views, prepend=True) for m in module.modules() if isinstance(m, FSDPModule)
    ]


def dp_optimizer_class(trainer: pl.Trainer, grad_sample_mode: str) -> Type[DPOptimizer]:
    """The DP optimizer for the mode and the strategy (hooks or ghost; one process, DDP or FSDP2)."""
    if is_fsdp(trainer):
        return _FSDPGhostDPOptimizer
    distributed = is_distributed(trainer)
    if grad_sample_mode == "ghost":
        return _DistributedGhostDPOptimizer if distributed else _GhostDPOptimizer
    return _DistributedDPOptimizer if distributed else _DPOptimizer


def resolve_sampling(trainer: pl.Trainer, seed: Optional[int], *, secure: bool) -> Sampling:
    """This fit's sampling: a given seed, or a fresh one from rank 0's OS entropy that every rank receives."""
    if not secure and seed is None:
        seed = draw_seed() if trainer.is_global_zero else None
        if is_distributed(trainer):
            seed = trainer.strategy.broadcast(seed, src=0)
    return Sampling(seed=None if secure else seed, rank=trainer.global_rank, world_size=trainer.world_size)


def resolve_noise(trainer: pl.Trainer, seed: Optional[int], *, secure: bool) -> NoiseSource:
    """This fit's noise: a given seed, or each rank's own secret one (the ranks' noise streams are independent)."""
    return NoiseSource(None if secure else seed, rank=trainer.global_rank, secure=secure)


def disable_ddp_gradient_sync(trainer: pl.Trainer) -> None:
    """Replace DDP's gradient all-reduce by a no-op: the DP optimizer reduces the noised, clipped sum itself."""
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel

    model: Any = trainer.strategy.model
    if isinstance(model, DistributedDataParallel) and not getattr(model, "_lightning_privacy_no_sync", False):
        model.register_comm_hook(state=None, hook=noop_hook)
        model._lightning_privacy_no_sync = True

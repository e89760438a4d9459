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
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import DPOptimizer

from lightning_privacy import _compat
from lightning_privacy.dpsgd.noise import NoiseSource
from lightning_privacy.dpsgd.optimizers import (
    _DistributedDPOptimizer,
    _DistributedGhostDPOptimizer,
    _DPOptimizer,
    _FSDPGhostDPOptimizer,
    _GhostDPOptimizer,
)
from lightning_privacy.dpsgd.samplers import install_exact_samplers
from lightning_privacy.dpsgd.sampling import draw_seed

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
    "resolve_grad_sample_mode",
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
    if grad_sample_mode == "functional":
        raise MisconfigurationException(
            "DPSGD(grad_sample_mode='functional') does not run under ModelParallelStrategy (FSDP2): its per-example "
            "pass calls the module with whole parameters, which FSDP2 shards across the ranks, so use "
            "grad_sample_mode='ghost'."
        )
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


def grad_sample_hooks(trainer: pl.Trainer, module: Any, *, grad_sample_mode: str, **kwargs: Any) -> Any:
    """Opacus' per-example hooks for the mode and the strategy (with :mod:`lightning_privacy.dpsgd.samplers`' corrections)."""
    from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
    from opacus.grad_sample.grad_sample_module_fast_gradient_clipping_fsdp import (
        GradSampleHooksFastGradientClippingFSDP,
    )

    if grad_sample_mode == "functional":
        return None  # (no hooks: dpsgd.functional differentiates the whole training_step)
    if grad_sample_mode == "hooks":
        kwargs.pop("max_grad_norm", None)
        return install_exact_samplers(GradSampleHooks(module, batch_first=True, **kwargs))
    cls = GradSampleHooksFastGradientClippingFSDP if is_fsdp(trainer) else GradSampleHooksFastGradientClipping
    return install_exact_samplers(cls(module, batch_first=True, **kwargs))


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
    """The DP optimizer for the mode and the strategy (hooks, or ghost and functional, which both leave the clipped
    sum in ``p.grad``; one process, DDP or FSDP2)."""
    if is_fsdp(trainer):
        return _FSDPGhostDPOptimizer
    distributed = is_distributed(trainer)
    if grad_sample_mode in ("ghost", "functional"):
        return _DistributedGhostDPOptimizer if distributed else _GhostDPOptimizer
    return _DistributedDPOptimizer if distributed else _DPOptimizer


def resolve_grad_sample_mode(trainer: pl.Trainer, module: Any, argument: str) -> Tuple[str, str]:
    """The mode a fit runs in and why: the argument as given, or for ``"auto"`` hooks where every trainable parameter
    belongs to exactly one layer with an exact Opacus per-example gradient, functional otherwise
    (:func:`lightning_privacy.dpsgd.functional.hooks_obstacles`: static, decided before any data is seen); under
    FSDP2, ghost clipping (the one mode it runs), or a refusal naming what ghost clipping cannot clip."""
    from lightning_privacy.dpsgd.functional import hooks_obstacles

    if argument != "auto":
        return argument, "given as DPSGD(grad_sample_mode=...)"
    obstacles = hooks_obstacles(module)
    shown = "; ".join(obstacles[:3]) + (f"; and {len(obstacles) - 3} more" if len(obstacles) > 3 else "")
    if is_fsdp(trainer):
        if obstacles:
            raise MisconfigurationException(
                "DPSGD(grad_sample_mode='auto') under ModelParallelStrategy (FSDP2) can run ghost clipping only, whose "
                f"per-layer norms cannot clip this model ({shown}), so use one process or DDP, where "
                "grad_sample_mode='functional' clips each example's whole gradient."
            )
        return "ghost", "FSDP2 runs ghost clipping, and every trainable parameter belongs to one layer it clips"
    if obstacles:
        return "functional", f"Opacus' per-layer hooks cannot vouch for this model: {shown}"
    return "hooks", (
        "every trainable parameter belongs to exactly one layer with an exact Opacus per-example gradient "
        "(the exactness check confirms it on the first steps)"
    )


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

"""DPSGD's self-checks on its first steps, and its opt-in clipping telemetry.

Self-checks (``check_*``) re-derive, from what Opacus left on the parameters, that privacy is really applied:
every trainable parameter has per-sample gradients; the summed gradient is the sum of per-sample gradients clipped
to the callback's C; the noise added has standard deviation σ·C (:mod:`lightning_privacy.dpsgd.noise_check`). Ghost clipping never materialises per-sample
gradients, so there the check is that the clipped sum is within batch size × C (:func:`check_clipped_sum_bound`);
that what is clipped is each example's whole gradient, in both modes, is the exactness check's (:mod:`lightning_privacy.dpsgd.exactness`). They raise ``MisconfigurationException`` naming the parameter. Telemetry (:class:`ClippingStats`) records per-sample gradient norms; it is data-dependent and not
covered by the DP guarantee.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

# the noise check, in its own module (re-exported: it is one of the self-checks)
from lightning_privacy.dpsgd.clipping import ClippingRule
from lightning_privacy.dpsgd.noise_check import (  # noqa: F401
    NOISE_FALSE_ALARM,
    NOISE_MIN_COORDINATES,
    NoiseCheck,
    check_noise,
    local_tensor,
    noise_readback,
)

__all__ = [
    "ClippingStats",
    "check_clipped_sum_bound",
    "check_clipping",
    "check_no_tied_parameters_for_ghost",
    "check_noise",
    "NoiseCheck",
    "check_per_sample_gradients",
    "local_tensor",
    "noise_readback",
    "per_sample_norms",
    "tied_trainable_parameters",
]


def _grad_sample(param: torch.Tensor) -> torch.Tensor:
    sample = param.grad_sample
    if isinstance(sample, (list, tuple)):  # several forward passes before one step
        sample = torch.cat(list(sample), dim=0)
    return sample


def per_sample_norms(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-sample gradient norms over all ``params`` (as Opacus' ``DPOptimizer.clip_and_accumulate`` computes them)."""
    samples = [_grad_sample(p) for p in params]
    if not samples or samples[0].shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=samples[0].device if samples else None)
    # in the gradients' own dtype, as Opacus clips (a float64 copy of every per-sample gradient cost 25% of a step)
    per_param = [g.reshape(len(g), -1).norm(2, dim=-1).to(torch.float64) for g in samples]
    return torch.stack(per_param, dim=1).norm(2, dim=1)


def check_per_sample_gradients(params: Sequence[torch.Tensor], param_names: Dict[int, str]) -> None:
    """Every trainable parameter the optimizer updates carries a per-sample gradient of the batch's size."""
    sizes: Dict[str, int] = {}
    for param in params:
        name = param_names.get(id(param), f"<unnamed parameter of shape {tuple(param.shape)}>")
        if getattr(param, "grad_sample", None) is None:
            raise MisconfigurationException(
                f"DP-SGD self-check: trainable parameter `{name}` has no per-sample gradient, so it would be updated "
                "without clipping and the privacy accounting would be wrong: its layer type may have no Opacus grad "
                "sampler, it may run under `torch.utils.checkpoint` (whose re-run in the backward pass Opacus' hooks "
                "do not record), or it is unused in the forward pass; use grad_sample_mode='functional' (or 'auto'), "
                "which differentiates each example's loss itself, or freeze it (requires_grad=False)."
            )
        sizes[name] = int(_grad_sample(param).shape[0])
    if len(set(sizes.values())) > 1:
        raise MisconfigurationException(odd_batch_message(sizes))


def odd_batch_message(sizes: Dict[str, int], what: str = "gradients") -> str:
    """The parameters whose per-example ``what`` (gradients, or ghost clipping's norms) count other examples than
    the batch, and the fix."""
    counts: Dict[int, int] = {}
    for size in sizes.values():
        counts[size] = counts.get(size, 0) + 1
    batch = max(counts, key=lambda size: (counts[size], size))  # the size most parameters agree on
    odd = {name: size for name, size in sizes.items() if size != batch}
    shown = ", ".join(f"`{name}` ({size})" for name, size in list(odd.items())[:5])
    return (
        f"DP-SGD self-check: per-example {what} of {shown} count other examples than the batch's {batch}: "
        "their layer was called on a tensor whose first dimension is not the batch — e.g. position ids of shape "
        "[1, T] broadcast over the batch, as GPT-2's `wpe` — or by several forward passes. Call it with batch-first "
        "inputs (`position_ids.repeat(batch_size, 1)`: contiguous, as Opacus' ghost embedding norms need), freeze "
        "it (requires_grad=False), or use grad_sample_mode='auto' (the default) or 'functional', which computes each "
        "example's gradient alone (an unmodified Hugging Face model trains there)."
    )


def check_clipping(
    params: Sequence[torch.Tensor], param_names: Dict[int, str], *, max_grad_norm: float, rule: Any = None
) -> None:
    """``p.summed_grad`` is the sum of the per-sample gradients clipped to ``max_grad_norm`` (before any noise), or
    scaled by another clipping ``rule``'s factors (:mod:`~lightning_privacy.dpsgd.clipping`)."""
    norms = per_sample_norms(params)
    factors = (rule or ClippingRule()).factors(norms, max_grad_norm)  # (the rule's own factors: fixed by default)
    for param in params:
        name = param_names.get(id(param), f"<unnamed parameter of shape {tuple(param.shape)}>")
        summed = param.summed_grad.to(torch.float64)
        sample = _grad_sample(param).to(torch.float64)
        expected = torch.einsum("i,i...->...", factors, sample) if sample.shape[0] else torch.zeros_like(summed)
        tolerance = 1e-4 * (float(expected.norm()) + max_grad_norm)
        if float((summed - expected.reshape(summed.shape)).norm()) > tolerance:
            raise MisconfigurationException(
                f"DP-SGD self-check: the gradient of `{name}` is not the sum of its per-sample gradients clipped to "
                f"max_grad_norm={max_grad_norm:g}; clipping is not applied as configured."
            )
    check_clipped_sum_bound([p.summed_grad for p in params], max_grad_norm=max_grad_norm, batch_size=int(norms.numel()))


def check_clipped_sum_bound(
    sums: Sequence[torch.Tensor],
    *,
    max_grad_norm: float,
    batch_size: int,
    averaged_over: int = 1,
    all_reduce: Optional[Callable[[torch.Tensor], Any]] = None,
) -> None:
    """``‖Σᵢ clipped gᵢ‖ ≤ batch_size · max_grad_norm`` for the clipped sums (before any noise).

    FSDP2 (``all_reduce`` given, a collective call): ``sums`` are this rank's shards of the ranks' average, so the
    squared norms and batch sizes are summed over the ranks and the bound is divided by ``averaged_over`` ranks.
    """
    totals = torch.tensor(
        [sum(float(local_tensor(s).to(torch.float64).pow(2).sum()) for s in sums), float(batch_size)],
        dtype=torch.float64,
    )
    if all_reduce is not None:
        all_reduce(totals)
    total, bound = math.sqrt(float(totals[0])), max_grad_norm * max(1.0, float(totals[1])) / averaged_over
    if total > bound * (1 + 1e-4):
        over = f" / {averaged_over} ranks (FSDP2 averages their sums)" if averaged_over > 1 else ""
        raise MisconfigurationException(
            f"DP-SGD self-check: the clipped gradient sum has norm {total:.4g} > batch size × "
            f"max_grad_norm{over} = {bound:.4g}."
        )


class ClippingStats:
    """Per-sample gradient norms of one epoch (opt-in telemetry; data-dependent, not covered by DP)."""

    def __init__(self) -> None:
        self.norms: List[torch.Tensor] = []

    def update(self, params: Sequence[torch.Tensor]) -> None:
        self.add(per_sample_norms(params))

    def add(self, norms: torch.Tensor) -> None:
        """Record per-sample norms computed elsewhere (ghost clipping's)."""
        self.norms.append(norms.detach().to(device="cpu", dtype=torch.float64))

    def reset(self) -> None:
        self.norms = []

    def values(self) -> torch.Tensor:
        return torch.cat(self.norms) if self.norms else torch.zeros(0, dtype=torch.float64)

    def gathered(self, trainer: Any, device: torch.device) -> torch.Tensor:
        """Every rank's norms (a collective call under several processes: padded to one length for all_gather)."""
        norms = self.values()
        if trainer.world_size == 1:
            return norms
        count = trainer.strategy.all_gather(torch.tensor([norms.numel()], device=device))
        padded = torch.full((int(count.max()),), float("nan"), dtype=torch.float64, device=device)
        padded[: norms.numel()] = norms.to(device)
        norms = trainer.strategy.all_gather(padded).reshape(-1).cpu()
        return norms[~torch.isnan(norms)]

    def epoch_summary(
        self, trainer: Any, device: torch.device, max_grad_norm: float
    ) -> Optional[Tuple[float, float, torch.Tensor]]:
        """``(clip fraction, median norm, every rank's norms)`` of the epoch (a collective call), ``None`` without
        norms; the next epoch's record starts."""
        norms = self.gathered(trainer, device)
        self.reset()
        if norms.numel() == 0:
            return None
        return float((norms > max_grad_norm).to(torch.float64).mean()), float(norms.median()), norms


#: Layers that normalise with statistics of the whole batch in training mode (LazyBatchNorm becomes one of them).
_BATCH_STATISTICS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


def batch_statistics_layers(module: torch.nn.Module) -> List[tuple]:
    """``(name, layer)`` of every BatchNorm in ``module``, trainable or frozen (Opacus' validator sees only the
    trainable ones; a frozen one in training mode mixes examples all the same)."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, _BATCH_STATISTICS)]


def check_no_batch_statistics(layers: Sequence[tuple]) -> None:
    """No BatchNorm normalises with batch statistics (training mode, or no running statistics to use instead)."""
    for name, layer in layers:
        if layer.training or layer.running_mean is None:
            raise MisconfigurationException(
                f"DP-SGD self-check: `{name}` ({type(layer).__name__}) normalises with the statistics of the whole "
                "batch, so every example's gradient depends on the other examples and per-example clipping no longer "
                "bounds one example's influence (the privacy accounting would be wrong). Frozen layers pass Opacus' "
                "validator, and Lightning puts the whole model in training mode each epoch: keep it in eval mode "
                "(e.g. `def on_train_epoch_start(self): self.backbone.eval()` with running statistics), or replace it "
                "(GroupNorm)."
            )


def tied_trainable_parameters(module: torch.nn.Module) -> List[Tuple[str, ...]]:
    """The names of every trainable parameter that several layers share (tied weights), one tuple per parameter.

    A layer is a module without children that holds the parameter itself; a parameter that a container only aliases
    (Opacus' ``DPLSTM`` exposes its cells' weights as ``weight_ih_l0``) is used by one layer and is not tied.

    Example::

        >>> lm = torch.nn.ModuleDict({"wte": torch.nn.Embedding(5, 3), "lm_head": torch.nn.Linear(3, 5, bias=False)})
        >>> lm.lm_head.weight = lm.wte.weight  # GPT-2's tying: the output layer reads the token embedding
        >>> tied_trainable_parameters(lm)
        [('wte.weight', 'lm_head.weight')]
    """
    names: Dict[int, List[str]] = {}
    for prefix, layer in module.named_modules(remove_duplicate=False):
        if next(layer.children(), None) is not None:
            continue
        for name, param in layer.named_parameters(recurse=False):
            if param.requires_grad:
                names.setdefault(id(param), []).append(f"{prefix}.{name}" if prefix else name)
    return [tuple(group) for group in names.values() if len(group) > 1]


def check_no_tied_parameters_for_ghost(module: torch.nn.Module) -> None:
    """Ghost clipping computes one norm per layer and cannot clip a parameter two layers share: refuse, naming it."""
    tied = tied_trainable_parameters(module)
    if tied:
        shared = "; ".join(" is ".join(f"`{n}`" for n in group) for group in tied)
        raise MisconfigurationException(
            f"DPSGD(grad_sample_mode='ghost') cannot clip tied parameters ({shared}: one tensor used by several layers, "
            "as GPT-2's output layer reuses its token embedding), so use grad_sample_mode='hooks' or freeze the tied "
            "parameter (`requires_grad_(False)`, e.g. when training LoRA adapters)."
        )

"""DPSGD's exactness check: what DP-SGD clips for an example is that example's whole gradient.

Opacus computes per-example gradients (hooks mode) and per-example norms (ghost clipping) from hooks on the layers
it knows, so it sees a parameter only through its own layer's forward. A use of the parameter outside that layer —
``F.linear(z, self.lin.weight)``, a weight-tied output head ``h @ self.embed.weight.T`` — is invisible to the hooks
but not to autograd: ghost clipping then computed each example's norm without it while the second backward pass
(the clipped sum) included it, so one example could add several times C to a step; hooks mode dropped it from the
gradient altogether. A layer whose per-example function is wrong (Opacus' ``nn.Embedding`` with ``padding_idx``,
corrected in :mod:`lightning_privacy.dpsgd.samplers`) does the same.

On the steps DPSGD self-checks (the first :data:`~lightning_privacy.dpsgd.self_checks.SELF_CHECK_STEPS` of a fit, before any optimizer
step), this module compares what DP-SGD clips with a computation that differentiates the whole forward pass:

- **Per-example reference** (ghost mode always; hooks mode when ``training_step`` returns one loss per example): each
  example's gradient ``∇ℓᵢ`` of every trainable parameter by autograd on the step's own graph (the same forward pass,
  dropout masks included), all examples at once by ``torch.autograd.grad(..., is_grads_batched=True)`` (vmap over the
  backward pass) in chunks, or one example at a time where vmap cannot run the model's backward. Compared with the
  per-example gradients (hooks) or the per-parameter per-example norms (ghost) of every example — or, on a batch of
  more than ``exactness_examples`` (DPSGD's argument, default :data:`MAX_EXAMPLES`), of that many drawn uniformly
  by the check's own generator: each example costs about one backward pass of the whole batch, and a use the hooks
  miss reaches every example that makes it.
- **Sum invariant** (hooks mode with a reduced loss, where no per-example loss exists): for every parameter, the sum
  over examples of the per-example gradients the hooks produced equals autograd's gradient of the batch's loss
  (÷ the batch size under ``loss_reduction="mean"``). A use the hooks miss breaks it; what it cannot see is an error
  that cancels over the batch (examples swapped), which the per-example reference sees.

With book-keeping (ghost mode), the clipped sum is also compared with the second backward pass (autograd of
``Σᵢ cᵢ·ℓᵢ``) on these steps (:mod:`lightning_privacy.dpsgd.ghost_mode`). A mismatch raises before the first optimizer step, in one sentence
naming the parameter, the size of the mismatch and the fixes. :class:`ExactnessRecord` keeps what ran, for the
report and the ``dp/exactness_error`` scalar.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

__all__ = [
    "ExactnessRecord",
    "check_ghost_norms",
    "check_per_example_gradients",
    "check_summed_gradients",
    "checked_rows",
    "reference_gradients",
    "row_mismatch",
]

#: elements of per-example gradients one vmapped backward pass may hold (chunk size = this ÷ trainable elements)
CHUNK_ELEMENTS = 2**25
PROBE_SECONDS = 0.05  # vmap slower than this per example: one example by the loop is timed against it
MAX_CHUNK = 8  # examples per batched backward: its cotangents and intermediates grow with the whole batch's graph
#: DPSGD's default ``exactness_examples``: examples compared per checked step (each costs about one backward pass of
#: the whole batch), drawn uniformly from a larger batch
MAX_EXAMPLES = 64
PER_EXAMPLE_REFERENCE = "per-example gradients by autograd through the whole forward pass"
SUM_INVARIANT = "sum invariant: per-example gradients sum to autograd's batch gradient"

BYPASS = (
    "part of that parameter's gradient bypasses Opacus' per-example hooks (the parameter used outside its layer, as "
    "`F.linear(x, layer.weight)` or an output head `h @ embed.weight.T`, or a layer whose per-example gradient Opacus "
    "computes wrongly)"
)
FIXES = (
    "use grad_sample_mode='functional' (or 'auto'), which computes each example's whole gradient alone, move that use "
    "into the layer, or untie or freeze the parameter (`requires_grad_(False)`)"
)


@dataclasses.dataclass
class ExactnessRecord:
    """What the exactness check compared over one fit.

    Attributes:
        reference: which computation ran: :data:`PER_EXAMPLE_REFERENCE` (with ``" (vmap)"`` or ``" (loop)"``),
            :data:`SUM_INVARIANT`, or ``"not run"`` with the reason.
        steps: self-checked steps compared.
        examples: examples compared over those steps.
        batch_examples: examples in those steps' batches (more than ``examples`` where a batch held more than
            ``exactness_examples`` and a uniform sample of them was compared).
        max_relative_error: the largest mismatch found, relative to the example's (or the sum's) gradient norm, on
            the self-checked steps and the sampled later ones.
        later_rate: the share of later steps checked against each sampled example's gradient computed alone
            (:mod:`lightning_privacy.dpsgd.sampled_exactness`; DPSGD's ``exactness_rate``).
        later_steps: later steps so compared; ``later_examples`` the examples compared on them;
            ``later_not_comparable`` steps drawn whose forward pass stayed random with dropout off (not compared).
    """

    reference: str = "not run"
    steps: int = 0
    examples: int = 0
    max_relative_error: float = 0.0
    batch_examples: int = 0
    later_rate: float = 0.0
    later_steps: int = 0
    later_examples: int = 0
    later_not_comparable: int = 0

    def add(self, reference: str, examples: int, error: float, batch: Optional[int] = None) -> None:
        self.reference = reference
        self.steps += 1
        self.examples += examples
        self.batch_examples += examples if batch is None else batch
        self.max_relative_error = max(self.max_relative_error, float(error))


def _name(names: Dict[int, str], param: torch.Tensor) -> str:
    return names.get(id(param), f"<unnamed parameter of shape {tuple(param.shape)}>")


def reference_gradients(
    losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    chunk: Optional[int] = None,
    rows: Optional[torch.Tensor] = None,
) -> Iterator[Tuple[torch.Tensor, List[torch.Tensor], str]]:
    """Per-example gradients ``∇ℓᵢ`` of ``params`` from the graph of the per-example ``losses`` (retained).

    Yields ``(index, grads, how)`` per chunk of the examples ``rows`` (default: every example, in order): ``index``
    holds the chunk's k example indices, ``grads[j]`` is ``[k, *params[j].shape]`` (zeros for a parameter the example
    does not reach), ``how`` is ``"vmap"`` or ``"loop"`` (one backward pass per example, where vmap cannot run the
    model's backward). Each example costs about one backward pass of the whole batch.

    Example::

        >>> lin = torch.nn.Linear(3, 1)
        >>> x = torch.randn(4, 3)
        >>> losses = lin(x).squeeze(1) ** 2 / 2
        >>> index, (w, b), how = next(reference_gradients(losses, [lin.weight, lin.bias], rows=torch.tensor([2, 3])))
        >>> index.tolist(), torch.allclose(w[0], (lin(x[2]) * x[2]).detach())
        ([2, 3], True)
    """
    order = torch.arange(int(losses.shape[0])) if rows is None else rows.reshape(-1).long().cpu()
    n = int(order.numel())
    params = list(params)
    elements = max(1, sum(p.numel() for p in params))
    size = chunk if chunk is not None else max(1, min(n, CHUNK_ELEMENTS // elements, MAX_CHUNK))
    vmap_ok, vmap_seconds, loop_seconds = True, None, None  # (seconds per example of each, once measured)
    start = 0
    while start < n:
        # the first vmap chunk is small: it is timed against one example of the loop, and the faster one goes on
        # (torch's batched backward falls back to a slow per-operation loop for some models, e.g. language models)
        k = min(size if vmap_seconds is not None or chunk is not None else min(size, 2), n - start)
        grads: Optional[Tuple[Optional[torch.Tensor], ...]] = None
        probe = vmap_ok and loop_seconds is None and chunk is None and (vmap_seconds or 0.0) > PROBE_SECONDS
        if probe:  # one example by the loop, to time it against vmap's
            k = 1
        if vmap_ok and not probe:
            index = order[start : start + k]
            outputs = torch.zeros(k, int(losses.shape[0]), dtype=losses.dtype, device=losses.device)
            outputs[torch.arange(k), index.to(losses.device)] = 1
            began = time.perf_counter()
            try:
                grads = torch.autograd.grad(
                    losses, params, grad_outputs=outputs, is_grads_batched=True, retain_graph=True, allow_unused=True
                )
                vmap_seconds = (time.perf_counter() - began) / k if vmap_seconds is None else vmap_seconds
            except (RuntimeError, NotImplementedError):  # an operation without a batching rule for its backward
                vmap_ok = False
        if grads is None:
            began = time.perf_counter()
            rows = [
                torch.autograd.grad(losses[int(i)], params, retain_graph=True, allow_unused=True)
                for i in order[start : start + k]
            ]
            loop_seconds = (time.perf_counter() - began) / k if loop_seconds is None else loop_seconds
            grads = tuple(
                torch.stack([row[j] if row[j] is not None else torch.zeros_like(p) for row in rows])
                for j, p in enumerate(params)
            )
        full = [
            g if g is not None else torch.zeros(k, *p.shape, dtype=p.dtype, device=p.device)
            for g, p in zip(grads, params)
        ]
        if probe and loop_seconds < vmap_seconds / 2:
            vmap_ok = False  # the loop is more than twice as fast here: it does the rest
        yield order[start : start + k], full, "vmap" if vmap_ok else "loop"
        start += k


def row_mismatch(
    ref: torch.Tensor, mine: torch.Tensor, *, norms_only: bool, rtol: float, scale: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per example, how far what DP-SGD clips (``mine``: ``[k, n]`` gradients, or ``[k]`` norms with ``norms_only``)
    is from the reference gradients ``ref`` (``[k, n]``), the bound it may not exceed, and the reference's norms:
    ``rtol`` of the larger of the two sizes, plus ``rtol · 1e-2 · scale`` (``scale``: the largest example's whole
    gradient norm, so a parameter whose gradient is nearly zero is not held to float rounding of its own size)."""
    ref_size = ref.norm(dim=1)
    if norms_only:
        mine_size = mine.reshape(-1)
        error = (ref_size - mine_size).abs()
    else:
        mine_size = mine.norm(dim=1)
        error = (ref - mine).norm(dim=1)
    bound = rtol * torch.maximum(ref_size, mine_size) + rtol * 1e-2 * scale + 1e-12
    return error, bound, ref_size


def _raise(message: str) -> None:
    raise MisconfigurationException(f"DP-SGD exactness check: {message}.")


def _compare_rows(
    params: Sequence[torch.Tensor],
    names: Dict[int, str],
    losses: torch.Tensor,
    got: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
    describe: Callable[[str, int, float, float, float], str],
    *,
    rtol: float,
    norms_only: bool,
    compared_with: str,
    record: Optional[ExactnessRecord],
    max_examples: Optional[int],
    generator: Optional[torch.Generator],
) -> None:
    """Compare ``got(j, ref, index)`` (what DP-SGD clips for the examples ``index``) with the reference, for every
    parameter and every example or ``max_examples`` of them (:func:`checked_rows`); record it in ``record`` as the
    reference "compared with ``compared_with``"."""
    rows = checked_rows(losses.numel(), max_examples, generator)
    worst, how = 0.0, "vmap"
    for index, grads, method in reference_gradients(losses, params, rows=rows):
        how, k = method, grads[0].shape[0] if grads else 0
        flat = [g.reshape(k, -1).to(torch.float64) for g in grads]
        total = torch.stack([f.pow(2).sum(1) for f in flat], 1).sum(1).sqrt()  # ‖∇ℓᵢ‖ over all parameters
        scale = total.max().item() if k else 0.0
        for j, (param, ref) in enumerate(zip(params, flat)):
            mine = got(j, ref, index).reshape(k, -1).to(torch.float64)
            error, bound, _ = row_mismatch(ref, mine, norms_only=norms_only, rtol=rtol, scale=scale)
            relative = error / total.clamp_min(1e-30)
            worst = max(worst, float(relative.max()) if k else 0.0)
            bad = torch.nonzero(error > bound).flatten()
            if bad.numel():
                i = int(bad[relative[bad].argmax()])
                _raise(
                    describe(
                        _name(names, param), int(index[i]), float(error[i]), float(relative[i]), float(ref[i].norm())
                    )
                )
    if record is not None:
        checked = losses.numel() if rows is None else rows.numel()
        record.add(f"{PER_EXAMPLE_REFERENCE} ({how}), compared with {compared_with}", checked, worst, losses.numel())


def checked_rows(
    batch: int, max_examples: Optional[int], generator: Optional[torch.Generator]
) -> Optional[torch.Tensor]:
    """The examples a checked step compares: all of them (``None``) up to ``max_examples``, else that many drawn
    uniformly without replacement by ``generator`` (the check's own: never the global generator, whose stream
    dropout and the user's code read), in increasing order."""
    if max_examples is None or batch <= max_examples:
        return None
    return torch.randperm(batch, generator=generator)[:max_examples].sort().values


def check_ghost_norms(
    losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    norms: Dict[torch.Tensor, torch.Tensor],
    names: Dict[int, str],
    *,
    rtol: float,
    record: Optional[ExactnessRecord] = None,
    max_examples: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> None:
    """Ghost mode: each parameter's per-example norm ghost clipping used equals ``‖∇ℓᵢ‖`` of that parameter.

    ``norms[p]`` is ``p``'s per-example norms (``[batch]``, Opacus' ``_norm_sample``); ``losses`` the per-example
    losses with their graph retained (Opacus' hooks off). Every example, or ``max_examples`` of them drawn uniformly
    by ``generator`` (:func:`checked_rows`).
    """
    if losses.numel() == 0:
        return

    def describe(name: str, i: int, error: float, relative: float, ref: float) -> str:
        return (
            f"ghost clipping clipped example {i} with a norm of `{name}`'s gradient that is {error:.4g} away from its "
            f"gradient by autograd through the whole forward pass ({ref:.4g}; {relative:.1%} of the example's "
            f"gradient norm), so {BYPASS}: {FIXES}, or use grad_sample_mode='hooks', which also handles a layer "
            "called several times"
        )

    _compare_rows(
        params, names, losses, lambda j, ref, index: norms[params[j]].reshape(-1)[index.to(ref.device)], describe,
        rtol=rtol, norms_only=True, compared_with="ghost clipping's norms", record=record, max_examples=max_examples,
        generator=generator,
    )  # fmt: skip


def check_per_example_gradients(
    losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    samples: Sequence[torch.Tensor],
    names: Dict[int, str],
    *,
    rtol: float,
    record: Optional[ExactnessRecord] = None,
    max_examples: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> None:
    """Hooks mode with per-example losses: every per-example gradient (``samples[j]``, ``[batch, *shape]``) is
    ``∇ℓᵢ`` of its parameter (every example, or ``max_examples`` drawn uniformly: :func:`checked_rows`)."""
    if losses.numel() == 0:
        return

    def describe(name: str, i: int, error: float, relative: float, ref: float) -> str:
        return (
            f"the per-example gradient of `{name}` that DP-SGD clips for example {i} is {error:.4g} away from its "
            f"gradient by autograd through the whole forward pass (norm {ref:.4g}; {relative:.1%} of the example's "
            f"gradient norm), so {BYPASS}: {FIXES}"
        )

    _compare_rows(
        params, names, losses, lambda j, ref, index: samples[j][index.to(samples[j].device)], describe,
        rtol=rtol, norms_only=False, compared_with="the per-example gradients", record=record,
        max_examples=max_examples, generator=generator,
    )  # fmt: skip


def check_summed_gradients(
    params: Sequence[torch.Tensor],
    samples: Sequence[torch.Tensor],
    names: Dict[int, str],
    *,
    loss_reduction: str,
    rtol: float,
    record: Optional[ExactnessRecord] = None,
) -> None:
    """Hooks mode with a reduced loss: ``Σᵢ samples[j][i]`` (÷ the batch under ``"mean"``) equals ``params[j].grad``,
    autograd's gradient of the batch's loss (the sum invariant)."""
    worst, examples = 0.0, 0
    pairs = [(p, s) for p, s in zip(params, samples) if p.grad is not None and s.shape[0] > 0]
    scale = math.sqrt(sum(float(p.grad.to(torch.float64).pow(2).sum()) for p, _ in pairs))  # the batch gradient
    if pairs:  # ... or, where the examples' gradients cancel in it, a typical example's whole gradient (÷ the batch
        # under "mean"): autograd's float32 sum of terms of that size rounds at ~1e-7 of it, which is no bypass
        squares = sum(s.to(torch.float64).reshape(s.shape[0], -1).pow(2).sum(1) for _, s in pairs)
        divisor = squares.numel() if loss_reduction == "mean" else 1
        scale = max(scale, float(squares.sqrt().mean()) / divisor * squares.numel() ** 0.5)
    for param, sample in pairs:
        examples = int(sample.shape[0])
        # (16-bit parameters: autograd sums in 16 bits, at 8 units of their roundoff as float32's 1e-6 is of its own)
        unit = max(torch.finfo(param.grad.dtype).eps, torch.finfo(sample.dtype).eps)
        sample = sample.to(torch.float64)
        divisor = examples if loss_reduction == "mean" else 1
        total, grad = sample.sum(0) / divisor, param.grad.to(torch.float64)
        error = float((total - grad).norm())
        size = max(float(grad.norm()), float(total.norm()))
        # float rounding of the sum grows with the per-example gradients summed, not with their (cancelling) sum
        rounding = max(1e-6, 8 * unit) * float(sample.reshape(examples, -1).norm(dim=1).sum()) / divisor
        relative = error / max(size, rtol * 1e-2 * scale, 1e-30)
        worst = max(worst, relative)
        if error > rtol * size + rtol * 1e-2 * scale + rounding + 1e-12:
            _raise(
                f"the per-example gradients of `{names.get(id(param), tuple(param.shape))}` that DP-SGD clips sum to a "
                f"gradient {error:.4g} away from autograd's gradient of the batch's loss ({relative:.1%} of its norm "
                f"{float(grad.norm()):.4g}), so {BYPASS}: {FIXES}"
            )
    if record is not None and examples:
        record.add(SUM_INVARIANT, examples, worst)

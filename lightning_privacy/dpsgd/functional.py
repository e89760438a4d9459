r"""DPSGD's functional engine: each example's whole gradient by ``torch.func``, clipped and summed chunk by chunk.

``DPSGD(grad_sample_mode="functional")`` does not ask Opacus' per-layer hooks for per-example gradients: it runs the
module's own ``training_step`` on each example's row alone (a batch of one) under
``vmap(grad(...), randomness="different")`` through ``functional_call``, so what is clipped is the gradient of that
example's loss with respect to every trainable parameter, however the parameter is used — a weight tied to an output
head, a ``F.linear(x, layer.weight)`` beside the layer, a raw ``nn.Parameter`` used in ``training_step``,
``nn.Bilinear``, a sequence-first layer, a custom ``autograd.Function`` with a vmap rule. The examples go through in
chunks whose per-example gradients fit a memory budget (``DPSGD(functional_chunk_size=...)``; by default
:data:`CHUNK_BYTES` on the CPU, a quarter of the free memory on a GPU, halved after an out-of-memory error); each example's gradient norm over all parameters is taken, the gradient is scaled by
``min(1, C / (norm + 1e-6))`` (Opacus' factor) and added to the step's sum, so one chunk's per-example gradients are
in memory at a time. Each example's contribution is then a function of that example alone, whatever the model does
with a batch: the bound on one example's influence does not rest on a check.

Where vmap cannot run ``training_step`` — ``.item()``, data-dependent control flow (``if tensor:``), an
``autograd.Function`` without a vmap rule (reentrant ``torch.utils.checkpoint`` is one), non-reentrant
``torch.utils.checkpoint`` (torch.func refuses saved-tensor hooks), an in-place write of an example into a shared
tensor — the same examples go through one at a time, each its own forward and backward pass by autograd (exact,
slower): :attr:`FunctionalClipping.fallback` names the operation and where it ran, and DPSGD says so once.
``self.log`` is suppressed inside the per-example passes (Lightning cannot log a batched tensor); DPSGD runs the
batch's own ``training_step`` once without gradients for what it logs and returns. ``training_step`` therefore runs
more than once per step (once per chunk under vmap, once per example in the loop, once for the batch): the passes
work on copies of the batch, so an in-place change to it happens once, but other side effects (a counter on the
module) happen in each.

Privacy does not rest on the model: each example's contribution is computed from that example alone, clipped to C,
whatever the forward pass does with a batch. Accuracy does: a model that uses its batch as a whole would be trained on
other losses than its own.

A model whose examples' losses computed alone differ from their losses in the batch mixes examples (``h - h.mean(0)``,
a sequence-first layer fed batch-first data): functional mode would train it on something else than the batch's
loss, so :func:`check_losses_alone` compares the two on the first steps (in eval mode, without dropout) and refuses
such a model before its first step.

Example::

    >>> import torch
    >>> lin = torch.nn.Linear(3, 1, bias=False)
    >>> x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    >>> step = lambda batch: (lin(batch) ** 2).sum() / 2  # one example's loss: (w·x)²/2
    >>> lin.weight.data = torch.tensor([[1.0, 1.0, 1.0]])
    >>> engine = FunctionalClipping(lin, max_grad_norm=1.0)
    >>> out = engine.clipped_sum(x, step)
    >>> out.norms.tolist(), out.how  # ‖(w·xᵢ)·xᵢ‖: 1 and 9
    ([1.0, 9.0], 'vmap')
    >>> out.sums[0].tolist()  # x₀'s gradient (norm 1) + x₁'s clipped to norm 1
    [[1.0, 1.0, 0.0]]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from lightning_privacy import _compat
from lightning_privacy.dpsgd import clipping, recurrent, samplers
from lightning_privacy.dpsgd.products import wide

__all__ = [
    "Examples",
    "CHUNK_BYTES",
    "FUNCTIONAL_REFERENCE",
    "ClippedSum",
    "FunctionalClipping",
    "check_losses_alone",
    "clip_factors",
    "example_loss",
    "hooks_obstacles",
    "logging_suppressed",
    "vmap_obstacle",
]

#: bytes of per-example gradients one chunk may hold on the CPU when ``functional_chunk_size`` is not given (on a GPU:
#: a quarter of its free memory)
CHUNK_BYTES = 2**28
PER_EXAMPLE_LOSS = "per_example_loss"  # (as dpsgd.modes: training_step's dict key beside "loss")
FUNCTIONAL_REFERENCE = (
    "functional: each example's whole gradient by torch.func on that example alone (exact by construction); "
    "compared: the examples' losses alone with their losses in the batch"
)
_MODE = "DPSGD(grad_sample_mode='functional')"


def clip_factors(norms: torch.Tensor, max_grad_norm: float, rule: Any = None) -> torch.Tensor:
    """The per-example factors of the clipping ``rule`` (:mod:`~lightning_privacy.dpsgd.clipping`; ``None``: Opacus'
    ``min(1, C / (‖gᵢ‖ + 1e-6))``).

    Example::

        >>> clip_factors(torch.tensor([0.5, 4.0]), 1.0).tolist()
        [1.0, 0.25]
    """
    return (rule or clipping.ClippingRule()).factors(norms, max_grad_norm)


def example_loss(out: Any) -> torch.Tensor:
    """The one loss of a batch of one from what ``training_step`` returned: a tensor of shape ``[]`` or ``[1]``, or
    a dict's ``"per_example_loss"`` (else its ``"loss"``) of that shape."""
    if isinstance(out, dict):
        out = out.get(PER_EXAMPLE_LOSS, out.get("loss"))
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        what = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise MisconfigurationException(
            f"{_MODE} runs `training_step` on each example alone and needs its loss, a tensor of shape [] or [1] (or "
            f"a dict's 'loss' or 'per_example_loss' of that shape) for a batch of one example; it returned {what}, "
            "so return one loss per example (e.g. `F.cross_entropy(logits, y, reduction='none')`), not one per token."
        )
    return out.reshape(())


@contextlib.contextmanager
def logging_suppressed(module: nn.Module) -> Iterator[None]:
    """``training_step``'s side effects do nothing inside a per-example pass; the batch's own ``training_step`` has
    them once per step, as without DPSGD.

    - ``module.log`` and ``module.log_dict`` (a LightningModule's ``self.log`` cannot take a per-example pass's
      batched tensors);
    - every torchmetrics ``Metric`` of the module: its ``update`` and ``forward`` do nothing (``forward`` returns
      NaN), so an accuracy updated in ``training_step`` counts each example once, not once more per pass, and keeps
      no tensor of a ``vmap`` ("tensor may have escaped from vmap");
    - lists held by the module (``self.outputs.append(logits)`` for ``on_train_epoch_end``): what a pass appends is
      removed after it;
    - Hugging Face's gradient checkpointing is off (torch.func cannot run its saved-tensor hooks; the chunks of
      examples bound the pass's memory), so the examples go through vmap rather than one at a time;
    - Hugging Face's SDPA mask shortcut, which reads the attention mask's values, builds the mask instead
      (:func:`~lightning_privacy._compat.hugging_face_sdpa_mask_vmappable`), so a stock GPT-2 or Llama given an
      ``attention_mask`` goes through vmap;
    - ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` run unrolled over time (:mod:`~lightning_privacy.dpsgd.recurrent`: the
      same equations in operations vmap batches, where torch's fused kernels write into a tensor the examples share).
    """
    silent = lambda *args, **kwargs: None  # noqa: E731
    nan = lambda *args, **kwargs: torch.tensor(float("nan"))  # noqa: E731
    lists = [(value, len(value)) for value in list(vars(module).values()) if isinstance(value, list)]
    # Hugging Face's gradient checkpointing (`gradient_checkpointing_enable()`): off inside the pass, where torch.func
    # cannot run its saved-tensor hooks and the chunks of examples already bound the memory (vmap, not a loop)
    checkpointed = [m for m in module.modules() if getattr(m, "gradient_checkpointing", None) is True]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_instance_attributes(module, log=silent, log_dict=silent))
        for metric in (m for m in module.modules() if _is_metric(m)):
            stack.enter_context(_instance_attributes(metric, update=silent, forward=nan))
        for m in checkpointed:
            stack.enter_context(_instance_attributes(m, gradient_checkpointing=False))
        for m in (m for m in module.modules() if type(m) in recurrent.UNROLLED):
            stack.enter_context(_instance_attributes(m, forward=recurrent.unrolled(m)))
        if checkpointed:  # (its `output.requires_grad_(True)` on the embeddings, for checkpointing: not needed here)
            stack.enter_context(_compat.hugging_face_input_grad_hooks_off(module))
        stack.enter_context(_compat.hugging_face_sdpa_mask_vmappable())  # (the explicit mask, not a read of its values)
        try:
            yield
        finally:
            for value, length in lists:
                del value[length:]


@contextlib.contextmanager
def _instance_attributes(obj: Any, **values: Any) -> Iterator[None]:
    """``obj``'s instance attributes set to ``values`` inside; after, each is what it was (or removed, where the
    instance had none of its own and its class's showed through)."""
    own = {name: obj.__dict__[name] for name in values if name in obj.__dict__}
    obj.__dict__.update(values)
    try:
        yield
    finally:
        for name in values:
            if name in own:
                obj.__dict__[name] = own[name]
            else:
                obj.__dict__.pop(name, None)


def _is_metric(module: nn.Module) -> bool:
    """A torchmetrics ``Metric`` (or collection), without importing torchmetrics where it is not loaded."""
    import sys

    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(module, (torchmetrics.Metric, torchmetrics.MetricCollection))


class _Call(nn.Module):
    """Holds the module as ``m`` so that ``functional_call`` swaps its parameters while ``step`` runs."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module
        self.step: Callable[[Any], Any] = lambda batch: None

    def forward(self, batch: Any) -> Any:
        return self.step(batch)


@dataclasses.dataclass
class ClippedSum:
    """One step's result: ``sums[j]`` is the clipped sum for ``params[j]``, ``norms`` and ``losses`` each example's
    gradient norm (float64) and loss alone, ``how`` ``"vmap"`` or ``"loop"``."""

    sums: List[torch.Tensor]
    norms: torch.Tensor
    losses: torch.Tensor
    how: str


_OPERATIONS = (  # (text of torch's error, the operation, the fix) — the first that matches names it
    (
        ".item()",
        "`.item()` or data-dependent control flow (`if tensor:`, `float(tensor)`)",
        "compute the value with tensor operations (`torch.where`) or log it outside the loss",
    ),
    (
        "setup_context",
        "a `torch.autograd.Function` without a vmap rule (a classic `forward(ctx, ...)`, as reentrant "
        "`torch.utils.checkpoint` uses)",
        "give it `setup_context` and `generate_vmap_rule = True`",
    ),
    (
        "saved tensor hooks",
        "non-reentrant `torch.utils.checkpoint` (torch.func does not run saved-tensor hooks)",
        "turn gradient checkpointing off, whose memory the chunked per-example pass does not need",
    ),
    (
        "dynamic shape",
        "an operation whose output shape depends on the data (boolean-mask indexing, `nonzero`)",
        "use `torch.where` or a mask multiplied in",
    ),
    (
        "broadcast shape",
        "an in-place write of an example into a tensor shared by all examples",
        "build the tensor from the example (`torch.zeros_like`) or write out of place",
    ),
    (
        "inplace",
        "an in-place operation on a tensor shared by all examples",
        "write out of place",
    ),
)


_PACKING = ("pack_padded_sequence", "pack_sequence", "_pack_padded_sequence")  # torch.nn.utils.rnn's packing


def _where(error: BaseException) -> str:
    """The innermost frame of the user's code in ``error``'s traceback, as ``file:line``."""
    skip = (os.sep + "torch" + os.sep, os.sep + "lightning" + os.sep, os.sep + "dpsgd" + os.sep + "functional.py")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not any(s in f.filename for s in skip)]
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def one_row_message(error: BaseException) -> str:
    """The sentence for a ``training_step`` that fails on one example alone (a batch of one row).

    Example::

        >>> print(one_row_message(ValueError("Target size (torch.Size([1])) must be the same as input size")))
        DPSGD(grad_sample_mode='functional') runs `training_step` on each example alone, as a batch of one row, and there it raised ValueError: Target size (torch.Size([1])) must be the same as input size; code that assumes several rows breaks on one — `logits.squeeze()` turns [1, 1] into [] (use `.squeeze(-1)`), a statistic over the batch (`x.std(0)`) is undefined — so make `training_step` work on a batch of one, or use grad_sample_mode='hooks'.
    """
    where = _where(error)
    at = f" (at {where})" if where else ""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return (
        f"{_MODE} runs `training_step` on each example alone, as a batch of one row, and there it raised "
        f"{type(error).__name__}: {first}{at}; code that assumes several rows breaks on one — `logits.squeeze()` turns "
        "[1, 1] into [] (use `.squeeze(-1)`), a statistic over the batch (`x.std(0)`) is undefined — so make "
        "`training_step` work on a batch of one, or use grad_sample_mode='hooks'."
    )


def vmap_obstacle(error: BaseException) -> str:
    """What in the model ``vmap`` could not run, from its error: the operation, where, and the fix (a phrase)."""
    text = str(error)
    where = _where(error)
    at = f" (at {where})" if where else ""
    if any(f.name in _PACKING for f in traceback.extract_tb(error.__traceback__)):
        return (
            f"a `PackedSequence`{at}, whose packing reads each example's length as data; to keep vmap's speed, run "
            "the recurrent layer on the padded batch (it runs unrolled under vmap) and read each row at its length "
            "(`out[torch.arange(len(out)), lengths - 1]`, for a layer in one direction)"
        )
    for needle, operation, fix in _OPERATIONS:
        if needle in text:
            if where.startswith("masking_utils.py"):  # Hugging Face's sdpa masks read the data to skip the mask
                fix = "load the model with `attn_implementation='eager'`, whose masks vmap runs"
            return f"{operation}{at}; to keep vmap's speed, {fix}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"an operation vmap cannot batch{at} (torch: {first[:200]})"


class Examples(list):
    """A batch's examples, each collated alone by the train loader's ``collate_fn`` — for a batch whose rows do not
    split into its examples (torchtext's ``(label, text, offsets)``: the texts concatenated, each offset counted from
    the batch's start; :func:`~lightning_privacy.dpsgd.sampling.splits_by_rows` finds it on the loader's own
    collate). The per-example passes run on each of them (one pass per example); ``batch`` is the batch itself, for
    what ``training_step`` computes on the whole batch."""

    def __init__(self, examples: Sequence[Any], batch: Any = None) -> None:
        super().__init__(examples)
        self.batch = batch


class FunctionalClipping:
    """Per-example gradients of ``module``'s trainable parameters by ``torch.func``, clipped and summed.

    Args:
        module: the module whose trainable parameters are differentiated (the LightningModule); it must carry no
            Opacus hooks (functional mode attaches none).
        max_grad_norm: C.
        chunk_size: examples per vmapped chunk; ``None``: as many as keep a chunk's per-example gradients within
            ``chunk_bytes`` (at least one). A chunk that runs out of GPU memory is split in two and the fit's
            chunks stay at most that large.
        chunk_bytes: the budget of ``chunk_size=None``; ``None``: :data:`CHUNK_BYTES` on the CPU, a quarter of the
            GPU's free memory on a GPU.

    Attributes:
        params: the trainable parameters, in ``module.parameters()`` order (tied ones once).
        fallback: ``None`` while vmap runs the model; else what it could not run (the examples then go one at a
            time, by autograd).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        max_grad_norm: float,
        chunk_size: Optional[int] = None,
        chunk_bytes: Optional[int] = None,
    ) -> None:
        self.module = module
        self.max_grad_norm = float(max_grad_norm)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.chunk_size = chunk_size
        self.chunk_bytes = chunk_bytes
        self.fallback: Optional[str] = None
        self.loop = False  # the examples one at a time by autograd even where vmap runs (exact both ways)
        #: user-level sampling: the step's (person of each row, rows per person, reduction), or ``None`` (per example)
        self.units: Optional[Callable[[], Any]] = None
        self.rule: Optional[clipping.ClippingRule] = None  # the clipping rule (None: fixed at max_grad_norm)
        #: which leaves of a batch hold one row per example (the train loader's collate on one and two examples,
        #: :func:`~lightning_privacy.dpsgd.sampling.example_leaves`); ``None``: inferred from the leaves' sizes
        self.per_example: Optional[Tuple[bool, ...]] = None
        self._out_of_memory: Optional[int] = None  # half the chunk that ran out of GPU memory
        self._call = _Call(module)

    def rows_per_chunk(self, rows: int) -> int:
        """Examples per vmapped chunk for a batch of ``rows`` (at most half the chunk that last ran out of memory)."""
        if self.chunk_size is not None:
            size = self.chunk_size
        else:
            budget = self.chunk_bytes
            if budget is None:  # the CPU's fixed budget; a quarter of a GPU's free memory
                device = self.params[0].device if self.params else torch.device("cpu")
                budget = torch.cuda.mem_get_info(device)[0] // 4 if device.type == "cuda" else CHUNK_BYTES
            size = budget // max(1, sum(p.numel() * p.element_size() for p in self.params))
        if self._out_of_memory is not None:
            size = min(size, self._out_of_memory)
        return max(1, min(rows, size))

    # ------------------------------------------------------------------------------------------------- the pass
    def clipped_sum(self, batch: Any, step: Callable[[Any], Any]) -> ClippedSum:
        """Σᵢ clip(∇ℓᵢ) over the examples of ``batch``, where ``ℓᵢ = example_loss(step(row i alone))``.

        ``step(batch)`` runs the user's ``training_step`` on a batch (its other arguments bound); its logging is
        suppressed here. Every tensor of ``batch`` whose first dimension is the batch's is split by rows; other
        values are given whole to every example.
        """
        units = self.units() if self.units is not None else None
        if units is not None:
            return self._per_person(batch, step, *units)
        sums = [torch.zeros_like(p, dtype=wide(p.dtype)) for p in self.params]  # (16-bit: in float32)
        norms: List[torch.Tensor] = []
        losses: List[torch.Tensor] = []
        how = "loop" if self.fallback is not None else "vmap"
        for grads, loss, chunk_how in self._per_example(batch, step):
            how = chunk_how
            norm = _norms(grads)
            factors = clip_factors(norm, self.max_grad_norm, self.rule)
            for total, g in zip(sums, grads):
                total.add_(torch.einsum("i,i...->...", factors.to(total.dtype), g.to(total.dtype)))
            norms.append(norm)
            losses.append(loss.detach().reshape(-1))
        empty = torch.zeros(0, dtype=torch.float64, device=sums[0].device if sums else None)
        return ClippedSum(
            sums, torch.cat(norms) if norms else empty, torch.cat(losses) if losses else empty.clone(), how
        )

    def _per_person(
        self, batch: Any, step: Callable[[Any], Any], index: torch.Tensor, counts: torch.Tensor, reduction: str
    ) -> ClippedSum:
        """User-level sampling: each person's rows' gradients (each row alone, as above) summed — or averaged — into
        one, clipped to C as a whole, summed over the people. The step's people's gradients are held at once (as
        hooks mode holds every example's); ``norms`` are the people's."""
        people = [p.new_zeros((len(counts), *p.shape), dtype=wide(p.dtype)) for p in self.params]
        losses: List[torch.Tensor] = []
        how, start = "loop" if self.fallback is not None else "vmap", 0
        for grads, loss, chunk_how in self._per_example(batch, step):
            how = chunk_how
            rows = index[start : start + len(loss.reshape(-1))].to(people[0].device if people else None)
            for total, g in zip(people, grads):
                total.index_add_(0, rows, g.to(total.dtype))
            start += len(loss.reshape(-1))
            losses.append(loss.detach().reshape(-1))
        if reduction == "mean":
            people = [g / counts.to(g.device, g.dtype).reshape(-1, *[1] * (g.dim() - 1)) for g in people]
        norm = _norms(people)
        factors = clip_factors(norm, self.max_grad_norm, self.rule)
        sums = [torch.einsum("i,i...->...", factors.to(g.dtype), g) for g in people]
        empty = torch.zeros(0, dtype=torch.float64, device=norm.device)
        return ClippedSum(sums, norm, torch.cat(losses) if losses else empty, how)

    def gradients_alone(self, batch: Any, step: Callable[[Any], Any]) -> Tuple[List[torch.Tensor], torch.Tensor, str]:
        """Each example's whole gradient (not clipped) and loss, each computed on its row alone: ``grads[j]`` is
        ``[rows, *params[j].shape]`` (the exactness check's reference, :mod:`~lightning_privacy.dpsgd.sampled_exactness`;
        all rows are held at once, so give it a few)."""
        parts = list(self._per_example(batch, step))
        grads = [torch.cat([g[j] for g, _, _ in parts]) for j in range(len(self.params))]
        losses = torch.cat([loss.detach().reshape(-1) for _, loss, _ in parts])
        return grads, losses, parts[-1][2] if parts else ("loop" if self.fallback is not None else "vmap")

    def _per_example(
        self, batch: Any, step: Callable[[Any], Any]
    ) -> Iterator[Tuple[List[torch.Tensor], torch.Tensor, str]]:
        """Chunks of per-example gradients and losses of ``batch``'s rows, each row alone (vmap, or the loop after a
        :attr:`fallback`)."""
        if isinstance(batch, Examples):  # (examples collated alone: one pass each)
            with logging_suppressed(self.module), torch.enable_grad():
                for example in batch:
                    yield (*self._one(_copy(example), step), "loop")
            return
        leaves, spec, rows, batched = _split(batch, self.per_example)
        how = "loop" if self.fallback is not None or self.loop else "vmap"
        size = self.rows_per_chunk(rows)
        start = 0
        with logging_suppressed(self.module), torch.enable_grad():
            while start < rows:
                k = min(size, rows - start) if how == "vmap" else 1
                chunk = [leaves[i][start : start + k] for i in batched]
                if how == "vmap":
                    try:
                        grads, loss = self._vmapped(leaves, spec, batched, chunk, step)
                    except torch.cuda.OutOfMemoryError:
                        if k == 1:
                            raise
                        self._out_of_memory = size = k // 2  # (this fit's chunks stay at most that large)
                        torch.cuda.empty_cache()
                        continue
                    except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
                        how, k = "loop", 1  # exact and slower: each example its own backward pass by autograd
                        chunk = [c[:1] for c in chunk]
                        grads, loss = self._looped(leaves, spec, batched, chunk, step)  # (its own error is the user's)
                        self.fallback = vmap_obstacle(error)
                else:
                    grads, loss = self._looped(leaves, spec, batched, chunk, step)
                yield grads, loss, how
                start += k

    def losses_alone(self, batch: Any, step: Callable[[Any], Any]) -> torch.Tensor:
        """Each example's loss from ``step`` on its row alone, without gradients (vmap, or the loop after a
        :attr:`fallback`)."""
        if isinstance(batch, Examples):
            with logging_suppressed(self.module), torch.enable_grad():
                losses = [example_loss(_on_one_row(step, _copy(example))).detach().reshape(-1) for example in batch]
            return torch.cat(losses) if losses else torch.zeros(0)
        leaves, spec, rows, batched = _split(batch, self.per_example)
        params = self._values()
        out = []
        with logging_suppressed(self.module), torch.enable_grad():  # (a step may differentiate: a gradient penalty)
            if self.fallback is None:
                try:
                    size = self.rows_per_chunk(rows)
                    for start in range(0, rows, size):
                        chunk = [leaves[i][start : start + size].unsqueeze(1) for i in batched]
                        fn = vmap(self._loss_fn(leaves, spec, batched, step), in_dims=(None, *[0] * len(chunk)),
                                  randomness="different")  # fmt: skip
                        out.append(fn(params, *chunk).detach().reshape(-1))
                    return torch.cat(out)
                except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
                    self.fallback, out = vmap_obstacle(error), []
            for i in range(rows):
                rebuilt = _rebuild(leaves, spec, batched, [leaves[j][i : i + 1] for j in batched])
                out.append(example_loss(_on_one_row(step, rebuilt)).detach().reshape(-1))
        return torch.cat(out)

    def _values(self) -> Dict[str, torch.Tensor]:
        return {f"m.{name}": p.detach() for name, p in zip(self.names, self.params)}

    def _loss_fn(self, leaves: List[Any], spec: Any, batched: List[int], step: Callable[[Any], Any]) -> Callable:
        call = self._call

        def loss(params: Dict[str, torch.Tensor], *rows: torch.Tensor) -> torch.Tensor:
            call.step = step
            return example_loss(functional_call(call, params, (_rebuild(leaves, spec, batched, list(rows)),)))

        return loss

    def _vmapped(
        self, leaves: List[Any], spec: Any, batched: List[int], chunk: List[torch.Tensor], step: Callable[[Any], Any]
    ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        loss = self._loss_fn(leaves, spec, batched, step)

        def with_value(params: Dict[str, torch.Tensor], *rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            value = loss(params, *rows)
            return value, value.detach()

        per_example = vmap(
            grad(with_value, has_aux=True), in_dims=(None, *[0] * len(chunk)), randomness="different"
        )  # each example sees its rows as a batch of one: [k, 1, ...] mapped over the first dimension
        grads, values = per_example(self._values(), *[c.unsqueeze(1) for c in chunk])
        return [grads[f"m.{name}"] for name in self.names], values

    def _looped(
        self, leaves: List[Any], spec: Any, batched: List[int], chunk: List[torch.Tensor], step: Callable[[Any], Any]
    ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        return self._one(_rebuild(leaves, spec, batched, chunk), step)

    def _one(self, example: Any, step: Callable[[Any], Any]) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """One example's gradient (``[1, *shape]`` per parameter) and loss, by autograd on ``step(example)``."""
        value = example_loss(_on_one_row(step, example))
        grads: Sequence[Optional[torch.Tensor]] = [None] * len(self.params)
        if value.requires_grad:
            try:
                grads = torch.autograd.grad(value, self.params, allow_unused=True, retain_graph=True)
            except RuntimeError as error:
                if "use_reentrant=True" not in str(error):
                    raise
                grads = _by_backward(value, self.params)  # (reentrant checkpointing: only `.backward()` runs it)
        return [
            _dense(g if g is not None else torch.zeros_like(p)).unsqueeze(0) for g, p in zip(grads, self.params)
        ], value.detach().reshape(1)


def _dense(gradient: torch.Tensor) -> torch.Tensor:
    """A sparse gradient (``nn.Embedding(sparse=True)``) as the dense tensor DP-SGD clips and noises: the noise
    reaches every row, so the step is dense whatever the layer's gradient layout."""
    return gradient.to_dense() if gradient.is_sparse else gradient


class OneRowError(MisconfigurationException):
    """``training_step`` failed on one example alone (a batch of one row); :func:`one_row_message` says why."""


def _on_one_row(step: Callable[[Any], Any], batch: Any) -> Any:
    """``step(batch)`` on one example's row; an error of the user's code there is one sentence saying why a batch of
    one breaks it (:func:`one_row_message`), not torch's alone."""
    try:
        return step(batch)
    except MisconfigurationException:
        raise
    except Exception as error:  # noqa: BLE001 (the user's training_step, whatever it raises)
        raise OneRowError(one_row_message(error)) from error


def _by_backward(value: torch.Tensor, params: Sequence[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """``value``'s gradients of ``params`` by ``value.backward()``, the parameters' own ``.grad`` left as they were."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        value.backward()
        return [p.grad for p in params]
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _split(batch: Any, per_example: Optional[Sequence[bool]] = None) -> Tuple[List[Any], Any, int, List[int]]:
    """``batch``'s leaves, its structure, its rows and the leaves split by rows. ``per_example`` (from the train
    loader's own collate, :func:`~lightning_privacy.dpsgd.sampling.example_leaves`) says which leaves hold one row per
    example, so a tensor the collate shares with every example is given whole even when its size happens to equal the
    batch's; without it (or for a batch of another structure) the tensors whose first dimension is the batch's are
    split (the first tensor of at least one dimension sets it). The tensors are copies: an in-place change that
    ``training_step`` makes to its batch happens to the batch once, in the batch's own pass, as without DPSGD."""
    leaves, spec = tree_flatten(_copy(batch))
    if per_example is not None and len(per_example) == len(leaves):
        batched = [i for i, flag in enumerate(per_example) if flag and isinstance(leaves[i], torch.Tensor)]
        if batched and all(leaves[i].ndim > 0 for i in batched):
            rows = int(leaves[batched[0]].shape[0])
            uneven = [tuple(leaves[i].shape) for i in batched if leaves[i].shape[0] != rows]
            if uneven:
                raise MisconfigurationException(
                    f"{_MODE} splits the batch into its examples by the leaves the train loader's collate_fn gives one "
                    f"row per example, and this batch's disagree in length ({rows} rows, and leaves of shapes "
                    f"{uneven}); let every per-example tensor of a batch have one row per example."
                )
            return leaves, spec, rows, batched
    tensors = [x for x in leaves if isinstance(x, torch.Tensor) and x.ndim > 0]
    if not tensors:
        raise MisconfigurationException(
            f"{_MODE} splits the batch into its examples by the first dimension of its tensors, and this batch holds "
            f"no tensor of at least one dimension (got a {type(batch).__name__})."
        )
    rows = int(tensors[0].shape[0])
    batched = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.ndim > 0 and x.shape[0] == rows]
    return leaves, spec, rows, batched


def _copy(batch: Any) -> Any:
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, batch)


def _rebuild(leaves: List[Any], spec: Any, batched: List[int], rows: Sequence[torch.Tensor]) -> Any:
    leaves = list(leaves)
    for i, row in zip(batched, rows):
        leaves[i] = row
    return tree_unflatten(leaves, spec)


def _norms(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each example's gradient norm over all parameters (per parameter in the gradients' dtype, float32 at least)."""
    k = int(grads[0].shape[0]) if grads else 0
    per_param = [torch.linalg.vector_norm(g.reshape(k, -1), dim=1, dtype=wide(g.dtype)).double() for g in grads]
    return torch.stack(per_param, dim=1).norm(2, dim=1) if per_param else torch.zeros(k, dtype=torch.float64)


# ------------------------------------------------------------------------------------------ the batch's own losses
@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def check_parameters_swapped(engine: FunctionalClipping, batch: Any, step: Callable[[Any], Any]) -> None:
    """Refuse a forward pass that reaches a trainable parameter through a reference ``functional_call`` cannot swap.

    ``functional_call`` replaces the module's registered parameters for the per-example pass; a ``Parameter`` the
    forward pass reaches another way — kept in a plain ``dict`` or ``list`` attribute, or in a closure — stays the
    original, so its gradient through that use would be silently dropped from every example's gradient (and the
    update). One example's loss, computed with the parameters swapped for fresh copies, must not depend on the
    originals.

    Raises:
        MisconfigurationException: naming the parameter and the fix.
    """
    if isinstance(batch, Examples):  # (the first example collated alone, as a batch of its own)
        if not batch:
            return
        leaves, spec = tree_flatten(_copy(batch[0]))
        rows, batched = 1, []  # (nothing to split: the example is the pass's batch)
    else:
        leaves, spec, rows, batched = _split(batch, engine.per_example)
    if rows == 0 or not engine.params:
        return
    copies = {f"m.{name}": p.detach().clone().requires_grad_(True) for name, p in zip(engine.names, engine.params)}
    loss = engine._loss_fn(leaves, spec, batched, lambda rows: _on_one_row(step, rows))  # (the per-example pass's)
    with logging_suppressed(engine.module), _eval_mode(engine.module), torch.enable_grad():  # (no dropout, no stats)
        value = loss(copies, *[leaves[i][:1] for i in batched])
    if not value.requires_grad:
        return
    reached = torch.autograd.grad(value, engine.params, allow_unused=True)
    names = [name for name, g in zip(engine.names, reached) if g is not None]
    if names:
        raise MisconfigurationException(
            f"{_MODE}: the forward pass reaches the trainable parameter `{names[0]}` through a reference that "
            "`torch.func.functional_call` does not swap (a plain dict, list or closure holding the Parameter, not the "
            "module attribute it is registered as), so that use's share of each example's gradient would be dropped "
            "without a word; reach it through its module attribute (or an nn.ParameterDict / nn.ParameterList), or "
            "use grad_sample_mode='hooks'."
        )


def check_losses_alone(
    engine: FunctionalClipping,
    batch: Any,
    step: Callable[[Any], Any],
    *,
    loss_reduction: str,
    rtol: float,
) -> float:
    """Refuse a model that mixes examples: each example's loss computed alone equals its loss in the batch.

    Both in eval mode (no dropout) and without gradients; with a reduced loss from ``training_step``, the mean (or
    sum, by ``loss_reduction``) of the examples' losses alone equals the batch's. Returns the largest mismatch
    relative to the losses' size.

    Raises:
        MisconfigurationException: naming the example and the two losses, and the likely causes.
    """
    # (with gradients: a training_step may differentiate inside, as an input-gradient penalty does)
    with _eval_mode(engine.module), logging_suppressed(engine.module), torch.enable_grad():
        out = step(_copy(batch.batch if isinstance(batch, Examples) else batch))
        alone = engine.losses_alone(batch, step).detach().to(torch.float64)
    together = out.get(PER_EXAMPLE_LOSS, out.get("loss")) if isinstance(out, dict) else out
    if not isinstance(together, torch.Tensor):
        return 0.0
    together = together.detach().to(torch.float64).reshape(-1)
    per_example = (
        together.numel() == alone.numel() and together.numel() != 1 or (together.numel() == 1 and alone.numel() == 1)
    )
    if not per_example:
        alone = (alone.mean() if loss_reduction == "mean" else alone.sum()).reshape(1)
    scale = max(float(together.abs().max()), float(alone.abs().max()), 1e-12)
    error = (together - alone).abs()
    relative = float(error.max()) / scale if error.numel() else 0.0
    if relative > rtol:
        i = int(error.argmax())
        causes = (
            "the model mixes examples in its forward pass (an operation across the batch dimension such as "
            "`h - h.mean(0)`, a sequence-first layer fed batch-first data, batch statistics)"
        )
        if per_example:
            what = f"example {i}'s loss computed alone ({float(alone[i]):.6g}) differs from its loss in the batch"
            fix = "compute each example's output from that example alone"
        else:
            what = (
                f"the {loss_reduction} of the examples' losses computed alone ({float(alone[0]):.6g}) differs from "
                "the batch's loss"
            )
            causes += (
                " or the loss is not the " + loss_reduction + " of per-example losses (a token mean over the batch)"
            )
            fix = "compute each example's output from that example alone, or return one loss per example"
        raise MisconfigurationException(
            f"{_MODE}: {what} ({float(together[i if per_example else 0]):.6g}), so {causes}, and DP-SGD would train "
            f"on other losses than the batch's: {fix}."
        )
    return relative


# ---------------------------------------------------------------------------------------------- grad_sample_mode="auto"
def hooks_obstacles(module: nn.Module) -> List[str]:
    """Why Opacus' per-layer hooks cannot vouch for ``module``'s per-example gradients, before any step (empty: every
    trainable parameter belongs to exactly one layer with an exact Opacus per-example gradient).

    Static and data-independent: tied parameters (one tensor held by several layers), a trainable parameter held by a
    module that is not a layer Opacus samples exactly (a raw ``nn.Parameter``, ``nn.Bilinear``, attention and
    recurrent layers, a custom layer; DPSGD's corrected ``Embedding`` and ``EmbeddingBag`` samplers and its Hugging Face
    ``Conv1D`` sampler count as exact), a convolution that pads with other than zeros, a sequence-first module
    (``batch_first=False``: Opacus takes the first dimension for the batch) and gradient checkpointing (layers re-run
    in the backward pass). A use of a parameter outside its layer in the forward code cannot be seen here; the
    exactness check finds it on the first steps.

    Example::

        >>> hooks_obstacles(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)))
        []
        >>> hooks_obstacles(nn.ModuleDict({"mix": nn.Bilinear(2, 2, 1)}))
        ['`mix` (Bilinear) has no exact Opacus per-example gradient']
    """
    from opacus.grad_sample import GradSampleHooks

    from lightning_privacy.dpsgd.checks import tied_trainable_parameters

    # (Embedding and EmbeddingBag with dpsgd.samplers' corrections; Hugging Face's Conv1D with its sampler)
    exact = set(GradSampleHooks.GRAD_SAMPLERS) | ({samplers.hugging_face_conv1d()} - {None})
    # (in the order they are shown: what makes hooks wrong however the layers are written, then what has no sampler)
    tied = [
        " is ".join(f"`{n}`" for n in group) + " (tied: Opacus' hooks clip each layer's use apart)"
        for group in tied_trainable_parameters(module)
    ]
    layout: List[str] = []
    for prefix, m in module.named_modules():
        where = f"`{prefix or type(m).__name__}` ({type(m).__name__})"
        if getattr(m, "batch_first", None) is False and any(p.requires_grad for p in m.parameters()):
            layout.append(
                f"{where} is sequence-first (batch_first=False), while Opacus' hooks take the first dimension for the batch"
            )
        if getattr(m, "gradient_checkpointing", False) is True:
            layout.append(f"{where} uses gradient checkpointing, whose re-run Opacus' hooks count twice")
        if isinstance(m, nn.modules.conv._ConvNd) and m.padding_mode != "zeros" and m.weight.requires_grad:
            layout.append(f"{where} pads with {m.padding_mode!r}, which Opacus' hooks treat as zeros")
        if (
            getattr(m, "sparse", False) is True
            and isinstance(m, (nn.Embedding, nn.EmbeddingBag))
            and m.weight.requires_grad
        ):
            layout.append(f"{where} has sparse=True, whose sparse gradient Opacus' hooks and checks do not take")
    owners: Dict[int, List[Tuple[str, str, nn.Module]]] = {}
    for prefix, layer in module.named_modules(remove_duplicate=False):
        for name, param in layer.named_parameters(recurse=False):
            if param.requires_grad:
                owners.setdefault(id(param), []).append((prefix, name, layer))
    outside: Dict[int, Tuple[str, nn.Module, List[str]]] = {}  # holder -> its own trainable parameters
    unsampled: List[str] = []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        leaves = [(p, layer) for p, _, layer in owners.get(id(param), []) if next(layer.children(), None) is None]
        if not leaves:
            prefix, own, holder = owners[id(param)][0]
            outside.setdefault(id(holder), (prefix, holder, []))[2].append(own)
        elif type(leaves[0][1]) not in exact:
            prefix, layer = leaves[0]
            unsampled.append(f"`{prefix or name}` ({type(layer).__name__}) has no exact Opacus per-example gradient")
    held = [
        f"`{prefix or type(holder).__name__}` ({type(holder).__name__}) holds "
        + ", ".join(f"`{n}`" for n in names)
        + " outside any layer"
        for prefix, holder, names in outside.values()
    ]
    from lightning_privacy.dpsgd.modules import hooks_unsampled_layers

    buffered = [
        f"`{i.name}` ({i.kind}) is a trainable layer holding buffers, which Opacus' hooks refuse"
        for i in hooks_unsampled_layers(module)
        if "buffers" in i.reason
    ]
    return list(dict.fromkeys([*tied, *layout, *held, *unsampled, *buffered]))

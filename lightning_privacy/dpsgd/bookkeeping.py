"""Ghost clipping's clipped sum in one backward pass: book-keeping (Bu, Wang, Zha, Karypis, ICML 2023).

Ghost clipping (Li et al. 2022) runs two backward passes: the first gives each example's gradient norm ‖∇ℓᵢ‖ layer
by layer (Opacus' hooks, without per-example gradients), the second the gradient of ``Σᵢ cᵢ·ℓᵢ`` with
``cᵢ = min(1, C / (‖∇ℓᵢ‖ + 1e-6))`` — the clipped sum. Bu et al.'s book-keeping keeps what the first pass already
computed — each layer's input ``aᵢ`` (activations) and the gradient ``gᵢ`` of the loss at its output (backprops) —
and forms the clipped sum from them directly, without the second pass through the network:

- ``nn.Linear``: ``Σᵢ cᵢ ∇_W ℓᵢ = Σᵢ cᵢ gᵢᵀ aᵢ`` (over positions too), one matrix product per layer; the bias
  ``Σᵢ cᵢ Σ_positions gᵢ``; Hugging Face's ``Conv1D`` (GPT-2; ``x @ W + b``) the same product transposed,
  ``Σᵢ aᵢᵀ cᵢgᵢ``;
- ``nn.Conv1d/2d/3d``: torch's own weight gradient of a convolution (``torch.nn.grad.conv*d_weight``) for the
  output gradients ``cᵢ·gᵢ`` (the input padded first as the layer pads it: ``"reflect"``, ``"replicate"``,
  ``"circular"``); the bias ``Σᵢ cᵢ Σ_positions gᵢ``;
- ``nn.Embedding``: ``Σᵢ cᵢ gᵢ`` added into the rows of the looked-up indices (``index_add_``; the
  ``padding_idx`` row gets no gradient, as in torch's own backward);
- any other layer Opacus has a per-example gradient function for (LayerNorm, GroupNorm, convolutions, …): its
  per-example gradients from ``cᵢ·gᵢ``, summed over examples. These are small layers (their per-example gradients
  are what ghost clipping materialises for them anyway).

The first pass itself need not compute any parameter's gradient (ghost clipping discards them): when every layer's
output is known, :meth:`BookKeeping.first_pass_targets` names those outputs, and a first pass that differentiates
with respect to them alone propagates the output gradients through the network (Opacus' norm hooks and
book-keeping's capture fire as before) while torch skips every weight gradient. One backward pass then costs
about what the non-private one does, plus the norms and one weight product per layer.

The sum is the second pass's up to floating-point summation order (tests compare it with hooks mode and with the
two passes). It saves the second pass's propagation through the network — its input gradients — and keeps each
layer's output gradient until the sum is formed (memory of the size of the activations). A step falls back to the
second pass whenever book-keeping cannot be sure to be exact: a layer called more than once in the forward pass
(shared weights, recurrent layers), a layer type without a per-example gradient function, an ``nn.Embedding`` with
``max_norm``, ``scale_grad_by_freq`` or sparse gradients, or a layer's captured batch size other than the
examples'.

A linear layer's weighted output gradients ``cᵢ·gᵢ`` (and its inputs, where they are cast) are formed a slice of
examples at a time (about ``CHUNK_BYTES`` of them in float32; GPT-2's head has 50,257 outputs per position), so the
sum's temporaries stay small whatever the batch.

Under bf16 autocast a linear layer's captures are 16-bit (its output gradient ``gᵢ``; its input ``xᵢ`` is what
autocast cast to 16 bits before multiplying). Book-keeping multiplies those same operands — ``xᵢ`` rounded to the
16-bit dtype, then both in the parameters' float32 (``SIXTEEN_BIT_PRODUCTS = "float32"``, the default) — and the
ghost norm (:func:`lightning_privacy.dpsgd.samplers.linear_norm_sample`) takes the norm of the same product with
float32 accumulation, so each example adds ``cᵢ·xᵢᵀgᵢ`` with ``cᵢ‖xᵢᵀgᵢ‖ ≤ C`` up to float32 rounding, as in float32
training. ``"split"`` (not the default) rounds each weighted gradient ``w`` (float32) to bfloat16 twice,
``hi = bf16(w)`` and ``lo = bf16(w − hi)``, and adds the two bfloat16 products ``xᵀhi + xᵀlo`` with float32
accumulation (CUDA: ``torch.mm(..., out_dtype=torch.float32)``, tensor cores; elsewhere the same products in
float32): every product of two bfloat16 numbers is exact in float32 and ``|w − hi − lo| ≤ 2⁻¹⁶·|w|`` elementwise, so
each example's contribution to a layer's sum moves by at most ``2⁻¹⁶·cᵢ·‖xᵢ‖_F·‖gᵢ‖_F`` (Cauchy–Schwarz over
positions) beyond float32's own accumulation. Ghost mode folds that bound into the clip factors
(:meth:`BookKeeping.split_overshoot`: ``εᵢ = 2⁻¹⁶·(Σ_layers (‖xᵢ‖_F·‖gᵢ‖_F)²)^½``, the layers' errors being
orthogonal; ``cᵢ = min(1, C / (‖∇ℓᵢ‖ + εᵢ + 1e-6))``), so each contribution stays within C up to float32 rounding
there too. ``benchmarks/gpu_check.py`` (its ``ghost-split`` row) measures whether it is faster; it is not the
default until it has.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from opacus.grad_sample import GradSampleModule
from torch import nn
from torch.nn import functional as F

from lightning_privacy.dpsgd.products import SIXTEEN_BIT, native, split_product, wide
from lightning_privacy.dpsgd.samplers import hugging_face_conv1d

__all__ = ["BookKeeping", "CHUNK_BYTES", "PROFILER_RANGE", "SIXTEEN_BIT_PRODUCTS", "exact_under_autocast"]

#: the ``torch.profiler`` range around :meth:`BookKeeping.clipped_sums` (``benchmarks/gpu_check.py`` reports its time)
PROFILER_RANGE = "lightning_privacy::book-keeping"
#: how a linear layer's bfloat16 captures (bf16 autocast) are multiplied: ``"float32"`` or ``"split"`` (see above)
SIXTEEN_BIT_PRODUCTS = "float32"
#: float32 bytes of output gradients and inputs a linear layer's sum casts or weights at once (a slice of examples)
CHUNK_BYTES = 2**30


def _direct_trainable(module: nn.Module) -> List[torch.Tensor]:
    return [p for p in module.parameters(recurse=False) if p.requires_grad]


_CONV_WEIGHT = {nn.Conv1d: torch.nn.grad.conv1d_weight, nn.Conv2d: torch.nn.grad.conv2d_weight,
                nn.Conv3d: torch.nn.grad.conv3d_weight}  # fmt: skip


def _plain_conv(module: nn.Module) -> bool:
    return type(module) in _CONV_WEIGHT and not isinstance(module.padding, str)


def _is_conv1d(module: nn.Module) -> bool:
    return type(module) is hugging_face_conv1d()


def _embedding_ok(module: nn.Module) -> bool:
    return module.max_norm is None and not module.scale_grad_by_freq and not module.sparse


class BookKeeping:
    """Capture each trainable layer's input and output gradient in the first ghost pass; form the clipped sum.

    Args:
        module: the module Opacus' ghost-clipping hooks watch (the LightningModule).
        loss_reduction: ``"mean"`` or ``"sum"``: how the first pass reduced the per-example losses (``"mean"``
            gradients are ``1/n`` of the per-example ones, and are scaled back).

    Use: :meth:`start` before the forward pass, ``capturing = True`` around the first backward pass, then
    :meth:`ready` and :meth:`clipped_sums`; :meth:`clear` after the step; :meth:`remove` at the end.

    Example::

        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> keeper = BookKeeping(net, loss_reduction="sum")
        >>> x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
        >>> keeper.start()
        >>> losses = nn.functional.cross_entropy(net(x), y, reduction="none")
        >>> keeper.capturing = True
        >>> losses.sum().backward()
        >>> keeper.capturing = False
        >>> c = torch.rand(5)
        >>> sums = keeper.clipped_sums(c)
        >>> net.zero_grad()
        >>> (c * nn.functional.cross_entropy(net(x), y, reduction="none")).sum().backward()
        >>> all(torch.allclose(sums[p], p.grad, atol=1e-6) for p in net.parameters())
        True
        >>> keeper.remove()
    """

    def __init__(self, module: nn.Module, *, loss_reduction: str) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"`loss_reduction` must be 'mean' or 'sum', got {loss_reduction!r}")
        self.loss_reduction = loss_reduction
        self.capturing = False
        self.low_precision = False  # the last sums came from 16-bit output gradients (autocast)
        self.products: Optional[str] = None  # "split" when the last sums' linear products were (SIXTEEN_BIT_PRODUCTS)
        self._layers = [m for m in module.modules() if _direct_trainable(m)]
        self.supported = all(self._supports(m) for m in self._layers)
        self._inputs: Dict[nn.Module, List[Tuple[torch.Tensor, ...]]] = {}
        self._outputs: Dict[nn.Module, List[object]] = {}
        self._grads: Dict[nn.Module, List[torch.Tensor]] = {}
        self._handles = []
        if self.supported:
            for layer in self._layers:
                self._handles.append(layer.register_forward_hook(self._forward))
                self._handles.append(layer.register_full_backward_hook(self._backward))

    @staticmethod
    def _supports(layer: nn.Module) -> bool:
        if type(layer) is nn.Linear or _is_conv1d(layer):
            return True
        if type(layer) is nn.Embedding:
            return _embedding_ok(layer)
        return type(layer) in GradSampleModule.GRAD_SAMPLERS and type(layer) is not nn.EmbeddingBag

    def _forward(self, layer: nn.Module, inputs: Tuple[torch.Tensor, ...], output: object) -> None:
        if layer.training and torch.is_grad_enabled():
            self._inputs.setdefault(layer, []).append(tuple(t.detach() for t in inputs if isinstance(t, torch.Tensor)))
            # (forward hooks see the layer's own output, before torch wraps it for the layer's backward hooks)
            self._outputs.setdefault(layer, []).append(output)

    def _backward(self, layer: nn.Module, _grad_input: tuple, grad_output: tuple) -> None:
        if self.capturing and grad_output and grad_output[0] is not None:
            self._grads.setdefault(layer, []).append(grad_output[0].detach())

    def start(self) -> None:
        """Forget the last step's captures (call before the forward pass)."""
        self.clear()

    def clear(self) -> None:
        self._inputs.clear()
        self._outputs.clear()
        self._grads.clear()

    def first_pass_targets(self) -> Optional[List[torch.Tensor]]:
        """After the forward pass: every layer's output, to differentiate the first pass with respect to (or ``None``).

        The gradient with respect to these tensors runs through every layer's backward hooks (each output's
        gradient is needed) and through no weight's gradient; ``None`` when a layer ran other than once or returned
        something other than one tensor that needs a gradient.
        """
        if not self.forward_ready():
            return None
        outputs = [self._outputs.get(m, [None])[0] for m in self._layers]
        if not all(isinstance(t, torch.Tensor) and t.requires_grad for t in outputs):
            return None
        return outputs

    def forward_ready(self) -> bool:
        """After the forward pass: every trainable layer ran exactly once (so one backward pass can do)."""
        return self.supported and all(len(self._inputs.get(m, ())) == 1 for m in self._layers)

    def ready(self, batch_size: int) -> bool:
        """After the first backward pass: every layer has one input and one output gradient, ``batch_size`` rows."""
        if not self.forward_ready():
            return False
        for layer in self._layers:
            grads = self._grads.get(layer, ())
            if len(grads) != 1 or grads[0].ndim == 0 or grads[0].shape[0] != batch_size:
                return False
            if not self._inputs[layer][0] or self._inputs[layer][0][0].shape[0] != batch_size:
                return False
        return True

    def captured_16_bit(self) -> bool:
        """The first pass captured a 16-bit output gradient (autocast)."""
        return any(g.dtype in SIXTEEN_BIT for grads in self._grads.values() for g in grads)

    def clipped_sums(self, coefficients: torch.Tensor) -> Dict[torch.Tensor, torch.Tensor]:
        """``{parameter: Σᵢ cᵢ ∇ℓᵢ}`` from the captured first pass (:meth:`ready` must be true)."""
        with torch.profiler.record_function(PROFILER_RANGE):
            return self._clipped_sums(coefficients)

    def _clipped_sums(self, coefficients: torch.Tensor) -> Dict[torch.Tensor, torch.Tensor]:
        result: Dict[torch.Tensor, torch.Tensor] = {}
        n = int(coefficients.shape[0])
        self.low_precision = self.captured_16_bit()
        self.products = None
        for layer in self._layers:
            (inputs,), (grad,) = self._inputs[layer], self._grads[layer]
            dtype = wide(_direct_trainable(layer)[0].dtype)  # sums in the parameters' precision, float32 at least
            weight = coefficients.to(device=grad.device, dtype=dtype) * (n if self.loss_reduction == "mean" else 1)
            if type(layer) is nn.Linear or _is_conv1d(layer):
                sums = self._linear_sums(layer, inputs[0], grad, weight)
            else:
                grad = grad.to(dtype)
                inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
                sums = self._layer_sums(layer, inputs, grad * weight.view(-1, *([1] * (grad.ndim - 1))))
            for param, total in sums.items():
                if param.requires_grad:
                    result[param] = total  # (16-bit parameters: in float32, handed over beside their .grad)
        return result

    def _linear_sums(
        self, layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor
    ) -> Dict[torch.Tensor, torch.Tensor]:
        """An ``nn.Linear``'s or ``Conv1D``'s weight and bias sums, a slice of examples at a time (module docstring)."""
        dtype, conv1d = weight.dtype, type(layer) is not nn.Linear
        split = self._split(layer)
        if split:
            self.products = "split" if native() and grad.is_cuda else "split (emulated in float32)"
        step = max(1, CHUNK_BYTES // max(4 * (grad[0].numel() + x[0].numel()), 1)) if grad.shape[0] else 1
        total = bias = None
        for start in range(0, max(grad.shape[0], 1), step):
            rows = slice(start, start + step)
            w = grad[rows].to(dtype) * weight[rows].view(-1, *([1] * (grad.ndim - 1)))
            w, xs = w.reshape(-1, w.shape[-1]), x[rows].reshape(-1, x.shape[-1])
            if split:
                part = split_product(xs, w, transpose=not conv1d)
            else:  # (nn.Linear's W is [out, in]; Hugging Face's Conv1D, y = x @ W + b, stores it [in, out])
                if grad.dtype in SIXTEEN_BIT:
                    xs = xs.to(grad.dtype)  # the operand autocast's layer multiplied, as the ghost norm takes it
                xs = xs.to(dtype)
                part = w.t().mm(xs) if not conv1d else xs.t().mm(w)
            total = part if total is None else total.add_(part)
            if layer.bias is not None:
                bias = w.sum(0) if bias is None else bias.add_(w.sum(0))
        sums = {layer.weight: total}
        if layer.bias is not None:
            sums[layer.bias] = bias
        return sums

    def _split(self, layer: nn.Module) -> bool:
        """This step's sum of ``layer`` takes the "split" products (a linear layer, bfloat16 captures, float32)."""
        return (SIXTEEN_BIT_PRODUCTS == "split" and (type(layer) is nn.Linear or _is_conv1d(layer))
                and self._grads[layer][0].dtype == torch.bfloat16
                and _direct_trainable(layer)[0].dtype == torch.float32)  # fmt: skip

    def split_overshoot(self) -> Optional[torch.Tensor]:
        """Each example's bound ``εᵢ`` on how far the "split" products move its (unclipped) gradient, to add to its
        norm before the clip factor (module docstring); ``None`` where no layer takes them (call after :meth:`ready`)."""
        squares = None
        for layer in self._layers:
            if not self._split(layer):
                continue
            (inputs,), (grad,) = self._inputs[layer], self._grads[layer]
            x = inputs[0].to(torch.bfloat16).flatten(1)
            term = (torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)
                    * torch.linalg.vector_norm(grad.flatten(1), dim=1, dtype=torch.float32)).square()  # fmt: skip
            squares = term if squares is None else squares + term
        return None if squares is None else 2.0**-16 * squares.sqrt()

    @staticmethod
    def _layer_sums(layer: nn.Module, inputs: tuple, weighted: torch.Tensor) -> Dict[torch.Tensor, torch.Tensor]:
        if _plain_conv(layer):
            x, padding = inputs[0], layer.padding
            if layer.padding_mode != "zeros":  # as nn.ConvNd pads: F.pad first, then a convolution without padding
                x = F.pad(x, [q for q in reversed(padding) for _ in range(2)], mode=layer.padding_mode)
                padding = 0
            weight = _CONV_WEIGHT[type(layer)](
                x, layer.weight.shape, weighted, layer.stride, padding, layer.dilation, layer.groups
            )
            sums = {layer.weight: weight}
            if layer.bias is not None:
                sums[layer.bias] = weighted.sum(dim=[0, *range(2, weighted.ndim)])
            return sums
        if type(layer) is nn.Embedding:
            total = torch.zeros_like(layer.weight, dtype=weighted.dtype)
            total.index_add_(0, inputs[0].reshape(-1), weighted.reshape(-1, weighted.shape[-1]))
            if layer.padding_idx is not None:
                total[layer.padding_idx] = 0
            return {layer.weight: total}
        samples = GradSampleModule.GRAD_SAMPLERS[type(layer)](layer, list(inputs), weighted)
        return {param: sample.sum(0) for param, sample in samples.items()}

    def disagreeing(self, sums: Dict[torch.Tensor, torch.Tensor], params: List[torch.Tensor]) -> Optional[torch.Tensor]:
        """The first of ``params`` whose clipped sum in ``sums`` differs from its ``.grad`` (the second pass's), else
        ``None``: DPSGD's self-check of book-keeping (a layer whose gradient is not what its type suggests).

        Relative tolerance 1e-3 of the sum's norm, plus 1e-6; when the sums came from 16-bit output gradients
        (autocast: the second pass multiplies in 16 bits, book-keeping in float32) 5e-2, plus 2⁻⁸ (bfloat16's unit
        roundoff) of the whole step's gradient norm: a parameter whose sum cancels to about zero (an attention key's
        bias: softmax ignores it) is 16-bit rounding noise in the second pass, far above its own norm.
        """
        rtol, atol = (5e-2, 2.0**-8) if self.low_precision else (1e-3, 0.0)
        grads = {p: p.grad.to(torch.float64) for p in params if p.grad is not None and sums.get(p) is not None}
        floor = atol * sum(float(g.square().sum()) for g in grads.values()) ** 0.5 + 1e-6
        for param, grad in grads.items():
            total = sums[param].to(torch.float64)
            if float((total - grad).norm()) > rtol * max(float(grad.norm()), float(total.norm())) + floor:
                return param
        return None

    def remove(self) -> None:
        """Remove the hooks and forget the captures."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.clear()


def exact_under_autocast(module: nn.Module) -> bool:
    """Whether ghost clipping of ``module`` under 16-bit autocast (bf16 or fp16) bounds each example's contribution
    by C up to float32 rounding on the steps book-keeping forms the sum: every trainable layer is one whose ghost norm
    and book-kept sum multiply the same operands in float32 — ``nn.Linear`` and ``Conv1D`` (module docstring), and
    ``nn.Embedding`` and ``nn.LayerNorm``, which autocast runs in float32 — and book-keeping supports it.

    Example::

        >>> exact_under_autocast(nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 2)))
        True
        >>> exact_under_autocast(nn.Sequential(nn.Conv2d(1, 2, 3)))  # (Opacus' per-example convolutions: 16-bit)
        False
    """
    exact = {nn.Linear, nn.Embedding, nn.LayerNorm, hugging_face_conv1d()}
    layers = [m for m in module.modules() if _direct_trainable(m)]
    return all(type(m) in exact and BookKeeping._supports(m) for m in layers)

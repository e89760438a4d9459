"""Opacus' per-example samplers, corrected where they differ from torch's own gradient.

``nn.Embedding(padding_idx=p)``: torch's backward gives the padding row no gradient (the row stays as initialised),
but Opacus' per-example gradient (hooks mode) scatters the output gradient of every position into its row,
padding positions included, and its ghost norm counts them too. In hooks mode that updated the padding row and
clipped padded examples by a norm that included it; in ghost mode it clipped them as if their gradient were larger
(over-clipping: a norm of 2.24 used for 0.71). The samplers below zero the output gradient at the padding positions
first, then call Opacus' own function, so per-example gradients, norms and clipped sums are torch's.

``nn.EmbeddingBag``: Opacus' sampler adds each bag's output gradient with ``gsm[i][index] += g`` (advanced
indexing, which writes a repeated index once: a token that occurs twice in a bag got the gradient of one occurrence;
in ghost mode an example then added up to 1.06·C to a step), ignores ``padding_idx`` and ``per_sample_weights``, and
fails on a ``[B, L]`` input without offsets. :func:`embedding_bag_grad_sample` is torch's backward per bag
(``index_add_``: every occurrence counts; padding entries add nothing and are not counted in a mean;
``per_sample_weights`` scale their rows in ``mode="sum"``). ``mode="max"`` is refused before training
(:func:`lightning_privacy.dpsgd.modules.incompatible_layers`).

Hugging Face's ``Conv1D`` (GPT-2's ``c_attn``, ``c_proj``, ``c_fc``: ``x @ W + b`` with ``W`` stored ``[in, out]``)
has no Opacus sampler: Opacus computed its per-example gradients by ``torch.func`` (every example's whole weight, in
ghost mode too, only to take its norm), and book-keeping could not form GPT-2's clipped sum, so ghost clipping ran
a second backward pass. :func:`conv1d_grad_sample` is the linear layer's per-example gradient in ``Conv1D``'s layout,
and its norm is Opacus' linear norm (the same Frobenius norm, from the layer's inputs and output gradients, whatever
the weight's layout), so GPT-2's norms come without per-example weights and book-keeping covers it
(:mod:`lightning_privacy.dpsgd.bookkeeping`).

``nn.Linear`` and ``Conv1D`` norms in ghost mode (:func:`linear_norm_sample`): Opacus' linear norm forms the Gram
matrices ``ggᵀ`` and ``aaᵀ`` in the output gradients' dtype, so under bf16 autocast every norm came out rounded to
bfloat16, either way, and an example clipped by a norm that came out too small added more than C to the sum (up to
1.004·C in ``tests/test_bookkeeping.py``'s removal test).
Here the same operands the layer multiplied (its input in the output gradient's 16-bit dtype, as autocast's layer took
it) are multiplied with float32 accumulation and output (CUDA's ``torch.bmm(..., out_dtype=torch.float32)``), so the
norm is that of the gradient book-keeping sums, up to float32 rounding; per layer the cheaper of the Gram matrices
(``T²·(in + out)``) and each example's weight gradient (``T·in·out``) is formed, as Bu et al.'s mixed ghost clipping.

They are installed on the hooks object of one fit (its ``GRAD_SAMPLERS``/``NORM_SAMPLERS`` as instance attributes,
read by Opacus at every backward pass), never in Opacus' global registries: other Opacus users in the process keep
Opacus' behaviour, and samplers a user registers for their own layers are still found.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

from lightning_privacy.dpsgd.products import SIXTEEN_BIT, float32_product, wide

__all__ = ["conv1d_grad_sample", "embedding_bag_grad_sample", "hugging_face_conv1d", "install_exact_samplers",
           "linear_norm_sample", "without_padding"]  # fmt: skip


def hugging_face_conv1d() -> Any:
    """``transformers.pytorch_utils.Conv1D`` where transformers is imported (a model using it has imported it), else
    ``None``; transformers itself is never imported here."""
    import sys

    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def conv1d_grad_sample(layer: nn.Module, activations: List[torch.Tensor], backprops: torch.Tensor) -> Dict[Any, Any]:
    """Per-example gradients of a Hugging Face ``Conv1D`` (``y = x @ W + b``, ``W`` of shape ``[in, out]``):
    ``Σ_positions xᵀ g`` per example, ``[B, in, out]``, and the bias ``Σ_positions g``.

    Example::

        >>> layer = type("Conv1D", (nn.Module,), {})()
        >>> layer.weight, layer.bias = nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(2))
        >>> x, g = torch.ones(1, 4, 3), torch.ones(1, 4, 2)
        >>> samples = conv1d_grad_sample(layer, [x], g)
        >>> list(samples[layer.weight].shape), samples[layer.weight][0, 0, 0].item(), samples[layer.bias].tolist()
        ([1, 3, 2], 4.0, [[4.0, 4.0]])
    """
    x = activations[0].to(backprops.dtype)
    ret: Dict[Any, Any] = {}
    if layer.weight.requires_grad:
        ret[layer.weight] = torch.einsum("n...i,n...j->nij", x, backprops)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = torch.einsum("n...k->nk", backprops)
    return ret


def linear_norm_sample(layer: nn.Module, activations: List[torch.Tensor], backprops: torch.Tensor) -> Dict[Any, Any]:
    """Each example's gradient norm of an ``nn.Linear`` or Hugging Face ``Conv1D`` (the same Frobenius norm whatever
    the weight's layout) and of its bias, from the layer's input and output gradient, in float32 (module docstring).

    Example::

        >>> layer = nn.Linear(3, 2)
        >>> x, g = torch.randn(4, 5, 3), torch.randn(4, 5, 2)
        >>> norms = linear_norm_sample(layer, [x], g)
        >>> exact = torch.einsum("nti,nto->noi", x.double(), g.double()).flatten(1).norm(dim=1)
        >>> torch.allclose(norms[layer.weight].double(), exact), torch.allclose(norms[layer.bias], g.sum(1).norm(dim=1))
        (True, True)
    """
    g, a = backprops, activations[0]
    if g.dtype in SIXTEEN_BIT and a.dtype != g.dtype:
        a = a.to(g.dtype)  # (the operand autocast's layer multiplied)
    n, dtype = g.shape[0], wide(g.dtype)  # (accumulation: float32 at least)
    g, a = g.reshape(n, -1, g.shape[-1]), a.reshape(n, -1, a.shape[-1])
    ret: Dict[Any, Any] = {}
    if layer.weight.requires_grad:
        positions, inputs, outputs = a.shape[1], a.shape[2], g.shape[2]
        if positions == 1:  # ‖a gᵀ‖ = ‖a‖·‖g‖
            squares = (torch.linalg.vector_norm(a, dim=(1, 2), dtype=dtype)
                       * torch.linalg.vector_norm(g, dim=(1, 2), dtype=dtype)).square()  # fmt: skip
        elif positions * (inputs + outputs) <= inputs * outputs:  # the Gram matrices are the cheaper
            squares = (float32_product(torch.bmm, g, g.transpose(1, 2))
                       * float32_product(torch.bmm, a, a.transpose(1, 2))).sum((1, 2))  # fmt: skip
        else:  # each example's weight gradient is
            squares = float32_product(torch.bmm, a.transpose(1, 2), g).square().sum((1, 2))
        ret[layer.weight] = squares.clamp(min=0).sqrt()
    if getattr(layer, "bias", None) is not None and layer.bias.requires_grad:
        ret[layer.bias] = torch.linalg.vector_norm(g.sum(1, dtype=dtype), dim=1)
    return ret


def without_padding(sampler: Callable[..., Dict[nn.Parameter, torch.Tensor]]) -> Callable[..., Any]:
    """``sampler`` (an Opacus grad or norm sampler of ``nn.Embedding``) with the padding positions' output gradient
    set to zero first, as torch's own backward of ``F.embedding(..., padding_idx=p)`` does.

    Example::

        >>> from opacus.grad_sample.embedding import compute_embedding_grad_sample
        >>> layer = nn.Embedding(4, 2, padding_idx=0)
        >>> ids, grads = torch.tensor([[0, 1]]), torch.ones(1, 2, 2)
        >>> compute_embedding_grad_sample(layer, [ids], grads)[layer.weight][0, 0].tolist()  # Opacus: row 0 moves
        [1.0, 1.0]
        >>> without_padding(compute_embedding_grad_sample)(layer, [ids], grads)[layer.weight][0, 0].tolist()
        [0.0, 0.0]
    """

    @functools.wraps(sampler)
    def exact(layer: nn.Module, activations: List[torch.Tensor], backprops: torch.Tensor) -> Any:
        padding = getattr(layer, "padding_idx", None)
        if padding is not None and backprops.numel():
            keep = (activations[0] != padding).unsqueeze(-1).to(backprops.dtype)
            backprops = backprops * keep.reshape(*backprops.shape[:-1], 1)
        return sampler(layer, activations, backprops)

    return exact


def _bags(layer: nn.EmbeddingBag, activations: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, Any]:
    """``(indices, bag of each index, per_sample_weights or None)`` from the inputs Opacus recorded (positional only)."""
    indices = activations[0]
    if indices.ndim == 2:  # [B, L]: B bags of L indices
        bags = torch.arange(indices.shape[0], device=indices.device).repeat_interleave(indices.shape[1])
        weights = activations[2] if len(activations) > 2 else None
        return indices.reshape(-1), bags, None if weights is None else weights.reshape(-1)
    if len(activations) < 2:
        from lightning.pytorch.utilities.exceptions import MisconfigurationException

        raise MisconfigurationException(
            f"DPSGD: an nn.EmbeddingBag({layer.num_embeddings}, {layer.embedding_dim}) was called on a 1-D input "
            "without positional offsets (given by keyword, Opacus' hooks do not see them), so its examples' bags "
            "cannot be told apart: call it as `bag(indices, offsets)`, or with a [batch, length] input."
        )
    offsets = activations[1].long()
    ends = torch.cat([offsets[1:], offsets.new_tensor([indices.numel()])])
    if layer.include_last_offset:
        offsets, ends = offsets[:-1], offsets[1:]
    counts = (ends - offsets).clamp(min=0)
    bags = torch.arange(offsets.numel(), device=indices.device).repeat_interleave(counts)
    start = int(offsets[0]) if offsets.numel() else 0
    indices = indices[start : start + int(counts.sum())]
    weights = activations[2][start : start + int(counts.sum())] if len(activations) > 2 else None
    return indices, bags, weights


def embedding_bag_grad_sample(
    layer: nn.EmbeddingBag, activations: List[torch.Tensor], backprops: torch.Tensor
) -> Dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of an ``nn.EmbeddingBag``'s weight as torch's backward computes them (``mode`` sum or
    mean; see the module docstring).

    Example::

        >>> bag = nn.EmbeddingBag(4, 2, mode="sum")
        >>> ids, grads = torch.tensor([[1, 1, 2]]), torch.ones(1, 2)
        >>> embedding_bag_grad_sample(bag, [ids], grads)[bag.weight][0, :, 0].tolist()  # index 1 twice: 2
        [0.0, 2.0, 1.0, 0.0]
    """
    ret: Dict[nn.Parameter, torch.Tensor] = {}
    if not layer.weight.requires_grad:
        return ret
    indices, bags, weights = _bags(layer, activations)
    rows = backprops.shape[0]
    keep = torch.ones_like(indices, dtype=backprops.dtype)
    if layer.padding_idx is not None:
        keep = keep * (indices != layer.padding_idx).to(backprops.dtype)
    scale = keep
    if layer.mode == "mean":
        counts = torch.zeros(rows, dtype=backprops.dtype, device=backprops.device).index_add_(0, bags, keep)
        scale = keep / counts.clamp(min=1)[bags]
    elif weights is not None:
        scale = keep * weights.to(backprops.dtype)
    contributions = backprops[bags] * scale.unsqueeze(1)  # [entries, dim]
    flat = torch.zeros(rows * layer.num_embeddings, layer.embedding_dim, dtype=backprops.dtype, device=backprops.device)
    flat.index_add_(0, bags * layer.num_embeddings + indices.long(), contributions)
    ret[layer.weight] = flat.view(rows, layer.num_embeddings, layer.embedding_dim)
    return ret


def install_exact_samplers(hooks: Any) -> Any:
    """Give the Opacus hooks object ``hooks`` the corrected samplers of this module (see the module docstring)."""
    conv1d = hugging_face_conv1d()
    for registry in ("GRAD_SAMPLERS", "NORM_SAMPLERS"):
        samplers = getattr(type(hooks), registry, None)
        if samplers is not None and nn.Embedding in samplers:
            samplers = {**samplers, nn.Embedding: without_padding(samplers[nn.Embedding])}
        if samplers is not None and registry == "GRAD_SAMPLERS":
            samplers = {**samplers, nn.EmbeddingBag: embedding_bag_grad_sample}  # (ghost mode: its norm from these)
        if samplers is not None and registry == "NORM_SAMPLERS":  # (a user's own norm sampler for Linear is kept)
            from opacus.grad_sample.linear import compute_linear_norm_sample

            if samplers.get(nn.Linear) in (None, compute_linear_norm_sample):
                samplers = {**samplers, nn.Linear: linear_norm_sample}
        if samplers is not None and conv1d is not None and conv1d not in samplers:
            sampler = conv1d_grad_sample if registry == "GRAD_SAMPLERS" else linear_norm_sample
            samplers = {**samplers, conv1d: sampler}
        if samplers is not None:
            setattr(hooks, registry, samplers)
    return hooks

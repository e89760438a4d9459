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

They are installed on the hooks object of one fit (its ``GRAD_SAMPLERS``/``NORM_SAMPLERS`` as instance attributes,
read by Opacus at every backward pass), never in Opacus' global registries: other Opacus users in the process keep
Opacus' behaviour, and samplers a user registers for their own layers are still found.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

__all__ = ["embedding_bag_grad_sample", "install_exact_samplers", "without_padding"]


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
    for registry in ("GRAD_SAMPLERS", "NORM_SAMPLERS"):
        samplers = getattr(type(hooks), registry, None)
        if samplers is not None and nn.Embedding in samplers:
            samplers = {**samplers, nn.Embedding: without_padding(samplers[nn.Embedding])}
        if samplers is not None and registry == "GRAD_SAMPLERS":
            samplers = {**samplers, nn.EmbeddingBag: embedding_bag_grad_sample}  # (ghost mode: its norm from these)
        if samplers is not None:
            setattr(hooks, registry, samplers)
    return hooks

"""Opacus' per-example samplers, corrected where they differ from torch's own gradient.

``nn.Embedding(padding_idx=p)``: torch's backward gives the padding row no gradient (the row stays as initialised),
but Opacus' per-example gradient (hooks mode) scatters the output gradient of every position into its row,
padding positions included, and its ghost norm counts them too. In hooks mode that updated the padding row and
clipped padded examples by a norm that included it; in ghost mode it clipped them as if their gradient were larger
(over-clipping: a norm of 2.24 used for 0.71). The samplers below zero the output gradient at the padding positions
first, then call Opacus' own function, so per-example gradients, norms and clipped sums are torch's.

They are installed on the hooks object of one fit (its ``GRAD_SAMPLERS``/``NORM_SAMPLERS`` as instance attributes,
read by Opacus at every backward pass), never in Opacus' global registries: other Opacus users in the process keep
Opacus' behaviour, and samplers a user registers for their own layers are still found.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List

import torch
from torch import nn

__all__ = ["install_exact_samplers", "without_padding"]


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


def install_exact_samplers(hooks: Any) -> Any:
    """Give the Opacus hooks object ``hooks`` the corrected samplers of this module (see the module docstring)."""
    for registry in ("GRAD_SAMPLERS", "NORM_SAMPLERS"):
        samplers = getattr(type(hooks), registry, None)
        if samplers is not None and nn.Embedding in samplers:
            setattr(hooks, registry, {**samplers, nn.Embedding: without_padding(samplers[nn.Embedding])})
    return hooks

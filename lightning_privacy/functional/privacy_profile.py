"""Torch helpers for the privacy profile: find the linear head, gather its inputs, per-row gradients.

The math lives in :mod:`lightning_privacy.analysis.privacy_profile` (numpy); these functions turn a
trained model and a data loader into the arrays it needs, in one vectorised pass.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

__all__ = ["linear_head_inputs", "logistic_per_example_gradients", "resolve_linear_head"]


def resolve_linear_head(model: nn.Module, layer: str | nn.Module | None = None) -> nn.Linear:
    """The binary linear layer ``f·h`` that the privacy profile analyses.

    Args:
        model: the trained model.
        layer: ``None`` (the model's ``linear`` attribute, as in
            :class:`~lightning_privacy.models.LogisticRegressionModule`), a submodule name for
            :meth:`torch.nn.Module.get_submodule` (e.g. ``"net.4"``), or the layer itself.

    Returns:
        The :class:`torch.nn.Linear` layer.

    Raises:
        ValueError: if the layer is missing, not an ``nn.Linear``, has more than one output or has a bias
            (the analysis covers ``f·x`` with no intercept; build the head with ``bias=False``).

    Example::

        >>> head = resolve_linear_head(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1, bias=False)), "2")
        >>> head.in_features
        3
    """
    if layer is None:
        head = getattr(model, "linear", None)
        if head is None:
            raise ValueError(
                f"`layer`=None needs a model with a `linear` attribute; {type(model).__name__} has none: pass "
                "the name of its last linear layer"
            )
    elif isinstance(layer, str):
        try:
            head = model.get_submodule(layer)
        except AttributeError as err:
            raise ValueError(f"`layer`={layer!r} is not a submodule of {type(model).__name__}") from err
    else:
        head = layer
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"`layer` must be an nn.Linear (L2-regularised logistic regression), got {type(head).__name__}"
        )
    if head.out_features != 1:
        raise ValueError(
            f"`layer` must have out_features=1 (binary logistic regression), got out_features={head.out_features}"
        )
    if head.bias is not None:
        raise ValueError("`layer` must have bias=False: the analysis covers f·x without an intercept, got a bias")
    return head


@torch.no_grad()
def linear_head_inputs(
    model: nn.Module, head: nn.Linear, batches: Iterable, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model`` over ``batches`` of ``(x, y)`` in eval mode and return the inputs of ``head``.

    Args:
        model: the model (its train/eval mode is restored afterwards).
        head: a submodule of ``model`` (:func:`resolve_linear_head`).
        batches: an iterable of ``(x, y)`` pairs in a fixed order (row ``i`` is the ``i``-th row seen).
        device: where to run ``model`` (default: the device of ``head``).

    Returns:
        ``(features (n, d) float64, labels (n,) int64)`` on the CPU.

    Raises:
        ValueError: no batches, or batches that are mappings (a language model's ``{"input_ids": ...}``).

    Example::

        >>> model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1, bias=False))
        >>> x, y = linear_head_inputs(model, model[1], [(torch.ones(4, 2), torch.ones(4, dtype=torch.long))])
        >>> tuple(x.shape), x.dtype
        ((4, 3), torch.float64)
    """
    device = head.weight.device if device is None else torch.device(device)
    captured: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    handle = head.register_forward_pre_hook(lambda _module, args: captured.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            if isinstance(batch, Mapping):  # e.g. a language model's {"input_ids": ..., "attention_mask": ...}
                raise ValueError(
                    f"the privacy profile reads batches of (x, y) rows of a logistic-regression head, but got a mapping "
                    f"with keys {sorted(map(str, batch))}: it does not apply to a language model's sequences"
                )
            x, y = batch[0], batch[1]
            model(x.to(device))
            labels.append(torch.as_tensor(y).reshape(-1).cpu())
    finally:
        handle.remove()
        model.train(was_training)
    if not captured:
        raise ValueError("`batches` is empty: no training rows to analyse")
    features = torch.cat([c.reshape(c.shape[0], -1) for c in captured]).to("cpu", torch.float64)
    return features, torch.cat(labels).long()


def logistic_per_example_gradients(weights: torch.Tensor, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-row gradients ``−y_i σ(−y_i f·x_i) x_i`` of the logistic loss, all rows in one pass.

    Args:
        weights: ``(d,)`` ``f``.
        features: ``(n, d)``.
        labels: ``(n,)`` in ``{0, 1}`` (0 means −1).

    Returns:
        ``(n, d)`` float64.

    Raises:
        ValueError: on mismatched shapes or labels outside ``{0, 1}``.

    Example::

        >>> logistic_per_example_gradients(torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, 0.5]]), torch.tensor([1, 0]))
        tensor([[-0.5000, -0.0000],
                [ 0.0000,  0.2500]], dtype=torch.float64)
    """
    f = weights.detach().reshape(-1).to(torch.float64)
    x = features.detach().to(torch.float64)
    if x.ndim != 2 or x.shape[1] != f.shape[0]:
        raise ValueError(f"`features` must have shape (n, {f.shape[0]}), got {tuple(x.shape)}")
    if labels.shape != (x.shape[0],):
        raise ValueError(f"`labels` must have shape ({x.shape[0]},), got {tuple(labels.shape)}")
    if not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError(f"`labels` must be 0 or 1, got values {torch.unique(labels).tolist()}")
    signs = labels.to(torch.float64) * 2.0 - 1.0
    scale = -signs * torch.sigmoid(-signs * (x @ f))
    return scale[:, None] * x

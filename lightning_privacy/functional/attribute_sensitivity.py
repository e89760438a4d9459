r"""Per-step gradient sensitivity to a sensitive attribute (Cherubin et al. 2024, Corollary 10, Algorithm 4).

At step t of DP-SGD, for every example ``z`` of the Poisson batch ``L_t`` and every candidate value
``a ∈ A`` of the sensitive attribute, ``ḡ_t((φ(z), a))`` is the per-sample gradient of the example with
its attribute replaced by ``a``, clipped to ``max_grad_norm`` C exactly as Opacus' ``DPOptimizer`` clips
(factor ``min(1, C / (‖g‖ + 1e-6))``, one flat norm over all trainable parameters). Then

    R_t = max_{z ∈ L_t} diam{ ḡ_t((φ(z), a)) : a ∈ A },

the largest distance between two substitutions of the same record. Plugged into
:func:`~lightning_privacy.analysis.bayes_security.ai_bayes_security` it gives β*_AI.

Methods (Section 5.4):

- ``"exact"``: the diameter, from the |A|×|A| Gram matrix of each example's gradients (one batched
  matrix product); the maximising pair is then re-measured directly, so the value is not affected by the
  cancellation of ``‖a‖² + ‖b‖² − 2⟨a, b⟩``.
- ``"approximate"``: ``2·max_a ‖ḡ_a − v‖`` with ``v`` the mean of the |A| gradients, O(|A|) distances. By
  the triangle inequality it is an UPPER bound on the diameter (the safe side: β*_AI from it is a lower
  bound on the exact-diameter β*_AI). Since every clipped gradient has norm ≤ C the diameter is also
  ≤ 2C, so the reported value is ``min(2·max_a ‖ḡ_a − v‖, 2C)`` — still an upper bound.
- ``values="extremes"`` (with either method): only the smallest and largest candidate values — a
  domain-knowledge restriction of ``A`` (the bound then speaks about an attacker choosing between those
  two values only).

Per-sample gradients use ``torch.func`` (``functional_call`` + ``grad`` + ``vmap``) on a module without
hooks. A module that carries Opacus' hooks cannot be used with ``torch.func``: build its twin once with
:func:`hook_free_twin` and call it with the live parameters (``params=dict(live.named_parameters())``).
Randomness (dropout) is drawn once per example and shared by its |A| substitutions (nested ``vmap``,
inner ``randomness="same"``), so the distances measure the attribute and not the dropout noise; the
module's train/eval mode is respected (an eval-mode module has no dropout). BatchNorm in training mode
is rejected (per-example gradients are not defined for it, and Opacus rejects it too).

Work is chunked over examples (``chunk_size`` examples, i.e. ``chunk_size·|A|`` gradient rows, at a
time), so memory stays bounded; the result does not depend on the chunking.
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from lightning_privacy.functional.attributes import SensitiveAttribute, ValuesSpec, _tree_map, tree_batch_size

__all__ = [
    "METHODS",
    "hook_free_twin",
    "per_sample_gradients",
    "clip_factors",
    "sensitivity_from_gradients",
    "attribute_sensitivities",
    "attribute_sensitivity",
]

METHODS = ("exact", "approximate")
CLIP_EPS = 1e-6  # Opacus' DPOptimizer.clip_and_accumulate: C / (norm + 1e-6)
DEFAULT_CHUNK_ELEMENTS = 2**23  # gradient entries per chunk (32 MB in float32)
LossFn = Callable[[Any, Any], torch.Tensor]


# ---------------------------------------------------------------------------------------- validation
def _check_max_grad_norm(max_grad_norm: Any) -> float:
    if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, numbers.Real) or not (
        math.isfinite(float(max_grad_norm)) and max_grad_norm > 0
    ):
        raise ValueError(f"Expected argument `max_grad_norm` to be a finite number > 0, but got {max_grad_norm!r}.")
    return float(max_grad_norm)


def _check_method(method: Any) -> str:
    if method not in METHODS:
        raise ValueError(f"Expected argument `method` to be one of {METHODS}, but got {method!r}.")
    return method


def _hooked(module: nn.Module) -> list:
    found = []
    for name, m in module.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(m, attr, None):
                found.append(name or type(m).__name__)
                break
    return found


def _check_module(module: Any) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise TypeError(f"Expected argument `module` to be a torch.nn.Module, but got {type(module).__name__}.")
    hooked = _hooked(module)
    if hooked:
        raise ValueError(
            f"Expected a module without hooks (torch.func cannot run through e.g. Opacus' per-sample-gradient hooks), "
            f"but submodules {hooked[:3]} carry hooks. Build a twin once with hook_free_twin(module) and pass "
            "params=dict(module.named_parameters())."
        )
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            raise ValueError(
                f"Submodule {name!r} is {type(m).__name__} in training mode: per-example gradients are not defined for "
                "batch statistics (Opacus rejects it too). Replace it, e.g. with GroupNorm (opacus ModuleValidator.fix)."
            )
    return module


# ---------------------------------------------------------------------------------------- twin
def hook_free_twin(module: nn.Module) -> nn.Module:
    """A copy of ``module`` without any hooks, sharing its parameters and buffers.

    ``torch.func`` transforms fail on modules that carry Opacus' per-sample-gradient hooks; the twin
    runs the same forward code. Parameters and buffers are not copied (the twin holds the same tensor
    objects), and callers normally pass the live ones explicitly through ``params`` anyway. Keep the
    twin's train/eval mode in step with the live module (see :func:`sync_training_mode`).

    Example::

        >>> live = nn.Linear(3, 2)
        >>> _ = live.register_forward_hook(lambda m, i, o: None)
        >>> twin = hook_free_twin(live)
        >>> len(live._forward_hooks), len(twin._forward_hooks), twin.weight is live.weight
        (1, 0, True)
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"Expected argument `module` to be a torch.nn.Module, but got {type(module).__name__}.")
    memo: Dict[int, Any] = {}
    for tensor in list(module.parameters()) + list(module.buffers()):
        memo[id(tensor)] = tensor
    for m in module.modules():
        for key, value in vars(m).items():
            if "hooks" in key and isinstance(value, dict):
                memo[id(value)] = type(value)()
    twin = copy.deepcopy(module, memo)
    for m in twin.modules():
        for attr in ("autograd_grad_sample_hooks", "activations"):  # Opacus bookkeeping, meaningless on the twin
            if attr in vars(m):
                delattr(m, attr)
    return twin


def sync_training_mode(twin: nn.Module, live: nn.Module) -> None:
    """Copy every submodule's ``training`` flag from ``live`` to its twin (same module tree)."""
    for t, m in zip(twin.modules(), live.modules()):
        t.training = m.training


# ---------------------------------------------------------------------------------------- gradients
def _split_params(module: nn.Module, params: Optional[Mapping[str, torch.Tensor]], buffers: Optional[Mapping[str, torch.Tensor]]):
    own = dict(module.named_parameters())
    params = own if params is None else dict(params)
    unknown = sorted(set(params) - set(own))
    if unknown:
        raise ValueError(f"Expected `params` to be named like the module's parameters, but got unknown names {unknown[:5]}.")
    trainable = {n: params[n].detach() for n in own if n in params and own[n].requires_grad}
    if not trainable:
        raise ValueError("The module has no trainable parameters (requires_grad=True): there is no gradient to measure.")
    frozen = {n: params.get(n, own[n]).detach() for n in own if n not in trainable}
    frozen.update({n: b for n, b in (dict(module.named_buffers()) if buffers is None else dict(buffers)).items()})
    return trainable, frozen


def _example_grad_fn(module: nn.Module, loss_fn: LossFn, frozen: Dict[str, torch.Tensor]):
    """``grad`` of the loss of ONE example (inputs/targets without batch dim) w.r.t. trainable params."""

    def loss(trainable, inputs, targets):
        batch = _tree_map(lambda t: t.unsqueeze(0), inputs)
        out = functional_call(module, (trainable, frozen), (batch,))
        return loss_fn(out, _tree_map(lambda t: t.unsqueeze(0), targets))

    return grad(loss)


def per_sample_gradients(
    module: nn.Module,
    inputs: Any,
    targets: Any,
    *,
    loss_fn: LossFn = F.cross_entropy,
    params: Optional[Mapping[str, torch.Tensor]] = None,
    buffers: Optional[Mapping[str, torch.Tensor]] = None,
    randomness: str = "different",
) -> Dict[str, torch.Tensor]:
    """Unclipped per-sample gradients ``∇_θ loss_fn(module(x_i), y_i)``, one row per example.

    They equal Opacus' ``grad_sample`` for the same inputs (Opacus rescales ``loss_reduction="mean"``
    by the batch size, so both are gradients of the per-example loss).

    Args:
        module: a module without hooks (see :func:`hook_free_twin`).
        inputs: batch of inputs (tensor or tuple/list/dict of tensors, leading batch dim).
        targets: batch of targets.
        loss_fn: ``loss_fn(outputs, targets)`` on a batch of one example — the training loss.
        params: parameters to evaluate at (default: the module's own).
        buffers: buffers to evaluate with (default: the module's own).
        randomness: ``vmap`` randomness for dropout and the like (``"different"`` or ``"same"``).

    Returns:
        ``{name: (B, *param.shape)}`` for every trainable parameter.

    Example::

        >>> _ = torch.manual_seed(0); model = nn.Linear(3, 2)
        >>> g = per_sample_gradients(model, torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
        >>> g["weight"].shape, g["bias"].shape
        (torch.Size([4, 2, 3]), torch.Size([4, 2]))
    """
    _check_module(module)
    trainable, frozen = _split_params(module, params, buffers)
    fn = vmap(_example_grad_fn(module, loss_fn, frozen), in_dims=(None, 0, 0), randomness=randomness)
    return fn(trainable, inputs, targets)


def clip_factors(squared_norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Opacus' per-sample clip factors ``min(1, C / (‖g‖ + 1e-6))`` from squared flat norms.

    Example::

        >>> clip_factors(torch.tensor([0.25, 4.0]), 1.0)
        tensor([1.0000, 0.5000])
    """
    return (max_grad_norm / (squared_norms.clamp_min(0).sqrt() + CLIP_EPS)).clamp(max=1.0)


def _flat(gradients: Union[torch.Tensor, Mapping[str, torch.Tensor]]) -> list:
    if isinstance(gradients, torch.Tensor):
        gradients = {"": gradients}
    flats = [g.reshape(g.shape[0], g.shape[1], -1) for g in gradients.values()]
    if not flats or flats[0].ndim != 3:
        raise ValueError("Expected gradients of shape (examples, |A|, ...) per parameter.")
    return flats


def sensitivity_from_gradients(
    gradients: Union[torch.Tensor, Mapping[str, torch.Tensor]], *, max_grad_norm: float, method: str = "approximate"
) -> torch.Tensor:
    """Per-example sensitivity from the UNCLIPPED gradients of each example's |A| substitutions.

    Clips every gradient as Opacus does, then takes the diameter of each example's |A| points
    (``"exact"``) or the upper bound ``min(2·max_a‖ḡ_a − mean‖, 2C)`` (``"approximate"``).

    Args:
        gradients: ``(B, |A|, D)`` or a dict ``{name: (B, |A|, *shape)}`` (the flat gradient is their
            concatenation).
        max_grad_norm: C.
        method: ``"exact"`` or ``"approximate"``.

    Returns:
        ``(B,)`` float tensor, each entry in ``[0, 2C]``.

    Example::

        >>> g = torch.tensor([[[3.0, 0.0], [0.0, 0.5], [-0.5, 0.0]]])  # one example, |A| = 3
        >>> sensitivity_from_gradients(g, max_grad_norm=1.0, method="exact")  # |(1,0) - (-0.5,0)|
        tensor([1.5000])
        >>> sensitivity_from_gradients(g, max_grad_norm=1.0, method="approximate")  # >= exact
        tensor([1.6997])
    """
    c_max = _check_max_grad_norm(max_grad_norm)
    _check_method(method)
    flats = _flat(gradients)
    b, k = flats[0].shape[:2]
    if b == 0:
        return flats[0].new_zeros(0)
    norms = torch.stack([g.norm(dim=2) for g in flats], dim=2).norm(dim=2)  # Opacus: norm of per-param norms
    c = clip_factors(norms.square(), c_max)  # (b, k)
    if method == "approximate":
        r2 = torch.zeros(b, k, dtype=flats[0].dtype, device=flats[0].device)
        for g in flats:
            clipped = g * c.unsqueeze(2)
            r2 += (clipped - clipped.mean(dim=1, keepdim=True)).square().sum(dim=2)
        return (2.0 * r2.max(dim=1).values.sqrt()).clamp(max=2.0 * c_max)
    gram = sum(torch.bmm(g, g.transpose(1, 2)) for g in flats)  # (b, k, k), unclipped
    gram = gram * c.unsqueeze(2) * c.unsqueeze(1)
    diag = gram.diagonal(dim1=1, dim2=2)
    d2 = diag.unsqueeze(2) + diag.unsqueeze(1) - 2.0 * gram
    best = d2.reshape(b, k * k).argmax(dim=1)
    i, j = best // k, best % k
    rows = torch.arange(b, device=best.device)
    exact2 = sum(
        (g[rows, i] * c[rows, i].unsqueeze(1) - g[rows, j] * c[rows, j].unsqueeze(1)).square().sum(dim=1) for g in flats
    )  # the maximising pair, measured directly
    return exact2.sqrt().clamp(max=2.0 * c_max)  # ≤ 2C holds exactly; the clamp only removes float rounding


def _check_chunk_size(chunk_size: Any) -> Optional[int]:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"Expected argument `chunk_size` to be a positive int (examples per chunk) or None, but got {chunk_size!r}.")
    return int(chunk_size)


def attribute_sensitivities(
    module: nn.Module,
    inputs: Any,
    targets: Any,
    *,
    attribute: SensitiveAttribute,
    max_grad_norm: float,
    method: str = "approximate",
    values: ValuesSpec = "all",
    loss_fn: LossFn = F.cross_entropy,
    params: Optional[Mapping[str, torch.Tensor]] = None,
    buffers: Optional[Mapping[str, torch.Tensor]] = None,
    chunk_size: Optional[int] = None,
    randomness: str = "different",
) -> torch.Tensor:
    """Per-example sensitivity ``diam{ḡ((φ(z), a)) : a ∈ A}`` (or its upper bound) for a batch.

    Args:
        module: a module without hooks (see :func:`hook_free_twin`); its train/eval mode is used.
        inputs: the batch's inputs (tensor or tuple/list/dict of tensors with a leading batch dim).
        targets: the batch's targets.
        attribute: the :class:`~lightning_privacy.functional.attributes.SensitiveAttribute`.
        max_grad_norm: C, DP-SGD's clipping norm.
        method: ``"exact"`` diameter or ``"approximate"`` (upper bound, Section 5.4).
        values: ``"all"``, ``"extremes"`` or a subset of the attribute's values.
        loss_fn: ``loss_fn(outputs, targets)``, the training loss (here on one example).
        params: parameters to evaluate at, e.g. the live module's (default: the module's own).
        buffers: buffers to use (default: the module's own).
        chunk_size: examples per chunk (default: as many as fit in 2**23 gradient entries).
        randomness: ``vmap`` randomness across examples (``"different"`` or ``"same"``); the |A|
            substitutions of one example always share it.

    Returns:
        ``(B,)`` tensor with entries in ``[0, 2C]`` (empty for an empty batch).

    Raises:
        ValueError, TypeError: for a bad argument (named in the message).

    Example::

        >>> _ = torch.manual_seed(0); model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> attr = SensitiveAttribute.numeric(column=0, values=[-1.0, 0.0, 1.0])
        >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
        >>> exact = attribute_sensitivities(model, x, y, attribute=attr, max_grad_norm=0.1, method="exact")
        >>> approx = attribute_sensitivities(model, x, y, attribute=attr, max_grad_norm=0.1)
        >>> exact.shape, bool((approx >= exact).all()), bool((approx <= 0.2).all())
        (torch.Size([5]), True, True)
    """
    _check_module(module)
    c_max = _check_max_grad_norm(max_grad_norm)
    _check_method(method)
    chunk_size = _check_chunk_size(chunk_size)
    if not isinstance(attribute, SensitiveAttribute):
        raise TypeError(f"Expected argument `attribute` to be a SensitiveAttribute, but got {type(attribute).__name__}.")
    if randomness not in ("different", "same"):
        raise ValueError(f"Expected argument `randomness` to be 'different' or 'same', but got {randomness!r}.")
    attribute = attribute.select(values)
    n = tree_batch_size(inputs)
    if tree_batch_size(targets) != n:
        raise ValueError(f"Expected `targets` to have the batch size of `inputs` ({n}), but got {tree_batch_size(targets)}.")
    trainable, frozen = _split_params(module, params, buffers)
    device = next(iter(trainable.values())).device
    if n == 0:
        return torch.zeros(0, device=device)
    k = attribute.size
    if chunk_size is None:
        dim = sum(p.numel() for p in trainable.values())
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // (k * dim))
    per_value = vmap(_example_grad_fn(module, loss_fn, frozen), in_dims=(None, 0, None), randomness="same")
    per_example = vmap(per_value, in_dims=(None, 0, 0), randomness=randomness)
    out = []
    for start in range(0, n, chunk_size):
        x = _tree_map(lambda t: t[start : start + chunk_size], inputs)
        y = _tree_map(lambda t: t[start : start + chunk_size], targets)
        grads = per_example(trainable, attribute.expand(x), y)  # {name: (b, k, *shape)}
        out.append(sensitivity_from_gradients(grads, max_grad_norm=c_max, method=method))
    return torch.cat(out)


def attribute_sensitivity(
    module: nn.Module,
    inputs: Any,
    targets: Any,
    *,
    attribute: SensitiveAttribute,
    max_grad_norm: float,
    method: str = "approximate",
    values: ValuesSpec = "all",
    loss_fn: LossFn = F.cross_entropy,
    params: Optional[Mapping[str, torch.Tensor]] = None,
    buffers: Optional[Mapping[str, torch.Tensor]] = None,
    chunk_size: Optional[int] = None,
    randomness: str = "different",
    sync: bool = True,
) -> float:
    """R_t of Corollary 10: the largest per-example sensitivity of the batch (0 for an empty batch).

    With ``sync=True`` and an initialised ``torch.distributed`` process group the maximum is also
    taken across processes (a collective call: every rank must call it), so every rank gets the R_t
    of the global batch. Arguments as in :func:`attribute_sensitivities`.

    Example::

        >>> _ = torch.manual_seed(0); model = nn.Linear(3, 2)
        >>> sex = SensitiveAttribute.one_hot(columns=[1, 2], values=["F", "M"])
        >>> r = attribute_sensitivity(model, torch.randn(8, 3), torch.randint(0, 2, (8,)), attribute=sex,
        ...                           max_grad_norm=1.0, method="exact")
        >>> 0.0 < r <= 2.0
        True
        >>> attribute_sensitivity(model, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), attribute=sex,
        ...                       max_grad_norm=1.0)
        0.0
    """
    per_example = attribute_sensitivities(
        module, inputs, targets, attribute=attribute, max_grad_norm=max_grad_norm, method=method, values=values,
        loss_fn=loss_fn, params=params, buffers=buffers, chunk_size=chunk_size, randomness=randomness,
    )  # fmt: skip
    local = per_example.max() if per_example.numel() else per_example.new_zeros(())
    if sync and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        local = local.detach().clone()
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return float(local)

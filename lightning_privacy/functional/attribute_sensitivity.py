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
  matrix product); on the ``"func"`` backend the gradients are centred on their mean first and the
  maximising pair is then re-measured directly, so neither the choice of the pair nor the value suffers
  the float32 cancellation of ``‖a‖² + ‖b‖² − 2⟨a, b⟩`` at the scale of C².
- ``"approximate"``: ``2·max_a ‖ḡ_a − v‖`` with ``v`` the mean of the |A| gradients, O(|A|) distances. By
  the triangle inequality it is an UPPER bound on the diameter (the safe side: β*_AI from it is a lower
  bound on the exact-diameter β*_AI). Since every clipped gradient has norm ≤ C the diameter is also
  ≤ 2C, so the reported value is ``min(2·max_a ‖ḡ_a − v‖, 2C)`` — still an upper bound.
- ``values="extremes"`` (with either method): only the smallest and largest candidate values — a
  domain-knowledge restriction of ``A`` (the bound then speaks about an attacker choosing between those
  two values only).

Backends (same values up to float rounding):

- ``"func"``: per-sample gradients by ``torch.func`` (``functional_call`` + ``grad`` + ``vmap``) on a
  module without hooks, for any module. A module that carries Opacus' hooks cannot be used with
  ``torch.func``: build its twin once with :func:`hook_free_twin` and call it with the live parameters
  (``params=dict(live.named_parameters())``). Randomness (dropout) is drawn once per example and shared
  by its |A| substitutions (nested ``vmap``, inner ``randomness="same"``), so the distances measure the
  attribute and not the dropout noise. The masks are fresh draws, not the ones the live step used: with
  dropout, R_t is a one-sample estimate of the mask-dependent sensitivity (without dropout it is exact).
- ``"gram"``: one ordinary forward/backward over the ``B·|A|`` substituted rows, no vmap. Forward hooks
  on the supported layers record their inputs ``a`` and outputs, one ``autograd.grad`` gives the
  back-propagated errors ``δ``, and each layer adds its share of every example's |A|×|A| Gram matrix of
  UNCLIPPED per-sample gradients, in float64: Linear (any ``[N, *, d]`` input, also Opacus'
  ``RNNLinear``, hence ``DPLSTM``/``DPGRU``/``DPRNN``) by the ghost identity
  ``⟨Σ_t δ_tᵢa_tᵢᵀ, Σ_s δ_sⱼa_sⱼᵀ⟩ = Σ_{t,s}(a_tᵢ·a_sⱼ)(δ_tᵢ·δ_sⱼ)`` or with the per-sample gradient
  materialised, whichever is cheaper; Conv1d/2d/3d the same after unfolding (as Opacus' conv grad
  sampler); Embedding likewise (materialised on each example's own tokens only); LayerNorm, RMSNorm and
  GroupNorm from Opacus' grad-sample formulas; Opacus' ``SequenceBias``; so also
  ``DPMultiheadAttention``. Formulas and costs: :mod:`lightning_privacy.functional._gram`. The diagonal
  gives the norms, hence Opacus' clip factors ``c``, and ``‖c_a g_a − c_b g_b‖² = c_a²G_aa + c_b²G_bb −
  2c_a c_b G_ab``. It applies when every trainable parameter sits in exactly one supported layer (exact
  types; frozen layers of any kind are fine) and no dropout layer is active
  (:func:`gram_backend_reason` says why not). ``"linear"`` is the former name of this backend (it
  covered ``nn.Linear`` only) and is still accepted.
- ``"auto"`` (default): ``"gram"`` when it applies, else ``"func"``; also ``"func"`` when a batch does not
  fit at run time (a supported layer that sees the batch folded into another dimension, e.g.
  ``x.view(-1, d)``, or a packed sequence).

Precision: the computation runs with autocast disabled, in the parameters' dtype but at least float32
(bfloat16/float16 parameters, buffers, inputs and targets are upcast exactly), whatever precision the
training step uses. What is left is float32 rounding of the forward and backward passes (≈ 1e-7·C on
the test architectures); ``rounding_allowance`` (see :func:`sensitivity_rounding_allowance`) adds a
margin, absolute in C, that keeps the result at or above the exact value.

The module's train/eval mode is respected (an eval-mode module has no dropout). BatchNorm in training
mode is rejected (per-example gradients are not defined for it, and Opacus rejects it too).

Work is chunked over examples (``chunk_size`` examples, i.e. ``chunk_size·|A|`` gradient rows, at a
time), so memory stays bounded; the result does not depend on the chunking. Without ``chunk_size`` the
Gram backend measures what its first example holds and sizes later chunks to about 2**23 elements (a
cache-sized working set, fastest on CPU).

On the Gram backend the module's OUTPUT must have the batch on dim 0 (the loss is evaluated row by
row); inside, a layer's input may have it on dim 0 or dim 1 (sequence-first ``[T, N, d]``). If both
dims have the chunk's row count, the chunk is split so that they differ.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from lightning_privacy.attributes import SensitiveAttribute, ValuesSpec, _tree_map, tree_batch_size
from lightning_privacy.functional import _gram
from lightning_privacy.functional._precision import at_least_float32

__all__ = [
    "METHODS",
    "hook_free_twin",
    "per_sample_gradients",
    "clip_factors",
    "sensitivity_from_gradients",
    "attribute_sensitivities",
    "attribute_sensitivity",
    "sensitivity_rounding_allowance",
    "step_sensitivity",
]

METHODS = ("exact", "approximate")
CLIP_EPS = 1e-6  # Opacus' DPOptimizer.clip_and_accumulate: C / (norm + 1e-6)
DEFAULT_CHUNK_ELEMENTS = 2**23  # gradient entries per chunk (32 MB in float32)
GRAM_CHUNK_ELEMENTS = 2**23  # Gram backend: elements held per chunk (activations, errors, per-layer work); cache-sized
ROUNDING_ALLOWANCE_EPS = 1024  # sensitivity_rounding_allowance: machine epsilons of C
LossFn = Callable[[Any, Any], torch.Tensor]


# ---------------------------------------------------------------------------------------- validation
def _check_max_grad_norm(max_grad_norm: Any) -> float:
    if (
        isinstance(max_grad_norm, bool)
        or not isinstance(max_grad_norm, numbers.Real)
        or not (math.isfinite(float(max_grad_norm)) and max_grad_norm > 0)
    ):
        raise ValueError(f"Expected argument `max_grad_norm` to be a finite number > 0, but got {max_grad_norm!r}.")
    return float(max_grad_norm)


def _check_method(method: Any) -> str:
    if method not in METHODS:
        raise ValueError(f"Expected argument `method` to be one of {METHODS}, but got {method!r}.")
    return method


def _check_rounding_allowance(rounding_allowance: Any) -> float:
    if isinstance(rounding_allowance, bool) or not isinstance(rounding_allowance, numbers.Real):
        raise TypeError(
            f"Expected argument `rounding_allowance` to be a real number, but got {type(rounding_allowance).__name__}."
        )
    if not (math.isfinite(float(rounding_allowance)) and rounding_allowance >= 0):
        raise ValueError(
            f"Expected argument `rounding_allowance` to be a finite number >= 0, but got {rounding_allowance!r}."
        )
    return float(rounding_allowance)


# ---------------------------------------------------------------------------------------- precision
def _full_precision(device: torch.device):
    """A context without autocast on ``device``'s type: the measurement runs in the dtypes it is given."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def sensitivity_rounding_allowance(dtype: torch.dtype, *, max_grad_norm: float) -> float:
    r"""The absolute allowance that keeps a computed sensitivity at or above its exact value: ``1024·eps·C``.

    :func:`attribute_sensitivity` runs in the parameters' dtype, upcast to float32 when narrower (and with
    autocast disabled), so ``dtype`` float16/bfloat16 gives the float32 value ``1024 · 2⁻²³ · C ≈ 1.22e-4·C``;
    float64 gives ``2.3e-13·C``.

    Why absolute, and why 1024 epsilons: if every computed per-sample gradient is within a normwise relative
    error ρ of its exact value (forward and backward rounding), then each CLIPPED gradient is within ``2ρC``
    (clipping to the ball of radius C moves a point by at most its error inside the ball, and by at most
    ``C·‖ĝ/‖ĝ‖ − g/‖g‖‖ ≤ 2ρC`` outside), so a distance between two of them is within ``4ρC`` and the
    approximate bound ``2‖ḡ_a − v‖`` within ``8ρC`` — errors proportional to C, not to the distance, which can
    be far smaller than C (nearly equal clipped gradients). The distances themselves are measured directly on
    centred points (float64 Gram matrices on the Gram backend), adding ~eps relative. ``1024·eps`` therefore
    covers ρ ≤ 128·eps (256 unit roundoffs: a worst-case error accumulated over 256 roundings in a row, or
    the typical √n growth over far more). This is an engineering margin, not a proof: a badly conditioned
    network can amplify rounding further. Measured on the end-to-end test architectures (CNN + GroupNorm,
    attention, DPLSTM, frozen backbone) in float32 against float64 over ~320 bf16-mixed training steps each with
    ATEN_CPU_CAPABILITY=default, avx2 and avx512: sensitivities at most 2.1e-7·C below the float64 value and never
    further from it than 1.7e-3 of the allowance, i.e. the allowance is ~570× the largest observed rounding.

    Args:
        dtype: the parameters' dtype.
        max_grad_norm: C, DP-SGD's clipping norm.

    Returns:
        The allowance to pass as ``rounding_allowance``.

    Raises:
        TypeError: ``dtype`` is not a floating dtype. ValueError: ``max_grad_norm`` is not finite and > 0.

    Example::

        >>> round(sensitivity_rounding_allowance(torch.bfloat16, max_grad_norm=1.0), 7)
        0.0001221
        >>> sensitivity_rounding_allowance(torch.float32, max_grad_norm=2.0) == 2 * 1024 * 2.0**-23
        True
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"Expected argument `dtype` to be a floating torch.dtype, but got {dtype!r}.")
    c_max = _check_max_grad_norm(max_grad_norm)
    return ROUNDING_ALLOWANCE_EPS * torch.finfo(torch.promote_types(dtype, torch.float32)).eps * c_max


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
    dropped = object()  # DPSGD's stand-ins for backward and training_step (they hold the fit: the Trainer, optimizer)
    for key in ("backward", "training_step"):
        value = vars(module).get(key)
        if getattr(getattr(value, "__self__", value), "stands_in_for_a_fit", False):
            memo[id(value)] = dropped
    twin = copy.deepcopy(module, memo)
    for key in ("backward", "training_step"):
        if vars(twin).get(key) is dropped:
            del twin.__dict__[key]  # (the class's own methods again)
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
def _split_params(
    module: nn.Module, params: Optional[Mapping[str, torch.Tensor]], buffers: Optional[Mapping[str, torch.Tensor]]
):
    own = dict(module.named_parameters())
    params = own if params is None else dict(params)
    unknown = sorted(set(params) - set(own))
    if unknown:
        raise ValueError(
            f"Expected `params` to be named like the module's parameters, but got unknown names {unknown[:5]}."
        )
    trainable = {n: params[n].detach() for n in own if n in params and own[n].requires_grad}
    if not trainable:
        raise ValueError(
            "The module has no trainable parameters (requires_grad=True): there is no gradient to measure."
        )
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
    flats = [at_least_float32(g.reshape(g.shape[0], g.shape[1], -1)) for g in gradients.values()]
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
    return _sensitivity(_flat(gradients), c_max, method, floor=None)


def _sq_dist(a: list, b: list) -> torch.Tensor:
    """Squared distances between row-aligned point lists, measured directly (no cancellation)."""
    return sum((x - y).square().sum(dim=1) for x, y in zip(a, b))


def _sensitivity(
    flats: list, c_max: float, method: str, floor: Optional[float], in_place: bool = False
) -> torch.Tensor:
    """Core of :func:`sensitivity_from_gradients` on flat blocks ``[(b, k, d_p)]``.

    The clipped gradients are centred on their mean ``v`` first (``ḡ_a − v``, materialised), so every
    distance and inner product below is taken at the scale of the spread of the |A| points, not of C:
    squared distances to the mean are measured directly, and the |A|×|A| Gram matrix that picks the
    farthest pair has its cancellation error relative to the diameter (with uncentred points it is relative
    to C², and a small diameter could be under-reported by picking the wrong pair). The maximising point or
    pair is then re-measured directly. With ``floor`` (a value some example of the batch is known to reach),
    examples whose upper bound ``r₍₁₎ + r₍₂₎`` (two largest distances to the mean, with a rounding
    allowance) cannot exceed it skip the |A|×|A| Gram matrix and report their lower bound instead: the batch
    maximum is unchanged (this is only done for :func:`attribute_sensitivity`). With ``in_place`` the blocks
    (which the caller no longer needs) are centred in place instead of copied.
    """
    b, k = flats[0].shape[:2]
    if b == 0:
        return flats[0].new_zeros(0)
    norms = torch.stack([g.norm(dim=2) for g in flats], dim=2).norm(dim=2)  # Opacus: norm of per-param norms
    c = clip_factors(norms.square(), c_max)  # (b, k)
    rows = torch.arange(b, device=c.device)
    w = (c / k).unsqueeze(1)  # (b, 1, k)
    centre = [torch.bmm(w, g) for g in flats]  # (b, 1, d_p): v, the mean of the clipped points
    centred = [  # ḡ_a − v; in place only on a contiguous block (an expanded one shares memory between rows)
        g.mul_(c.unsqueeze(2)).sub_(v) if in_place and g.is_contiguous() else torch.addcmul(-v, g, c.unsqueeze(2))
        for g, v in zip(flats, centre)
    ]
    r2 = sum(torch.linalg.vector_norm(p, dim=2).square() for p in centred)  # (b, k) distances² to v, measured
    far = r2.argmax(dim=1)
    if method == "approximate":
        return (2.0 * r2[rows, far].sqrt()).clamp(max=2.0 * c_max)
    # exact: lower bound = the farthest point from the point farthest from the mean (re-measured directly)
    far_point = [p[rows, far] for p in centred]
    dots_far = sum(torch.bmm(q.unsqueeze(1), p.transpose(1, 2)).squeeze(1) for p, q in zip(centred, far_point))
    partner = (r2 - 2.0 * dots_far).argmax(dim=1)  # ‖p_a − p_far‖² up to the constant ‖p_far‖²
    lower = _sq_dist(far_point, [p[rows, partner] for p in centred]).sqrt()
    if floor is None:
        todo = rows
    else:
        top2 = r2.topk(min(2, k), dim=1).values + 1e-5 * c_max**2  # rounding allowance of the centring
        upper = top2.sqrt().sum(dim=1)
        todo = rows[upper > max(floor, float(lower.max()))]
    result = lower.clone()
    if todo.numel():
        sub = centred if len(todo) == b else [p[todo] for p in centred]
        gram = sum(torch.bmm(p, p.transpose(1, 2)) for p in sub)
        diag = gram.diagonal(dim1=1, dim2=2)
        best = (diag.unsqueeze(2) + diag.unsqueeze(1) - 2.0 * gram).reshape(len(todo), k * k).argmax(dim=1)
        i, j = best // k, best % k
        local = torch.arange(len(todo), device=c.device)
        exact = _sq_dist([p[local, i] for p in sub], [p[local, j] for p in sub]).sqrt()
        result[todo] = torch.maximum(exact, lower[todo])  # both are measured distances of pairs
    return result.clamp(max=2.0 * c_max)  # ≤ 2C holds exactly; the clamp only removes float rounding


def _check_chunk_size(chunk_size: Any) -> Optional[int]:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(
            f"Expected argument `chunk_size` to be a positive int (examples per chunk) or None, but got {chunk_size!r}."
        )
    return int(chunk_size)


# ---------------------------------------------------------------------------------------- Gram backend
def gram_backend_reason(module: nn.Module, *, params: Optional[Mapping[str, torch.Tensor]] = None) -> Optional[str]:
    """Why the Gram backend cannot take ``module`` (``None`` if it can): what ``backend="auto"`` decides on.

    The Gram backend needs every trainable parameter to sit in exactly one supported layer (exact types:
    ``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.GroupNorm``,
    ``nn.RMSNorm`` and Opacus' ``RNNLinear`` and ``SequenceBias``, hence ``DPMultiheadAttention``, ``DPLSTM``,
    ``DPGRU`` and ``DPRNN``) and no active dropout layer. A batch can still be refused at run time (a layer
    that folds the batch into another dimension, packed sequences); ``"auto"`` then uses torch.func.

    Example::

        >>> gram_backend_reason(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(16, 2))) is None
        True
        >>> print(gram_backend_reason(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4).eval())))
        parameter '1.weight' belongs to '1', a BatchNorm1d (not a supported layer)
    """
    trainable, _ = _split_params(module, params, None)
    found = _gram.plan(module, trainable)
    return found if isinstance(found, str) else None


def _gram_sensitivities(
    module, layers, trainable, frozen, loss_fn, attribute, inputs, targets, c_max, method, chunk_size
):
    """Per-example sensitivities on the Gram backend, chunk by chunk (raises _gram.Unsupported if it cannot)."""
    n, k = tree_batch_size(inputs), attribute.size
    state = {"copy": False}

    def run(index: torch.Tensor, copies: int = 1) -> tuple:
        """Sensitivities of the examples ``index`` (each taken ``copies`` times; the first copy is kept)."""
        rows = index.repeat(copies) if copies > 1 else index
        b = len(rows)
        if index.is_contiguous() and copies == 1 and bool((index[1:] - index[:-1] == 1).all()):
            pick = lambda t: t[int(index[0]) : int(index[0]) + b]  # noqa: E731  (a view, no gather)
        else:
            pick = lambda t: t[rows.to(t.device)]  # noqa: E731
        x = _tree_map(lambda t: t.reshape(b * k, *t.shape[2:]), attribute.expand(_tree_map(pick, inputs)))
        y = _tree_map(lambda t: pick(t).repeat_interleave(k, dim=0), targets)
        try:
            gram, held = _gram.chunk_gram(module, layers, trainable, frozen, loss_fn, x, y, b, k, state["copy"])
        except _gram.InPlace as exc:
            if state["copy"]:
                raise _gram.Unsupported(
                    f"layer {exc}: captured tensors are modified in place even when copied"
                ) from exc
            state["copy"] = True  # an in-place op downstream of a hooked layer: hand on copies from now on
            return run(index, copies)
        except _gram.Ambiguous:
            # some layer's sequence length equals the row count b·|A|: any other row count tells the dims apart
            if len(index) > 1:
                first, _ = run(index[:-1])
                last, held = run(index[-1:])
                return torch.cat([first, last]), held
            if copies < 3:  # one example: run it twice (or three times) and keep one copy
                return run(index, copies + 1)
            raise
        return _sensitivity_from_gram(gram[: len(index)], c_max, method), held / b  # elements held per example

    dtype = next(iter(trainable.values())).dtype
    out, start = [], 0
    step = chunk_size or 1  # without a chunk size, the first example measures the memory one example needs
    while start < n:
        stop = min(n, start + step)
        values, held = run(torch.arange(start, stop))
        out.append(values.to(dtype))
        if chunk_size is None:
            step = max(1, int(GRAM_CHUNK_ELEMENTS // max(held, 1.0)))
        start = stop
    return torch.cat(out)


def _sensitivity_from_gram(gram: torch.Tensor, c_max: float, method: str) -> torch.Tensor:
    """Per-example exact diameter / approximate bound from unclipped Gram matrices ``(b, k, k)``."""
    k = gram.shape[1]
    c = clip_factors(gram.diagonal(dim1=1, dim2=2), c_max)
    gc = gram * c.unsqueeze(2) * c.unsqueeze(1)
    diag = gc.diagonal(dim1=1, dim2=2)
    if method == "approximate":
        r2 = diag - 2.0 * gc.mean(dim=2) + gc.mean(dim=(1, 2)).unsqueeze(1)  # ‖ḡₐ − v‖², v = mean
        value = 2.0 * r2.clamp_min(0.0).max(dim=1).values.sqrt()
    else:
        value = (
            (diag.unsqueeze(2) + diag.unsqueeze(1) - 2.0 * gc)
            .clamp_min(0.0)
            .reshape(len(gram), k * k)
            .max(dim=1)
            .values.sqrt()
        )
    return value.clamp(max=2.0 * c_max)  # float64; the caller casts to the parameters' dtype


# ---------------------------------------------------------------------------------------- driver
BACKENDS = ("auto", "func", "gram", "linear")


def _sensitivities(
    module,
    inputs,
    targets,
    *,
    attribute,
    max_grad_norm,
    method,
    values,
    loss_fn,
    params,
    buffers,
    chunk_size,
    randomness,
    backend,
    prune,
    rounding_allowance,
) -> torch.Tensor:
    _check_module(module)
    c_max = _check_max_grad_norm(max_grad_norm)
    _check_method(method)
    chunk_size = _check_chunk_size(chunk_size)
    allowance = _check_rounding_allowance(rounding_allowance)
    if not isinstance(attribute, SensitiveAttribute):
        raise TypeError(
            f"Expected argument `attribute` to be a SensitiveAttribute, but got {type(attribute).__name__}."
        )
    if randomness not in ("different", "same"):
        raise ValueError(f"Expected argument `randomness` to be 'different' or 'same', but got {randomness!r}.")
    if backend not in BACKENDS:
        raise ValueError(f"Expected argument `backend` to be one of {BACKENDS}, but got {backend!r}.")
    attribute = attribute.select(values)
    n = tree_batch_size(inputs)
    if tree_batch_size(targets) != n:
        raise ValueError(
            f"Expected `targets` to have the batch size of `inputs` ({n}), but got {tree_batch_size(targets)}."
        )
    trainable, frozen = _split_params(module, params, buffers)
    device = next(iter(trainable.values())).device
    if n == 0:
        return torch.zeros(0, device=device)
    # Full width whatever the caller's precision: bf16/fp16 tensors upcast (exactly) to float32, no autocast.
    trainable, frozen = ({name: at_least_float32(t) for name, t in d.items()} for d in (trainable, frozen))
    inputs, targets = (_tree_map(at_least_float32, t) for t in (inputs, targets))
    with _full_precision(device):
        per_example = _measure(
            module,
            inputs,
            targets,
            attribute,
            trainable,
            frozen,
            loss_fn,
            c_max,
            method,
            chunk_size,
            randomness,
            backend,
            prune,
        )
    if allowance:
        per_example = (per_example + allowance).clamp(max=2.0 * c_max)  # the exact value is <= 2C
    return per_example


def _measure(
    module,
    inputs,
    targets,
    attribute,
    trainable,
    frozen,
    loss_fn,
    c_max,
    method,
    chunk_size,
    randomness,
    backend,
    prune,
) -> torch.Tensor:
    """Per-example sensitivities of a validated, non-empty batch (see :func:`_sensitivities`)."""
    n, k = tree_batch_size(inputs), attribute.size
    if backend != "func":
        layers = _gram.plan(module, trainable)
        reason = layers if isinstance(layers, str) else None
        if reason is None:
            try:
                return _gram_sensitivities(
                    module, layers, trainable, frozen, loss_fn, attribute, inputs, targets, c_max, method, chunk_size
                )
            except _gram.Unsupported as exc:
                reason = str(exc)
        if backend != "auto":
            raise ValueError(f"backend={backend!r} cannot take this module: {reason}. Use backend='func' (or 'auto').")
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // (k * sum(p.numel() for p in trainable.values())))
    per_value = vmap(_example_grad_fn(module, loss_fn, frozen), in_dims=(None, 0, None), randomness="same")
    per_example = vmap(per_value, in_dims=(None, 0, 0), randomness=randomness)
    out = []
    floor = 0.0 if prune else None
    for start in range(0, n, chunk_size):
        x = _tree_map(lambda t: t[start : start + chunk_size], inputs)
        y = _tree_map(lambda t: t[start : start + chunk_size], targets)
        grads = per_example(trainable, attribute.expand(x), y)  # {name: (b, k, *shape)}
        out.append(_sensitivity(_flat(grads), c_max, method, floor, in_place=True))  # fresh gradients
        if prune:
            floor = max(floor, float(out[-1].max()))
    return torch.cat(out)


_SHARED_ARGS = """
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
        backend: ``"func"`` (torch.func per-sample gradients, any module), ``"gram"`` (Gram matrices
            from one batched forward/backward, for modules whose trainable parameters all sit in
            supported layers — Linear, Conv, Embedding, LayerNorm/RMSNorm/GroupNorm, Opacus'
            DPMultiheadAttention and DP RNNs — without active dropout; ``"linear"`` is its former name)
            or ``"auto"`` (``"gram"`` when it applies). All give the same values up to rounding.
        rounding_allowance: added to every example's sensitivity (capped at 2C, before any maximum), so
            float rounding cannot put the result below the exact value; see
            :func:`sensitivity_rounding_allowance` for a value (default 0: the computed value as is)."""


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
    backend: str = "auto",
    rounding_allowance: float = 0.0,
) -> torch.Tensor:
    """Per-example sensitivity ``diam{ḡ((φ(z), a)) : a ∈ A}`` (or its upper bound) for a batch.

    Computed in the parameters' dtype, at least float32, with autocast disabled: bfloat16/float16
    parameters, buffers, inputs and targets are upcast (exactly) first, so a call from inside a
    bf16-mixed step measures the full-width value. The result is in that dtype.

    Args:{args}

    Returns:
        ``(B,)`` tensor with entries in ``[0, 2C]`` (``[min(rounding_allowance, 2C), 2C]``; empty for an
        empty batch).

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
        >>> func = attribute_sensitivities(model, x, y, attribute=attr, max_grad_norm=0.1, method="exact", backend="func")
        >>> torch.allclose(func, exact, atol=1e-6)
        True
    """
    return _sensitivities(
        module,
        inputs,
        targets,
        attribute=attribute,
        max_grad_norm=max_grad_norm,
        method=method,
        values=values,
        loss_fn=loss_fn,
        params=params,
        buffers=buffers,
        chunk_size=chunk_size,
        randomness=randomness,
        backend=backend,
        prune=False,
        rounding_allowance=rounding_allowance,
    )


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
    backend: str = "auto",
    sync: bool = True,
    rounding_allowance: float = 0.0,
) -> float:
    """R_t of Corollary 10: the largest per-example sensitivity of the batch (0 for an empty batch).

    With ``sync=True`` and an initialised ``torch.distributed`` process group the maximum is also
    taken across processes (a collective call: every rank must call it), so every rank gets the R_t
    of the global batch. With ``method="exact"`` on the torch.func path, examples whose upper bound
    cannot beat a diameter already found skip their |A|×|A| Gram matrix (the maximum is unchanged).

    Precision as in :func:`attribute_sensitivities` (at least float32, autocast disabled). For a value that
    float rounding cannot put below the exact R_t, pass
    ``rounding_allowance=sensitivity_rounding_allowance(dtype, max_grad_norm=C)`` (what
    :class:`~lightning_privacy.AttributeInferenceMonitor` does): it is added before the maximum and the
    cross-process reduction.

    Args:{args}
        sync: take the maximum across processes too.

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
        >>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
        >>> allowance = sensitivity_rounding_allowance(torch.float32, max_grad_norm=1.0)
        >>> safe = attribute_sensitivity(model, x, y, attribute=sex, max_grad_norm=1.0, rounding_allowance=allowance)
        >>> plain = attribute_sensitivity(model, x, y, attribute=sex, max_grad_norm=1.0)
        >>> round((safe - plain) / allowance, 3)
        1.0
    """
    per_example = _sensitivities(
        module,
        inputs,
        targets,
        attribute=attribute,
        max_grad_norm=max_grad_norm,
        method=method,
        values=values,
        loss_fn=loss_fn,
        params=params,
        buffers=buffers,
        chunk_size=chunk_size,
        randomness=randomness,
        backend=backend,
        prune=True,
        rounding_allowance=rounding_allowance,
    )
    local = per_example.max() if per_example.numel() else per_example.new_zeros(())
    if sync and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        local = local.detach().clone()
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return float(local)


attribute_sensitivities.__doc__ = attribute_sensitivities.__doc__.replace("{args}", _SHARED_ARGS)
attribute_sensitivity.__doc__ = attribute_sensitivity.__doc__.replace("{args}", _SHARED_ARGS)


def step_sensitivity(
    twin: nn.Module,
    module: nn.Module,
    inputs: Any,
    targets: Any,
    *,
    attribute: SensitiveAttribute,
    max_grad_norm: float,
    params: Mapping[str, torch.Tensor],
    buffers: Optional[Mapping[str, torch.Tensor]] = None,
    method: str = "approximate",
    loss_fn: LossFn = F.cross_entropy,
    chunk_size: Optional[int] = None,
    backend: str = "auto",
    sync: bool = True,
) -> float:
    """R_t of one DP-SGD step as :class:`~lightning_privacy.AttributeInferenceMonitor` measures it.

    ``twin`` (:func:`hook_free_twin` of ``module``) takes ``module``'s training mode and is called with ``params`` and
    ``buffers`` (``module``'s own, all-gathered where sharded); with ``sync`` the value is the maximum over processes
    (a collective call). Other arguments as in :func:`attribute_sensitivity`.

    Precision: R_t is computed in float32 (the parameters' dtype if wider) outside autocast, whatever precision the
    Trainer uses (16-bit weights and inputs are upcast exactly), plus the allowance of the trainable parameters'
    dtype, 1024·eps·C (1.2e-4·C in float32, :func:`sensitivity_rounding_allowance`), so that float rounding cannot put
    it below the exact value for the step's weights and batch (tested against a float64 brute force under bf16-mixed
    on CNN, attention, LSTM and frozen-backbone models, where float32 alone came out up to 2.1e-7·C below). The
    allowance lowers β*_AI by 6e-6 (approximate R_t) and 9e-6 (exact) in the 30-epoch Adult reproduction and by at
    most 6e-5 on those test models (2 epochs at σ = 1): for R_t ≥ 0.023·C it moves R_t up by at most one of the
    ledger's levels.

    Example::

        >>> _ = torch.manual_seed(0); model = nn.Linear(3, 2)
        >>> sex = SensitiveAttribute.one_hot(columns=[1, 2], values=["F", "M"])
        >>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
        >>> r = step_sensitivity(hook_free_twin(model), model, x, y, attribute=sex, max_grad_norm=1.0,
        ...                      params=dict(model.named_parameters()))
        >>> allowance = sensitivity_rounding_allowance(torch.float32, max_grad_norm=1.0)
        >>> r == attribute_sensitivity(model, x, y, attribute=sex, max_grad_norm=1.0, rounding_allowance=allowance)
        True
    """
    sync_training_mode(twin, module)
    dtype = next((p.dtype for p in module.parameters() if p.requires_grad), torch.float32)
    return attribute_sensitivity(
        twin,
        inputs,
        targets,
        attribute=attribute,
        max_grad_norm=max_grad_norm,
        method=method,
        loss_fn=loss_fn,
        params=params,
        buffers=buffers,
        chunk_size=chunk_size,
        backend=backend,
        sync=sync,
        rounding_allowance=sensitivity_rounding_allowance(dtype, max_grad_norm=max_grad_norm),
    )

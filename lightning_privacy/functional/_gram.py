r"""Gram matrices of per-sample gradients from one batched forward/backward, layer by layer (no vmap).

Private backend of :mod:`lightning_privacy.functional.attribute_sensitivity` (``backend="gram"``).

For the ``N = b·k`` rows of a chunk (``b`` examples, each with its ``k = |A|`` substitutions, example-major),
forward hooks on every supported layer record its input ``a`` and output; one ``autograd.grad`` of the
summed per-row losses with respect to those outputs gives the back-propagated errors ``δ``. No parameter
gradient is formed by autograd. Each layer then adds its share of the per-example Gram matrices
``G[i] ∈ R^{k×k}``, ``G[i]_{uv} = ⟨g_{(i,u)}, g_{(i,v)}⟩`` of the UNCLIPPED per-sample gradients, in float64.
A parameter belongs to exactly one layer, so the flat inner product is the sum of the per-layer ones.

Per-layer formulas (row ``n``, positions ``t`` — sequence positions, conv output locations, and every
call of a layer used several times, e.g. a DPLSTM cell at each time step):

- Linear (also Opacus' ``RNNLinear``), input ``[N, *, d_in]``: ``∇W_n = Σ_t δ_{nt} a_{nt}ᵀ``, ``∇b_n = Σ_t δ_{nt}``.
  Either the "ghost" form ``⟨∇W_n, ∇W_m⟩ = Σ_{t,s} (a_{nt}·a_{ms})(δ_{nt}·δ_{ms})`` (Li et al. 2022; cost
  per example ∝ k²T²(d_in + d_out)) or ``∇W_n`` materialised (∝ k·T·d_in·d_out + k²·d_in·d_out),
  whichever is cheaper (:func:`prefer_ghost`); for k = 1 this is the usual "ghost where T² < d_in·d_out".
- Conv1d/2d/3d: the input is unfolded into its receptive fields (as Opacus' conv grad sampler does), then
  it is the Linear case per group with ``T`` = output locations.
- Embedding, indices ``[N, *]``: ``∇E_n = Σ_t e_{idx_{nt}} δ_{nt}ᵀ`` (``padding_idx`` rows excluded), either
  ghost ``Σ_{t,s} [idx_{nt} = idx_{ms}] (δ_{nt}·δ_{ms})`` or materialised on each example's own
  vocabulary (the distinct indices of its k·T positions), never on the whole table.
- LayerNorm / RMSNorm / GroupNorm: ``∇γ_n = Σ_t x̂_{nt} ⊙ δ_{nt}``, ``∇β_n = Σ_t δ_{nt}`` with ``x̂`` the
  normalised input (Opacus' grad samplers), materialised (they are small).
- Opacus' ``SequenceBias`` (DPMultiheadAttention with ``add_bias_kv``): ``∇b_n = δ`` at the appended position.

The batch dimension of a layer's input is found from its shape (dim 0, or dim 1 for sequence-first
``[T, N, …]`` inputs; inside a ``DPMultiheadAttention(batch_first=False)`` it is dim 1). When both
could be the batch (``T == N``) the chunk is split and redone (:class:`Ambiguous`). Anything that does
not fit raises :class:`Unsupported`, and the caller falls back to torch.func.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from lightning_privacy.attributes import _tree_map

try:  # Opacus' DP building blocks (a dependency of the package); kept optional for this module
    from opacus.layers.dp_multihead_attention import DPMultiheadAttention, SequenceBias
    from opacus.layers.dp_rnn import RNNLinear
    from opacus.layers.param_rename import RenameParamsMixin
    from opacus.utils.tensor_utils import unfold2d, unfold3d
except ImportError:  # pragma: no cover - opacus is a hard dependency today
    DPMultiheadAttention = SequenceBias = RNNLinear = RenameParamsMixin = unfold2d = unfold3d = None

__all__ = ["Unsupported", "Ambiguous", "InPlace", "Layer", "plan", "chunk_gram", "prefer_ghost", "supported_types"]


class Unsupported(Exception):
    """The module (or this batch) does not fit the Gram backend; the message says why."""


class Ambiguous(Unsupported):
    """A layer's input could have its batch on dim 0 or dim 1 (``T == N``); another chunk size decides."""


class InPlace(Exception):
    """A captured activation or layer output was modified in place later in the forward; redo with copies."""


def _kinds() -> Dict[type, str]:
    kinds: Dict[type, str] = {
        nn.Linear: "linear",
        nn.Conv1d: "conv",
        nn.Conv2d: "conv",
        nn.Conv3d: "conv",
        nn.Embedding: "embedding",
        nn.LayerNorm: "layer_norm",
        nn.GroupNorm: "group_norm",
    }
    if hasattr(nn, "RMSNorm"):
        kinds[nn.RMSNorm] = "rms_norm"
    if RNNLinear is not None:
        kinds[RNNLinear] = "linear"
        kinds[SequenceBias] = "sequence_bias"
    return kinds


KINDS = _kinds()


def supported_types() -> Tuple[type, ...]:
    """The layer classes (exact types, not subclasses) whose parameters the Gram backend handles."""
    return tuple(KINDS)


@dataclass
class Layer:
    """A hooked layer: its trainable local parameter names and the batch dim of its input (None: from shape)."""

    name: str
    module: nn.Module
    kind: str
    trainable: Tuple[str, ...]
    batch_dim: Optional[int] = None
    calls: List[tuple] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- plan
def _active_dropout(module: nn.Module) -> Optional[str]:
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0:
            return name or type(m).__name__
    return None


def plan(module: nn.Module, trainable: Mapping[str, Any]) -> Union[List[Layer], str]:
    """The layers to hook if every trainable parameter sits in exactly one supported layer, else the reason."""
    dropout = _active_dropout(module)
    if dropout is not None:
        return (
            f"submodule {dropout!r} is an active dropout layer (the Gram backend cannot share its masks between an "
            "example's substitutions; torch.func does)"
        )
    own = dict(module.named_parameters())
    wanted = {id(own[n]): n for n in trainable}
    owners: Dict[int, List[Tuple[str, nn.Module, str]]] = {i: [] for i in wanted}
    for name, m in module.named_modules():
        for local, p in m._parameters.items():
            if p is not None and id(p) in owners:
                owners[id(p)].append((name, m, local))
    layers: Dict[int, Layer] = {}
    for pid, found in owners.items():
        real = [o for o in found if not (RenameParamsMixin is not None and isinstance(o[1], RenameParamsMixin))]
        full = wanted[pid]
        if len(real) != 1:
            where = [o[0] or type(o[1]).__name__ for o in real]
            return f"parameter {full!r} is shared by the layers {where} (tied weights)"
        name, m, local = real[0]
        kind = KINDS.get(type(m))
        if kind is None:
            return (
                f"parameter {full!r} belongs to {name or 'the module'!r}, a {type(m).__name__} (not a supported layer)"
            )
        if kind == "embedding" and (m.max_norm is not None or m.scale_grad_by_freq):
            return f"embedding {name!r} uses max_norm or scale_grad_by_freq"
        layer = layers.setdefault(id(m), Layer(name, m, kind, ()))
        layer.trainable += (local,)
    if DPMultiheadAttention is not None:
        for m in module.modules():
            if isinstance(m, DPMultiheadAttention) and not m.batch_first:
                for child in (m.qlinear, m.klinear, m.vlinear, m.out_proj):
                    if id(child) in layers:
                        layers[id(child)].batch_dim = 1
    for layer in layers.values():
        if layer.kind == "sequence_bias":
            layer.batch_dim = 0 if layer.module.batch_first else 1
    return list(layers.values())


# ---------------------------------------------------------------------------------------- helpers
def _batch_dim(layer: Layer, shape: Sequence[int], rows: int, lead: int) -> int:
    """The batch dim of an input/output of ``shape`` whose first ``lead`` dims are not features."""
    if layer.batch_dim is not None:
        if len(shape) > layer.batch_dim and shape[layer.batch_dim] == rows:
            return layer.batch_dim
        raise Unsupported(
            f"layer {layer.name!r}: expected {rows} rows on dim {layer.batch_dim}, got shape {list(shape)}"
        )
    found = [d for d in range(min(lead, 2)) if shape[d] == rows]
    if len(found) == 1:
        return found[0]
    if not found:
        raise Unsupported(
            f"layer {layer.name!r} sees an input of shape {list(shape)}: no batch dimension of size {rows} "
            "(batch folded into another dim, packed sequence or unbatched call)"
        )
    raise Ambiguous(f"layer {layer.name!r}: dims 0 and 1 both have size {rows}")


def _rows_first(t: torch.Tensor, dim: int, rows: int, tail: int) -> torch.Tensor:
    """``t`` with its batch dim first and every other non-feature dim flattened: ``[rows, T, *last tail dims]``."""
    if dim:
        t = t.movedim(dim, 0)
    return t.reshape(rows, -1, *t.shape[t.ndim - tail :]) if tail else t.reshape(rows, -1)


def _gram_of(flat: torch.Tensor, b: int, k: int) -> torch.Tensor:
    """``(b, k, k)`` float64 Gram of materialised per-row vectors ``flat`` of shape ``[b·k, P]``."""
    g = flat.reshape(b, k, -1).double()
    return torch.bmm(g, g.transpose(1, 2))


#: tests set this to "ghost" or "materialise" to exercise one form everywhere it is a choice
FORCE: Optional[str] = None


def prefer_ghost(k: int, positions: int, d_in: int, d_out: int) -> bool:
    """Ghost Gram cheaper than materialising ``∇W`` (per group and example; float64 work counted twice)?

    ghost: ``2·k²T²(d_in + d_out + 1)``; materialise: ``k·T·d_in·d_out + 2·k²·d_in·d_out``.
    """
    if FORCE is not None:
        return FORCE == "ghost"
    t = positions
    return 2 * k * k * t * t * (d_in + d_out + 1) < k * t * d_in * d_out + 2 * k * k * d_in * d_out


def _ghost(a: torch.Tensor, d: torch.Tensor, b: int, k: int, bias: bool) -> torch.Tensor:
    """``Σ_g Σ_{t,s} (a_t·a_s + 1)(δ_t·δ_s)`` for ``a: [N, G, T, d_in]``, ``d: [N, G, T, d_out]`` -> ``(b, k, k)``.

    The ``+ 1`` (the bias) only when ``bias``. Products and sums in float64.
    """
    n, groups, t = d.shape[:3]

    def pairs(x):
        x = x.reshape(b, k, groups, t, x.shape[-1]).transpose(1, 2).reshape(b * groups, k * t, x.shape[-1]).double()
        return torch.bmm(x, x.transpose(1, 2))

    aa = pairs(a)
    prod = (aa.add_(1.0) if bias else aa).mul_(pairs(d))
    if groups == 1 and t == 1:
        return prod
    return prod.view(b, groups, k, t, k, t).sum(dim=(1, 3, 5))


def _linear_like(
    a: torch.Tensor, d: torch.Tensor, b: int, k: int, weight: bool, bias: bool
) -> Tuple[torch.Tensor, int]:
    """Gram share of a (grouped) linear map ``a: [N, G, T, d_in] -> d: [N, G, T, d_out]``; returns (gram, elements)."""
    n, groups, t, d_in = a.shape
    d_out = d.shape[-1]
    if weight and ((t == 1 and FORCE is None) or prefer_ghost(k, t, d_in, d_out)):
        return _ghost(a, d, b, k, bias), 2 * b * groups * (k * t) ** 2 + n * groups * t * (d_in + d_out)
    gram = torch.zeros(b, k, k, dtype=torch.float64, device=d.device)
    work = 0
    if weight:
        grads = torch.bmm(d.reshape(n * groups, t, d_out).transpose(1, 2), a.to(d.dtype).reshape(n * groups, t, d_in))
        gram += _gram_of(grads.reshape(n, -1), b, k)
        work += 2 * n * groups * d_in * d_out
    if bias:
        gram += _gram_of(d.sum(dim=2).reshape(n, -1), b, k)
    return gram, work


# ---------------------------------------------------------------------------------------- layers
def _calls(layer: Layer):
    """(input, output, output gradient) of every call whose output reaches the loss."""
    return [(x, out, g) for x, out, g in layer.calls if g is not None]


def _linear(layer: Layer, rows: int, b: int, k: int):
    m = layer.module
    xs, gs = [], []
    for x, _, g in _calls(layer):
        dim = _batch_dim(layer, x.shape, rows, x.ndim - 1)
        xs.append(_rows_first(x, dim, rows, 1))
        gs.append(_rows_first(g, dim, rows, 1))
    if not xs:
        return None, 0
    a = torch.cat(xs, 1).unsqueeze(1) if len(xs) > 1 else xs[0].unsqueeze(1)
    d = torch.cat(gs, 1).unsqueeze(1) if len(gs) > 1 else gs[0].unsqueeze(1)
    return _linear_like(a, d, b, k, "weight" in layer.trainable, m.bias is not None and "bias" in layer.trainable)


def _ntuple(value, n: int) -> Tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def _unfold(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Receptive fields ``[N, C_in·Πk, L]`` (channel-major, as ``weight.view(C_out, -1)``), by Opacus' unfold.

    Opacus' strided-view ``unfold2d``/``unfold3d`` make one copy and are much faster than ``F.unfold``'s
    im2col on CPU; they pad with zeros themselves (``"same"`` with the extra element on the right, as torch).
    Other padding modes are applied here first.
    """
    nd = x.ndim - 2
    x = x.contiguous()  # Opacus' unfolds take strides as if the (padded) input were contiguous
    kernel, stride, dilation = _ntuple(m.kernel_size, nd), _ntuple(m.stride, nd), _ntuple(m.dilation, nd)
    padding = m.padding if isinstance(m.padding, str) else _ntuple(m.padding, nd)
    if m.padding_mode != "zeros" and padding != "valid":
        if padding == "same":
            totals = [dilation[i] * (kernel[i] - 1) for i in range(nd)]
            pairs = [(t // 2, t - t // 2) for t in totals]
        else:
            pairs = [(p, p) for p in padding]
        x = F.pad(x, [p for pair in reversed(pairs) for p in pair], mode=m.padding_mode)
        padding = (0,) * nd
    if nd == 3:
        return unfold3d(x, kernel_size=kernel, padding=padding, stride=stride, dilation=dilation)
    if nd == 1:  # as a 2-D convolution of height 1
        x, kernel, stride, dilation = x.unsqueeze(2), (1, *kernel), (1, *stride), (1, *dilation)
        padding = padding if isinstance(padding, str) else (0, *padding)
    return unfold2d(x, kernel_size=kernel, padding=padding, stride=stride, dilation=dilation)


def _conv(layer: Layer, rows: int, b: int, k: int):
    m = layer.module
    nd = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}[type(m)]
    xs, gs = [], []
    for x, _, g in _calls(layer):
        if x.ndim != nd + 2 or x.shape[0] != rows:
            raise Unsupported(f"conv {layer.name!r}: expected a batched input with {rows} rows, got {list(x.shape)}")
        cols = _unfold(m, x)  # [N, C_in·Πk, L]
        g = g.reshape(rows, m.out_channels, -1)  # [N, C_out, L]
        if cols.shape[-1] != g.shape[-1]:
            raise Unsupported(f"conv {layer.name!r}: unfolded {cols.shape[-1]} locations, output has {g.shape[-1]}")
        xs.append(cols)
        gs.append(g)
    if not xs:
        return None, 0
    groups = m.groups
    a = torch.cat(xs, 2) if len(xs) > 1 else xs[0]  # [N, C_in·Πk, L]
    d = torch.cat(gs, 2) if len(gs) > 1 else gs[0]  # [N, C_out, L]
    locations = a.shape[-1]
    d_in, d_out = a.shape[1] // groups, m.out_channels // groups
    weight, bias = "weight" in layer.trainable, m.bias is not None and "bias" in layer.trainable
    if weight and not prefer_ghost(k, locations, d_in, d_out):
        # materialised per-sample gradients, one batched product (Opacus' einsum "noq,npq->nop", per group)
        grads = torch.bmm(
            d.reshape(rows * groups, d_out, locations),
            a.to(d.dtype).reshape(rows * groups, d_in, locations).transpose(1, 2),
        )
        gram = _gram_of(grads.reshape(rows, -1), b, k)
        if bias:
            gram += _gram_of(d.sum(dim=2), b, k)
        return gram, a.numel() + 2 * grads.numel()
    a = a.view(rows, groups, d_in, locations).transpose(2, 3)  # [N, G, L, d_in]
    d = d.view(rows, groups, d_out, locations).transpose(2, 3)  # [N, G, L, d_out]
    gram, work = _linear_like(a, d, b, k, weight, bias)
    return gram, work + a.numel()


def _embedding_ghost(idx: torch.Tensor, d: torch.Tensor, b: int, k: int):
    """``Σ_{t,s} [idx_t = idx_s] (δ_t·δ_s)`` for ``idx: [N, T]``, ``d: [N, T, E]``."""
    t, e = idx.shape[1], d.shape[-1]
    flat = idx.reshape(b, k * t)
    same = (flat.unsqueeze(2) == flat.unsqueeze(1)).double()
    dd = d.reshape(b, k * t, e).double()
    same.mul_(torch.bmm(dd, dd.transpose(1, 2)))
    return same.view(b, k, t, k, t).sum(dim=(2, 4)), 3 * b * (k * t) ** 2


def _embedding(layer: Layer, rows: int, b: int, k: int):
    m = layer.module
    idx_list, gs = [], []
    for idx, _, g in _calls(layer):
        dim = _batch_dim(layer, idx.shape, rows, idx.ndim)
        idx_list.append(_rows_first(idx, dim, rows, 0))
        gs.append(_rows_first(g, dim, rows, 1))
    if not idx_list:
        return None, 0
    idx = torch.cat(idx_list, 1)  # [N, T]
    d = torch.cat(gs, 1)  # [N, T, E]
    if m.padding_idx is not None:
        d = d * (idx != m.padding_idx).unsqueeze(-1).to(d.dtype)
    t, e = idx.shape[1], d.shape[-1]
    if (t == 1 and FORCE is None) or FORCE == "ghost":
        return _embedding_ghost(idx, d, b, k)
    # distinct indices of each example over its k·T positions (its own small vocabulary)
    keys = torch.arange(b, device=idx.device).unsqueeze(1) * m.num_embeddings + idx.reshape(b, k * t)
    uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    starts = torch.searchsorted(uniq, torch.arange(b, device=idx.device) * m.num_embeddings)
    width = int(torch.diff(torch.cat([starts, starts.new_tensor([len(uniq)])])).max())
    if FORCE is None and 2 * k * t * t * (e + 1) < t * e + 2 * k * width * e:  # ghost cheaper (per example, ÷k)
        return _embedding_ghost(idx, d, b, k)
    local = (inverse - starts.unsqueeze(1)).reshape(rows, t)  # column of each position in its example's vocabulary
    grads = d.new_zeros(rows, width, e)
    grads.scatter_add_(1, local.unsqueeze(-1).expand(rows, t, e), d)
    return _gram_of(grads.reshape(rows, -1), b, k), 2 * rows * width * e


def _norm_grads(layer: Layer, rows: int, normalise: Callable):
    """Per-row ``[Σ x̂⊙δ, Σ δ]`` over calls and positions, ``[N, P]`` (LayerNorm/RMSNorm: trailing feature dims)."""
    m = layer.module
    tail = len(m.normalized_shape)
    w_sum = b_sum = None
    for x, _, g in _calls(layer):
        dim = _batch_dim(layer, x.shape, rows, x.ndim - tail)
        if "weight" in layer.trainable:
            w = _rows_first(normalise(m, x) * g, dim, rows, tail).sum(1)
            w_sum = w if w_sum is None else w_sum + w
        if getattr(m, "bias", None) is not None and "bias" in layer.trainable:
            s = _rows_first(g, dim, rows, tail).sum(1)
            b_sum = s if b_sum is None else b_sum + s
    parts = [p.reshape(rows, -1) for p in (w_sum, b_sum) if p is not None]
    return torch.cat(parts, 1) if parts else None


def _finish(flat: Optional[torch.Tensor], b: int, k: int):
    if flat is None:
        return None, 0
    return _gram_of(flat, b, k), 2 * flat.numel()


def _layer_norm(layer: Layer, rows: int, b: int, k: int):
    return _finish(_norm_grads(layer, rows, lambda m, x: F.layer_norm(x, m.normalized_shape, eps=m.eps)), b, k)


def _rms_norm(layer: Layer, rows: int, b: int, k: int):
    return _finish(_norm_grads(layer, rows, lambda m, x: F.rms_norm(x, m.normalized_shape, eps=m.eps)), b, k)


def _group_norm(layer: Layer, rows: int, b: int, k: int):
    # the affine parameters act on dim 1 (channels); every later dim is summed over, as in Opacus
    m = layer.module
    w_sum = b_sum = None
    for x, _, g in _calls(layer):
        if x.ndim < 2 or x.shape[0] != rows:
            raise Unsupported(f"group norm {layer.name!r}: expected {rows} rows on dim 0, got {list(x.shape)}")
        if "weight" in layer.trainable:
            w = (F.group_norm(x, m.num_groups, eps=m.eps) * g).reshape(rows, m.num_channels, -1).sum(2)
            w_sum = w if w_sum is None else w_sum + w
        if m.bias is not None and "bias" in layer.trainable:
            s = g.reshape(rows, m.num_channels, -1).sum(2)
            b_sum = s if b_sum is None else b_sum + s
    parts = [p for p in (w_sum, b_sum) if p is not None]
    return _finish(torch.cat(parts, 1) if parts else None, b, k)


def _sequence_bias(layer: Layer, rows: int, b: int, k: int):
    total = None
    for _, out, g in _calls(layer):
        dim = _batch_dim(layer, out.shape, rows, 2)
        last = g[:, -1] if dim == 0 else g[-1]
        total = last if total is None else total + last
    return _finish(total, b, k)


HANDLERS = {
    "linear": _linear,
    "conv": _conv,
    "embedding": _embedding,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "group_norm": _group_norm,
    "sequence_bias": _sequence_bias,
}


# ---------------------------------------------------------------------------------------- one chunk
def _first_input(args: tuple, kwargs: dict) -> Any:
    if args:
        return args[0]
    if kwargs:
        return next(iter(kwargs.values()))
    raise Unsupported("a hooked layer was called without an input")


@torch.enable_grad()  # also when called from a no_grad context
def chunk_gram(
    module: nn.Module,
    layers: List[Layer],
    trainable: Mapping[str, torch.Tensor],
    frozen: Mapping[str, torch.Tensor],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    inputs: Any,
    targets: Any,
    b: int,
    k: int,
    copy_outputs: bool = False,
) -> Tuple[torch.Tensor, int]:
    """``(b, k, k)`` float64 Gram matrices of the unclipped per-sample gradients of ``b·k`` example-major rows.

    Returns the Gram matrices and the number of tensor elements the chunk held (to size the next chunk).
    With ``copy_outputs`` every hooked output is handed on as a copy, so in-place operations downstream
    (``ReLU(inplace=True)``) cannot alter what was captured.

    Raises:
        Unsupported: a layer's input does not fit (see the module docstring); Ambiguous: retry with
            another chunk size; InPlace: retry with ``copy_outputs=True``.
    """
    rows = b * k

    def hook(m, args, kwargs, out, layer):
        x = _first_input(args, kwargs)
        if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
            raise Unsupported(f"layer {layer.name!r} takes or returns something other than one tensor")
        if copy_outputs:
            x = x.detach().clone()
            layer.calls.append((x, out, x._version, out._version))
            return out.clone()
        layer.calls.append((x, out, x._version, out._version))
        return None

    for layer in layers:
        layer.calls = []
    handles = [
        layer.module.register_forward_hook(
            lambda m, args, kwargs, out, layer=layer: hook(m, args, kwargs, out, layer), with_kwargs=True
        )
        for layer in layers
    ]
    try:
        params = {n: t.detach().requires_grad_(True) for n, t in trainable.items()}
        outputs = functional_call(module, (params, dict(frozen)), (inputs,))
        one = lambda t: t.unsqueeze(0)  # noqa: E731
        per_row = vmap(lambda o, t: loss_fn(_tree_map(one, o), _tree_map(one, t)))(outputs, targets)
        if per_row.shape != (rows,):
            raise Unsupported(
                f"the loss must give one value per example (module output with the batch on dim 0), got {tuple(per_row.shape)}"
            )
        wanted = [(layer, i) for layer in layers for i, call in enumerate(layer.calls) if call[1].requires_grad]
        grads = (
            torch.autograd.grad(per_row.sum(), [layer.calls[i][1] for layer, i in wanted], allow_unused=True)
            if wanted
            else []
        )
        for layer in layers:
            for x, out, vx, vo in layer.calls:
                if x._version != vx or out._version != vo:
                    raise InPlace(layer.name)
        got = {(id(layer), i): g for (layer, i), g in zip(wanted, grads)}
        for layer in layers:
            layer.calls = [(x.detach(), out, got.get((id(layer), i))) for i, (x, out, _, _) in enumerate(layer.calls)]
        gram = torch.zeros(b, k, k, dtype=torch.float64, device=per_row.device)
        held = 0
        for layer in layers:
            held += sum(x.numel() + 2 * out.numel() for x, out, _ in layer.calls)
            part, work = HANDLERS[layer.kind](layer, rows, b, k)
            if part is not None:
                gram += part
            held += work
        return gram, held
    finally:
        for h in handles:
            h.remove()
        for layer in layers:
            layer.calls = []

"""``DPSGD(fix_modules=True)``: Opacus' ``ModuleValidator.fix``, applied in place to a LightningModule.

``ModuleValidator.fix(model)`` deep-copies the whole model and returns the copy, but the Trainer keeps training the
LightningModule it was given. So each trainable submodule with a registered fixer (BatchNorm → GroupNorm,
``nn.MultiheadAttention`` → ``DPMultiheadAttention``, ``nn.LSTM``/``GRU``/``RNN`` → their DP twins, …) is passed to
``ModuleValidator.fix`` on its own and the result is put where it was: untouched submodules keep their identity,
so parameters tied across them stay tied. This must run before ``configure_optimizers`` (DPSGD's ``setup``).
The replacement itself is :func:`lightning_privacy.checkpoints.replace_module`, which also replays it when a
checkpoint is loaded into the user's class (DPSGD saves :func:`fixed_modules_record` in its state).
"""

from __future__ import annotations

import functools
import math
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from opacus.utils.module_utils import trainable_modules
from opacus.validators import ModuleValidator
from torch import nn

from lightning_privacy import _compat
from lightning_privacy.checkpoints import fixable_module_names, replace_module

__all__ = [
    "Incompatible",
    "Replacement",
    "attention_fix_changes_outputs",
    "fix_modules_in_place",
    "fixed_modules_record",
    "hooks_unsampled_layers",
    "incompatible_layers",
    "incompatible_layers_message",
    "replacements_warning",
]

#: Opacus' replacement of each layer type it has a fixer for (opacus/validators/*.py), for messages only.
_REPLACED_BY = {
    nn.BatchNorm1d: "GroupNorm",
    nn.BatchNorm2d: "GroupNorm",
    nn.BatchNorm3d: "GroupNorm",
    nn.SyncBatchNorm: "GroupNorm",
    nn.MultiheadAttention: "DPMultiheadAttention",
    nn.LSTM: "DPLSTM",
    nn.GRU: "DPGRU",
    nn.RNN: "DPRNN",
}
_FUSED = (
    "Opacus cannot compute per-example gradients through the fused implementation; the replacement is the same "
    "layer built from Linear layers, with the same weights"
)
_BATCH = (
    "BatchNorm normalises each example with the statistics of its batch, so one example's gradient depends on the "
    "others; GroupNorm normalises each example on its own"
)
_RUNNING = (
    "Running statistics over the batches (track_running_stats=True) would need noise of their own; the fix turns "
    "them off"
)
#: Why each layer type cannot be trained as it is (one sentence instead of Opacus' paragraph per layer).
_REASONS = {
    **dict.fromkeys((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm), _BATCH),
    **dict.fromkeys((nn.MultiheadAttention, nn.LSTM, nn.GRU, nn.RNN), _FUSED),
    **dict.fromkeys((nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), _RUNNING),
}
_NAMES_SHOWN = 24  # layers named per kind in a message; more are counted


class Replacement(NamedTuple):
    """One replaced submodule: its name, the old and new type names, a caveat ("" when none), whether the new
    layer starts from fresh weights (the replaced layer's trained values could not be carried over), and a new
    GroupNorm's groups where DPSGD chose them (``None``: Opacus' fixer)."""

    name: str
    old: str
    new: str
    caveat: str = ""
    fresh: bool = False
    num_groups: Optional[int] = None

    def __str__(self) -> str:
        return f"{self.name} ({self.old} → {self.new})"


@functools.cache
def attention_fix_changes_outputs() -> bool:
    """Whether this Opacus' ``DPMultiheadAttention(batch_first=True)`` computes another function than the layer it fixes.

    opacus 1.6.0 reshapes the batch-first output ``(B·H, T, d)`` straight to ``(B, T, H·d)``, which splices heads into
    positions (meta-pytorch/opacus#825). Examples stay apart (DP holds), but the replacement is not the same layer.
    Probed once on a small layer, so a fixed Opacus stops the warning by itself.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # layer initialisation must not move the user's seed
        layer = nn.MultiheadAttention(4, 2, batch_first=True)
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
        x = torch.randn(2, 3, 4, generator=generator)
        fixed = ModuleValidator.fix(layer)
        return not torch.allclose(layer(x, x, x)[0], fixed(x, x, x)[0], atol=1e-5)


def fix_modules_in_place(module: nn.Module) -> List[Replacement]:
    """Replace ``module``'s DP-incompatible trainable submodules; returns what was replaced, in module order.

    The replacement gets the replaced module's dtype and device (Opacus' fixers build in the default dtype) and its
    train/eval mode. Where a fixer cannot keep the weights (BatchNorm → GroupNorm), the new layer starts afresh, as in
    Opacus.

    Example::

        >>> model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8)).double()
        >>> [str(r) for r in fix_modules_in_place(model)]
        ['1 (BatchNorm1d → GroupNorm)']
        >>> model[1].weight.dtype
        torch.float64
    """
    replaced: List[Replacement] = []
    for name in fixable_module_names(module):
        sub = module.get_submodule(name)
        before = _fingerprint(sub)
        one_group = type(sub) is nn.BatchNorm1d  # keeps a [batch, C] input (Opacus' GroupNorm(C, C) erases it)
        new = replace_module(module, name, num_groups=1 if one_group else None)
        caveat = ""
        if (
            isinstance(sub, nn.MultiheadAttention)
            and sub.batch_first
            and sub.num_heads > 1
            and attention_fix_changes_outputs()
        ):
            caveat = (
                f"{name}: this Opacus' DPMultiheadAttention(batch_first=True) splices heads into positions in its "
                "output (meta-pytorch/opacus#825); examples stay apart, so DP holds, but the layer computes another "
                "function than the nn.MultiheadAttention it replaces (same weights, different outputs)"
            )
        if one_group:
            caveat = (
                f"{name}: BatchNorm1d({new.num_channels}) became GroupNorm(1, {new.num_channels}), which normalises each "
                "example's features together (a LayerNorm over them, with per-feature scale and shift), not Opacus' "
                f"GroupNorm({min(32, new.num_channels)}, {new.num_channels}): on [batch, {new.num_channels}] features "
                "that normalises each feature on its own, so every output is its bias and the layer erases its input "
                "(meta-pytorch/opacus#567)"
            )
        fresh = not _same_values(_fingerprint(new), before)
        groups = new.num_groups if one_group else None
        replaced.append(Replacement(name, type(sub).__name__, type(new).__name__, caveat, fresh, groups))
    return replaced


def _fingerprint(module: nn.Module) -> tuple:
    """The multiset of ``module``'s parameter values, summarised: count, sum and sum of squares (float64).

    A fixer that carries the weights over (DPLSTM, DPMultiheadAttention: same values under other names and shapes)
    keeps it; one that builds a fresh layer (BatchNorm → GroupNorm) changes it unless the old values were the
    fresh layer's initial ones, in which case nothing was lost either.
    """
    values = [p.detach().double().reshape(-1) for p in module.parameters()]
    if not values:
        return (0, 0.0, 0.0)
    flat = torch.cat(values)
    return (flat.numel(), float(flat.sum()), float((flat * flat).sum()))


def _same_values(a: tuple, b: tuple) -> bool:
    """Fingerprints of the same values, up to the rounding of summing them in another order."""
    return a[0] == b[0] and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a[1:], b[1:]))


def replacements_warning(replaced: Sequence[Replacement]) -> str:
    """``DPSGD(fix_modules=True)``'s warning: what was replaced, which layers start afresh, the caveats.

    Example::

        >>> replacements_warning([Replacement("lstm", "LSTM", "DPLSTM")])
        'DPSGD(fix_modules=True) replaced 1 module(s) DP-SGD cannot train: lstm (LSTM → DPLSTM).'
        >>> print(replacements_warning([Replacement("bn", "BatchNorm1d", "GroupNorm", fresh=True)]))
        DPSGD(fix_modules=True) replaced 1 module(s) DP-SGD cannot train: bn (BatchNorm1d → GroupNorm). bn starts from GroupNorm's initial weights: its trained values could not be carried over.
    """
    text = f"DPSGD(fix_modules=True) replaced {len(replaced)} module(s) DP-SGD cannot train: "
    text += ", ".join(map(str, replaced)) + "."
    fresh = [r for r in replaced if r.fresh]
    if fresh:
        news = sorted({r.new for r in fresh})
        text += (
            f" {', '.join(r.name for r in fresh)} {'starts' if len(fresh) == 1 else 'start'} from "
            f"{' / '.join(news)}'s initial weights: {'its' if len(fresh) == 1 else 'their'} trained values could not "
            "be carried over."
        )
    return text + "".join(f" Caveat: {r.caveat}." for r in replaced if r.caveat)


class Incompatible(NamedTuple):
    """A trainable layer Opacus' validator rejects: its name, type, Opacus' replacement (``None``: no fixer) and why."""

    name: str
    kind: str
    replacement: Optional[str]
    reason: str


def incompatible_layers(module: nn.Module) -> List[Incompatible]:
    """The trainable layers of ``module`` that ``ModuleValidator.validate`` rejects, named, in module order.

    Opacus' ``validate`` returns one long paragraph per layer without its name; this walks the same trainable
    submodules with the same registered validators and keeps the name, the replacement ``ModuleValidator.fix``
    would make and a one-sentence reason.

    Example::

        >>> model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.LSTM(8, 8))
        >>> [(i.name, i.kind, i.replacement) for i in incompatible_layers(model)]
        [('1', 'BatchNorm1d', 'GroupNorm'), ('2', 'LSTM', 'DPLSTM')]
    """
    found: List[Incompatible] = [
        Incompatible(name or "(the module itself)", type(sub).__name__, None, _SPECTRAL)
        for name, sub in module.named_modules()
        if _spectral_norm(sub) and any(p.requires_grad for p in sub.parameters())
    ]
    for name, sub in trainable_modules(module):
        if _spectral_norm(sub):
            continue
        embedding = _embedding_reason(sub)
        if embedding is not None:
            found.append(Incompatible(name or "(the module itself)", type(sub).__name__, None, embedding))
            continue
        validator = ModuleValidator.VALIDATORS.get(type(sub))
        errors = validator(sub) if validator is not None else []
        if (
            isinstance(sub, nn.modules.conv._ConvNd) and sub.padding_mode != "zeros"
        ):  # Opacus 1.6 validates nothing here
            found.append(Incompatible(name or "(the module itself)", type(sub).__name__, None, _padding_reason(sub)))
            continue
        if not errors:
            continue
        kind = type(sub).__name__
        if type(sub) not in ModuleValidator.FIXERS:
            replacement = None
        elif type(sub) in _REPLACED_BY:
            replacement = _REPLACED_BY[type(sub)]
        elif isinstance(sub, nn.modules.instancenorm._InstanceNorm):
            replacement = f"{kind}(track_running_stats=False)"
        else:
            replacement = "Opacus' replacement"
        reason = _REASONS.get(type(sub)) or str(errors[0]).split(". ")[0].rstrip(".")  # Opacus' first sentence
        found.append(Incompatible(name or "(the module itself)", kind, replacement, reason))
    return found


_SPECTRAL = (
    "spectral_norm updates its power-iteration vectors (`weight_u`, `weight_v`) in place at every forward pass in "
    "train mode, and DP-SGD runs the forward pass more than once per step (per-example passes and checks), so the "
    "layer would not compute one function per step (and Opacus' hooks refuse a trainable layer with buffers): remove "
    "spectral_norm from trainable layers (normalise the weight in `forward` instead, e.g. by its norm), or freeze "
    "the layer"
)


def _spectral_norm(layer: nn.Module) -> bool:
    """``layer`` is under ``nn.utils.spectral_norm`` (a forward pre-hook) or its parametrization."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.spectral_norm import SpectralNorm

    if any(isinstance(hook, SpectralNorm) for hook in _compat.forward_pre_hooks(layer)):
        return True
    return parametrize.is_parametrized(layer) and any(
        type(p).__name__ == "_SpectralNorm" for plist in layer.parametrizations.values() for p in plist
    )


def hooks_unsampled_layers(module: nn.Module) -> List[Incompatible]:
    """Trainable layers Opacus' per-layer hooks cannot handle at all, where functional mode can (each refused in
    hooks and ghost mode, in one sentence instead of Opacus' raw error): a trainable layer holding buffers (Opacus
    raises "trainable layer with buffers"), and a layer without an Opacus sampler whose ``forward`` takes several
    inputs (``nn.Bilinear``: Opacus' per-layer fallback calls it with one)."""
    import inspect

    from opacus.grad_sample import GradSampleHooks

    found: List[Incompatible] = []
    for name, sub in trainable_modules(module):
        kind, where = type(sub).__name__, name or "(the module itself)"
        if _spectral_norm(sub) or type(sub) in ModuleValidator.VALIDATORS:
            continue  # (refused in every mode, or by Opacus' validator with its own reason)
        buffers = [b for b, _ in sub.named_buffers()]
        if buffers:
            found.append(Incompatible(where, kind, None, (
                f"Opacus' per-example hooks do not handle a trainable layer holding buffers "
                f"({', '.join(f'`{b}`' for b in buffers[:3])}): use grad_sample_mode='functional' (or 'auto'), "
                "which differentiates each example's loss itself"
            )))  # fmt: skip
            continue
        if type(sub) in GradSampleHooks.GRAD_SAMPLERS:
            continue
        required = [
            p for p in list(inspect.signature(sub.forward).parameters.values())
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]  # fmt: skip
        if len(required) > 1:
            found.append(Incompatible(where, kind, None, (
                f"Opacus has no per-example gradient for {kind}, and its per-layer fallback calls a layer with one "
                f"input while `{kind}.forward` takes {len(required)}: use grad_sample_mode='functional' (or 'auto'), "
                "which differentiates each example's loss itself"
            )))  # fmt: skip
    return found


def _embedding_reason(layer: nn.Module) -> Optional[str]:
    """Why an embedding layer cannot be trained by DP-SGD in any mode, or None (Opacus validates none of these)."""
    if not isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        return None
    if layer.max_norm is not None:
        return (
            f"max_norm={layer.max_norm!r} renormalises the looked-up rows of the weight in place during the forward "
            "pass, outside DP-SGD's clipping and noise: after one step a row's norm says whether any example "
            "contained its token. Remove max_norm (normalise the layer's output instead, e.g. "
            "`F.normalize(emb(x), dim=-1) * r`)"
        )
    if layer.scale_grad_by_freq:
        return (
            "scale_grad_by_freq=True divides each row's gradient by how often its index occurs in the whole batch, so "
            "one example's gradient depends on the other examples (and Opacus' per-example gradients ignore the "
            "scaling): use scale_grad_by_freq=False"
        )
    if isinstance(layer, nn.EmbeddingBag) and layer.mode == "max":
        return (
            "mode='max' has no exact per-example gradient in Opacus (its sampler treats the bag as a sum): use "
            "mode='sum' or mode='mean'"
        )
    return None


def _padding_reason(conv: nn.Module) -> str:
    return (
        f"Opacus computes a convolution's per-example gradients as if it padded with zeros, but this one pads with "
        f"padding_mode={conv.padding_mode!r} (wrong per-example gradients, so wrong clipping): pad the input with "
        "`F.pad(x, ..., mode=...)` before the layer and give it padding=0"
    )


def incompatible_layers_message(
    owner: str, layers: Sequence[Incompatible], *, fix_modules: bool, other: Sequence[str] = ()
) -> str:
    """The error for layers DP-SGD cannot train: the fix first, then each layer once, grouped by kind.

    ``other``: the validator's errors that are not about one layer (a module in eval mode), already worded.

    Example::

        >>> layers = [Incompatible(name, "BatchNorm2d", "GroupNorm", "It mixes examples") for name in ("bn1", "bn2")]
        >>> print(incompatible_layers_message("Net", layers, fix_modules=False))
        Pass `DPSGD(fix_modules=True)`: it replaces the 2 layers of Net that DP-SGD cannot train, in setup, as listed (or apply `model = opacus.validators.ModuleValidator.fix(model)` before `fit`).
        - BatchNorm2d → GroupNorm: bn1, bn2. It mixes examples.
    """
    fixable = [layer for layer in layers if layer.replacement is not None]
    stuck = [layer for layer in layers if layer.replacement is None]
    lines: List[str] = []
    if fixable and not fix_modules:
        lines.append(
            f"Pass `DPSGD(fix_modules=True)`: it replaces the {len(fixable)} layer{'s' * (len(fixable) != 1)} of "
            f"{owner} that DP-SGD cannot train, in setup, as listed (or apply "
            "`model = opacus.validators.ModuleValidator.fix(model)` before `fit`)."
        )
    if stuck:
        after = " after DPSGD(fix_modules=True)" if fix_modules else ""
        lines.append(
            f"{owner} has {len(stuck)} layer{'s' * (len(stuck) != 1)} DP-SGD cannot train{after} and Opacus has no "
            "replacement for: replace them with layers that treat each example on its own, or freeze them "
            "(requires_grad=False)."
        )
    groups: Dict[str, Dict[tuple, List[str]]] = {}  # reason -> (kind, replacement) -> names
    for layer in [*fixable, *stuck]:
        groups.setdefault(layer.reason, {}).setdefault((layer.kind, layer.replacement), []).append(layer.name)
    for reason, kinds in groups.items():
        parts = []
        for (kind, replacement), names in kinds.items():
            shown = ", ".join(names[:_NAMES_SHOWN])
            if len(names) > _NAMES_SHOWN:
                shown += f" and {len(names) - _NAMES_SHOWN} more"
            parts.append(f"{kind} → {replacement}: {shown}" if replacement else f"{kind} (no replacement): {shown}")
        lines.append(f"- {'; '.join(parts)}. {reason}.")
    if other:
        lines.append(("Also: " if lines else "") + "; ".join(other))
    return "\n".join(lines)


def fixed_modules_record(replaced: List[Replacement]) -> List[Dict[str, str]]:
    """What DPSGD saves in its state: plain strings, enough for :func:`lightning_privacy.checkpoints.replay_fixes`.

    Example::

        >>> fixed_modules_record([Replacement("1", "BatchNorm1d", "GroupNorm", num_groups=1)])
        [{'name': '1', 'old': 'BatchNorm1d', 'new': 'GroupNorm', 'num_groups': 1}]
    """
    return [
        {"name": r.name, "old": r.old, "new": r.new, **({} if r.num_groups is None else {"num_groups": r.num_groups})}
        for r in replaced
    ]

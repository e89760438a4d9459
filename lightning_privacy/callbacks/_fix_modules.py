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
from typing import Dict, List, NamedTuple

import torch
from opacus.validators import ModuleValidator
from torch import nn

from lightning_privacy.checkpoints import fixable_module_names, replace_module

__all__ = ["Replacement", "attention_fix_changes_outputs", "fix_modules_in_place", "fixed_modules_record"]


class Replacement(NamedTuple):
    """One replaced submodule: its name, the old and new type names, and a caveat ("" when none)."""

    name: str
    old: str
    new: str
    caveat: str = ""

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
        new = replace_module(module, name)
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
        replaced.append(Replacement(name, type(sub).__name__, type(new).__name__, caveat))
    return replaced


def fixed_modules_record(replaced: List[Replacement]) -> List[Dict[str, str]]:
    """What DPSGD saves in its state: plain strings, enough for :func:`lightning_privacy.checkpoints.replay_fixes`.

    Example::

        >>> fixed_modules_record([Replacement("1", "BatchNorm1d", "GroupNorm")])
        [{'name': '1', 'old': 'BatchNorm1d', 'new': 'GroupNorm'}]
    """
    return [{"name": r.name, "old": r.old, "new": r.new} for r in replaced]

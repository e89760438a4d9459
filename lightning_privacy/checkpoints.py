"""Checkpoints of DP-SGD runs in the user's own class: the modules ``DPSGD(fix_modules=True)`` replaced, the training set.

``DPSGD(fix_modules=True)`` replaces the layers DP-SGD cannot train (BatchNorm → GroupNorm, ``nn.MultiheadAttention``
→ Opacus' ``DPMultiheadAttention``, ``nn.LSTM``/``nn.GRU``/``nn.RNN`` → ``DPLSTM``/``DPGRU``/``DPRNN``) before training, so the checkpoint
holds the replacements' weights (``self_attn.qlinear.weight``, a GroupNorm without running statistics) and a freshly
built user model refuses them. DPSGD records in its state what it replaced (``fixed_modules``: module path, old and
new class names, plain strings, so the checkpoint still loads with ``weights_only=True``) and the size of the training
set it Poisson-sampled (``dataset_size``). :func:`load_checkpoint` builds the user's class, applies the same
replacement with the fixer DPSGD uses (:func:`replace_module`) and then loads the weights strictly; the audit commands
load checkpoints the same way.

No Lightning import here: a LightningModule class is used through its own ``load_from_checkpoint``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from opacus.utils.module_utils import requires_grad
from opacus.validators import ModuleValidator, register_module_fixer, register_module_validator
from opacus.validators.errors import ShouldReplaceModuleError
from torch import nn

__all__ = [
    "DATASET_SIZE",
    "FIXED_MODULES",
    "build_model",
    "dpsgd_state",
    "dpsgd_state_digest",
    "fixable_module_names",
    "fixed_modules",
    "load_checkpoint",
    "privacy_ledger",
    "replace_module",
    "replay_fixes",
    "training_set_size",
]

FIXED_MODULES = "fixed_modules"  # DPSGD state key: [{"name", "old", "new"}, ...] of the replaced modules
DATASET_SIZE = "dataset_size"  # DPSGD state key: rows of the training set it Poisson-sampled
# state-dict names only Opacus' replacement layers have: DPMultiheadAttention's separate q/k/v projections, the
# per-layer cells of DPLSTM/DPGRU/DPRNN
_OPACUS_KEYS = re.compile(
    r"(^|\.)([qkv]linear\.(weight|bias)|seq_bias_[kv]\.bias|l\d+(_reverse)?\.(ih|hh)\.(weight|bias))$"
)


# --- the replacement ---------------------------------------------------------------------------


# Opacus validates and fixes nn.LSTM and nn.GRU (→ DPLSTM, DPGRU) but not nn.RNN, whose fused kernel its hooks cannot
# sample either: unflagged, its functorch fallback fails raw when the layer's output sequence is not used (only h_n).
# Registered here, through Opacus' own registry, as its lstm.py does: DPRNN, with the same weights.
@register_module_validator(nn.RNN)
def _validate_rnn(module: nn.RNN) -> List[ShouldReplaceModuleError]:
    return [
        ShouldReplaceModuleError(
            "nn.RNN runs a fused kernel Opacus' per-example hooks cannot sample; DPRNN is the same layer built from "
            "Linear layers, with the same weights"
        )
    ]


@register_module_fixer(nn.RNN)
def _fix_rnn(module: nn.RNN) -> nn.Module:
    from opacus.layers import DPRNN

    names = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
    fixed = DPRNN(**{name: getattr(module, name) for name in names}, nonlinearity=module.nonlinearity)
    fixed.load_state_dict(module.state_dict())
    return fixed


def fixable_module_names(module: nn.Module) -> List[str]:
    """Paths of the trainable submodules Opacus has a fixer for, outermost only, in module order.

    Example::

        >>> fixable_module_names(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.LSTM(8, 8)))
        ['1', '2']
    """
    names: List[str] = []
    for name, sub in module.named_modules():
        if not name or type(sub) not in ModuleValidator.FIXERS or not requires_grad(sub, recurse=False):
            continue
        if not any(name.startswith(done + ".") for done in names):  # not inside a module already chosen
            names.append(name)
    return names


def replace_module(root: nn.Module, name: str, *, num_groups: Optional[int] = None) -> nn.Module:
    """Replace ``root``'s submodule ``name`` by Opacus' fix of it, in place; returns the new module.

    ``num_groups`` (a BatchNorm only): a ``GroupNorm(num_groups, C)`` of the BatchNorm's ``eps`` and ``affine``
    instead of Opacus' ``GroupNorm(min(32, C), C)`` — ``DPSGD(fix_modules=True)`` gives ``BatchNorm1d`` one group,
    since Opacus' choice normalises each of C ≤ 32 features of a [batch, C] input on its own and erases it.

    The replacement gets the replaced module's dtype, device and train/eval mode (Opacus' fixers build in the
    default dtype). Where a fixer cannot keep the weights (BatchNorm → GroupNorm), the new layer starts afresh, as in
    Opacus. ``DPSGD(fix_modules=True)`` and :func:`replay_fixes` both replace through this function.

    Example::

        >>> model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8)).double()
        >>> type(replace_module(model, "1")).__name__
        'GroupNorm'
        >>> model[1].weight.dtype
        torch.float64
    """
    sub = root.get_submodule(name)
    reference = next(sub.parameters(), None)
    if num_groups is not None and isinstance(sub, nn.modules.batchnorm._BatchNorm):
        new = nn.GroupNorm(int(num_groups), sub.num_features, eps=sub.eps, affine=sub.affine)
    else:
        new = ModuleValidator.fix(sub)
    if reference is not None:
        dtype = reference.dtype if reference.dtype.is_floating_point else torch.get_default_dtype()
        new = new.to(device=reference.device, dtype=dtype)
    new.train(sub.training)
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)
    return new


def replay_fixes(module: nn.Module, record: Sequence[Mapping[str, str]]) -> List[str]:
    """Apply the replacement a checkpoint's ``fixed_modules`` record describes; returns one line per module.

    A module that already has the new class (a model built with Opacus' layers) is left as it is.

    Raises:
        ValueError: the record names a module ``module`` lacks, or one of another class than was replaced.

    Example::

        >>> model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        >>> replay_fixes(model, [{"name": "1", "old": "BatchNorm1d", "new": "GroupNorm"}])
        ['1 (BatchNorm1d → GroupNorm)']
        >>> type(model[1]).__name__
        'GroupNorm'
    """
    done: List[str] = []
    for entry in record:
        name, old, new = (str(entry.get(k, "")) for k in ("name", "old", "new"))
        groups = entry.get("num_groups")  # (recorded since GroupNorm(1, C) for BatchNorm1d; older records: Opacus')
        what = f"{name} ({old} → {new})"
        try:
            found = type(module.get_submodule(name)).__name__
        except AttributeError:
            raise ValueError(
                f"the checkpoint was trained with module {what} replaced by DPSGD(fix_modules=True), but "
                f"{type(module).__name__} has no module {name!r}"
            ) from None
        if found == new:
            continue
        if found != old:
            raise ValueError(
                f"the checkpoint was trained with module {what} replaced by DPSGD(fix_modules=True), but "
                f"{type(module).__name__}.{name} is a {found}"
            )
        made = type(replace_module(module, name, num_groups=None if groups is None else int(groups))).__name__
        if made != new:
            raise ValueError(f"this Opacus replaces {name} ({old}) by {made}, the checkpoint's training by {new}")
        done.append(what)
    return done


def _fix_all(module: nn.Module) -> List[str]:
    """What ``DPSGD(fix_modules=True)`` does to a freshly built model, for checkpoints without a record."""
    done = []
    for name in fixable_module_names(module):
        old = type(module.get_submodule(name)).__name__
        groups = 1 if old == "BatchNorm1d" else None  # (as DPSGD(fix_modules=True): GroupNorm(1, C) for BatchNorm1d)
        done.append(f"{name} ({old} → {type(replace_module(module, name, num_groups=groups)).__name__})")
    return done


# --- what a checkpoint records -----------------------------------------------------------------
def _dpsgd_states(checkpoint: Any) -> List[Mapping[str, Any]]:
    """The DPSGD states among ``checkpoint["callbacks"]`` (recognised by their keys, not by the state key)."""
    callbacks = checkpoint.get("callbacks") if isinstance(checkpoint, Mapping) else None
    if not isinstance(callbacks, Mapping):
        return []
    return [
        state
        for state in callbacks.values()
        if isinstance(state, Mapping) and "max_grad_norm" in state and ("ledger" in state or "history" in state)
    ]


def fixed_modules(checkpoint: Any) -> Optional[List[Dict[str, str]]]:
    """The modules ``DPSGD(fix_modules=True)`` replaced in training (``[]``: none), or ``None`` if unrecorded.

    Example::

        >>> state = {"max_grad_norm": 1.0, "ledger": {}, "fixed_modules": [{"name": "1", "old": "A", "new": "B"}]}
        >>> fixed_modules({"callbacks": {"DPSGD{...}": state}})
        [{'name': '1', 'old': 'A', 'new': 'B'}]
        >>> fixed_modules({"state_dict": {}}) is None
        True
    """
    records = [state[FIXED_MODULES] for state in _dpsgd_states(checkpoint) if FIXED_MODULES in state]
    if not records:
        return None
    return [dict(entry) for record in records for entry in record]


def training_set_size(checkpoint: Any) -> Optional[int]:
    """Rows of the training set DPSGD Poisson-sampled, or ``None`` if the checkpoint does not record it.

    Example::

        >>> training_set_size({"callbacks": {"DPSGD{...}": {"max_grad_norm": 1.0, "ledger": {}, "dataset_size": 512}}})
        512
    """
    sizes = [state[DATASET_SIZE] for state in _dpsgd_states(checkpoint) if state.get(DATASET_SIZE) is not None]
    return int(sizes[0]) if sizes else None


def dpsgd_state(checkpoint: Any) -> Optional[Mapping[str, Any]]:
    """The DPSGD callback's saved state (σ, C, the ledger, ...), or ``None`` if the checkpoint holds none.

    Raises:
        ValueError: the checkpoint holds several DPSGD states (which one trained the model is unknown).

    Example::

        >>> dpsgd_state({"callbacks": {"DPSGD{...}": {"max_grad_norm": 1.0, "ledger": {}, "noise_multiplier": 1.1}}})
        {'max_grad_norm': 1.0, 'ledger': {}, 'noise_multiplier': 1.1}
    """
    states = _dpsgd_states(checkpoint)
    if len(states) > 1:
        raise ValueError(f"the checkpoint holds {len(states)} DPSGD states: which one trained the model is unknown")
    return states[0] if states else None


def dpsgd_state_digest(state: Mapping[str, Any]) -> str:
    """``"sha256:<hex>"`` of a DPSGD state's canonical JSON (sorted keys, every key but ``"digest"``).

    DPSGD saves it beside its state; :func:`lightning_privacy.statement.privacy_statement` recomputes it. A mismatch
    shows an edit made after saving (by hand or by a program that did not recompute it); anyone who edits the state
    can recompute the digest too, so it is a check against accidents, not a signature.

    Example::

        >>> dpsgd_state_digest({"max_grad_norm": 1.0, "noise_multiplier": 1.5})[:14]
        'sha256:90313f2'
        >>> dpsgd_state_digest({"noise_multiplier": 1.5, "max_grad_norm": 1.0, "digest": "x"})[:14]
        'sha256:90313f2'
    """
    import hashlib
    import json

    body = {key: value for key, value in state.items() if key != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True, default=repr)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def privacy_ledger(checkpoint: Any, *, delta: float = 1e-5) -> Any:
    """DPSGD's :class:`~lightning_privacy.ledger.PrivacyLedger` rebuilt from a checkpoint, or ``None`` if it has none.

    The ledger gets the saved history (and composed chunks) of the DPSGD state, so its ε, β* and trade-off curve
    (``tpr_bounds``) are the run's. The ledger's reference δ is ``delta`` (callers pass the run's, which DPSGD saves
    as ``"delta"`` in its state; β* and ``tpr_bounds`` do not depend on it).

    Raises:
        ValueError: the checkpoint holds several DPSGD states, or one that does not load (privacy state fails closed).

    Example::

        >>> state = {"max_grad_norm": 1.0, "version": 2, "accountant": "rdp",
        ...          "ledger": {"version": 1, "accountant": "rdp", "history": [[1.0, 0.01, 100]]}}
        >>> ledger = privacy_ledger({"callbacks": {"DPSGD{...}": state}})
        >>> ledger.steps, round(ledger.epsilon(), 3)
        (100, 1.214)
        >>> privacy_ledger({"state_dict": {}}) is None
        True
    """
    from lightning_privacy.ledger import PrivacyLedger

    state = dpsgd_state(checkpoint)
    if state is None:
        return None
    if "ledger" in state:
        saved = state["ledger"]
    else:  # DPSGD state version 1: the accountant's history only
        saved = {"version": 1, "accountant": state.get("accountant"), "history": state.get("history")}
    try:
        ledger = PrivacyLedger(
            accountant=saved["accountant"], delta=delta, relation=saved.get("relation", "replace"),
            group_size=int(saved.get("group_size", 1)),  # (a person's k rows under example-level sampling)
            unit=saved.get("unit", "example"),
        )  # fmt: skip
        ledger.load_state_dict(dict(saved))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"the checkpoint's DPSGD state does not give a privacy ledger: {err}") from None
    return ledger


# --- loading -----------------------------------------------------------------------------------
def _replacing_on_load(model_class: type, apply: Callable[[Any], None]) -> type:
    """``model_class`` whose ``on_load_checkpoint`` first applies the replacement.

    ``load_from_checkpoint`` builds the model with its saved hyperparameters, calls ``on_load_checkpoint`` and then
    loads the state dict strictly; the subclass puts the replacement between the two (the loaded model gets
    ``model_class`` back as its class). The tests that load fixed checkpoints fail loudly if Lightning changes that
    order.
    """

    class Replacing(model_class):
        def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
            apply(self)
            super().on_load_checkpoint(checkpoint)

    Replacing.__name__, Replacing.__qualname__ = model_class.__name__, model_class.__qualname__
    Replacing.__module__ = model_class.__module__
    return Replacing


def _opacus_layer_hint(model_class: type, state: Any, error: Exception) -> Optional[str]:
    """The refusal for weights of Opacus' layers with no record of the replacement, or ``None``."""
    keys = [k for k in state if isinstance(k, str) and _OPACUS_KEYS.search(k)] if isinstance(state, Mapping) else []
    stats = re.findall(r"[\"']([\w.]*(?:running_mean|running_var|num_batches_tracked))[\"']", str(error))
    if not keys and not (stats and "Missing key" in str(error)):
        return None
    signs = ", ".join(keys[:3]) if keys else f"no BatchNorm statistics ({', '.join(stats[:2])}): GroupNorm in training"
    return (
        f"the checkpoint holds Opacus' replacement layers ({signs}) of a model trained with `DPSGD(fix_modules=True)` "
        f"(or Opacus' ModuleValidator.fix), which {model_class.__name__} does not build, and no record of the replaced "
        "modules (a checkpoint saved before DPSGD recorded them): load it with the same replacement, "
        "`load_checkpoint(..., fix_modules=True)` (CLI: `--fix-modules`)"
    )


def build_model(
    model_class: Any,
    path: Any,
    checkpoint: Any,
    model_args: Optional[Mapping[str, Any]] = None,
    *,
    fix_modules: Optional[bool] = None,
    map_location: Any = "cpu",
) -> Tuple[Any, List[str]]:
    """``(model, replaced)``: :func:`load_checkpoint` for a checkpoint already read, without the warning.

    ``checkpoint`` is the file's contents (read with ``weights_only=True``); ``replaced`` lists the modules replaced
    before the weights were loaded.

    Raises:
        ValueError: the replacement cannot be applied, or the weights are of Opacus' layers and nothing says which
            modules to replace (the message names ``DPSGD(fix_modules=True)`` and ``fix_modules=True``).
        RuntimeError: other mismatches between the checkpoint and ``model_class`` (torch's message).
    """
    model_args = dict(model_args or {})
    record = fixed_modules(checkpoint) if fix_modules is not False else None
    replaced: List[str] = []

    def apply(model: Any) -> None:
        if record is not None:
            replaced.extend(replay_fixes(model, record))
        elif fix_modules:
            replaced.extend(_fix_all(model))

    lightning = isinstance(checkpoint, Mapping) and "state_dict" in checkpoint
    state = checkpoint["state_dict"] if lightning else checkpoint
    try:
        if lightning and hasattr(model_class, "load_from_checkpoint"):
            if record or fix_modules:
                model = _replacing_on_load(model_class, apply).load_from_checkpoint(
                    path, map_location=map_location, weights_only=True, **model_args
                )
                model.__class__ = model_class
            else:
                model = model_class.load_from_checkpoint(
                    path, map_location=map_location, weights_only=True, **model_args
                )
        else:
            model = model_class(**model_args)
            apply(model)
            model.load_state_dict(state)
    except RuntimeError as err:
        hint = None if replaced else _opacus_layer_hint(model_class, state, err)
        if hint is None:
            raise
        raise ValueError(hint) from None
    return model, replaced


def replaced_message(model_class: Any, replaced: Sequence[str]) -> str:
    """The one warning of a load that replaced modules."""
    name = model_class.__name__
    return (
        f"before loading the weights into {name}, replaced what DPSGD(fix_modules=True) replaced in training: "
        f"{', '.join(replaced)}; the model runs as it was trained (with Opacus' layers), not as {name} builds it."
    )


def load_checkpoint(
    model_class: Any,
    path: Any,
    *,
    fix_modules: Optional[bool] = None,
    map_location: Any = "cpu",
    **model_args: Any,
) -> Any:
    """A checkpoint's model in the user's own class, ready for the :mod:`~lightning_privacy.audits`.

    A Lightning checkpoint (with ``state_dict``) goes through ``model_class.load_from_checkpoint`` (its saved
    hyperparameters, overridden by ``model_args``); a bare ``state_dict`` is loaded into ``model_class(**model_args)``.
    The file is read with ``weights_only=True``. Where ``DPSGD(fix_modules=True)`` replaced modules in training, the
    same modules are replaced first (warning once with the list), so the weights load strictly and the model computes
    what was trained.

    Args:
        model_class: the user's class (a LightningModule or any ``nn.Module``).
        path: the checkpoint file.
        fix_modules: ``None`` (default): replace what the checkpoint records; ``True``: also, for a checkpoint that
            records nothing (saved before DPSGD recorded it), replace every module Opacus has a fixer for, as
            ``DPSGD(fix_modules=True)`` does; ``False``: replace nothing.
        map_location: where the weights go.
        model_args: constructor arguments (over the saved hyperparameters).

    Raises:
        ValueError: see :func:`build_model`.

    Example::

        >>> model = load_checkpoint(Net, "model.ckpt")  # doctest: +SKIP
        >>> result = audit_epsilon_star(model, members, nonmembers)  # doctest: +SKIP
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model, replaced = build_model(
        model_class, path, checkpoint, model_args, fix_modules=fix_modules, map_location=map_location
    )
    if replaced:
        warnings.warn(replaced_message(model_class, replaced), UserWarning, stacklevel=2)
    return model

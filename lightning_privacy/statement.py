"""A model's privacy statement for release: from a checkpoint alone, as JSON and as a model card's Markdown section.

:func:`privacy_statement` reads what a release check asks of a model trained with :class:`~lightning_privacy.DPSGD`
from a Lightning checkpoint (no model class needed: the file is read with ``torch.load(weights_only=True)`` and only
the callbacks' saved states are used) or from a Trainer after ``fit``:

- the mechanism: σ, the sample rate q, the steps, the clipping norm C, δ, the accountant, the relation of each value,
  whether the batches' sampling and the noise were secret, the per-example gradient mode, the strategy and the
  training set size;
- the guarantee: the accountant's ε at δ, the safe β*_MIA and the TPR bounds at FPR 0.001, 0.01 and 0.1 of any
  membership attack, computed by the run's :class:`~lightning_privacy.ledger.PrivacyLedger` rebuilt from the saved
  state (:func:`lightning_privacy.checkpoints.privacy_ledger`), so they equal the run's own values;
- the audits whose results the source holds, their values and their verdicts on the claims they tested;
- the versions of lightning-privacy, torch, Opacus and Lightning, and what the numbers do not cover (telemetry, data
  used outside DP-SGD, approximations).

A checkpoint without a DPSGD state gives a statement that says so and states no ε, β* or TPR bound. The result, a
:class:`PrivacyStatement`, renders as JSON (:meth:`PrivacyStatement.to_json`, stable keys, ``format_version``), as a
Markdown section for a Hugging Face model card with its YAML metadata block (:meth:`PrivacyStatement.to_markdown`),
as text (``lightning-privacy statement CHECKPOINT``) and as the privacy report's last section
(:meth:`PrivacyStatement.report_section`, :mod:`lightning_privacy.report`). The JSON holds the computed values; the
Markdown and the report round them toward the safe side (ε and TPR bounds up, β* down).

Example::

    >>> statement = privacy_statement("final.ckpt")  # doctest: +SKIP
    >>> statement.epsilon, statement.to_dict()["guarantee"]["bayes_security"]  # doctest: +SKIP
    (0.559..., 0.9000...)
    >>> print(statement.to_markdown())  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import copy
import json
import math
import os
import pickle
import platform
import re
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from lightning_privacy import __version__, names
from lightning_privacy.ledger import accountant_label
from lightning_privacy.reporting import ReportSection, ReportTable, down, up

__all__ = ["FORMAT", "FORMAT_VERSION", "FPRS", "PrivacyStatement", "privacy_statement", "read_checkpoint"]

FORMAT = "lightning-privacy privacy statement"
FORMAT_VERSION = 1
#: The standard false-positive rates of the TPR bounds (those :class:`~lightning_privacy.BayesSecurityMonitor` logs).
FPRS = (0.001, 0.01, 0.1)
_RELATIONS = ("replace", "add_remove")  # the TPR bounds are given for both
_RELATION_LABELS = {"replace": "replace one example", "add_remove": "add or remove one example"}
# audit values a statement lists: the scalars of the audit/ keys, without values that are no valid bound
_AUDIT_KEYS = tuple(key for key in names.ALL_KEYS if key.startswith("audit/") and names.KEY_DOCS[key][2] != names.MEDIA)
_NOT_BOUNDS = (names.CANARY_EPSILON_OPTIMISTIC, names.CANARY_EPSILON_OPTIMISTIC_GDP)
_VERDICT_KEYS = tuple(key for key in _AUDIT_KEYS if key.endswith("_claim_contradicted"))
_SEEDS = {
    "secret": "secret (OS entropy per fit)",
    "fixed": "fixed (reproducible, not secret)",
    "secure": "secure (OS CSPRNG every step)",
}
_DEFAULT_DELTA = 1e-5  # DPSGD's default δ, for a version-1 DPSGD state that did not save its δ


# --- reading a checkpoint ---------------------------------------------------------------------------------------
def read_checkpoint(path: Union[str, os.PathLike]) -> Mapping[str, Any]:
    """A checkpoint's contents, read with ``torch.load(weights_only=True)``: tensors and plain values, nothing else.

    A file that holds pickled Python objects (classes, functions) is refused before anything in it runs. Large files
    are memory-mapped where torch can, so reading a statement does not load every weight.

    Raises:
        FileNotFoundError: no file at ``path`` (the message names it).
        ValueError: not a file torch can read, a file that holds more than plain values, or contents that are not a
            checkpoint (a dict); each message names the path.
    """
    import torch

    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r}: no such file")
    if not file.is_file():
        raise ValueError(f"checkpoint {str(path)!r} is not a file")
    try:
        with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the error below says enough
            warnings.simplefilter("ignore")
            try:
                contents = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:  # a file of torch's legacy format cannot be memory-mapped
                if "mmap" not in str(err):
                    raise
                contents = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported operand" in str(err) or "invalid load key" in str(err):
            raise ValueError(
                f"checkpoint {str(path)!r} is not a file torch can read (no checkpoint of torch.save)"
            ) from None
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f" (it references `{found.group(1)}`)" if found else ""
        raise ValueError(
            f"refused checkpoint {str(path)!r}: it holds more than tensors and plain values{what}, and loading it "
            "would let the file run code on this machine (torch.load(weights_only=True) refused it)"
        ) from None
    except Exception as err:  # not a torch file at all: zip and pickle errors of many kinds (KeyError(105) for text)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(
            f"checkpoint {str(path)!r} is not a file torch can read ({type(err).__name__}: {first})"
        ) from None
    if not isinstance(contents, Mapping):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(contents).__name__}, not a checkpoint (a dict)")
    return contents


# --- the statement ------------------------------------------------------------------------------------------------
def privacy_statement(source: Any) -> PrivacyStatement:
    """The privacy statement of a checkpoint file, a checkpoint's contents, or a Trainer after ``fit``.

    Args:
        source: a path to a Lightning checkpoint (``str`` or ``os.PathLike``), the dict ``torch.load`` returns for
            one, or a ``lightning.pytorch.Trainer`` (its callbacks' states, as a checkpoint would save them, plus what
            only the running callbacks know: the claims the audits tested, ``secure_mode``, the strategy).

    Returns:
        A :class:`PrivacyStatement`.

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a file that is no checkpoint, or one with several DPSGD states or a DPSGD state that does not load
            (each message names the path or the state).
        TypeError: ``source`` of another type.

    Example::

        >>> privacy_statement({"state_dict": {}}).differentially_private
        False
        >>> privacy_statement(42)
        Traceback (most recent call last):
        ...
        TypeError: `source` must be a checkpoint path, a checkpoint dict or a Trainer, got 42
    """
    if isinstance(source, (str, os.PathLike)):
        return PrivacyStatement(_build(read_checkpoint(source), {"kind": "checkpoint", "path": os.fspath(source)}))
    if isinstance(source, Mapping):
        return PrivacyStatement(_build(source, {"kind": "checkpoint dict", "path": None}))
    if hasattr(source, "callbacks") and hasattr(source, "global_step") and hasattr(source, "strategy"):
        checkpoint, live = _trainer_checkpoint(source)
        return PrivacyStatement(_build(checkpoint, {"kind": "trainer", "path": None}, live=live, trainer=source))
    raise TypeError(f"`source` must be a checkpoint path, a checkpoint dict or a Trainer, got {source!r}")


def _trainer_checkpoint(trainer: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """What a checkpoint of ``trainer`` would hold of its callbacks (their non-empty states), and the callbacks."""
    states: Dict[str, Any] = {}
    live: Dict[str, Any] = {}
    for callback in trainer.callbacks:
        key = callback.state_key
        live[key] = callback
        state = callback.state_dict()
        if state:
            states[key] = state
    checkpoint = {
        "callbacks": states,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pytorch-lightning_version": _installed("lightning"),
    }
    return checkpoint, live


def _state_key_arguments(key: str) -> Dict[str, Any]:
    """The arguments a callback's state key records (``DPSGD{'noise_multiplier': None, ...}``), or ``{}``."""
    _, brace, rest = key.partition("{")
    if not brace:
        return {}
    try:
        found = ast.literal_eval("{" + rest)
    except (ValueError, SyntaxError):
        return {}
    return dict(found) if isinstance(found, dict) else {}


def _finite(value: Any) -> Optional[float]:
    """A float for JSON, or ``None`` where it is not finite (JSON has no infinity)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _installed(package: str) -> Optional[str]:
    """The installed version of ``package`` (read from its metadata: importing Lightning takes seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _versions(checkpoint: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    return {
        "computed_with": {
            "lightning_privacy": __version__,
            "torch": str(torch.__version__),
            "opacus": _installed("opacus"),
            "lightning": _installed("lightning"),
            "python": platform.python_version(),
        },
        "checkpoint_saved_with": {"lightning": checkpoint.get("pytorch-lightning_version")},
    }


def _seed_kind(value: Any, secure: Optional[bool]) -> str:
    if secure:
        return "secure"
    return "fixed" if value is not None else "secret"


def _build(checkpoint: Mapping[str, Any], source: Dict[str, Any], *, live: Any = None, trainer: Any = None) -> dict:
    from lightning_privacy.checkpoints import dpsgd_state

    live = live or {}
    callbacks = checkpoint.get("callbacks")
    callbacks = callbacks if isinstance(callbacks, Mapping) else {}
    where = f"checkpoint {source['path']!r}" if source.get("path") else "the checkpoint"
    try:
        state = dpsgd_state(checkpoint)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    key = next((k for k, v in callbacks.items() if v is state), None) if state is not None else None
    source.update(
        epoch=checkpoint.get("epoch"),
        global_step=checkpoint.get("global_step"),
        lightning_checkpoint="state_dict" in checkpoint or "callbacks" in checkpoint,
    )
    mechanism = guarantee = None
    notes: List[str] = []
    if state is not None:
        mechanism, guarantee, notes = _dp_sgd(checkpoint, state, key, live.get(key), trainer, where)
    audits = _audits(callbacks, live)
    budget = _budget(callbacks)
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "source": source,
        "differentially_private": mechanism is not None and mechanism["steps"] > 0,
        "summary": "",
        "mechanism": mechanism,
        "guarantee": guarantee,
        "budget": budget,
        "audits": audits,
        "versions": _versions(checkpoint),
        "not_covered": [],
        "approximations": [],
    }
    data["summary"] = _summary(data)
    data["not_covered"] = _not_covered(data, notes, live=bool(live))
    data["approximations"] = _approximations(data)
    return data


def _dp_sgd(
    checkpoint: Mapping[str, Any], state: Mapping[str, Any], key: Optional[str], callback: Any, trainer: Any, where: str
) -> Tuple[dict, dict, List[str]]:
    """The mechanism and the guarantee of a DPSGD state, from the ledger it saved."""
    from lightning_privacy.checkpoints import privacy_ledger

    notes: List[str] = []
    delta = state.get("delta")
    if delta is None:
        delta = _DEFAULT_DELTA
        notes.append(f"The DPSGD state does not record its δ (saved by an older version): δ = {delta:g} is assumed.")
    try:
        ledger = privacy_ledger(checkpoint, delta=float(delta))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    history = ledger.history
    sigma = state.get("noise_multiplier")
    rate = state.get("sample_rate")
    if history:
        sigma = history[-1][0] if sigma is None else sigma
        rate = history[-1][1] if rate is None else rate
    secure = getattr(callback, "secure_mode", None) if callback is not None else state.get("secure_mode")
    strategy, world_size = state.get("strategy"), state.get("world_size")  # (recorded since 0.3.0)
    if trainer is not None:
        strategy, world_size = type(trainer.strategy).__name__, int(trainer.world_size)
    planned = {
        k: v
        for k, v in _state_key_arguments(key or "").items()
        if k in ("target_bayes_security", "target_epsilon", "epochs") and v is not None
    }
    size = state.get("dataset_size")
    mechanism = {
        "name": "DP-SGD",
        "noise_multiplier": _finite(sigma),
        "sample_rate": _finite(rate),
        "steps": int(ledger.steps),
        "max_grad_norm": float(state["max_grad_norm"]),
        "delta": float(delta),
        "accountant": ledger.mechanism,
        "relation": ledger.relation,
        "history": [[s, p, t] for s, p, t in history],
        "dataset_size": None if size is None else int(size),
        "sampling_seed": _seed_kind(state.get("sampling_seed"), secure),
        "noise_seed": _seed_kind(state.get("noise_seed"), secure),
        "secure_mode": secure,
        "grad_sample_mode": state.get("grad_sample_mode"),
        "loss_reduction": state.get("loss_reduction"),
        "strategy": strategy,
        "world_size": world_size,
        "fixed_modules": [dict(entry) for entry in state.get("fixed_modules") or []],
        "planned_for": planned or None,
    }
    bounds = {
        relation: {f"fpr_{fpr:g}": float(b) for fpr, b in zip(FPRS, ledger.tpr_bounds(list(FPRS), relation=relation))}
        for relation in _RELATIONS
    }
    beta = float(ledger.bayes_security())
    guarantee = {
        "epsilon": _finite(ledger.epsilon()),
        "delta": float(delta),
        "epsilon_relation": "add_remove",
        "bayes_security": beta,
        "bayes_security_relation": ledger.relation,
        "advantage": 1.0 - beta,
        "tpr_bounds": bounds,
        "bayes_security_closed_form": float(ledger.bayes_security_closed_form()),
    }
    return mechanism, guarantee, notes


def _budget(callbacks: Mapping[str, Any]) -> Optional[dict]:
    """A PrivacyBudgetStopping's budget and where it stopped (its state key records the budget)."""
    for key, state in callbacks.items():
        if isinstance(state, Mapping) and set(state) == {"stopped_at_step"}:
            arguments = _state_key_arguments(str(key))
            limits = {
                k: arguments.get(k) for k in ("min_bayes_security", "max_epsilon") if arguments.get(k) is not None
            }
            if not limits:
                continue
            stopped = state["stopped_at_step"]
            return {
                **limits,
                "delta": arguments.get("delta"),  # of an ε budget; None: the run's δ (or a β* budget)
                "threat": arguments.get("threat", "mia"),
                "stopped_at_step": None if stopped is None else int(stopped),
            }
    return None


def _audit_values(values: Any) -> Optional[Dict[str, float]]:
    if not isinstance(values, Mapping):
        return None
    found = {key: float(values[key]) for key in _AUDIT_KEYS if key in values and key not in _NOT_BOUNDS}
    return found or None


def _audits(callbacks: Mapping[str, Any], live: Mapping[str, Any]) -> List[dict]:
    """One entry per audit whose values the source holds: the saved states, then running callbacks without one."""
    entries = []
    for key, state in callbacks.items():
        if not isinstance(state, Mapping):
            continue
        values = _audit_values(state.get("results")) or _audit_values(state.get("last"))
        if values is not None:
            entries.append(_audit_entry(str(key).partition("{")[0], values, live.get(key)))
    for key, callback in live.items():
        if key in callbacks:
            continue
        values = _audit_values(getattr(callback, "results", None))
        result = getattr(callback, "result", None)
        if values is None and callable(getattr(result, "metrics", None)):
            values = _audit_values(result.metrics())
        if values is not None:
            entries.append(_audit_entry(type(callback).__name__, values, callback))
    return entries


def _audit_entry(name: str, values: Dict[str, float], callback: Any) -> dict:
    attack = next((a for a in ("rmia", "lira", "loss") if names.membership_key(a, "auc") in values), None)
    verdict_key = next((k for k in _VERDICT_KEYS if k in values), None)
    verdict = None if verdict_key is None else ("contradicted" if values[verdict_key] else "consistent")
    result = getattr(callback, "result", None) if callback is not None else None
    claim = None
    if verdict is not None and getattr(result, "claim_verdict", None) is not None:
        found = getattr(result, "claim", None)
        claim = found.to_dict() if callable(getattr(found, "to_dict", None)) else None
    alpha = getattr(callback, "alpha", None) if callback is not None else None
    return {
        "audit": name if attack is None else f"{name} ({attack})",
        "values": values,
        "verdict": verdict,
        "claim": copy.deepcopy(claim),
        "confidence": None if alpha is None or verdict is None else 1.0 - float(alpha),
    }


# --- sentences ----------------------------------------------------------------------------------------------------
def _summary(data: dict) -> str:
    mechanism, guarantee = data["mechanism"], data["guarantee"]
    if mechanism is None:
        return (
            "No DP-SGD: the source holds no DPSGD state, so lightning-privacy states no differential-privacy guarantee "
            "for this model (no ε, β*_MIA or TPR bound)."
        )
    if not mechanism["steps"]:
        return (
            "No DP-SGD step recorded: the DPSGD state holds no step (saved before training?), so no privacy was spent "
            "and nothing is stated about a trained model."
        )
    eps = guarantee["epsilon"]
    epsilon = "no finite ε" if eps is None else f"(ε = {up(eps)}, δ = {guarantee['delta']:g})-DP"
    return (
        f"Trained with DP-SGD: {epsilon} for one training example added or removed "
        f"({accountant_label(mechanism['accountant']).replace(' (add/remove)', '')}), after {mechanism['steps']} steps at noise multiplier "
        f"σ = {mechanism['noise_multiplier']:g} and sample rate q = {mechanism['sample_rate']:.6g}; any membership "
        f"attacker's Bayes security β*_MIA ≥ {down(guarantee['bayes_security'])} "
        f"({_RELATION_LABELS[guarantee['bayes_security_relation']]})."
    )


def _not_covered(data: dict, notes: List[str], *, live: bool) -> List[str]:
    mechanism = data["mechanism"]
    out = list(notes)
    if mechanism is None or not mechanism["steps"]:
        out.append(
            "Nothing bounds what the model reveals about its training data: audit results, if any, are lower bounds "
            "or estimates of leakage, never a guarantee."
        )
    else:
        out += [
            "The guarantee is per training example, not per person: someone with k rows in the training set is "
            "protected only at about k·ε (group privacy).",
            "Only the DP-SGD steps are accounted: data used outside them (pre-training, preprocessing statistics "
            "fitted on the training set, validation and test sets, hyperparameter tuning and model selection on "
            "private data, earlier or repeated runs) is not.",
        ]
        for field, what in (("sampling_seed", "batches' Poisson sampling"), ("noise_seed", "noise")):
            if mechanism[field] == "fixed":
                out.append(
                    f"The {what} came from a fixed seed: the guarantee holds only against an adversary who does not "
                    "know it (fixed seeds are for tests and debugging)."
                )
        if mechanism["secure_mode"] is None:
            out.append(
                "Whether DPSGD ran with `secure_mode` is not recorded in the checkpoint; without it the noise is "
                "floating-point Gaussian samples from a pseudo-random generator, and floating-point attacks on the "
                "noise (Mironov 2012) are not excluded."
            )
        elif not mechanism["secure_mode"]:
            out.append(
                "DPSGD ran without `secure_mode`: the noise is floating-point Gaussian samples from a pseudo-random "
                "generator, and floating-point attacks on the noise (Mironov 2012) are not excluded."
            )
        if mechanism["strategy"] is None:
            out.append("The strategy (one device, DDP, FSDP2) is not recorded in the checkpoint.")
    out.append(
        "Telemetry and audit results are computed from the private data outside the DP mechanism and are not "
        "covered by ε: clipping statistics (`dp/clip_fraction`, `dp/grad_norm_median`, `dp/grad_norms`), "
        "attribute sensitivities (`privacy/ai_sensitivity`), membership-audit and canary scores and their metrics."
    )
    if not live:
        out.append(
            "A checkpoint holds the results of the audits that save them (MembershipAudit, CanaryAudit, "
            "PanoramiaAudit) as of when it was saved: an audit at fit end is in a checkpoint saved after fit "
            "(`trainer.save_checkpoint`), not in one ModelCheckpoint saved during it; EpsilonStarAudit and "
            "PrivacyProfileAudit save none (see the privacy report)."
        )
        if any(a["verdict"] is not None for a in data["audits"]):
            out.append(
                "The checkpoint records each verdict, not the claim it tested: by default an audit tests the run's "
                "own DP-SGD guarantee at the time of the audit, else the `claim=` given to it."
            )
    return out


def _approximations(data: dict) -> List[str]:
    mechanism = data["mechanism"]
    out = []
    if mechanism is not None and mechanism["steps"]:
        accountant = mechanism["accountant"]
        if accountant == "pld":
            out.append(
                "ε is the certified upper bound of the pessimistic privacy-loss distribution (add/remove) that β*_MIA "
                "and the TPR bounds also come from: one accountant for every number here."
            )
        elif accountant == "rdp":
            out.append(
                "ε is Opacus' RDP accountant's upper bound; its conversion to (ε, δ) is loose, so the true ε is lower."
            )
        elif accountant == "prv":
            out.append("ε is the upper end of Opacus' PRV accountant's error-bounded estimate.")
        elif accountant == "gdp":
            out.append(
                "ε is Opacus' GDP accountant's central-limit approximation: NOT an upper bound (it can understate ε, "
                "and it reads only the last segment of the history). β*_MIA and the TPR bounds are certified."
            )
        out += [
            "β*_MIA and the TPR bounds come from a pessimistic discretisation of the privacy-loss distribution of the "
            "recorded history: certified (β* never above, a TPR bound never below the exact value).",
            "β*_MIA closed form (Cherubin et al. 2024, Cor. 7) is an approximation, shown for comparison only; it can "
            "overstate security.",
        ]
        if len({(s, p) for s, p, _ in mechanism["history"]}) > 1:
            out.append(
                f"σ or q changed during training ({len(mechanism['history'])} segments): the values above are the "
                "last segment's; ε, β* and the TPR bounds compose every segment."
            )
    if data["audits"]:
        out.append(
            "Audit ε lower bounds hold at their confidence; estimates (Epsilon*, PANORAMIA's ε̃, AUC and TPR of an "
            "attack) carry no guarantee either way."
        )
    out.append(
        "The Markdown and the report round ε, the advantage and the TPR bounds up and β* down; the JSON holds the "
        "computed values."
    )
    return out


# --- rows ------------------------------------------------------------------------------------------------------------
Row = Tuple[str, str, str]


def _mechanism_rows(data: dict) -> List[Row]:
    m = data["mechanism"]
    if m is None:
        return [("differentially private", "no", "the source holds no DPSGD state: no DP-SGD guarantee is stated")]
    rows = [
        (
            "differentially private",
            "yes" if m["steps"] else "no step",
            "trained with DP-SGD by lightning-privacy's DPSGD callback",
        ),
        (
            "mechanism",
            "DP-SGD",
            "each example's gradient clipped to norm C, Gaussian noise of std σ·C added to their sum, batches "
            "Poisson-sampled",
        ),
        (
            "noise multiplier σ",
            "—" if m["noise_multiplier"] is None else f"{m['noise_multiplier']:.6g}",
            "noise std / C",
        ),
        ("clipping norm C", f"{m['max_grad_norm']:g}", "each example's gradient is clipped to norm ≤ C"),
        (
            "sample rate q",
            "—" if m["sample_rate"] is None else f"{m['sample_rate']:.6g}",
            "each example joins a batch with probability q",
        ),
        ("optimizer steps T", str(m["steps"]), "DP-SGD steps the accountant recorded (over resumes)"),
        (
            "training set size N",
            "not recorded" if m["dataset_size"] is None else str(m["dataset_size"]),
            "rows the Poisson sampling drew from",
        ),
        ("δ", f"{m['delta']:g}", "δ of the (ε, δ) guarantee"),
        ("accountant", m["accountant"], "the accountant that gives ε (pld: the package's pessimistic PLD)"),
        ("batch sampling", _SEEDS[m["sampling_seed"]], "the Poisson masks' randomness"),
        ("noise", _SEEDS[m["noise_seed"]], "the Gaussian noise's randomness"),
        (
            "per-example gradients",
            str(m["grad_sample_mode"]),
            "hooks: Opacus' per-sample gradients; ghost: ghost clipping",
        ),
        (
            "strategy",
            "not recorded" if m["strategy"] is None else f"{m['strategy']} ({m['world_size']} process(es))",
            "the Trainer's strategy",
        ),
    ]
    planned = m["planned_for"]
    if planned:
        target = (
            f"β*_MIA ≥ {planned['target_bayes_security']:g}"
            if "target_bayes_security" in planned
            else f"ε ≤ {planned.get('target_epsilon', float('nan')):g}"
        )
        rows.append(
            ("planned for", f"{target} after {planned.get('epochs')} epochs", "σ was calibrated for this target")
        )
    return rows


def _guarantee_rows(data: dict) -> List[Row]:
    g, m = data["guarantee"], data["mechanism"]
    if g is None or not m["steps"]:
        return []
    eps = g["epsilon"]
    beta = g["bayes_security"]
    relation = _RELATION_LABELS[g["bayes_security_relation"]]
    rows = [
        (
            f"ε at δ = {g['delta']:g}",
            "no finite ε" if eps is None else up(eps),
            f"(ε, δ)-DP, {_RELATION_LABELS['add_remove']}: {accountant_label(m['accountant'])}",
        ),
        (
            "β*_MIA",
            down(beta),
            f"certified lower bound ({relation}): any membership attacker's accuracy ≤ "
            f"{up(100 * (1 - beta / 2), 1)}% at a uniform prior",
        ),
        ("membership advantage", up(g["advantage"]), "1 − β*: bound on any attacker's TPR − FPR"),
    ]
    for relation_key in (g["bayes_security_relation"], *[r for r in _RELATIONS if r != g["bayes_security_relation"]]):
        for fpr in FPRS:
            rows.append(
                (
                    f"TPR bound at FPR {fpr:g} ({_RELATION_LABELS[relation_key]})",
                    up(g["tpr_bounds"][relation_key][f"fpr_{fpr:g}"]),
                    f"largest share of members any attack finds while flagging {fpr:.1%} of non-members",
                )
            )
    rows.append(
        (
            "β*_MIA closed form",
            f"{g['bayes_security_closed_form']:.4f}",
            "approximate (Cor. 7), for comparison; can overstate security",
        )
    )
    budget = data["budget"]
    if budget is not None:
        limit = (
            f"β*_{budget['threat'].upper()} ≥ {budget['min_bayes_security']:g}"
            if "min_bayes_security" in budget
            else f"ε ≤ {budget['max_epsilon']:g}"
        )
        stopped = budget["stopped_at_step"]
        rows.append(
            (
                "budget",
                f"{limit}, stopped after step {stopped}" if stopped is not None else f"{limit}, not reached",
                "PrivacyBudgetStopping stops before the step that would break it",
            )
        )
    return rows


def _audit_cells(audit: dict) -> List[str]:
    values = []
    for key, value in audit["values"].items():
        if key in _VERDICT_KEYS:
            continue
        trust = names.KEY_DOCS[key][2]
        kind = " (lower bound)" if trust == names.LOWER_BOUND else " (estimate)" if trust == names.ESTIMATE else ""
        values.append(f"`{key}` = {value:.4g}{kind}")
    if audit["verdict"] is None:
        claim = "none tested"
    elif audit["claim"] is not None:
        claim = audit["claim"]["label"]
    else:
        claim = "not recorded"
    verdict = "—" if audit["verdict"] is None else audit["verdict"]
    if audit["verdict"] is not None and audit["confidence"] is not None:
        verdict += f" at confidence {audit['confidence']:.0%}"
    return [audit["audit"], "; ".join(values), claim, verdict]


_AUDIT_HEADER = ["audit", "values", "claim tested", "verdict"]


def _version_cells(data: dict) -> List[List[str]]:
    computed = data["versions"]["computed_with"]
    cells = [[package.replace("_", "-"), str(version)] for package, version in computed.items()]
    saved = data["versions"]["checkpoint_saved_with"].get("lightning")
    if data["source"]["kind"] != "trainer" and saved:
        cells.append(["lightning (checkpoint saved with)", str(saved)])
    return cells


# --- YAML ----------------------------------------------------------------------------------------------------------
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*(?: [A-Za-z0-9_.\-]+)*")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}  # YAML 1.1 booleans and null


def _yaml_scalar(value: Any) -> str:
    """A scalar in YAML that PyYAML and other YAML 1.1/1.2 readers read back as the same type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "null"
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 reads 1e-05 as a string: 1.0e-05
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text  # a plain scalar every YAML reader takes for this string
    return json.dumps(text, ensure_ascii=False)  # a double-quoted YAML scalar


def _yaml(value: Any, indent: int = 0) -> List[str]:
    """Block-style YAML of plain dicts, lists and scalars."""
    pad = " " * indent
    lines: List[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, (Mapping, list)) and item:
                lines.append(f"{pad}{key}:")
                lines += _yaml(item, indent + 2)
            else:
                empty = "{}" if isinstance(item, Mapping) else "[]"
                lines.append(f"{pad}{key}: {empty if isinstance(item, (Mapping, list)) else _yaml_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, Mapping):
                inner = _yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].strip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    return lines


def _escape(line: str) -> str:
    """``line`` with ``*`` escaped outside code spans: ``β*_MIA … β*`` in one paragraph would otherwise be emphasis."""
    parts = line.split("`")
    return "`".join(part if i % 2 else part.replace("*", "\\*") for i, part in enumerate(parts))


class PrivacyStatement:
    """A model's privacy statement (:func:`privacy_statement`): plain values and their renderings.

    ``to_dict()`` has these keys (``format_version`` 1; a key's meaning never changes within a version):
    ``format``, ``format_version``, ``source`` (``kind``, ``path``, ``epoch``, ``global_step``,
    ``lightning_checkpoint``), ``differentially_private``, ``summary``, ``mechanism`` (``None`` without DP-SGD: ``name``,
    ``noise_multiplier``, ``sample_rate``, ``steps``, ``max_grad_norm``, ``delta``, ``accountant``, ``relation``,
    ``history``, ``dataset_size``, ``sampling_seed`` and ``noise_seed`` (``"secret"``, ``"fixed"`` or ``"secure"``),
    ``secure_mode``, ``grad_sample_mode``, ``loss_reduction``, ``strategy``, ``world_size``, ``fixed_modules``,
    ``planned_for``), ``guarantee`` (``None`` without DP-SGD: ``epsilon``, ``delta``, ``epsilon_relation``,
    ``bayes_security``, ``bayes_security_relation``, ``advantage``, ``tpr_bounds`` by relation and ``fpr_0.001`` /
    ``fpr_0.01`` / ``fpr_0.1``, ``bayes_security_closed_form``), ``budget``, ``audits`` (``audit``, ``values``,
    ``verdict``, ``claim``, ``confidence``), ``versions`` (``computed_with``, ``checkpoint_saved_with``),
    ``not_covered`` and ``approximations`` (sentences). ``None`` stands for "not recorded" (and for a non-finite ε).

    Example::

        >>> statement = PrivacyStatement.from_json(privacy_statement({"state_dict": {}}).to_json())
        >>> statement.differentially_private, statement.epsilon
        (False, None)
        >>> statement.to_markdown().splitlines()[:4]
        ['---', 'tags:', '  - lightning-privacy', 'privacy:']
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f"`data` must be a privacy statement's to_dict() (format {FORMAT!r}), got {data!r:.80}")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"`data` has format_version {data.get('format_version')!r}; this lightning-privacy reads "
                f"{FORMAT_VERSION}"
            )
        self._data = copy.deepcopy(dict(data))

    # ---------------------------------------------------------------------------------------------------- values
    def to_dict(self) -> Dict[str, Any]:
        """The statement as plain values (a copy), ready for :func:`json.dumps`."""
        return copy.deepcopy(self._data)

    @property
    def differentially_private(self) -> bool:
        """Whether the source holds a DPSGD state with at least one step."""
        return bool(self._data["differentially_private"])

    @property
    def epsilon(self) -> Optional[float]:
        """The accountant's ε at δ (``None`` without DP-SGD or for no finite ε)."""
        guarantee = self._data["guarantee"]
        return None if guarantee is None else guarantee["epsilon"]

    @property
    def summary(self) -> str:
        """One paragraph: the guarantee, or that there is none."""
        return self._data["summary"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyStatement) and other._data == self._data

    def __repr__(self) -> str:
        return f"PrivacyStatement({self.summary!r})"

    # ---------------------------------------------------------------------------------------------------- JSON
    def to_json(self, *, indent: Optional[int] = 2) -> str:
        """The statement as JSON (standard JSON: no NaN or infinity)."""
        return json.dumps(self._data, indent=indent, ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> PrivacyStatement:
        """A statement back from :meth:`to_json`.

        Raises:
            ValueError: text that is no statement's JSON.
        """
        return cls(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyStatement:
        """A statement back from :meth:`to_dict`."""
        return cls(data)

    # ---------------------------------------------------------------------------------------------------- Markdown
    def metadata(self) -> Dict[str, Any]:
        """The model card's YAML metadata as a dict: ``tags`` and a ``privacy`` block (safe-rounded values)."""
        data, m, g = self._data, self._data["mechanism"], self._data["guarantee"]
        tags = ["differential-privacy", "dp-sgd", "lightning-privacy"] if data["differentially_private"] else []
        privacy: Dict[str, Any] = {"differentially_private": data["differentially_private"]}
        if m is None:
            privacy["mechanism"] = "none"
        else:
            privacy.update(
                mechanism="DP-SGD",
                epsilon=None if g["epsilon"] is None or not m["steps"] else float(up(g["epsilon"])),
                delta=m["delta"],
                epsilon_relation="add_remove",
                accountant=m["accountant"],
                noise_multiplier=m["noise_multiplier"],
                sample_rate=m["sample_rate"],
                steps=m["steps"],
                max_grad_norm=m["max_grad_norm"],
                dataset_size=m["dataset_size"],
                mia_bayes_security=float(down(g["bayes_security"])) if m["steps"] else None,
                mia_bayes_security_relation=g["bayes_security_relation"],
                sampling_seed=m["sampling_seed"],
                noise_seed=m["noise_seed"],
            )
        if data["audits"]:
            privacy["audits"] = [{"name": a["audit"], "verdict": a["verdict"]} for a in data["audits"]]
        privacy["statement"] = f"lightning-privacy {data['versions']['computed_with']['lightning_privacy']}"
        return {"tags": tags or ["lightning-privacy"], "privacy": privacy}

    def to_markdown(self, *, front_matter: bool = True, heading_level: int = 2) -> str:
        """A Markdown section for a model card (Hugging Face's README.md), with its YAML metadata block first.

        Args:
            front_matter: start with the ``---`` YAML block (:meth:`metadata`); ``False``: the section alone, to add
                to a card that has its own metadata.
            heading_level: the level of the section's heading (``## Privacy`` by default); its parts are one deeper.

        Raises:
            ValueError: ``heading_level`` not in 1..5.
        """
        if isinstance(heading_level, bool) or heading_level not in (1, 2, 3, 4, 5):
            raise ValueError(f"`heading_level` must be an int in 1..5, got {heading_level!r}")
        data = self._data
        head, part = "#" * heading_level, "#" * (heading_level + 1)
        lines: List[str] = [f"{head} Privacy", "", data["summary"], ""]
        table = ["| quantity | value | meaning |", "|---|---|---|"]
        lines += [f"{part} Mechanism", "", *table, *(f"| {q} | {v} | {m} |" for q, v, m in _mechanism_rows(data)), ""]
        guarantee = _guarantee_rows(data)
        if guarantee:
            lines += [f"{part} Guarantee", "", *table, *(f"| {q} | {v} | {m} |" for q, v, m in guarantee), ""]
        lines += [f"{part} Audits", ""]
        if data["audits"]:
            lines += ["| " + " | ".join(_AUDIT_HEADER) + " |", "|---" * len(_AUDIT_HEADER) + "|"]
            lines += ["| " + " | ".join(_audit_cells(a)) + " |" for a in data["audits"]]
        else:
            lines.append("No audit results are recorded.")
        lines += ["", f"{part} What the numbers do not cover", "", *(f"- {s}" for s in data["not_covered"]), ""]
        lines += [f"{part} Approximations", "", *(f"- {s}" for s in data["approximations"]), ""]
        lines += [f"{part} Versions", "", "| package | version |", "|---|---|"]
        lines += [f"| {a} | {b} |" for a, b in _version_cells(data)]
        body = [_escape(line) for line in lines]
        return "\n".join([*(["---", *_yaml(self.metadata()), "---", ""] if front_matter else []), *body]) + "\n"

    # ---------------------------------------------------------------------------------------------------- report, text
    def report_section(self, trainer: Any = None) -> ReportSection:
        """The statement as the privacy report's section (:mod:`lightning_privacy.reporting`): the value rows, the
        audits, what the numbers do not cover, the approximations and the versions."""
        data = self._data
        rows = [*_mechanism_rows(data), *_guarantee_rows(data)]
        extras = []
        if data["audits"]:
            extras.append(ReportTable("Audits", list(_AUDIT_HEADER), [_audit_cells(a) for a in data["audits"]]))
        extras += [
            ReportTable("What the numbers do not cover", ["not covered"], [[s] for s in data["not_covered"]]),
            ReportTable("Approximations", ["approximation"], [[s] for s in data["approximations"]]),
            ReportTable("Versions", ["package", "version"], _version_cells(data)),
        ]
        warnings: Tuple[str, ...] = ()
        if data["mechanism"] is not None and data["mechanism"]["accountant"] == "gdp":
            warnings = (next(s for s in data["approximations"] if "GDP" in s),)
        return ReportSection("Privacy statement", rows, extras=extras, warnings=warnings)

    def to_text(self) -> str:
        """The statement as plain text for a terminal (``lightning-privacy statement CHECKPOINT``)."""
        data = self._data
        path = data["source"]["path"]
        head = f"Privacy statement of {path}" if path else "Privacy statement"
        lines = [head, "-" * len(head), data["summary"], ""]
        rows = [*_mechanism_rows(data), *_guarantee_rows(data)]
        width = max(len(q) for q, _, _ in rows)
        lines += [f"{q:<{width}}  {v}" for q, v, _ in rows]
        lines += ["", "Audits:"]
        if data["audits"]:
            for audit in data["audits"]:
                name, values, claim, verdict = _audit_cells(audit)
                lines.append(f"  {name}: verdict {verdict}; claim tested: {claim}; {values.replace('`', '')}")
        else:
            lines.append("  none recorded")
        lines += ["", "Not covered:", *(f"  - {s}" for s in data["not_covered"])]
        lines += ["", "Approximations:", *(f"  - {s}" for s in data["approximations"])]
        lines += ["", "Versions: " + ", ".join(f"{a} {b}" for a, b in _version_cells(data))]
        return "\n".join(lines).replace("`", "")

"""DPSGD's checkpoint state: what it saves, and the checks before a resumed run continues the privacy ledger.

Plain functions of the callback's attributes (no Trainer): :func:`dpsgd_state` is ``DPSGD.state_dict``,
:func:`load_dpsgd_state` is ``DPSGD.load_state_dict`` (version 1, the history before the ledger, still loads).
"""

from __future__ import annotations

from typing import Any, Dict

from lightning.pytorch.utilities import rank_zero_warn

from lightning_privacy.checkpoints import dpsgd_state_digest
from lightning_privacy.dpsgd.auto import Switched
from lightning_privacy.dpsgd.settings import new_ledger
from lightning_privacy.ledger import DEFAULT_ACCOUNTANT, accountant_label

STATE_VERSION = 2  # 2: the privacy ledger (history + composed PLD chunks); 1 (history only) still loads

#: the precision of a resumed checkpoint's steps where it saved none (an older version)
NOT_RECORDED = "not recorded"

__all__ = [
    "NOT_RECORDED",
    "STATE_VERSION",
    "check_checkpoint_has_state",
    "dpsgd_state",
    "load_dpsgd_state",
    "state_key_fields",
]


def state_key_fields(dp: Any) -> Dict[str, Any]:
    """What the DPSGD ``dp``'s checkpoint key is made of (its σ or planning target and C), as older checkpoints have it."""
    keys: Dict[str, Any] = dict(
        noise_multiplier=None if dp._planned else dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        target_bayes_security=dp.target_bayes_security,
        epochs=dp.epochs,
    )
    if dp.target_epsilon is not None:  # added later: keys of older checkpoints stay the same
        keys["target_epsilon"] = dp.target_epsilon
    return keys


def clipping_record(dp: Any) -> Dict[str, Any]:
    """``dp``'s clipping rule as plain values (``{"rule": "fixed"}`` for a DPSGD from before the rules)."""
    rule = getattr(dp, "clipping", None)
    return {"rule": "fixed"} if rule is None else rule.record()


def unit_record(dp: Any) -> Dict[str, Any]:
    """The privacy unit of ``dp`` (``None``: the row, as every checkpoint before user-level DP) as plain values."""
    if dp is None or getattr(dp, "privacy_unit", "example") == "example":
        return {"unit": "example"}
    return {
        "unit": "user",
        "max_examples_per_user": dp.max_examples_per_user,
        "user_sampling": dp.user_sampling,
        "user_reduction": dp.user_reduction,
    }


def dpsgd_state(dp: Any) -> Dict[str, Any]:
    """The state a checkpoint keeps of the DPSGD ``dp``: the ledger, the recipe, and what loading and auditing need,
    sealed by a digest of them (:func:`~lightning_privacy.checkpoints.dpsgd_state_digest`)."""
    switched = getattr(dp, "grad_sample_mode_switch", None)
    state = {
        "version": STATE_VERSION,
        "accountant": dp.accountant_mechanism,
        "ledger": dp.ledger.state_dict(),
        "noise_multiplier": dp.noise_multiplier,
        "sample_rate": dp.sample_rate,
        "max_grad_norm": dp.max_grad_norm,
        "sampling_seed": dp.sampling_seed,  # a fixed seed only; an OS-drawn one is never saved
        "noise_seed": dp.noise_seed,  # likewise
        # for loading and auditing the checkpoint (lightning_privacy.checkpoints), not for resuming: a resumed
        # fit records its own in setup and when its train loader is built
        "fixed_modules": [dict(entry) for entry in dp.fixed_modules],
        "dataset_size": dp.dataset_size,
        # the public constant the noised clipped sum was divided by (over all ranks), and whether q was given
        # (else q = 1/len(train loader), which makes the number of batches public)
        "expected_batch_size": dp.expected_batch_size,
        "sample_rate_given": dp.sample_rate_argument is not None,
        "sample_rate_origin": dp.sample_rate_origin,  # e.g. 1/⌊N/batch size⌋ for a loader with drop_last=True
        # the recipe, for audits that retrain like the run (reference models) and report its δ
        "delta": dp.delta,
        "loss_reduction": dp.loss_reduction,
        "grad_sample_mode": dp.grad_sample_mode,
        # grad_sample_mode="auto" left hooks for functional mode (dpsgd.auto): at which step and why
        "grad_sample_mode_switch": None if switched is None else switched.state_dict(),
        # for the privacy statement (lightning_privacy.statement): how the noise was drawn and on what strategy
        "secure_mode": dp.secure_mode,
        "strategy": dp.strategy_name,
        "world_size": dp.world_size,
        # the privacy unit (lightning_privacy.dpsgd.users): a resume must protect the same unit with the same bound
        "privacy_unit": unit_record(dp),
        # the clipping rule (lightning_privacy.dpsgd.clipping): a resume must clip as the run did
        "clipping": clipping_record(dp),
        "clip": None if getattr(dp, "quantile", None) is None else dp.quantile.clip,  # quantile clipping's C_t
        # the Trainer's precision and the steps whose clipped sum bounded each example by C only up to 16-bit
        # rounding (ghost clipping: lightning_privacy.dpsgd.ghost_mode), for the statement
        "precision": {"precision": getattr(dp, "precision", None), "rounded_steps": getattr(dp, "rounded_steps", 0)},
    }
    state["digest"] = dpsgd_state_digest(state)  # the statement recomputes it: an edit after saving shows
    return state


def load_dpsgd_state(dp: Any, state_dict: Dict[str, Any]) -> None:
    """Continue ``dp``'s ledger from a checkpoint's state; refuses a state of another accountant or clipping norm, or
    one that lacks the history (accounting would restart at 0), and warns when the seeds differ."""
    version = state_dict.get("version")
    history_key = "ledger" if version == STATE_VERSION else "history"
    missing = {"version", "accountant", history_key, "max_grad_norm"} - set(state_dict)
    if missing:
        raise RuntimeError(f"DPSGD state is missing {sorted(missing)}: refusing to restart privacy accounting at 0")
    if version not in (1, STATE_VERSION):
        raise RuntimeError(f"DPSGD state version {version!r} is not {STATE_VERSION} (or 1)")
    if state_dict["accountant"] != dp.accountant_mechanism:
        if dp._accountant_given:
            raise RuntimeError(
                f"checkpoint accounted with {state_dict['accountant']!r}, this DPSGD uses {dp.accountant_mechanism!r}"
            )
        rank_zero_warn(  # (a 0.2.0 checkpoint: RDP was the default then)
            f"The checkpoint was accounted with the {state_dict['accountant']!r} accountant; the resumed run keeps it so "
            f"that its ε stays one computation ({accountant_label(state_dict['accountant'])}). New runs use "
            f"{DEFAULT_ACCOUNTANT!r} (a certified, tighter ε); pass DPSGD(accountant={state_dict['accountant']!r}) to "
            "silence this."
        )
        dp.accountant_mechanism = state_dict["accountant"]
        dp.ledger = new_ledger(dp)
    saved_unit, own_unit = state_dict.get("privacy_unit") or unit_record(None), unit_record(dp)
    if saved_unit != own_unit:
        raise RuntimeError(
            f"checkpoint trained with privacy unit {saved_unit}, this DPSGD has {own_unit}: a run's unit, bound and "
            "sampling cannot change on resume (its ledger accounts one of them); resume with the checkpoint's "
            "DPSGD(privacy_unit=..., max_examples_per_user=..., user_sampling=...)."
        )
    if (state_dict.get("clipping") or {"rule": "fixed"}) != clipping_record(dp):
        raise RuntimeError(
            f"checkpoint trained with clipping {state_dict.get('clipping') or {'rule': 'fixed'}}, this DPSGD has "
            f"{clipping_record(dp)}: resume with the checkpoint's DPSGD(clipping=..., stability=...)."
        )
    dp._resumed_clip = state_dict.get("clip")  # (quantile clipping continues from the saved C)
    if state_dict["max_grad_norm"] != dp.max_grad_norm:
        raise RuntimeError(
            f"checkpoint trained with max_grad_norm={state_dict['max_grad_norm']}, this DPSGD has {dp.max_grad_norm}"
        )
    for name, what in (("sampling_seed", "masks"), ("noise_seed", "noise")):
        saved, own = state_dict.get(name), getattr(dp, name)
        if saved is not None and saved != own:
            rank_zero_warn(
                f"The checkpoint was trained with DPSGD({name}={saved}) and this DPSGD has {name}={own!r}: the "
                f"resumed run draws other {what} than the uninterrupted run would have (still independent of the "
                "earlier ones)."
            )
    if version == 1:  # before the ledger: only the history; the PLD is recomposed from its segments
        ledger = {"version": 1, "accountant": dp.accountant_mechanism, "history": state_dict["history"]}
    else:
        ledger = state_dict["ledger"]
    dp.ledger.load_state_dict(ledger)
    dp.grad_sample_mode_switch = Switched.from_state(state_dict.get("grad_sample_mode_switch"))
    # (older versions saved none: the steps so far are of a precision not recorded, and none was counted)
    precision = state_dict.get("precision") or {"precision": NOT_RECORDED if dp.ledger.steps else None}
    dp.precision, dp.rounded_steps = precision.get("precision"), int(precision.get("rounded_steps") or 0)


def check_checkpoint_has_state(state_key: str, checkpoint: Dict[str, Any]) -> None:
    """A checkpoint resumed with DPSGD must hold its state under ``state_key`` (else accounting would restart at 0)."""
    saved = checkpoint.get("callbacks", {})
    if state_key not in saved:
        others = [key for key in saved if isinstance(key, str) and key.startswith("DPSGD{")]
        if others:
            differences = "; ".join(_key_differences(key, state_key) for key in others)
            raise RuntimeError(
                f"The checkpoint's DPSGD was built with other arguments than this one ({differences}): the callback "
                "that resumes a run must be built as the one that saved it, so that its state (the privacy history) "
                "is found and continued. Resume with the checkpoint's arguments, or start a new fit (its ledger then "
                "starts at 0: a fresh DPSGD does not compose with the checkpoint's spent privacy)."
            )
        raise RuntimeError(
            f"The checkpoint has no DPSGD state under {state_key!r}: its privacy history is unknown, so "
            "resuming would restart accounting at 0. Resume with the same DPSGD arguments as the original run."
        )


def _key_fields(key: str) -> Dict[str, Any]:
    """The arguments a DPSGD state key was made of (``DPSGD{...}``, Lightning's ``_generate_state_key``)."""
    import ast

    try:
        fields = ast.literal_eval(key[len("DPSGD") :])
    except (ValueError, SyntaxError):
        return {}
    return fields if isinstance(fields, dict) else {}


def _key_differences(saved: str, wanted: str) -> str:
    """What differs between the checkpoint's DPSGD key and this DPSGD's, argument by argument."""
    old, new = _key_fields(saved), _key_fields(wanted)
    names = [name for name in dict.fromkeys([*old, *new]) if old.get(name) != new.get(name)]
    if not names:
        return f"saved under {saved!r}, this DPSGD's key is {wanted!r}"
    return ", ".join(f"{name}={old.get(name)!r} in the checkpoint, {new.get(name)!r} here" for name in names)

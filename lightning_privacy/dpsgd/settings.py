"""DPSGD's settings without a Trainer: its argument checks, seeds, the planned σ, and the module made trainable.

Everything here takes plain values or a ``torch.nn.Module`` (no Trainer), so it is tested directly; the callback
(:class:`~lightning_privacy.DPSGD`) calls it from ``__init__``, ``setup`` and ``on_fit_start``.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.validators import ModuleValidator

from lightning_privacy import names
from lightning_privacy._validation import check_bool, check_choice, check_int, check_open_unit, check_positive
from lightning_privacy.dpsgd import users
from lightning_privacy.dpsgd.clipping import AUTOMATIC, QUANTILE, RULES, ClippingRule
from lightning_privacy.dpsgd.modules import (
    fix_modules_in_place,
    fixed_modules_record,
    hooks_unsampled_layers,
    incompatible_layers,
    incompatible_layers_message,
    replacements_warning,
)
from lightning_privacy.ledger import ACCOUNTANTS, DEFAULT_ACCOUNTANT, PrivacyLedger

GRAD_SAMPLE_MODES = ("hooks", "ghost", "functional", "auto")


def positive(name: str, value: Any) -> float:
    return check_positive(name, value, exc=MisconfigurationException)


def check_arguments(noise_multiplier: Any, target_bayes_security: Any, target_epsilon: Any, epochs: Any) -> None:
    """Exactly one of σ and the two targets; ``epochs`` with a target (a positive int) and only then."""
    given = {
        "noise_multiplier": noise_multiplier,
        "target_bayes_security": target_bayes_security,
        "target_epsilon": target_epsilon,
    }
    if sum(v is not None for v in given.values()) != 1:
        raise MisconfigurationException(
            "Give exactly one of `noise_multiplier`, `target_bayes_security` or `target_epsilon` (with `epochs`), "
            f"got {', '.join(f'{k}={v!r}' for k, v in given.items())}"
        )
    if noise_multiplier is not None:
        positive("noise_multiplier", noise_multiplier)
        if epochs is not None:
            raise MisconfigurationException(
                "`epochs` is only used with `target_bayes_security` or `target_epsilon`; remove it"
            )
        return
    check_open_unit("target_bayes_security", target_bayes_security, exc=MisconfigurationException, optional=True)
    if target_epsilon is not None:
        positive("target_epsilon", target_epsilon)
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise MisconfigurationException(
            f"`epochs` must be a positive int when planning σ from a target, got {epochs!r}"
        )


def check_choices(*, delta: Any, accountant: Any, loss_reduction: Any, mode: Any) -> None:
    """δ in (0, 1), and the accountant, the loss reduction and the per-sample gradient mode from their choices."""
    check_open_unit("delta", delta, exc=MisconfigurationException, float_only=True)
    check_choice("accountant", accountant, ACCOUNTANTS, exc=MisconfigurationException)
    check_choice("loss_reduction", loss_reduction, ("mean", "sum"), exc=MisconfigurationException)
    check_choice("grad_sample_mode", mode, GRAD_SAMPLE_MODES, exc=MisconfigurationException)


def seed(name: str, value: Optional[int], secure: bool, what: str, whose: str) -> Optional[int]:
    """A fixed seed (a non-negative int) or None; a fixed seed contradicts ``secure_mode``."""
    if value is None:
        return None
    check_int(name, value, minimum=0, exc=MisconfigurationException)
    if secure:
        raise MisconfigurationException(
            f"`{name}={value!r}` makes {what} reproducible, which `secure_mode=True` rules out (its {whose} come from "
            "fresh OS entropy every step); give one or the other"
        )
    return value


def set_arguments(
    dp: Any,
    *,
    noise_multiplier: Any,
    max_grad_norm: Any,
    target_bayes_security: Any,
    target_epsilon: Any,
    epochs: Any,
    delta: Any,
    accountant: Optional[str],
    loss_reduction: Any,
    secure_mode: Any,
    sampling_seed: Optional[int],
    noise_seed: Optional[int],
    log_clipping: Any,
    clipping_every_n_steps: Any,
    grad_sample_mode: Any,
    fix_modules: Any,
    exactness_examples: Any,
    sample_rate: Any = None,
    expected_batch_size: Any = None,
    functional_chunk_size: Any = None,
    exactness_rate: Any = 0.01,
    neighbour_rate: Any = 0.005,
    privacy_unit: Any = "example",
    user_ids: Any = None,
    max_examples_per_user: Any = None,
    user_sampling: Any = True,
    user_reduction: Any = "sum",
    clipping: Any = "fixed",
    stability: Any = 0.01,
    target_quantile: Any = 0.5,
    clipping_learning_rate: Any = 0.2,
    count_noise_multiplier: Any = None,
) -> None:
    """:class:`~lightning_privacy.DPSGD`'s arguments checked (a MisconfigurationException naming the argument and the
    value) and stored on ``dp`` under their names (the accountant as ``accountant_mechanism``)."""
    check_arguments(noise_multiplier, target_bayes_security, target_epsilon, epochs)
    dp._accountant_given = accountant is not None  # (else a resumed checkpoint's accountant is kept)
    accountant = DEFAULT_ACCOUNTANT if accountant is None else accountant
    check_choices(delta=delta, accountant=accountant, loss_reduction=loss_reduction, mode=grad_sample_mode)
    bad = MisconfigurationException
    dp.clipping = clipping_rule(clipping, stability, max_grad_norm)
    if clipping == QUANTILE:
        dp.clipping = quantile_rule(target_quantile, clipping_learning_rate, count_noise_multiplier)
    dp.quantile = None  # this fit's QuantileClipping (the adaptive C), built with the DP optimizer
    dp.max_grad_norm = positive("max_grad_norm", 1.0 if max_grad_norm is None else max_grad_norm)
    dp.grad_sample_mode = grad_sample_mode  # (each fit resolves "auto": dpsgd.strategies.resolve_grad_sample_mode)
    dp.grad_sample_mode_argument = grad_sample_mode
    dp.grad_sample_mode_switch = None  # auto's switch to functional mode (dpsgd.auto.Switched), saved
    dp.grad_sample_mode_reason = None if grad_sample_mode == "auto" else "given as DPSGD(grad_sample_mode=...)"
    if functional_chunk_size is not None:
        functional_chunk_size = check_int("functional_chunk_size", functional_chunk_size, minimum=1, exc=bad)
    dp.functional_chunk_size = functional_chunk_size
    dp.fix_modules = check_bool("fix_modules", fix_modules, exc=bad)
    if exactness_examples is not None:
        exactness_examples = check_int("exactness_examples", exactness_examples, minimum=1, exc=bad)
    dp.exactness_examples = exactness_examples
    if isinstance(exactness_rate, bool) or not isinstance(exactness_rate, (int, float)) or not 0 <= exactness_rate <= 1:
        raise bad(f"DPSGD(exactness_rate={exactness_rate!r}): expected a share of the steps in [0, 1] (0: never).")
    dp.exactness_rate = float(exactness_rate)
    if isinstance(neighbour_rate, bool) or not isinstance(neighbour_rate, (int, float)) or not 0 <= neighbour_rate <= 1:
        raise bad(f"DPSGD(neighbour_rate={neighbour_rate!r}): expected a share of the later steps in [0, 1].")
    dp.neighbour_rate = float(neighbour_rate)
    dp.noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)
    dp._planned = noise_multiplier is None
    dp.target_bayes_security = target_bayes_security
    dp.target_epsilon = None if target_epsilon is None else float(target_epsilon)
    dp.epochs, dp.delta, dp.accountant_mechanism, dp.loss_reduction = epochs, delta, accountant, loss_reduction
    dp.secure_mode = check_bool("secure_mode", secure_mode, exc=bad)
    dp.sampling_seed = seed("sampling_seed", sampling_seed, secure_mode, "the batches", "masks")
    dp.noise_seed = seed("noise_seed", noise_seed, secure_mode, "the noise", "noise")
    dp.log_clipping = check_bool("log_clipping", log_clipping, exc=bad)
    dp.clipping_every_n_steps = check_int("clipping_every_n_steps", clipping_every_n_steps, minimum=1, exc=bad)
    if sample_rate is not None and (
        isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real) or not 0 < sample_rate <= 1
    ):
        raise bad(f"`sample_rate` must be a number in (0, 1], got {sample_rate!r}")
    dp.sample_rate_argument = None if sample_rate is None else float(sample_rate)
    dp.expected_batch_size_argument = check_positive("expected_batch_size", expected_batch_size, exc=bad, optional=True)
    set_unit(dp, privacy_unit, user_ids, max_examples_per_user, user_sampling, user_reduction)


def clipping_rule(rule: Any, stability: Any, max_grad_norm: Any) -> ClippingRule:
    """The clipping rule from DPSGD's arguments (:mod:`lightning_privacy.dpsgd.clipping`), each bad combination in
    one sentence naming the argument and the fix."""
    bad = MisconfigurationException
    if rule not in RULES:
        raise bad(
            f"DPSGD(clipping={rule!r}): 'fixed' (the default: clip each gradient to max_grad_norm), 'quantile' (C "
            "adapted to a target quantile of the norms) or 'automatic' (scale each by 1/(‖g‖ + stability))."
        )
    if rule == QUANTILE:
        return ClippingRule(QUANTILE)  # (its parameters: quantile_rule)
    if rule != AUTOMATIC:
        return ClippingRule()
    if max_grad_norm is not None:
        raise bad(
            f"DPSGD(clipping='automatic', max_grad_norm={max_grad_norm!r}): automatic clipping scales every gradient "
            "to a norm below 1 and has no clipping norm; drop max_grad_norm (the learning rate takes its place)."
        )
    if isinstance(stability, bool) or not isinstance(stability, numbers.Real) or not stability > 0:
        raise bad(f"DPSGD(stability={stability!r}): automatic clipping's γ in 1/(‖g‖ + γ) must be a number > 0.")
    return ClippingRule(AUTOMATIC, float(stability))


def quantile_rule(target: Any, learning_rate: Any, count_noise: Any) -> ClippingRule:
    """Andrew et al.'s adaptive clipping from DPSGD's arguments, each bad one in a sentence naming it and the fix."""
    bad = MisconfigurationException
    if isinstance(target, bool) or not isinstance(target, numbers.Real) or not 0 < target < 1:
        raise bad(f"DPSGD(target_quantile={target!r}): the share of examples whose norm C should cover, in (0, 1).")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real) or not learning_rate > 0:
        raise bad(f"DPSGD(clipping_learning_rate={learning_rate!r}): the geometric step of C must be a number > 0.")
    if count_noise is not None and (
        isinstance(count_noise, bool) or not isinstance(count_noise, numbers.Real) or not count_noise > 0
    ):
        raise bad(f"DPSGD(count_noise_multiplier={count_noise!r}): σ_b of the noised count must be a number > 0.")
    return ClippingRule(
        QUANTILE, target_quantile=float(target), learning_rate=float(learning_rate),
        count_noise_multiplier=None if count_noise is None else float(count_noise),
    )  # fmt: skip


def set_unit(dp: Any, unit: Any, user_ids: Any, k: Any, user_sampling: Any, user_reduction: Any) -> None:
    """The privacy unit's arguments (:mod:`lightning_privacy.dpsgd.users`), checked against each other and the mode."""
    try:
        users.check_user_arguments(unit, user_ids, k, user_sampling, user_reduction)
    except ValueError as error:
        raise MisconfigurationException(str(error)) from None
    dp.privacy_unit, dp.user_ids, dp.max_examples_per_user = unit, user_ids, None if k is None else int(k)
    dp.user_sampling, dp.user_reduction = bool(user_sampling), user_reduction
    dp.people = None  # this fit's users.People (built with the train loader)
    if unit == "user" and user_sampling and dp.grad_sample_mode == "ghost":
        raise MisconfigurationException(
            "DPSGD(privacy_unit='user', grad_sample_mode='ghost'): ghost clipping computes each row's gradient norm, "
            "not the norm of a person's summed gradient (that needs the cross terms of the person's rows); use "
            "grad_sample_mode='auto' (the default), 'hooks' or 'functional', or user_sampling=False (rows clipped "
            "one by one, accounted for groups of max_examples_per_user)."
        )
    if group_size(dp) > 1 and dp.accountant_mechanism != "pld":
        raise MisconfigurationException(
            f"DPSGD(privacy_unit='user', user_sampling=False, accountant={dp.accountant_mechanism!r}): a person's "
            "rows, each sampled on its own, are accounted by the PLD of groups (Charles et al.'s mixture of "
            "Gaussians), which only accountant='pld' (the default) computes."
        )


def group_size(dp: Any) -> int:
    """The rows the ledger's unit adds or removes, each Poisson-sampled on its own: k under user-level DP with
    example-level sampling (ELS), else 1 (a row, or a person sampled as a whole)."""
    if getattr(dp, "privacy_unit", "example") == "user" and not dp.user_sampling:
        return int(dp.max_examples_per_user)
    return 1


def new_ledger(dp: Any, accountant: Optional[str] = None) -> PrivacyLedger:
    """A fresh ledger for ``dp``'s privacy unit (a group ledger under ELS: add/remove of a person's k rows)."""
    k = group_size(dp)
    unit: Dict[str, Any] = {"relation": "add_remove", "group_size": k} if k > 1 else {}
    if getattr(dp, "privacy_unit", "example") == "user":
        unit["unit"] = "person"
    return PrivacyLedger(accountant=accountant or dp.accountant_mechanism, delta=dp.delta, **unit)


def dp_divisor(dp: Any, loader_batch_size: Optional[int], *, dataset_size: int) -> float:
    """The public constant the step's noised clipped sum is divided by (mean reduction), over all ranks.

    ``DPSGD(expected_batch_size=...)`` where given, else the train loader's ``batch_size``: a hyper-parameter, never
    computed from the private training set. (Opacus' ``make_private`` divides by ``int(len(dataset) · q)``, which
    differs between a dataset and its neighbour with one row fewer whenever ``N·q`` is within ``q`` of an integer —
    ``N`` a multiple of the batch size — so the noise's scale in the released weights tells them apart.) A
    ``batch_size`` of ``None`` (an Opacus ``DPDataLoader``, a ``batch_sampler``) must be replaced by the argument.
    A divisor far from the expected batch ``N·q`` only rescales the learning rate; it warns once.
    """
    if dp.expected_batch_size_argument is not None:
        divisor = float(dp.expected_batch_size_argument)
    elif loader_batch_size is None:
        raise MisconfigurationException(
            "DPSGD divides the noised clipped sum by a public constant, the train loader's `batch_size`, but this "
            "train loader has none (an Opacus DPDataLoader or a custom `batch_sampler`): give "
            "DPSGD(expected_batch_size=...), e.g. the batch size the loader was built for. (The number of rows times "
            "the sample rate would depend on the private dataset size.)"
        )
    else:
        divisor = float(loader_batch_size)
    expected = dataset_size * float(dp.sample_rate)
    if expected > 0 and not 0.5 <= divisor / expected <= 2.0:
        rank_zero_warn(
            f"DPSGD divides each step's noised clipped sum by {divisor:g} (the "
            f"{'`expected_batch_size` argument' if dp.expected_batch_size_argument is not None else 'loader batch_size'}"
            f"), while the expected Poisson batch is {expected:.4g} rows (sample rate {float(dp.sample_rate):.4g}): "
            "the update is scaled by their ratio, as a learning rate would be. Give DPSGD(expected_batch_size=...) "
            "near the expected batch if that is not intended (it must not be computed from the private data)."
        )
    return divisor


def seed_kind(value: Optional[int], secure: bool) -> str:
    """How a seed was chosen, for HPARAMS and the report (never the seed itself)."""
    if secure:
        return "secure (OS CSPRNG every step)"
    return "fixed (reproducible, not secret)" if value is not None else "secret (OS entropy per fit)"


def sample_rate_source(dp: Any) -> str:
    """Where q came from, which says what it makes public: the argument (nothing about the data), an Opacus
    ``DPDataLoader``'s own rate, or ``1/len(train loader)`` (the number of batches per epoch, hence ⌈N/batch⌉)."""
    if dp.sample_rate_argument is not None:
        return "argument"
    return getattr(dp, "sample_rate_origin", None) or "1/len(train loader)"


def privacy_settings(dp: Any) -> Dict[str, Any]:
    """The privacy settings of the DPSGD ``dp``, as logged in TensorBoard's HPARAMS tab (seeds by kind only)."""
    settings: Dict[str, Any] = {
        names.DP_NOISE_MULTIPLIER: dp.noise_multiplier,
        names.DP_MAX_GRAD_NORM: dp.max_grad_norm,
        names.DP_SAMPLE_RATE: dp.sample_rate,
        names.DP_DELTA: dp.delta,
        names.DP_ACCOUNTANT: dp.accountant_mechanism,
        names.DP_GRAD_SAMPLE_MODE: dp.grad_sample_mode,
        names.DP_SAMPLING_SEED: seed_kind(dp.sampling_seed, dp.secure_mode),
        names.DP_NOISE_SEED: seed_kind(dp.noise_seed, dp.secure_mode),
        names.DP_EXPECTED_BATCH_SIZE: dp.expected_batch_size,
        names.DP_SAMPLE_RATE_SOURCE: sample_rate_source(dp),
        names.DP_PRIVACY_UNIT: "person" if getattr(dp, "privacy_unit", "example") == "user" else "example",
        names.DP_CLIPPING: getattr(getattr(dp, "clipping", None), "rule", "fixed"),
    }
    if settings[names.DP_PRIVACY_UNIT] == "person":
        if dp.max_examples_per_user is not None:
            settings[names.DP_MAX_EXAMPLES_PER_USER] = dp.max_examples_per_user
        settings[names.DP_USER_SAMPLING] = "people" if dp.user_sampling else "rows"
    if dp.target_bayes_security is not None:
        settings[names.DP_TARGET_BAYES_SECURITY] = float(dp.target_bayes_security)
    if dp.target_epsilon is not None:
        settings[names.DP_TARGET_EPSILON] = dp.target_epsilon
    if dp._planned:
        settings[names.DP_PLANNED_EPOCHS] = int(dp.epochs)
    return settings


def plan_noise_multiplier(
    *,
    sample_rate: float,
    steps_per_epoch: int,
    epochs: int,
    accountant: str,
    target_bayes_security: Optional[float],
    target_epsilon: Optional[float],
    delta: float,
    max_epochs: Optional[int] = None,
    group_size: int = 1,
) -> float:
    """σ for the target after ``epochs`` epochs, from the ledger's one calibration routine (logged; a Trainer's
    ``max_epochs`` above ``epochs`` warns). ``group_size`` k > 1: for a person's k rows each sampled on its own."""
    unit = {"relation": "add_remove", "group_size": group_size} if group_size > 1 else {}
    steps = epochs * steps_per_epoch
    if target_bayes_security is not None:
        target, what = dict(target_bayes_security=float(target_bayes_security)), "β*_MIA ≥"
    else:
        target, what = dict(target_epsilon=target_epsilon, delta=delta), f"ε(δ={delta:g}) ≤"
    try:
        sigma = PrivacyLedger.calibrate(
            sample_rate=sample_rate,
            steps=steps,
            accountant=accountant,
            steps_per_read=steps_per_epoch,
            **target,
            **unit,
        )
    except ValueError as error:  # before any step: the target cannot be met
        raise MisconfigurationException(
            f"DPSGD({', '.join(f'{k}={v!r}' for k, v in target.items())}, epochs={epochs}): {error}"
        ) from None
    rank_zero_info(
        f"DPSGD: planned noise_multiplier={sigma:.4f} for {what} {next(iter(target.values()))} "
        f"after {epochs} epochs ({steps} steps at sample_rate={sample_rate:.3g})."
    )
    asked = ", ".join(f"{k}={v!r}" for k, v in target.items())
    if max_epochs is not None and max_epochs > epochs:
        rank_zero_warn(
            f"Trainer(max_epochs={max_epochs}) exceeds the planned epochs={epochs}: the run will "
            "exceed the privacy target unless PrivacyBudgetStopping stops it."
        )
    elif max_epochs is not None and 0 < max_epochs < epochs:
        reached = _reached(sigma, sample_rate, max_epochs * steps_per_epoch, accountant, delta, target, unit)
        rank_zero_warn(
            f"Trainer(max_epochs={max_epochs}) ends the fit before the planned DPSGD(epochs={epochs}): "
            f"noise_multiplier={sigma:.4f}, planned for {what} {next(iter(target.values()))} after {epochs} epochs, "
            f"is spent over {max_epochs}, which ends at {reached}: more noise than the target needs. Give "
            f"DPSGD({asked}, epochs={max_epochs}) to plan for the fit you run."
        )
    if sigma > SANE_NOISE_MULTIPLIER:
        at_sane = _reached(SANE_NOISE_MULTIPLIER, sample_rate, steps, accountant, delta, target, unit)
        rank_zero_warn(
            f"DPSGD({asked}, epochs={epochs}) plans noise_multiplier={sigma:.6g}, above {SANE_NOISE_MULTIPLIER:g}: "
            f"each step's noise is {sigma:.4g}× the clipping norm, which drowns the clipped gradients of any "
            f"realistic batch and trains little. noise_multiplier={SANE_NOISE_MULTIPLIER:g} would still give "
            f"{at_sane} over the same {steps} steps; loosen the target, or train fewer steps or at a smaller sample "
            "rate (a larger training set) if this one is needed."
        )
    return sigma


#: above this noise multiplier a planned σ is named in a warning (a target too strict to train under)
SANE_NOISE_MULTIPLIER = 50.0


def _reached(
    sigma: float, sample_rate: float, steps: int, accountant: str, delta: float, target: dict, unit: dict
) -> str:
    """The planned quantity (ε at δ, or β*_MIA) of ``steps`` steps at (σ, q), as words for a warning."""
    ledger = PrivacyLedger(accountant=accountant, delta=delta, **unit)
    ledger.step(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps)
    if "target_bayes_security" in target:
        return f"β*_MIA = {ledger.bayes_security():.4f}"
    return f"ε = {ledger.epsilon(delta):.4g} (δ = {delta:g})"


def prepare_module(
    module: torch.nn.Module, *, fix_modules: bool, grad_sample_mode: str = "hooks"
) -> Optional[List[Dict[str, str]]]:
    """Make ``module`` trainable by DP-SGD or refuse it, in ``setup``: :func:`fix_module` then :func:`check_module`.
    Returns the record of what ``fix_modules`` replaced (``None`` without it)."""
    record = fix_module(module, fix_modules=fix_modules)
    check_module(module, fix_modules=fix_modules, grad_sample_mode=grad_sample_mode)
    return record


def fix_module(module: torch.nn.Module, *, fix_modules: bool) -> Optional[List[Dict[str, str]]]:
    """With ``fix_modules``, Opacus' fixers replace the layers DP-SGD cannot train (warning with the list); returns
    the record of what was replaced (``None`` without ``fix_modules``)."""
    if not fix_modules:
        return None
    replaced = fix_modules_in_place(module)
    if replaced:
        rank_zero_warn(replacements_warning(replaced))
    return fixed_modules_record(replaced)


#: layers refused only because Opacus' hooks cannot sample them (fused recurrent and attention kernels, convolutions
#: that pad with other than zeros); functional mode differentiates them itself. Every other refusal (batch or running
#: statistics, embeddings that leak or mix) holds in every mode.
_HOOKS_ONLY = ("MultiheadAttention", "LSTM", "GRU", "RNN", "Conv1d", "Conv2d", "Conv3d")


def check_module(module: torch.nn.Module, *, fix_modules: bool, grad_sample_mode: str = "hooks") -> None:
    """Refuse a layer DP-SGD cannot train in ``grad_sample_mode`` (starting with the fix), and put the trainable
    layers of a module left in eval mode into train mode (Opacus' hooks need it). Functional mode
    (:mod:`lightning_privacy.dpsgd.functional`) differentiates each example's loss itself: it does not refuse what
    Opacus' hooks alone cannot sample, and leaves the modules' modes as they are."""
    functional = grad_sample_mode == "functional"
    sparse = [
        name for name, m in module.named_modules()
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad
    ]  # fmt: skip
    if sparse and grad_sample_mode in ("hooks", "ghost"):
        raise MisconfigurationException(
            f"DPSGD(grad_sample_mode={grad_sample_mode!r}): {', '.join(f'`{n}`' for n in sparse[:5])} "
            "(Embedding(sparse=True)) gives a sparse gradient, which Opacus' per-example hooks do not take; DP-SGD's "
            "noise reaches every row, so its step is dense anyway: use sparse=False, or grad_sample_mode='auto' (the "
            "default) or 'functional', which clip its dense per-example gradients."
        )
    layers = incompatible_layers(module)  # (also what Opacus' validator lets through: padded convolutions)
    if functional:
        layers = [layer for layer in layers if layer.kind not in _HOOKS_ONLY]
    else:
        layers += hooks_unsampled_layers(module)
    if layers or (not functional and ModuleValidator.validate(module, strict=False) and module.training):
        owner = type(module).__name__
        other = (
            [] if module.training or functional else [f"{owner} is in eval mode: call `model.train()` before `fit`."]
        )
        raise MisconfigurationException(
            incompatible_layers_message(owner, layers, fix_modules=fix_modules, other=other)
        )
    if not functional:
        train_trainable_layers(module)  # only eval mode remained of the validator's complaints


def train_trainable_layers(module: torch.nn.Module) -> None:
    """Put the layers with trainable parameters into train mode, warning with their names.

    Opacus records a layer's activations only in train mode, so a module left in eval mode (``model.eval()`` before
    ``fit``, or what ``from_pretrained`` leaves) would fail at its first step with "No activations detected". Layers
    without trainable parameters keep their mode (a frozen BatchNorm kept in eval mode is deliberate); the module
    itself is switched too (Opacus' validator asks for it).
    """
    chosen = [
        (name or type(m).__name__, m)
        for name, m in module.named_modules()
        if not m.training and (m is module or any(p.requires_grad for p in m.parameters(recurse=False)))
    ]
    if not chosen:
        return
    for _, m in chosen:
        m.training = True  # this module only: its children keep their own mode
    switched = [name for name, _ in chosen]
    others = [name for name, m in module.named_modules() if not m.training and name]
    shown = ", ".join(f"`{n}`" for n in switched[:8]) + (f" and {len(switched) - 8} more" if len(switched) > 8 else "")
    rest = (
        f" {len(others)} module(s) without trainable parameters stay in eval mode "
        f"({', '.join(f'`{n}`' for n in others[:3])}{', …' if len(others) > 3 else ''}); call `model.train()` before "
        "`fit` if they should train (dropout)."
        if others
        else ""
    )
    rank_zero_warn(
        f"DPSGD put {len(switched)} module(s) into train mode before the first step: {shown} — the module and its "
        "layers with trainable parameters, which Opacus needs in train mode to compute per-example gradients (the "
        f"module was left in eval mode).{rest}"
    )

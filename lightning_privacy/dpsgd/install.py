"""DPSGD's wiring into a fit: the DP optimizer, Opacus' hooks and the backward per strategy, and their removal.

:func:`prepare_fit` is the body of ``DPSGD.setup`` (checks, a fresh ledger for another module, the Poisson
sampling); :func:`install_dp_optimizer` is the body of ``DPSGD.on_fit_start``: it checks the optimizers, builds the Poisson
loader to learn the sample rate, plans σ where asked, attaches Opacus' per-example hooks (per-sample or ghost
clipping, FSDP2's hook views), replaces the module's backward (:class:`~lightning_privacy.dpsgd.backward.PerExampleBackward`), wraps the
optimizer in the strategy's DP optimizer class (:mod:`lightning_privacy.dpsgd.strategies`) with its noise source, and arms the self-checks.
:func:`epoch_end` is the body of ``DPSGD.on_train_epoch_end`` (the steps' accounting checked, the epoch's logs);
:func:`remove_dp_hooks` undoes the hooks at ``teardown``.
"""

from __future__ import annotations

import functools
import secrets
import weakref
from typing import Any, Callable, List

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import DPOptimizer

from lightning_privacy import _compat, names
from lightning_privacy.dpsgd import checks, functional, neighbours, sampled_exactness, state, strategies, users
from lightning_privacy.dpsgd.auto import AutoSwitch
from lightning_privacy.dpsgd.backward import PerExampleBackward
from lightning_privacy.dpsgd.bookkeeping import exact_under_autocast
from lightning_privacy.dpsgd.clipping import QuantileClipping
from lightning_privacy.dpsgd.exactness import ExactnessRecord
from lightning_privacy.dpsgd.loaders import install_poisson_sampling, make_poisson_loader
from lightning_privacy.dpsgd.modes import distributed, loss_scale
from lightning_privacy.dpsgd.products import wide
from lightning_privacy.dpsgd.self_checks import SelfChecks
from lightning_privacy.dpsgd.settings import (
    check_module,
    dp_divisor,
    fix_module,
    group_size,
    new_ledger,
    plan_noise_multiplier,
)

__all__ = [
    "check_steps_accounted",
    "check_trainer",
    "epoch_end",
    "install_dp_optimizer",
    "prepare_fit",
    "record_step",
    "remove_dp_hooks",
]


def check_trainer(trainer: pl.Trainer) -> None:
    """No gradient accumulation (Opacus rejects it with Poisson sampling)."""
    if trainer.accumulate_grad_batches != 1:
        raise MisconfigurationException(
            f"DPSGD does not support gradient accumulation (Trainer(accumulate_grad_batches="
            f"{trainer.accumulate_grad_batches})): Opacus rejects it with Poisson sampling. Use "
            "accumulate_grad_batches=1 and a larger batch size instead."
        )


def given_twice_message(callbacks: List[Any]) -> str:
    """One sentence for a Trainer given DPSGD more than once, naming each (its σ or target, and C)."""

    def described(dp: Any) -> str:
        fields = state.state_key_fields(dp)
        return "DPSGD(" + ", ".join(f"{k}={v!r}" for k, v in fields.items() if v is not None) + ")"

    listed = " and ".join(described(dp) for dp in callbacks)
    return (
        f"The Trainer's callbacks hold DPSGD {len(callbacks)} times: {listed}. DP-SGD makes the fit's one optimizer "
        "private once (one sampling, one clipping, one noise, one privacy ledger), so give exactly one DPSGD."
    )


def refuse_given_twice(dp: Any, key: str) -> str:
    """``key``, DPSGD's state key, unless Lightning is validating ``Trainer(callbacks=[DPSGD(...), DPSGD(...)])`` with
    the same arguments twice: then one sentence naming both (:func:`given_twice_message`)."""
    others = _compat.callbacks_sharing_state_key(dp, key)
    if others:
        raise MisconfigurationException(given_twice_message([*others, dp]))
    return key


def prepare_fit(dp: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """The body of ``DPSGD.setup`` for a fit: a fresh ledger for another module, the Trainer, module and strategy
    checks, the strategy recorded, and the Poisson sampling installed (the sample rate is learned at fit start)."""
    # Reused for another module: that model's privacy starts at 0 (a checkpoint's ledger is loaded after setup).
    # Fitted again on the same module: its privacy loss composes with what it already spent.
    given = [cb for cb in trainer.callbacks if type(cb) is type(dp)]
    if len(given) > 1:
        raise MisconfigurationException(given_twice_message(given))
    trained = dp._module() if dp._module is not None else None
    if trained is not None and trained is not pl_module and dp.ledger.steps:
        dp.ledger = new_ledger(dp)
        dp.grad_sample_mode_switch = None  # (auto's switch was that model's)
        dp.precision, dp.rounded_steps = None, 0
    dp._module = weakref.ref(pl_module)
    check_trainer(trainer)
    record = fix_module(pl_module, fix_modules=dp.fix_modules)
    if record is not None:
        dp.fixed_modules = record
    # "auto" is decided on the module as fixed, before any data is seen (dpsgd.functional.hooks_obstacles)
    argument = getattr(dp, "grad_sample_mode_argument", dp.grad_sample_mode)
    dp.grad_sample_mode, dp.grad_sample_mode_reason = strategies.resolve_grad_sample_mode(trainer, pl_module, argument)
    if argument == "auto":
        rank_zero_info(
            f"DPSGD(grad_sample_mode='auto') trains with {dp.grad_sample_mode!r}: {dp.grad_sample_mode_reason}."
        )
    check_module(pl_module, fix_modules=dp.fix_modules, grad_sample_mode=dp.grad_sample_mode)
    strategies.check_strategy(trainer)
    if strategies.is_fsdp(trainer):
        strategies.check_fsdp_settings(grad_sample_mode=dp.grad_sample_mode, loss_reduction=dp.loss_reduction)
    dp.rounds_16_bit = False  # (ghost clipping whose every step is 16-bit: below)
    if dp.grad_sample_mode == "ghost":
        checks.check_no_tied_parameters_for_ghost(pl_module)
        exact = str(trainer.precision) in ("bf16-mixed", "16-mixed") and not strategies.is_fsdp(trainer)
        dp.rounds_16_bit = "16" in str(trainer.precision) and not (exact and exact_under_autocast(pl_module))
        if dp.rounds_16_bit:
            rank_zero_warn(
                f"DPSGD(grad_sample_mode='ghost') under precision={trainer.precision!r}: the norms and the clipped "
                "sum come from 16-bit products (two 16-bit backward passes, or per-example gradients of layers other "
                "than Linear, Conv1D, Embedding and LayerNorm), so each example's contribution is bounded by "
                "max_grad_norm only up to 16-bit rounding. grad_sample_mode='hooks' clips exactly what is summed."
            )
    dp.strategy_name, dp.world_size = type(trainer.strategy).__name__, int(trainer.world_size)  # (saved)
    dp.sampling = strategies.resolve_sampling(trainer, dp.sampling_seed, secure=dp.secure_mode)
    install_poisson_sampling(trainer, dp)


def install_dp_optimizer(dp: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """Make the fit's one optimizer a DP optimizer of the DPSGD ``dp`` (see the module docstring)."""
    optimizers = trainer.strategy.optimizers
    if len(optimizers) != 1:
        raise MisconfigurationException(
            f"DPSGD supports exactly one optimizer; configure_optimizers returned {len(optimizers)}."
        )
    if isinstance(optimizers[0], DPOptimizer):
        raise MisconfigurationException("The optimizer is already an Opacus DPOptimizer; remove DPSGD or make_private.")
    loader = make_poisson_loader(trainer, dp, _compat.original_train_loader(trainer, before="poisson"), warn=False)
    dp.steps_per_epoch = len(loader)
    if dp._planned:
        dp.noise_multiplier = plan_noise_multiplier(
            sample_rate=dp.sample_rate,
            steps_per_epoch=dp.steps_per_epoch,
            epochs=dp.epochs,
            accountant=dp.accountant_mechanism,
            target_bayes_security=dp.target_bayes_security,
            target_epsilon=dp.target_epsilon,
            delta=dp.delta,
            max_epochs=trainer.max_epochs,
            group_size=group_size(dp),
        )
    _resume_switch(dp)
    dp._param_names = {id(p): name for name, p in pl_module.named_parameters()}
    dp._batch_statistics = checks.batch_statistics_layers(pl_module)
    fsdp = strategies.is_fsdp(trainer)
    dp._hooks = strategies.grad_sample_hooks(
        trainer,
        pl_module,
        grad_sample_mode=dp.grad_sample_mode,
        loss_reduction=dp.loss_reduction,
        max_grad_norm=dp.max_grad_norm,
    )
    dp._view_hooks = strategies.fsdp_outputs_without_hook_views(pl_module) if fsdp else []
    cls = strategies.dp_optimizer_class(trainer, dp.grad_sample_mode)
    strategies.disable_ddp_gradient_sync(trainer)
    dp.exactness = ExactnessRecord(reference="not run (FSDP2: the parameters are sharded)" if fsdp else "not run")
    sixteen_bit = "16" in str(trainer.precision)
    rtol = 5e-2 if sixteen_bit else 1e-3  # the exactness checks' (16-bit precision needs more)
    dp._backward = PerExampleBackward(
        pl_module,
        mode=dp.grad_sample_mode,
        loss_reduction=dp.loss_reduction,
        hooks=dp._hooks,
        param_names=dp._param_names,
        should_check=lambda: dp._checks is not None and dp._checks.checking_clipping and not fsdp,
        rtol=rtol,
        record=dp.exactness,
        exactness_examples=dp.exactness_examples,
        sharded=fsdp,
        engine=_functional_engine(dp, pl_module),
        sampled=_sampled_exactness(dp, pl_module, fsdp=fsdp, rtol=rtol, sixteen_bit=sixteen_bit),
        auto=AutoSwitch(dp, trainer) if getattr(dp, "grad_sample_mode_argument", None) == "auto" else None,
    )
    # (after the checkpoint's state is loaded: a resumed fit continues its precision record)
    if dp.precision is None or dp.precision.rsplit(", then ", 1)[-1] != str(trainer.precision):
        dp.precision = str(trainer.precision) if dp.precision is None else f"{dp.precision}, then {trainer.precision}"
    dp._backward.rounds_16_bit = dp.rounds_16_bit
    # (through a weak reference: the module holds its backward, and a deepcopy of the module — PANORAMIA's fresh
    # copy — must not reach the callback and through it the DP optimizer)
    dp._backward.on_rounded_step = functools.partial(_count_rounded_step, weakref.ref(dp))
    dp.example_leaves = getattr(loader, "per_example", None)  # which batch leaves are per-example: its collate says
    dp._backward.set_example_leaves(dp.example_leaves)
    _neighbour_check(dp, trainer, pl_module, loader, fsdp=fsdp)
    # The divisor of the noised sum: a public constant, never computed from the private N (dpsgd.settings.dp_divisor);
    # each rank divides its share by 1/W of it, so the ranks' average is the whole step's sum / divisor.
    dp.expected_batch_size = dp_divisor(dp, dp.loader_batch_size, dataset_size=len(loader.dataset))
    expected_batch_size = dp.expected_batch_size
    if strategies.is_distributed(trainer):
        expected_batch_size /= trainer.world_size
        narrow = sorted({str(p.dtype) for p in pl_module.parameters() if p.requires_grad and p.dtype != wide(p.dtype)})
        if narrow and fsdp:  # (DDP adds the ranks' float32 sums: optimizers._WideReduction; FSDP2 reduce-scatters)
            rank_zero_warn(
                f"DPSGD under {type(trainer.strategy).__name__} with {', '.join(narrow)} parameters: the ranks' "
                "clipped sums are added in the parameters' dtype (FSDP2's reduce-scatter of the gradients), so each "
                "example's contribution is bounded by max_grad_norm only up to that dtype's rounding of a rank's sum."
            )
    dp_optimizer = cls(
        optimizers[0],
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction=dp.loss_reduction,
        secure_mode=dp.secure_mode,
    )
    dp_optimizer.noise_source = strategies.resolve_noise(trainer, dp.noise_seed, secure=dp.secure_mode)
    dp_optimizer.noise_step = lambda: dp.ledger.steps  # the index of the step being taken, over the whole run
    dp_optimizer.attach_step_hook(functools.partial(record_step, dp))
    dp_optimizer.before_noise_hooks = dp._before_noise_hooks
    trainer.strategy.optimizers = [dp_optimizer]
    _quantile_clipping(dp, trainer, dp_optimizer)  # (clipping="quantile": the adaptive C and the split noise)
    dp._checks = SelfChecks(
        trainer,
        dp_optimizer,
        max_grad_norm=float(dp_optimizer.max_grad_norm),
        noise_multiplier=float(dp_optimizer.noise_multiplier),
        loss_reduction=dp.loss_reduction,
        param_names=dp._param_names,
        backward=dp._backward,
    )
    dp_optimizer.check_before_noise = dp._checks.before_noise
    if dp.quantile is not None:  # (the self-checks follow the callback's C_t, never the optimizer's own attribute)
        dp._checks.current_clip = lambda: dp.quantile.clip
    dp._units_of_batch = _units_of_batch(dp, trainer, pl_module)  # (user-level sampling: one clip per person)
    dp_optimizer.units_of_batch = dp._units_of_batch
    dp_optimizer.loss_scale = functools.partial(loss_scale, trainer)  # (fp16: clip the examples' own gradients)
    rule = getattr(dp, "clipping", None)
    dp_optimizer.clipping_rule = dp._backward.clipping_rule = rule  # (ghost mode's second pass reads it)
    if dp._backward.engine is not None:
        dp._backward.engine.units, dp._backward.engine.rule = dp._units_of_batch, rule
    if getattr(dp._backward, "neighbours", None) is not None:  # (the premise checked for the rule trained with)
        dp._backward.neighbours.engine.rule = rule


def _quantile_clipping(dp: Any, trainer: pl.Trainer, optimizer: Any) -> None:
    """``clipping="quantile"``: the run's adaptive C (:class:`~lightning_privacy.dpsgd.clipping.QuantileClipping`,
    continued from a checkpoint's C), the gradient's share z_Δ of the noise (the ledger keeps the combined z), and the
    count's secret generator (OS entropy, or a function of ``noise_seed``). Under DDP the ranks' counts are summed
    and every rank draws the same count noise from rank 0's seed, so the count is noised once and C stays equal."""
    rule = getattr(dp, "clipping", None)
    dp.quantile = None
    if rule is None or not rule.quantile:
        return
    seed = secrets.randbits(63) if dp.noise_seed is None else (int(dp.noise_seed) * 1_000_003 + 7) % 2**63
    if strategies.is_distributed(trainer):  # every rank draws the same count noise: one draw, added once
        seed = int(trainer.strategy.broadcast(seed, src=0))
        dp._count_sum = lambda count: int(  # the ranks' counts, summed (a collective: every rank steps together)
            trainer.strategy.reduce(torch.tensor(float(count), device=dp._module().device), reduce_op="sum")
        )
    else:
        dp._count_sum = lambda count: count
    generator = torch.Generator()
    generator.manual_seed(seed)
    try:
        dp.quantile = QuantileClipping(
            rule, clip=getattr(dp, "_resumed_clip", None) or dp.max_grad_norm,
            expected_batch_size=dp.expected_batch_size, noise_multiplier=float(dp.noise_multiplier),
            generator=generator,
        )  # fmt: skip
    except ValueError as error:
        raise MisconfigurationException(f"DPSGD(clipping='quantile', count_noise_multiplier=...): {error}.") from None
    optimizer.noise_multiplier = dp.quantile.gradient_noise
    set_clip(dp, dp.quantile.clip, optimizer)


def set_clip(dp: Any, clip: float, optimizer: Any = None) -> None:
    """C for the next step, wherever it is read: the DP optimizer (clipping and noise σ_Δ·C), the functional engine,
    the neighbour check."""
    if optimizer is not None:
        optimizer.max_grad_norm = clip
    backward = dp._backward
    if dp.grad_sample_mode == "ghost" and backward.hooks is not None:  # (the C ghost clipping's factors read)
        backward.hooks.max_grad_norm = clip
    for engine in (getattr(backward, "engine", None), getattr(getattr(backward, "neighbours", None), "engine", None)):
        if engine is not None:
            engine.max_grad_norm = clip
    if getattr(backward, "neighbours", None) is not None:
        backward.neighbours.max_grad_norm = clip


def _update_clip(dp: Any, optimizer: Any) -> None:
    """After a step: C_{t+1} from the step's count of examples (people) whose norm was ≤ C_t."""
    norms = getattr(optimizer, "last_norms", None) if dp.grad_sample_mode == "hooks" else dp._backward.last_norms
    count = 0 if norms is None else int((norms.double() <= float(optimizer.max_grad_norm)).sum())
    set_clip(dp, dp.quantile.update(dp._count_sum(count)), optimizer)


def _units_of_batch(dp: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
    """Under user-level sampling, a function giving the step's (person of each row, rows per person, reduction)
    from the rows the Poisson sampler drew for it; ``None`` otherwise (each row clipped alone)."""
    if getattr(dp, "privacy_unit", "example") != "user" or not dp.user_sampling:
        return None
    if dp.grad_sample_mode == "ghost":
        raise MisconfigurationException(
            "DPSGD(privacy_unit='user') with user-level sampling runs in ghost mode here (the strategy's only mode), "
            "which computes each row's gradient norm, not a person's: use a strategy where hooks or functional mode "
            "runs, or user_sampling=False."
        )

    def units() -> Any:
        sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        rows = getattr(sampler, "recent", {}).get(dp.ledger.steps)
        if rows is None:
            raise MisconfigurationException(
                "DPSGD(privacy_unit='user'): this step's rows are unknown (the train loader is not DPSGD's Poisson "
                "loader), so its people cannot be clipped one by one."
            )
        index, counts = users.person_index(dp.people, rows, device=pl_module.device)
        return index, counts, dp.user_reduction

    return units


def _resume_switch(dp: Any) -> None:
    """``auto`` resuming a run that switched to functional mode (the checkpoint's record): functional from the start."""
    switched = getattr(dp, "grad_sample_mode_switch", None)
    if (
        getattr(dp, "grad_sample_mode_argument", None) == "auto"
        and switched is not None
        and dp.grad_sample_mode == "hooks"
    ):
        dp.grad_sample_mode = "functional"
        dp.grad_sample_mode_reason = f"the run this fit resumes {switched.sentence()}"
        rank_zero_info(f"DPSGD(grad_sample_mode='auto') trains with 'functional': {dp.grad_sample_mode_reason}.")


def _functional_engine(dp: Any, pl_module: pl.LightningModule) -> Any:
    """Functional mode's per-example engine (:mod:`lightning_privacy.dpsgd.functional`); ``None`` in the others."""
    if dp.grad_sample_mode != "functional":
        return None
    chunk_size = getattr(dp, "functional_chunk_size", None)
    return functional.FunctionalClipping(pl_module, max_grad_norm=dp.max_grad_norm, chunk_size=chunk_size)


def _neighbour_check(dp: Any, trainer: pl.Trainer, pl_module: pl.LightningModule, loader: Any, *, fsdp: bool) -> None:
    """The neighbour check (:mod:`lightning_privacy.dpsgd.neighbours`) on the train loader's dataset and collate; this
    step's rows from the Poisson sampler of the loader Lightning iterates. Not under FSDP2 (sharded parameters)."""
    dp.neighbours = neighbours.NeighbourRecord(rate=dp.neighbour_rate, reason="not run (FSDP2: sharded parameters)")
    if fsdp:
        return
    from lightning.pytorch.utilities import move_data_to_device

    def as_training_step_sees(batch: Any) -> Any:  # (as Lightning's loop: the precision's dtype, then the device)
        return move_data_to_device(trainer.precision_plugin.convert_input(batch), pl_module.device)

    check = neighbours.NeighbourCheck(
        pl_module, max_grad_norm=dp.max_grad_norm, dataset=loader.dataset, collate=loader.collate_fn,
        rate=dp.neighbour_rate, per_example=dp.example_leaves, rtol=5e-2 if "16" in str(trainer.precision) else 1e-4,
        to_device=as_training_step_sees,
    )  # fmt: skip
    dp.neighbours = check.record
    if getattr(dp, "privacy_unit", "example") == "user" and dp.user_sampling:  # (the unit removed: a person)
        check.people, check.reduction = dp.people, dp.user_reduction

    def current_rows() -> Any:
        sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        return getattr(sampler, "recent", {}).get(dp.ledger.steps)

    dp._backward.neighbours, dp._backward.current_rows = check, current_rows
    if not getattr(loader, "by_rows", True):  # (torchtext's batches: each example collated alone, on the device)
        check.by_rows = False
        dp._backward.examples_of = _collated_examples(loader, current_rows, check.to_device)


def _collated_examples(loader: Any, current_rows: Callable[[], Any], to_device: Callable[[Any], Any]) -> Callable:
    """A step's examples, each collated alone by the train loader (a batch its rows do not split)."""

    def examples(batch: Any) -> Any:  # (a function: a copy of the module does not copy the loader it reads)
        rows = current_rows()
        if rows is None:
            raise MisconfigurationException(
                "DPSGD: this train loader's batches do not split into their examples by rows (its collate_fn "
                "concatenates them, as torchtext's `(label, text, offsets)`), so DP-SGD collates each example alone, "
                "and needs the step's rows from DPSGD's Poisson sampler, which this loader does not give."
            )
        collate, dataset = loader.collate_fn, loader.dataset
        return functional.Examples([to_device(collate([dataset[int(i)]])) for i in rows], batch=batch)

    return examples


def _sampled_exactness(dp: Any, pl_module: pl.LightningModule, *, fsdp: bool, rtol: float, sixteen_bit: bool) -> Any:
    """The exactness check on sampled later steps (:mod:`lightning_privacy.dpsgd.sampled_exactness`); ``None`` under
    FSDP2 (sharded parameters) or with ``exactness_rate=0``."""
    rate = getattr(dp, "exactness_rate", sampled_exactness.DEFAULT_RATE)
    if fsdp or rate == 0:
        return None
    return sampled_exactness.SampledExactness(
        pl_module, rate=rate, rtol=rtol, names=dp._param_names, record=dp.exactness, sixteen_bit=sixteen_bit
    )


def record_step(dp: Any, optimizer: DPOptimizer) -> None:
    """The DP optimizer's step hook: the self-checks after the step, the clipping telemetry, one step in the ledger."""
    if dp._checks is not None:
        dp._checks.after_step(optimizer)
    if dp.log_clipping:
        if dp.grad_sample_mode in ("ghost", "functional"):
            dp._clipping.add(dp._backward.last_norms)
        elif dp.ledger.steps % dp.clipping_every_n_steps == 0 or not dp._clipping.norms:
            dp._clipping.update(optimizer.params)  # (steps before this one; an epoch always gets one record)
    quantile = getattr(dp, "quantile", None)  # (the ledger keeps the combined z of gradient and count)
    sigma = optimizer.noise_multiplier if quantile is None else quantile.noise_multiplier
    dp.ledger.step(noise_multiplier=sigma, sample_rate=dp.sample_rate)
    if quantile is not None:
        _update_clip(dp, optimizer)


def before_optimizer_step(dp: Any, trainer: pl.Trainer, optimizer: Any) -> None:
    """The body of ``DPSGD.on_before_optimizer_step``: the per-sample gradients' self-check on its steps, and under
    fp16's loss scaling (a ``GradScaler``) a gradient that is not finite, whose step the scaler would skip.

    The scaler skips a step whose unscaled gradient holds an inf or a NaN (an example's gradient overflowed float16 at
    the scale): no noise is drawn and the accountant records nothing, yet whether the step happens depends on the
    private examples' gradients outside DP-SGD's noise — a decision ε does not cover — so DPSGD stops before it, on
    every rank when one rank's gradient overflowed.
    """
    if dp._checks is not None and isinstance(optimizer, DPOptimizer):
        dp._checks.per_sample_gradients(optimizer)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    finite = torch.stack([torch.isfinite(g).all() for g in grads]).all().float() if grads else torch.ones(())
    if distributed():  # (DDP: each rank's own gradient, DDP's sync being DPSGD's: every rank stops, or none waits)
        finite = finite.to(trainer.strategy.root_device)
        torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
    if bool(finite):
        return
    raise MisconfigurationException(
        f"DPSGD under precision={str(trainer.precision)!r}: at step {trainer.global_step} a gradient overflowed "
        f"float16 (an example's gradient times the GradScaler's scale {scaler.get_scale():g} is not finite), so the "
        "scaler would skip the step. Whether a step is skipped depends on the private examples' gradients outside "
        "DP-SGD's noise, a decision ε does not cover, so DPSGD stops. Use precision='bf16-mixed' where the device "
        "supports it, or give the Trainer a scaler whose scale does not overflow, e.g. plugins=[MixedPrecision("
        "'16-mixed', 'cuda', scaler=torch.amp.GradScaler(init_scale=2.0**8, growth_interval=10**9))]."
    )


def check_steps_accounted(dp: Any, trainer: pl.Trainer) -> None:
    """At every epoch end: the ledger recorded exactly the optimizer steps this fit took."""
    accounted = dp.steps - dp._fit_start[0]
    taken = trainer.global_step - dp._fit_start[1]
    if accounted != taken:
        raise MisconfigurationException(
            f"DP-SGD self-check: the accountant recorded {accounted} steps in this fit but the optimizer took "
            f"{taken}; the privacy accounting is wrong (was the DPOptimizer's step hook replaced?)."
        )


def epoch_end(dp: Any, trainer: pl.Trainer, pl_module: pl.LightningModule, log_histogram: Callable[..., None]) -> None:
    """The body of ``DPSGD.on_train_epoch_end``: every step accounted (:func:`check_steps_accounted`), then
    ``dp/exactness_error`` (the largest relative mismatch found, over the ranks: logged by every rank or none) and,
    with ``log_clipping``, the epoch's ``dp/clip_fraction``, ``dp/grad_norm_median`` and ``dp/grad_norms`` histogram
    (every rank's norms, a collective call; written by ``log_histogram``, the callbacks' writer); the next epoch's
    record of norms starts."""
    check_steps_accounted(dp, trainer)
    if dp._checks is not None and dp._checks.exactness_compared:
        pl_module.log(
            names.DP_EXACTNESS_ERROR, dp.exactness.max_relative_error, on_step=False, on_epoch=True, sync_dist=True,
            reduce_fx="max",
        )  # fmt: skip
    switched = getattr(dp, "grad_sample_mode_switch", None)
    if switched is not None:  # (the same on every rank)
        pl_module.log(names.DP_AUTO_SWITCH_STEP, float(switched.step), on_step=False, on_epoch=True)
    if not dp.log_clipping:
        return
    summary = dp._clipping.epoch_summary(trainer, pl_module.device, dp.max_grad_norm)
    if summary is None:
        return
    fraction, median, norms = summary
    for key, value in ((names.DP_CLIP_FRACTION, fraction), (names.DP_GRAD_NORM_MEDIAN, median)):
        pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="mean")
    log_histogram(trainer, names.DP_GRAD_NORMS, norms.numpy(), step=max(0, trainer.global_step - 1))


def _count_rounded_step(dp: Any) -> None:
    owner = dp()
    if owner is not None:
        owner.rounded_steps += 1


def remove_dp_hooks(dp: Any) -> None:
    """Give the module its backward back and remove Opacus' hooks (``teardown`` of a fit)."""
    if dp._backward is not None:
        dp._backward.remove()
        dp._backward = None
    for handle in dp._view_hooks:
        handle.remove()
    dp._view_hooks = []
    if dp._hooks is not None:
        dp._hooks.cleanup()
        dp._hooks = None

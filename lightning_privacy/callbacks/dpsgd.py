"""DP-SGD for an unchanged LightningModule, through Opacus."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from typing_extensions import override

from lightning_privacy import _compat, names
from lightning_privacy._validation import check_bool, check_choice, check_int, check_open_unit, check_positive
from lightning_privacy.callbacks import _dp_checks, _strategies
from lightning_privacy.callbacks._audit_utils import log_histogram
from lightning_privacy.callbacks._backward import PerExampleBackward, is_empty_batch
from lightning_privacy.callbacks._fix_modules import (
    fix_modules_in_place,
    fixed_modules_record,
    incompatible_layers,
    incompatible_layers_message,
    replacements_warning,
)
from lightning_privacy.callbacks._hparams import write_privacy_hparams
from lightning_privacy.callbacks._poisson import install_poisson_sampling, make_poisson_loader
from lightning_privacy.callbacks._self_checks import SelfChecks
from lightning_privacy.ledger import ACCOUNTANTS, PrivacyLedger

STATE_VERSION = 2  # 2: the privacy ledger (history + composed PLD chunks); 1 (history only) still loads
DEFAULT_DELTA = 1e-5
GRAD_SAMPLE_MODES = ("hooks", "ghost")


def _positive(name: str, value: Any) -> float:
    return check_positive(name, value, exc=MisconfigurationException)


def _train_trainable_layers(module: torch.nn.Module) -> None:
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


def _seed(name: str, seed: Optional[int], secure: bool, what: str, whose: str) -> Optional[int]:
    """A fixed seed (a non-negative int) or None; a fixed seed contradicts ``secure_mode``."""
    if seed is None:
        return None
    check_int(name, seed, minimum=0, exc=MisconfigurationException)
    if secure:
        raise MisconfigurationException(
            f"`{name}={seed!r}` makes {what} reproducible, which `secure_mode=True` rules out (its {whose} come from "
            "fresh OS entropy every step); give one or the other"
        )
    return seed


def _seed_kind(seed: Optional[int], secure: bool) -> str:
    """How a seed was chosen, for HPARAMS and the report (never the seed itself)."""
    if secure:
        return "secure (OS CSPRNG every step)"
    return "fixed (reproducible, not secret)" if seed is not None else "secret (OS entropy per fit)"


class DPSGD(Callback):
    r"""Train any LightningModule with DP-SGD (Abadi et al., 2016) through Opacus.

    Added to ``Trainer(callbacks=[...])``, it makes the run differentially private without changing
    the module: the train loader — from a datamodule, the module's ``train_dataloader`` hook or
    ``fit(train_dataloaders=...)`` — is replaced by a Poisson-sampling loader with the same expected
    batch size (sample rate ``p = 1 / len(loader)``, as Opacus' ``make_private``): at every step each row of the
    whole training set joins independently with probability p, from a secret seed (``sampling_seed``), every rank
    taking its share and one batch per step, empty or not (:mod:`lightning_privacy.sampling`); Opacus hooks compute
    per-sample gradients; the optimizer is wrapped in a ``DPOptimizer`` that clips each to
    ``max_grad_norm`` and adds Gaussian noise of standard deviation ``noise_multiplier · max_grad_norm``.

    The noise is given directly, or planned by :meth:`~lightning_privacy.ledger.PrivacyLedger.calibrate`:
    ``target_bayes_security`` + ``epochs`` gives the smallest σ (to 1e-4, rounded up) whose safe β*_MIA, composed
    one epoch at a time as the monitor composes it, meets the target after ``epochs`` epochs (the search starts
    from the closed form, Cherubin et al. 2024, Eq. 4); ``target_epsilon`` + ``epochs`` the smallest σ whose
    accountant ε at ``delta`` stays within it.

    Per-sample gradients (``grad_sample_mode``): ``"hooks"`` (default) stores every example's gradient (Opacus'
    hooks; memory grows with batch size × parameters); ``"ghost"`` uses Opacus' fast gradient clipping with ghost
    norms, which computes each example's gradient norm layer by layer without storing per-example gradients and
    then backpropagates the clipped sum in a second pass (see ``benchmarks/dpsgd_memory.py``). Both clip every
    example's gradient to C and add the same noise, so the privacy accounting is the same; with the same data and
    noise seed they give the same update up to floating-point rounding. Under 16-bit precision ghost clipping bounds
    each example's contribution only up to the rounding of two 16-bit backward passes (DPSGD warns); hooks clip
    exactly what is summed.

    The loss ``training_step`` returns: the usual loss reduced over the batch as ``loss_reduction`` says, or one
    loss per example — a tensor of shape ``[batch_size]`` such as ``F.cross_entropy(logits, y, reduction="none")``,
    returned as is or as the ``"loss"`` of a dict — which DPSGD reduces with ``loss_reduction``. Ghost clipping
    needs the per-example losses (it weights each by its clipping coefficient) and refuses a reduced loss, naming
    what was returned; ``self.log`` takes a scalar, so log ``losses.mean()``. To train one module unchanged with and
    without DPSGD, return ``{"loss": losses.mean(), "per_example_loss": losses}``: a plain ``Trainer`` trains on
    ``"loss"``, DPSGD on ``"per_example_loss"``. DPSGD performs the backward through
    the module's ``backward`` hook, which ghost mode does not allow to be overridden.

    Layers DP-SGD cannot train (BatchNorm, ``nn.MultiheadAttention``, ``nn.LSTM``, …) are an error that starts with
    the fix (``DPSGD(fix_modules=True)``) and names each such layer once, with its replacement and why; with
    ``fix_modules=True`` DPSGD applies Opacus' fixers to them in ``setup``, before the optimizer exists (BatchNorm →
    GroupNorm, attention and RNNs → Opacus' DP layers with the same weights), and warns with the list of replaced
    modules, naming those that start from fresh weights (a trained BatchNorm's scale and shift).

    An Opacus accountant (``accountant``, default RDP) records every optimizer step that happens; its
    ε at ``delta`` (default ``1e-5``) is a reference value only — the Bayes-security bounds of
    :class:`~lightning_privacy.BayesSecurityMonitor` use the same history. The history is saved in
    the callback's ``state_dict`` and a resumed run continues it. The same DPSGD passed to another ``fit`` of the same
    module continues its ledger (that model's privacy loss composes); a fit of another module starts a new one.

    Args:
        noise_multiplier: σ, the noise standard deviation relative to ``max_grad_norm``.
        max_grad_norm: C, the per-sample clipping norm.
        target_bayes_security: plan σ for this β*_MIA after ``epochs`` epochs (instead of σ).
        target_epsilon: plan σ for this accountant ε at ``delta`` after ``epochs`` epochs (instead of σ).
        epochs: training length the plan is for (required with ``target_bayes_security`` or ``target_epsilon``).
        delta: δ for the reference accountant's ε.
        accountant: ``"rdp"``, ``"prv"`` or ``"gdp"`` (Opacus accountants).
        loss_reduction: ``"mean"`` or ``"sum"``, how ``training_step`` reduces its loss over the batch (or how DPSGD
            reduces the per-example losses it returns).
        grad_sample_mode: ``"hooks"`` (per-sample gradients) or ``"ghost"`` (ghost clipping; per-example losses).
        fix_modules: replace DP-incompatible layers with Opacus' fixers in ``setup`` (warns with the list)
            instead of raising.
        secure_mode: draw the Poisson masks from the OS CSPRNG (``os.urandom``) and the noise as Opacus' secure mode
            does (four Gaussian draws per coordinate against floating-point attacks) from a generator reseeded with
            fresh OS entropy every step (slower).
        sampling_seed: ``None`` (default): the Poisson masks come from a 128-bit seed drawn from the OS's entropy at
            every fit, independent of the loader's generator and of ``seed_everything``, never saved. An int makes
            the masks reproducible (and the same under one process, DDP and after a resume) — and known to whoever
            knows the seed: such an adversary loses nothing to subsampling, so use it for tests and debugging only.
            See :mod:`lightning_privacy.sampling`.
        noise_seed: ``None`` (default): the Gaussian noise comes from a private generator seeded from the OS's entropy
            at every fit (each rank its own), independent of torch's global generator and of ``seed_everything``,
            never saved (a resumed run gets fresh noise); the noise draws nothing from the global stream. An int makes
            the noise of step t a function of (seed, rank, t) — reproducible, also after a resume, and known to whoever
            knows the seed, who can then subtract it from the released model: tests and debugging only. See
            :mod:`lightning_privacy.noise`.
        log_clipping: log per epoch ``dp/clip_fraction`` (share of per-sample gradients whose norm exceeded C)
            and ``dp/grad_norm_median``, and a histogram ``dp/grad_norms`` of per-sample norms, to tune C and to
            see that clipping is active. These values are computed from the private data and are NOT covered by
            the DP guarantee: publish them only where that is acceptable.
        clipping_every_n_steps: with ``log_clipping``, record the norms of every example of every n-th optimizer
            step (steps 0, n, 2n, … of the run), so the epoch's values are over a uniform 1/n of its steps; 1
            records every step (exact); an epoch shorter than n steps still records its first. The per-step work is mostly fixed kernel overhead (~0.5 ms, ~4% of a
            step of the Adult MLP), so thinning steps is what makes it cheap. Ghost clipping computes every norm
            anyway and records every step.

    Self-checks: on the first optimizer steps of every fit DPSGD re-derives from the parameters that privacy is
    really applied — every trainable parameter has per-sample gradients, the summed gradient is the sum of
    per-sample gradients clipped to C (every rank), and noise of standard deviation σ·C was added (a χ² test over
    as many steps as it takes to see 256 noise coordinates, false-alarm rate 1e-9 per fit; where the noise is added:
    rank 0 under DDP, every rank's shard under FSDP2) — and at every epoch end that the accountant recorded exactly the optimizer steps
    taken. A failure raises ``MisconfigurationException`` naming the parameter (under DDP on every rank).

    Strategies: one device, or DDP launched as a script (``strategy="ddp"``, torchrun, SLURM) with
    ``use_distributed_sampler=False``, in both ``grad_sample_mode`` values; FSDP2 (``ModelParallelStrategy`` with
    ``tensor_parallel_size=1``) with ``grad_sample_mode="ghost"`` and mean reduction; anything else is refused in
    ``setup`` (see ``callbacks/_strategies.py``).

    TensorBoard: at fit start DPSGD writes the run's one HPARAMS session — the model's hyperparameters beside σ,
    C, p, δ, the accountant (and the planning target), with the privacy metrics of the run's callbacks as columns.

    Attributes:
        noise_multiplier: σ in use (planned or given); ``None`` before planning.
        sample_rate: the Poisson sample rate (known from ``on_fit_start``).
        dataset_size: rows of the training set the Poisson sampling draws from (known with ``sample_rate``).
        fixed_modules: the modules ``fix_modules=True`` replaced, as ``{"name", "old", "new"}`` strings; saved with
            ``dataset_size`` in the checkpoint, where :func:`lightning_privacy.checkpoints.load_checkpoint` and the
            audit commands read them to load the weights into the user's class and to check the member set.
        accountant: the Opacus accountant of this run.

    Raises:
        MisconfigurationException: for inconsistent arguments, gradient accumulation, several
            optimizers, BatchNorm or other Opacus-incompatible layers (unless ``fix_modules=True``), DDP without
            ``use_distributed_sampler=False``, an unsupported strategy (``ddp_spawn``, DeepSpeed, FSDP1, XLA, …), and in ghost mode a reduced loss from
            ``training_step`` or an overridden ``backward``.

    Example::

        >>> from lightning_privacy import DPSGD
        >>> DPSGD(noise_multiplier=1.1, max_grad_norm=1.0).noise_multiplier
        1.1
        >>> DPSGD(target_bayes_security=0.9, epochs=20).noise_multiplier is None  # planned at fit start
        True
        >>> DPSGD(noise_multiplier=1.1, grad_sample_mode="ghost").grad_sample_mode  # training_step: losses of shape [B]
        'ghost'
        >>> # trainer = Trainer(callbacks=[DPSGD(noise_multiplier=1.1)]); trainer.fit(model, datamodule)
    """

    report_order = 10  # the report's sections: DP-SGD first, then monitors, then audits

    def report_section(self, trainer: Any = None) -> Any:
        """This callback's section of the privacy report (:mod:`lightning_privacy.reporting`)."""
        from lightning_privacy.callbacks._sections import dpsgd_section

        return dpsgd_section(self, trainer)

    def __init__(
        self,
        *,
        noise_multiplier: Optional[float] = None,
        max_grad_norm: float = 1.0,
        target_bayes_security: Optional[float] = None,
        target_epsilon: Optional[float] = None,
        epochs: Optional[int] = None,
        delta: float = DEFAULT_DELTA,
        accountant: str = "rdp",
        loss_reduction: str = "mean",
        secure_mode: bool = False,
        sampling_seed: Optional[int] = None,
        noise_seed: Optional[int] = None,
        log_clipping: bool = False,
        clipping_every_n_steps: int = 4,
        grad_sample_mode: str = "hooks",
        fix_modules: bool = False,
    ) -> None:
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
            _positive("noise_multiplier", noise_multiplier)
            if epochs is not None:
                raise MisconfigurationException(
                    "`epochs` is only used with `target_bayes_security` or `target_epsilon`; remove it"
                )
        else:
            check_open_unit(
                "target_bayes_security", target_bayes_security, exc=MisconfigurationException, optional=True
            )
            if target_epsilon is not None:
                _positive("target_epsilon", target_epsilon)
            if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
                raise MisconfigurationException(
                    f"`epochs` must be a positive int when planning σ from a target, got {epochs!r}"
                )
        self.max_grad_norm = _positive("max_grad_norm", max_grad_norm)
        check_open_unit("delta", delta, exc=MisconfigurationException, float_only=True)
        check_choice("accountant", accountant, ACCOUNTANTS, exc=MisconfigurationException)
        check_choice("loss_reduction", loss_reduction, ("mean", "sum"), exc=MisconfigurationException)
        check_choice("grad_sample_mode", grad_sample_mode, GRAD_SAMPLE_MODES, exc=MisconfigurationException)
        self.grad_sample_mode = grad_sample_mode
        self.fix_modules = check_bool("fix_modules", fix_modules, exc=MisconfigurationException)
        self.noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)
        self._planned = noise_multiplier is None
        self.target_bayes_security = target_bayes_security
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        self.epochs = epochs
        self.delta = delta
        self.accountant_mechanism = accountant
        self.loss_reduction = loss_reduction
        self.secure_mode = check_bool("secure_mode", secure_mode, exc=MisconfigurationException)
        self.sampling_seed = _seed("sampling_seed", sampling_seed, secure_mode, "the batches", "masks")
        self.noise_seed = _seed("noise_seed", noise_seed, secure_mode, "the noise", "noise")
        self.sampling = _strategies.Sampling()
        self.log_clipping = check_bool("log_clipping", log_clipping, exc=MisconfigurationException)
        self.clipping_every_n_steps = check_int(
            "clipping_every_n_steps", clipping_every_n_steps, minimum=1, exc=MisconfigurationException
        )
        self._clipping = _dp_checks.ClippingStats()
        self._before_noise_hooks: List[Callable[[DPOptimizer], None]] = []
        self._param_names: Dict[int, str] = {}
        self._checks: Optional[SelfChecks] = None  # this fit's self-checks (from on_fit_start)
        self._module: Optional[weakref.ref] = None  # the module of the last fit
        self._fit_start = (0, 0)  # (accountant steps, global step) when this fit started
        self.ledger = PrivacyLedger(accountant=accountant, delta=delta)
        self.sample_rate: Optional[float] = None
        self.dataset_size: Optional[int] = None  # rows Poisson-sampled (set with sample_rate; saved for the audits)
        self.fixed_modules: List[Dict[str, str]] = []  # what fix_modules replaced (saved: checkpoints load with it)
        self.steps_per_epoch: Optional[int] = None
        self._hooks: Any = None  # Opacus' per-example hooks (see _strategies.grad_sample_hooks)
        self._view_hooks: List[Any] = []  # FSDP2: forward hooks that keep Opacus' hook views from FSDP's checks
        self._backward: Optional[PerExampleBackward] = None
        self._batch_statistics: List[tuple] = []

    @property
    @override
    def state_key(self) -> str:
        keys: Dict[str, Any] = dict(
            noise_multiplier=None if self._planned else self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            target_bayes_security=self.target_bayes_security,
            epochs=self.epochs,
        )
        if self.target_epsilon is not None:  # added later: keys of older checkpoints stay the same
            keys["target_epsilon"] = self.target_epsilon
        return self._generate_state_key(**keys)

    # ----------------------------------------------------------------------------------- checks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Reused for another module: that model's privacy starts at 0 (a checkpoint's ledger is loaded after setup).
        # Fitted again on the same module: its privacy loss composes with what it already spent.
        trained = self._module() if self._module is not None else None
        if trained is not None and trained is not pl_module and self.ledger.steps:
            self.ledger = PrivacyLedger(accountant=self.accountant_mechanism, delta=self.delta)
        self._module = weakref.ref(pl_module)
        if trainer.accumulate_grad_batches != 1:
            raise MisconfigurationException(
                f"DPSGD does not support gradient accumulation (Trainer(accumulate_grad_batches="
                f"{trainer.accumulate_grad_batches})): Opacus rejects it with Poisson sampling. Use "
                "accumulate_grad_batches=1 and a larger batch size instead."
            )
        if self.fix_modules:
            replaced = fix_modules_in_place(pl_module)
            self.fixed_modules = fixed_modules_record(replaced)
            if replaced:
                rank_zero_warn(replacements_warning(replaced))
        if ModuleValidator.validate(pl_module, strict=False) and (pl_module.training or incompatible_layers(pl_module)):
            owner = type(pl_module).__name__
            other = [] if pl_module.training else [f"{owner} is in eval mode: call `model.train()` before `fit`."]
            raise MisconfigurationException(
                incompatible_layers_message(
                    owner, incompatible_layers(pl_module), fix_modules=self.fix_modules, other=other
                )
            )
        _train_trainable_layers(pl_module)  # only eval mode remained of the validator's complaints
        _strategies.check_strategy(trainer)
        if _strategies.is_fsdp(trainer):
            _strategies.check_fsdp_settings(grad_sample_mode=self.grad_sample_mode, loss_reduction=self.loss_reduction)
        if self.grad_sample_mode == "ghost":
            _dp_checks.check_no_tied_parameters_for_ghost(pl_module)
            if "16" in str(trainer.precision):
                rank_zero_warn(
                    f"DPSGD(grad_sample_mode='ghost') under precision={trainer.precision!r}: the norms and the clipped "
                    "sum come from two 16-bit backward passes, so each example's contribution is bounded by "
                    "max_grad_norm only up to 16-bit rounding. grad_sample_mode='hooks' clips exactly what is summed."
                )
        self.sampling = _strategies.resolve_sampling(trainer, self.sampling_seed, secure=self.secure_mode)
        install_poisson_sampling(trainer, self)

    # ----------------------------------------------------------------------------------- wiring
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizers = trainer.strategy.optimizers
        if len(optimizers) != 1:
            raise MisconfigurationException(
                f"DPSGD supports exactly one optimizer; configure_optimizers returned {len(optimizers)}."
            )
        if isinstance(optimizers[0], DPOptimizer):
            raise MisconfigurationException(
                "The optimizer is already an Opacus DPOptimizer; remove DPSGD or make_private."
            )
        loader = make_poisson_loader(
            trainer, self, _compat.original_train_loader(trainer, before="poisson"), warn=False
        )
        self.steps_per_epoch = len(loader)
        if self._planned:
            self._plan(trainer)
        self._param_names = {id(p): name for name, p in pl_module.named_parameters()}
        self._batch_statistics = _dp_checks.batch_statistics_layers(pl_module)
        fsdp = _strategies.is_fsdp(trainer)
        self._hooks = _strategies.grad_sample_hooks(
            trainer,
            pl_module,
            grad_sample_mode=self.grad_sample_mode,
            loss_reduction=self.loss_reduction,
            max_grad_norm=self.max_grad_norm,
        )
        self._view_hooks = _strategies.fsdp_outputs_without_hook_views(pl_module) if fsdp else []
        cls = _strategies.dp_optimizer_class(trainer, self.grad_sample_mode)
        _strategies.disable_ddp_gradient_sync(trainer)
        self._backward = PerExampleBackward(
            pl_module,
            mode=self.grad_sample_mode,
            loss_reduction=self.loss_reduction,
            hooks=self._hooks,
            param_names=self._param_names,
            check=functools.partial(_dp_checks.check_ghost_norm, rtol=5e-2 if "16" in str(trainer.precision) else 1e-3),
            should_check=lambda: self._checks is not None and self._checks.checking_clipping and not fsdp,
            sharded=fsdp,
        )
        expected_batch_size = int(len(loader.dataset) * self.sample_rate)
        if _strategies.is_distributed(trainer):
            expected_batch_size /= trainer.world_size
        dp_optimizer = cls(
            optimizers[0],
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=self.loss_reduction,
            secure_mode=self.secure_mode,
        )
        dp_optimizer.noise_source = _strategies.resolve_noise(trainer, self.noise_seed, secure=self.secure_mode)
        dp_optimizer.noise_step = lambda: self.ledger.steps  # the index of the step being taken, over the whole run
        dp_optimizer.attach_step_hook(self._record_step)
        dp_optimizer.before_noise_hooks = self._before_noise_hooks
        trainer.strategy.optimizers = [dp_optimizer]
        self._checks = SelfChecks(
            trainer,
            dp_optimizer,
            grad_sample_mode=self.grad_sample_mode,
            max_grad_norm=self.max_grad_norm,
            noise_multiplier=float(self.noise_multiplier),
            loss_reduction=self.loss_reduction,
            param_names=self._param_names,
            backward=self._backward,
        )
        dp_optimizer.check_before_noise = self._checks.before_noise
        write_privacy_hparams(trainer, pl_module, self.privacy_settings())

    def _plan(self, trainer: pl.Trainer) -> None:
        """σ for the target after ``epochs`` epochs, from the ledger's one calibration routine."""
        steps = self.epochs * self.steps_per_epoch
        if self.target_bayes_security is not None:
            target, what = dict(target_bayes_security=float(self.target_bayes_security)), "β*_MIA ≥"
        else:
            target, what = dict(target_epsilon=self.target_epsilon, delta=self.delta), f"ε(δ={self.delta:g}) ≤"
        try:
            self.noise_multiplier = PrivacyLedger.calibrate(
                sample_rate=self.sample_rate,
                steps=steps,
                accountant=self.accountant_mechanism,
                steps_per_read=self.steps_per_epoch,
                **target,
            )
        except ValueError as error:  # before any step: the target cannot be met
            raise MisconfigurationException(
                f"DPSGD({', '.join(f'{k}={v!r}' for k, v in target.items())}, epochs={self.epochs}): {error}"
            ) from None
        rank_zero_info(
            f"DPSGD: planned noise_multiplier={self.noise_multiplier:.4f} for {what} {next(iter(target.values()))} "
            f"after {self.epochs} epochs ({steps} steps at sample_rate={self.sample_rate:.3g})."
        )
        if trainer.max_epochs is not None and trainer.max_epochs > self.epochs:
            rank_zero_warn(
                f"Trainer(max_epochs={trainer.max_epochs}) exceeds the planned epochs={self.epochs}: the run will "
                "exceed the privacy target unless PrivacyBudgetStopping stops it."
            )

    def privacy_settings(self) -> Dict[str, Any]:
        """The run's privacy settings, as logged in TensorBoard's HPARAMS tab."""
        settings: Dict[str, Any] = {
            names.DP_NOISE_MULTIPLIER: self.noise_multiplier,
            names.DP_MAX_GRAD_NORM: self.max_grad_norm,
            names.DP_SAMPLE_RATE: self.sample_rate,
            names.DP_DELTA: self.delta,
            names.DP_ACCOUNTANT: self.accountant_mechanism,
            names.DP_GRAD_SAMPLE_MODE: self.grad_sample_mode,
            names.DP_SAMPLING_SEED: _seed_kind(self.sampling_seed, self.secure_mode),
            names.DP_NOISE_SEED: _seed_kind(self.noise_seed, self.secure_mode),
        }
        if self.target_bayes_security is not None:
            settings[names.DP_TARGET_BAYES_SECURITY] = float(self.target_bayes_security)
        if self.target_epsilon is not None:
            settings[names.DP_TARGET_EPSILON] = self.target_epsilon
        if self._planned:
            settings[names.DP_PLANNED_EPOCHS] = int(self.epochs)
        return settings

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = (self.steps, trainer.global_step)
        self._clipping.reset()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_statistics:  # every step: a module may switch modes at any time (Lightning does, per epoch)
            _dp_checks.check_no_batch_statistics(self._batch_statistics)
        if self._backward is not None:
            self._backward.start_batch(empty=self.grad_sample_mode == "ghost" and is_empty_batch(batch))

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._checks is not None and isinstance(optimizer, DPOptimizer):
            self._checks.per_sample_gradients(optimizer)

    def register_before_noise_hook(self, hook: Callable[[DPOptimizer], None]) -> None:
        """Call ``hook(optimizer)`` at every step after per-sample clipping and before the noise is added.

        At that point each parameter's ``p.summed_grad`` holds the sum of the batch's clipped per-sample gradients;
        a hook may add to it (e.g. the gradient canaries of :class:`~lightning_privacy.CanaryAudit`), and the
        Gaussian noise is then added to the result. Under DDP the hook runs on every rank and the ranks' sums are
        added up after the noise, so a hook that adds something once per step should do so on one rank only.
        """
        self._before_noise_hooks.append(hook)

    def _record_step(self, optimizer: DPOptimizer) -> None:
        if self._checks is not None:
            self._checks.after_step(optimizer)
        if self.log_clipping:
            if self.grad_sample_mode == "ghost":
                self._clipping.add(self._backward.last_norms)
            elif self.ledger.steps % self.clipping_every_n_steps == 0 or not self._clipping.norms:
                self._clipping.update(optimizer.params)  # (steps before this one; an epoch always gets one record)
        self.ledger.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=self.sample_rate)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        accounted = self.steps - self._fit_start[0]
        taken = trainer.global_step - self._fit_start[1]
        if accounted != taken:
            raise MisconfigurationException(
                f"DP-SGD self-check: the accountant recorded {accounted} steps in this fit but the optimizer took "
                f"{taken}; the privacy accounting is wrong (was the DPOptimizer's step hook replaced?)."
            )
        if self.log_clipping:
            self._log_clipping(trainer, pl_module)

    def _log_clipping(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        norms = self._clipping.gathered(trainer, pl_module.device)
        self._clipping.reset()
        if norms.numel() == 0:
            return
        fraction = float((norms > self.max_grad_norm).to(torch.float64).mean())
        for key, value in ((names.DP_CLIP_FRACTION, fraction), (names.DP_GRAD_NORM_MEDIAN, float(norms.median()))):
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="mean")
        log_histogram(trainer, names.DP_GRAD_NORMS, norms.numpy(), step=max(0, trainer.global_step - 1))

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._checks is not None:
            self._checks.at_train_end()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._backward is not None:
            self._backward.remove()
            self._backward = None
        if stage == "fit":
            for handle in self._view_hooks:
                handle.remove()
            self._view_hooks = []
        if stage == "fit" and self._hooks is not None:
            self._hooks.cleanup()
            self._hooks = None

    # ----------------------------------------------------------------------------------- results
    @property
    def steps(self) -> int:
        """Optimizer steps recorded (including those before a resume)."""
        return self.ledger.steps

    @property
    def accountant(self) -> Any:
        """The Opacus accountant of this run (inside :attr:`ledger`)."""
        return self.ledger.accountant

    def epsilon(self, delta: Optional[float] = None) -> float:
        """The run's accountant ε at ``delta`` (default: the callback's ``delta``)."""
        return self.ledger.epsilon(delta)

    # ----------------------------------------------------------------------------------- state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "accountant": self.accountant_mechanism,
            "ledger": self.ledger.state_dict(),
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "max_grad_norm": self.max_grad_norm,
            "sampling_seed": self.sampling_seed,  # a fixed seed only; an OS-drawn one is never saved
            "noise_seed": self.noise_seed,  # likewise
            # for loading and auditing the checkpoint (lightning_privacy.checkpoints), not for resuming: a resumed
            # fit records its own in setup and when its train loader is built
            "fixed_modules": [dict(entry) for entry in self.fixed_modules],
            "dataset_size": self.dataset_size,
            # the recipe, for audits that retrain like the run (reference models) and report its δ
            "delta": self.delta,
            "loss_reduction": self.loss_reduction,
            "grad_sample_mode": self.grad_sample_mode,
        }

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        version = state_dict.get("version")
        history_key = "ledger" if version == STATE_VERSION else "history"
        missing = {"version", "accountant", history_key, "max_grad_norm"} - set(state_dict)
        if missing:
            raise RuntimeError(f"DPSGD state is missing {sorted(missing)}: refusing to restart privacy accounting at 0")
        if version not in (1, STATE_VERSION):
            raise RuntimeError(f"DPSGD state version {version!r} is not {STATE_VERSION} (or 1)")
        if state_dict["accountant"] != self.accountant_mechanism:
            raise RuntimeError(
                f"checkpoint accounted with {state_dict['accountant']!r}, this DPSGD uses {self.accountant_mechanism!r}"
            )
        if state_dict["max_grad_norm"] != self.max_grad_norm:
            raise RuntimeError(
                f"checkpoint trained with max_grad_norm={state_dict['max_grad_norm']}, this DPSGD has {self.max_grad_norm}"
            )
        for name, what in (("sampling_seed", "masks"), ("noise_seed", "noise")):
            saved, own = state_dict.get(name), getattr(self, name)
            if saved is not None and saved != own:
                rank_zero_warn(
                    f"The checkpoint was trained with DPSGD({name}={saved}) and this DPSGD has {name}={own!r}: the "
                    f"resumed run draws other {what} than the uninterrupted run would have (still independent of the "
                    "earlier ones)."
                )
        if version == 1:  # before the ledger: only the history; the PLD is recomposed from its segments
            ledger = {"version": 1, "accountant": self.accountant_mechanism, "history": state_dict["history"]}
        else:
            ledger = state_dict["ledger"]
        self.ledger.load_state_dict(ledger)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Dict[str, Any]
    ) -> None:
        if self.state_key not in checkpoint.get("callbacks", {}):
            raise RuntimeError(
                f"The checkpoint has no DPSGD state under {self.state_key!r}: its privacy history is unknown, so "
                "resuming would restart accounting at 0. Resume with the same DPSGD arguments as the original run."
            )

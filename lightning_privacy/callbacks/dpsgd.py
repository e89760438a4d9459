"""DP-SGD for an unchanged LightningModule, through Opacus."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from opacus.optimizers import DPOptimizer
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.callbacks._audit_utils import log_histogram
from lightning_privacy.callbacks._hparams import write_privacy_hparams
from lightning_privacy.dpsgd import checks, install, state, strategies
from lightning_privacy.dpsgd.backward import PerExampleBackward
from lightning_privacy.dpsgd.exactness import ExactnessRecord
from lightning_privacy.dpsgd.run import DPSGDRun
from lightning_privacy.dpsgd.sampling import is_empty_batch
from lightning_privacy.dpsgd.self_checks import SelfChecks
from lightning_privacy.dpsgd.settings import new_ledger, privacy_settings, set_arguments

DEFAULT_DELTA = 1e-5  # (here, not imported: the API page shows a default defined in the module by its value)


class DPSGD(Callback, DPSGDRun):
    r"""Train any LightningModule with DP-SGD (Abadi et al., 2016) through Opacus.

    Added to ``Trainer(callbacks=[...])``, it makes the run differentially private without changing the module: the
    train loader (from a datamodule, the module's hook or ``fit(train_dataloaders=...)``) becomes a Poisson-sampling
    loader of sample rate ``p = 1 / len(loader)`` as Opacus' ``make_private`` (:mod:`lightning_privacy.dpsgd.sampling`);
    Opacus computes per-sample gradients, and a ``DPOptimizer`` clips each to ``max_grad_norm`` and adds Gaussian
    noise of standard deviation ``noise_multiplier · max_grad_norm``. σ is given, or planned by
    :meth:`~lightning_privacy.ledger.PrivacyLedger.calibrate`: the smallest σ (to 1e-4, rounded up) whose safe β*_MIA
    (``target_bayes_security``) or certified ε at ``delta`` (``target_epsilon``) meets the target after ``epochs``.

    The loss ``training_step`` returns: the usual reduced loss, or one loss per example (shape ``[batch_size]``, as
    is or as a dict's ``"loss"``), which DPSGD reduces with ``loss_reduction``; ghost clipping needs the per-example
    losses. ``{"loss": losses.mean(), "per_example_loss": losses}`` trains one module unchanged with and without
    DPSGD (a plain ``Trainer`` trains on ``"loss"``, DPSGD on ``"per_example_loss"``).

    The run's privacy state is one :class:`~lightning_privacy.ledger.PrivacyLedger` (a certified ε, β*, TPR bounds),
    saved in ``state_dict``: a resume continues it, another ``fit`` of the same module composes with it. DPSGD checks
    on its first steps that privacy is applied and raises naming the parameter otherwise. Strategies: one device, DDP
    with ``use_distributed_sampler=False``, FSDP2 with ghost clipping. The DP-SGD guide explains each part.

    Args:
        noise_multiplier: σ, the noise standard deviation relative to ``max_grad_norm``.
        max_grad_norm: C, the per-sample clipping norm (``None``: 1.0; not with ``clipping="automatic"``).
        target_bayes_security: plan σ for this β*_MIA after ``epochs`` epochs (instead of σ).
        target_epsilon: plan σ for this ε at ``delta`` after ``epochs`` epochs (instead of σ), by ``accountant``.
        epochs: training length the plan is for (required with ``target_bayes_security`` or ``target_epsilon``).
        delta: δ of the run's ε.
        accountant: ``"pld"`` (the default: the package's pessimistic privacy-loss distribution, add/remove, a
            certified upper bound — 4.18 for σ = 2, q = 0.1, 300 steps at δ = 1e-5, where Opacus' RDP says 4.56), or
            Opacus' ``"rdp"`` (0.2.0's default), ``"prv"`` or ``"gdp"`` (an approximation, not a bound) for a user
            who must quote Opacus' numbers. ``None`` (not given): ``"pld"``, and a resumed checkpoint's own
            accountant (a 0.2.0 checkpoint resumes with RDP, saying so in one warning).
        loss_reduction: ``"mean"`` or ``"sum"``, how ``training_step`` reduces its loss over the batch (or how DPSGD
            reduces the per-example losses it returns).
        grad_sample_mode: ``"auto"`` (default: Opacus' hooks where every trainable parameter is in a layer Opacus
            samples exactly, every step verified, and on a disagreement that step and the rest of the fit redone in
            functional mode before any noise, :mod:`lightning_privacy.dpsgd.auto`; pick, switch and why kept in
            ``grad_sample_mode``/``grad_sample_mode_reason``/``grad_sample_mode_switch``), ``"hooks"``, ``"ghost"``
            (ghost clipping; per-example losses) or ``"functional"`` (each example's whole gradient by ``torch.func``
            on that example alone; :mod:`lightning_privacy.dpsgd.functional`). Explicit modes never switch.
        fix_modules: replace DP-incompatible layers with Opacus' fixers in ``setup`` (warns with the list)
            instead of raising.
        exactness_examples: examples the exactness check compares on each of the two self-checked steps; a larger
            batch has that many drawn uniformly (each costs about one backward pass of the whole batch). ``None``
            compares every example. A use of a parameter the hooks miss reaches every example that makes it.
        sample_rate: q, each row's probability of joining a step's batch. ``None`` (default): ``1 / len(loader)``,
            as Opacus' ``make_private``, which makes the number of batches per epoch public (a neighbour with one
            row fewer can have another q where N crosses a multiple of the batch size). A given q does not depend
            on the training set: with ``Trainer(max_steps=...)`` the released mechanism is then the same function
            for a dataset and each add/remove neighbour, as the ε stated for them assumes.
        expected_batch_size: the public constant each step's noised clipped sum is divided by (mean reduction).
            ``None`` (default): the train loader's ``batch_size`` (required for a loader without one, e.g. an Opacus
            ``DPDataLoader``). Never computed from the private training set: Opacus' ``int(len(dataset) · q)`` gives
            63 for 6,399 rows and 64 for 6,400 at batch 64, so the noise's scale in the weights would tell the two
            neighbours apart. Under DDP/FSDP2 each rank divides by ``expected_batch_size / world_size``.
        secure_mode: masks from the OS CSPRNG (``os.urandom``), noise as Opacus' secure mode draws it (four Gaussians
            per coordinate against floating-point attacks), reseeded from OS entropy every step (slower).
        sampling_seed: ``None`` (default): the Poisson masks' 128-bit seed is drawn from the OS's entropy at every fit,
            never saved. An int makes the batches known to whoever knows it: tests and debugging only (`dpsgd.sampling`).
        noise_seed: ``None`` (default): the noise comes from a private generator seeded from the OS's entropy at every
            fit, never saved. An int makes it known to whoever knows the seed: tests and debugging only (`dpsgd.noise`).
        log_clipping: log per epoch ``dp/clip_fraction`` (share of per-sample gradients whose norm exceeded C),
            ``dp/grad_norm_median`` and a histogram ``dp/grad_norms`` of per-sample norms, to tune C and see that
            clipping is active. They are computed from the private data and NOT covered by the DP guarantee.
        clipping_every_n_steps: with ``log_clipping``, record the norms of every n-th optimizer step (0, n, 2n, …; an
            epoch shorter than n steps still records its first); 1: every step. Ghost clipping records every step.
        functional_chunk_size: functional mode's examples per vmapped chunk; ``None`` (default): as many as keep a
            chunk's per-example gradients within 256 MiB on the CPU, a quarter of the free memory on a GPU (at least
            one; halved after an out-of-memory error).
        exactness_rate: the share of the steps after the two self-checked ones on which a few examples' clipped
            gradients (4, drawn uniformly) are compared with their gradients computed alone by ``torch.func``, in
            every mode (:mod:`lightning_privacy.dpsgd.sampled_exactness`); a disagreement stops the fit before that
            step's noised update. 0 turns it off.
        privacy_unit: ``"example"`` (a row) or ``"user"`` (a person: every ε, β* and bound is then one person's).
        user_ids: each row's person, a sequence in the dataset's row order or a row field's name (`dpsgd.users`).
        max_examples_per_user: k: a person's rows beyond k are left out (a secret choice fixed before training).
        user_sampling: sample people, each clipped whole (ULS), or rows (ELS: accounted for groups of k rows).
        user_reduction: ``"sum"`` or ``"mean"`` of a person's rows' gradients, clipped as one vector (ULS).
        clipping: ``"fixed"`` (clip to C), ``"quantile"`` (Andrew et al.: C adapted to a target quantile of the norms
            from a noised count, accounted together) or ``"automatic"`` (Bu et al.: × 1/(‖g‖ + γ)); `dpsgd.clipping`.
        stability: γ of automatic clipping.
        target_quantile: the share of examples quantile clipping's C should cover.
        clipping_learning_rate: η of C's geometric update, C·exp(−η(b̃ − γ)).
        count_noise_multiplier: σ_b of the noised count (``None``: the expected batch size / 20).
        neighbour_rate: the share of the later steps on which the DP premise itself is tested (besides the first two
            steps): the step's clipped sum over its batch and over the batch without one example, both re-collated by
            the train loader's ``collate_fn``, differ by at most C (:mod:`lightning_privacy.dpsgd.neighbours`).

    Attributes:
        noise_multiplier: σ in use (planned or given); ``None`` before planning.
        sample_rate: the Poisson sample rate (the argument, or known from ``on_fit_start``).
        expected_batch_size: the divisor of the noised clipped sum in use (the argument, or the loader's
            ``batch_size``); saved and stated.
        dataset_size: rows of the training set the Poisson sampling draws from (known with ``sample_rate``).
        fixed_modules: the modules ``fix_modules=True`` replaced (``{"name", "old", "new"}``), saved for
            :func:`lightning_privacy.checkpoints.load_checkpoint` and the audit commands.
        grad_sample_mode: the mode of the last fit (``"auto"`` resolved); ``grad_sample_mode_reason`` says why.
        exactness: what the last fit's exactness check compared (:class:`~lightning_privacy.dpsgd.exactness.ExactnessRecord`), logged.

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
        max_grad_norm: Optional[float] = None,
        target_bayes_security: Optional[float] = None,
        target_epsilon: Optional[float] = None,
        epochs: Optional[int] = None,
        delta: float = DEFAULT_DELTA,
        accountant: Optional[str] = None,
        loss_reduction: str = "mean",
        secure_mode: bool = False,
        sampling_seed: Optional[int] = None,
        noise_seed: Optional[int] = None,
        log_clipping: bool = False,
        clipping_every_n_steps: int = 4,
        grad_sample_mode: str = "auto",
        fix_modules: bool = False,
        exactness_examples: Optional[int] = 64,
        sample_rate: Optional[float] = None,
        expected_batch_size: Optional[float] = None,
        functional_chunk_size: Optional[int] = None,
        exactness_rate: float = 0.01,
        neighbour_rate: float = 0.005,
        privacy_unit: str = "example",
        user_ids: Optional[Any] = None,
        max_examples_per_user: Optional[int] = None,
        user_sampling: bool = True,
        user_reduction: str = "sum",
        clipping: str = "fixed",
        stability: float = 0.01,
        target_quantile: float = 0.5,
        clipping_learning_rate: float = 0.2,
        count_noise_multiplier: Optional[float] = None,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}  # this signature's
        set_arguments(self, **arguments)  # checked and stored (dpsgd.settings, which names every one of them)
        self.sampling = strategies.Sampling()
        self._clipping = checks.ClippingStats()
        self._before_noise_hooks: List[Callable[[DPOptimizer], None]] = []
        self._param_names: Dict[int, str] = {}  # (this fit's parameter names, hooks, backward and self-checks:
        self._checks: Optional[SelfChecks] = None  # set in on_fit_start by dpsgd.install, removed at teardown)
        self._module: Optional[weakref.ref] = None  # the module of the last fit
        self._fit_start = (0, 0)  # (accountant steps, global step) when this fit started
        self.ledger = new_ledger(self)
        self.sample_rate: Optional[float] = self.sample_rate_argument  # (else known at fit start)
        self.sample_rate_origin: Optional[str] = None
        self.expected_batch_size: Optional[float] = self.expected_batch_size_argument  # (else the loader's batch size)
        self.loader_batch_size: Optional[int] = None
        self.example_leaves: Optional[tuple] = None  # which batch leaves hold one row per example (the collate's)
        self.dataset_size: Optional[int] = None  # rows Poisson-sampled (set with sample_rate; saved for the audits)
        self.fixed_modules: List[Dict[str, str]] = []  # what fix_modules replaced (saved: checkpoints load with it)
        self.exactness = ExactnessRecord()  # what the exactness check compared in the last fit
        self.steps_per_epoch: Optional[int] = None
        # (for the statement: strategy, processes, precision, steps bounded only up to 16-bit rounding: dpsgd.state)
        self.strategy_name, self.world_size, self.precision, self.rounded_steps = None, None, None, 0
        self._hooks: Any = None  # Opacus' per-example hooks (see strategies.grad_sample_hooks)
        self._view_hooks: List[Any] = []  # FSDP2: forward hooks that keep Opacus' hook views from FSDP's checks
        self._backward: Optional[PerExampleBackward] = None
        self._batch_statistics: List[tuple] = []  # BatchNorms, checked before every step

    @property
    @override
    def state_key(self) -> str:  # (DPSGD given twice: one sentence naming both, install.refuse_given_twice)
        return install.refuse_given_twice(self, self._generate_state_key(**state.state_key_fields(self)))

    # ----------------------------------------------------------------------------------- checks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        install.prepare_fit(self, trainer, pl_module)

    # ----------------------------------------------------------------------------------- wiring
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        install.install_dp_optimizer(self, trainer, pl_module)
        write_privacy_hparams(trainer, pl_module, self.privacy_settings())

    def privacy_settings(self) -> Dict[str, Any]:
        """The run's privacy settings, as logged in TensorBoard's HPARAMS tab."""
        return privacy_settings(self)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = (self.steps, trainer.global_step)
        self._clipping.reset()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_statistics:  # every step: a module may switch modes at any time (Lightning does, per epoch)
            checks.check_no_batch_statistics(self._batch_statistics)
        if self._backward is not None:
            self._backward.start_batch(empty=self.grad_sample_mode == "ghost" and is_empty_batch(batch))
        if getattr(self, "quantile", None) is not None:  # the adaptive clipping norm this step clips to
            pl_module.log(names.DP_MAX_GRAD_NORM, self.quantile.clip, on_step=True, on_epoch=False)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        install.before_optimizer_step(self, trainer, optimizer)  # (the self-check; a step fp16's scaler would skip)

    def register_before_noise_hook(self, hook: Callable[[DPOptimizer], None]) -> None:
        """Call ``hook(optimizer)`` at every step after per-sample clipping and before the noise is added.

        At that point each parameter's ``p.summed_grad`` holds the sum of the batch's clipped per-sample gradients;
        a hook may add to it (e.g. the gradient canaries of :class:`~lightning_privacy.CanaryAudit`), and the
        Gaussian noise is then added to the result. Under DDP the hook runs on every rank and the ranks' sums are
        added up after the noise, so a hook that adds something once per step should do so on one rank only.
        """
        self._before_noise_hooks.append(hook)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every step accounted; dp/exactness_error; with log_clipping the clipping statistics (install.epoch_end)
        install.epoch_end(self, trainer, pl_module, log_histogram)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._checks is not None:
            self._checks.at_train_end()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            install.remove_dp_hooks(self)

    # ----------------------------------------------------------------------------------- results
    def epsilon(self, delta: Optional[float] = None) -> float:
        """The run's ε at ``delta`` (default: the callback's ``delta``), add/remove of one privacy unit (a row, or a
        person: :meth:`record_epsilon` is then a row's), by its accountant (default: the certified upper bound of the
        pessimistic PLD; ``ledger.epsilon_label`` says which)."""
        return self.ledger.epsilon(delta)

    # ----------------------------------------------------------------------------------- state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return state.dpsgd_state(self)

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state.load_dpsgd_state(self, state_dict)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Dict[str, Any]
    ) -> None:
        state.check_checkpoint_has_state(self.state_key, checkpoint)

"""DP-SGD for an unchanged LightningModule, through Opacus."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import create_accountant
from opacus.grad_sample import GradSampleHooks
from opacus.optimizers import DistributedDPOptimizer, DPOptimizer
from opacus.validators import ModuleValidator
from typing_extensions import override

from lightning_privacy import _compat, names
from lightning_privacy.analysis.bayes_security import noise_multiplier_for_exact
from lightning_privacy.callbacks import _dp_checks
from lightning_privacy.callbacks._audit_utils import log_histogram
from lightning_privacy.callbacks._hparams import write_privacy_hparams
from lightning_privacy.callbacks._poisson import install_poisson_sampling, make_poisson_loader

STATE_VERSION = 1
ACCOUNTANTS = ("rdp", "prv", "gdp")
DEFAULT_DELTA = 1e-5
SELF_CHECK_STEPS = 2  # optimizer steps of each fit on which DPSGD re-derives clipping and noise


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MisconfigurationException(f"`{name}` must be a positive finite number, got {value!r}")
    return float(value)


class DPSGD(Callback):
    r"""Train any LightningModule with DP-SGD (Abadi et al., 2016) through Opacus.

    Added to ``Trainer(callbacks=[...])``, it makes the run differentially private without changing
    the module: the train loader — from a datamodule, the module's ``train_dataloader`` hook or
    ``fit(train_dataloaders=...)`` — is replaced by a Poisson-sampling loader with the same expected
    batch size (sample rate ``p = 1 / len(loader)``, as Opacus' ``make_private``); Opacus hooks compute
    per-sample gradients; the optimizer is wrapped in a ``DPOptimizer`` that clips each to
    ``max_grad_norm`` and adds Gaussian noise of standard deviation ``noise_multiplier · max_grad_norm``.

    The noise is given directly, or planned: ``target_bayes_security`` + ``epochs`` picks σ from the
    closed form (Cherubin et al. 2024, Eq. 4; see
    :func:`~lightning_privacy.analysis.bayes_security.noise_multiplier_for`), raised where needed so
    that the exact PLD Bayes security after ``epochs`` epochs also meets the target
    (:func:`~lightning_privacy.analysis.bayes_security.noise_multiplier_for_exact`).

    An Opacus accountant (``accountant``, default RDP) records every optimizer step that happens; its
    ε at ``delta`` (default ``1e-5``) is a reference value only — the Bayes-security bounds of
    :class:`~lightning_privacy.BayesSecurityMonitor` use the same history. The history is saved in
    the callback's ``state_dict`` and a resumed run continues it.

    Args:
        noise_multiplier: σ, the noise standard deviation relative to ``max_grad_norm``.
        max_grad_norm: C, the per-sample clipping norm.
        target_bayes_security: plan σ for this β*_MIA after ``epochs`` epochs (instead of σ).
        epochs: training length the plan is for (required with ``target_bayes_security``).
        delta: δ for the reference accountant's ε.
        accountant: ``"rdp"``, ``"prv"`` or ``"gdp"`` (Opacus accountants).
        loss_reduction: ``"mean"`` or ``"sum"``, how ``training_step`` reduces its loss over the batch.
        secure_mode: Opacus' secure noise generation (slower).
        log_clipping: log per epoch ``dp/clip_fraction`` (share of per-sample gradients whose norm exceeded C)
            and ``dp/grad_norm_median``, and a histogram ``dp/grad_norms`` of per-sample norms, to tune C and to
            see that clipping is active. These values are computed from the private data and are NOT covered by
            the DP guarantee: publish them only where that is acceptable.

    Self-checks: on the first optimizer steps of every fit DPSGD re-derives from the parameters that privacy is
    really applied — every trainable parameter has per-sample gradients, the summed gradient is the sum of
    per-sample gradients clipped to C, and noise of standard deviation σ·C was added (single process; under DDP
    only the first check runs) — and at every epoch end that the accountant recorded exactly the optimizer steps
    taken. A failure raises ``MisconfigurationException`` naming the parameter.

    TensorBoard: at fit start DPSGD writes the run's one HPARAMS session — the model's hyperparameters beside σ,
    C, p, δ, the accountant (and the planning target), with the privacy metrics of the run's callbacks as columns.

    Attributes:
        noise_multiplier: σ in use (planned or given); ``None`` before planning.
        sample_rate: the Poisson sample rate (known from ``on_fit_start``).
        accountant: the Opacus accountant of this run.

    Raises:
        MisconfigurationException: for inconsistent arguments, gradient accumulation, several
            optimizers, BatchNorm or other Opacus-incompatible layers, and DDP without
            ``use_distributed_sampler=False``.

    Example::

        >>> from lightning_privacy import DPSGD
        >>> DPSGD(noise_multiplier=1.1, max_grad_norm=1.0).noise_multiplier
        1.1
        >>> DPSGD(target_bayes_security=0.9, epochs=20).noise_multiplier is None  # planned at fit start
        True
        >>> # trainer = Trainer(callbacks=[DPSGD(noise_multiplier=1.1)]); trainer.fit(model, datamodule)
    """

    def __init__(
        self,
        *,
        noise_multiplier: Optional[float] = None,
        max_grad_norm: float = 1.0,
        target_bayes_security: Optional[float] = None,
        epochs: Optional[int] = None,
        delta: float = DEFAULT_DELTA,
        accountant: str = "rdp",
        loss_reduction: str = "mean",
        secure_mode: bool = False,
        log_clipping: bool = False,
    ) -> None:
        if (noise_multiplier is None) == (target_bayes_security is None):
            raise MisconfigurationException(
                "Give exactly one of `noise_multiplier` or `target_bayes_security` (with `epochs`), got "
                f"noise_multiplier={noise_multiplier!r}, target_bayes_security={target_bayes_security!r}"
            )
        if noise_multiplier is not None:
            _positive("noise_multiplier", noise_multiplier)
            if epochs is not None:
                raise MisconfigurationException("`epochs` is only used with `target_bayes_security`; remove it")
        else:
            if not (isinstance(target_bayes_security, (int, float)) and 0 < target_bayes_security < 1):
                raise MisconfigurationException(
                    f"`target_bayes_security` must be in (0, 1), got {target_bayes_security!r}"
                )
            if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
                raise MisconfigurationException(
                    f"`epochs` must be a positive int when planning from `target_bayes_security`, got {epochs!r}"
                )
        self.max_grad_norm = _positive("max_grad_norm", max_grad_norm)
        if not (isinstance(delta, float) and 0 < delta < 1):
            raise MisconfigurationException(f"`delta` must be a float in (0, 1), got {delta!r}")
        if accountant not in ACCOUNTANTS:
            raise MisconfigurationException(f"`accountant` must be one of {ACCOUNTANTS}, got {accountant!r}")
        if loss_reduction not in ("mean", "sum"):
            raise MisconfigurationException(f"`loss_reduction` must be 'mean' or 'sum', got {loss_reduction!r}")
        self.noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)
        self.target_bayes_security = target_bayes_security
        self.epochs = epochs
        self.delta = delta
        self.accountant_mechanism = accountant
        self.loss_reduction = loss_reduction
        self.secure_mode = secure_mode
        if not isinstance(log_clipping, bool):
            raise MisconfigurationException(f"`log_clipping` must be True or False, got {log_clipping!r}")
        self.log_clipping = log_clipping
        self._clipping = _dp_checks.ClippingStats()
        self._param_names: Dict[int, str] = {}
        self._checks_left = 0
        self._fit_start = (0, 0)  # (accountant steps, global step) when this fit started
        self.accountant = create_accountant(mechanism=accountant)
        self.sample_rate: Optional[float] = None
        self.steps_per_epoch: Optional[int] = None
        self._hooks: Optional[GradSampleHooks] = None
        self._distributed = False

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(
            noise_multiplier=None if self.target_bayes_security is not None else self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            target_bayes_security=self.target_bayes_security,
            epochs=self.epochs,
        )

    # ----------------------------------------------------------------------------------- checks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.accumulate_grad_batches != 1:
            raise MisconfigurationException(
                f"DPSGD does not support gradient accumulation (Trainer(accumulate_grad_batches="
                f"{trainer.accumulate_grad_batches})): Opacus rejects it with Poisson sampling. Use "
                "accumulate_grad_batches=1 and a larger batch size instead."
            )
        errors = ModuleValidator.validate(pl_module, strict=False)
        if errors:
            listed = "; ".join(str(e) for e in errors[:5])
            raise MisconfigurationException(
                f"{type(pl_module).__name__} has layers DP-SGD cannot train ({listed}). Replace them, e.g. "
                "BatchNorm by GroupNorm with `model = opacus.validators.ModuleValidator.fix(model)`."
            )
        self._distributed = trainer.world_size > 1
        if self._distributed:
            if not isinstance(trainer.strategy, DDPStrategy):
                raise MisconfigurationException(
                    f"DPSGD supports multi-process training only with a DDP strategy, got "
                    f"{type(trainer.strategy).__name__}. Use Trainer(strategy='ddp', ...)."
                )
            if _compat.uses_distributed_sampler(trainer):
                raise MisconfigurationException(
                    "DPSGD under DDP needs `Trainer(use_distributed_sampler=False)`: Lightning's "
                    "DistributedSampler would replace the Poisson sampling that the privacy analysis assumes."
                )
        elif not isinstance(trainer.strategy, SingleDeviceStrategy):
            rank_zero_warn(
                f"DPSGD was tested with single-device and DDP strategies, not {type(trainer.strategy).__name__}."
            )
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
        loader = make_poisson_loader(trainer, self, _compat.original_train_loader(trainer))
        self.steps_per_epoch = len(loader)
        if self.target_bayes_security is not None:
            planned = noise_multiplier_for_exact(
                target=float(self.target_bayes_security),
                sample_rate=self.sample_rate,
                steps=self.epochs * self.steps_per_epoch,
            )
            self.noise_multiplier = planned
            rank_zero_info(
                f"DPSGD: planned noise_multiplier={planned:.4f} for β*_MIA ≥ {self.target_bayes_security} after "
                f"{self.epochs} epochs ({self.epochs * self.steps_per_epoch} steps at sample_rate={self.sample_rate:.3g})."
            )
            if trainer.max_epochs is not None and trainer.max_epochs > self.epochs:
                rank_zero_warn(
                    f"Trainer(max_epochs={trainer.max_epochs}) exceeds the planned epochs={self.epochs}: "
                    "β*_MIA will fall below the target unless PrivacyBudgetStopping stops the run."
                )
        self._hooks = GradSampleHooks(pl_module, batch_first=True, loss_reduction=self.loss_reduction)
        cls = DistributedDPOptimizer if self._distributed else DPOptimizer
        expected_batch_size = int(len(loader.dataset) * self.sample_rate)
        if self._distributed:
            expected_batch_size /= trainer.world_size
        dp_optimizer = cls(
            optimizers[0],
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=self.loss_reduction,
            secure_mode=self.secure_mode,
        )
        dp_optimizer.attach_step_hook(self._record_step)
        trainer.strategy.optimizers = [dp_optimizer]
        self._param_names = {id(p): name for name, p in pl_module.named_parameters()}
        self._checks_left = SELF_CHECK_STEPS
        write_privacy_hparams(trainer, pl_module, self.privacy_settings())

    def privacy_settings(self) -> Dict[str, Any]:
        """The run's privacy settings, as logged in TensorBoard's HPARAMS tab."""
        settings: Dict[str, Any] = {
            names.DP_NOISE_MULTIPLIER: self.noise_multiplier,
            names.DP_MAX_GRAD_NORM: self.max_grad_norm,
            names.DP_SAMPLE_RATE: self.sample_rate,
            names.DP_DELTA: self.delta,
            names.DP_ACCOUNTANT: self.accountant_mechanism,
        }
        if self.target_bayes_security is not None:
            settings[names.DP_TARGET_BAYES_SECURITY] = float(self.target_bayes_security)
            settings[names.DP_PLANNED_EPOCHS] = int(self.epochs)
        return settings

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = (self.steps, trainer.global_step)
        self._clipping.reset()

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._checks_left > 0 and isinstance(optimizer, DPOptimizer):
            _dp_checks.check_per_sample_gradients(optimizer.params, self._param_names)

    def _record_step(self, optimizer: DPOptimizer) -> None:
        if self._checks_left > 0:
            self._checks_left -= 1
            if not self._distributed:  # DistributedDPOptimizer noises on rank 0 and all-reduces: not checked here
                scale = optimizer.expected_batch_size * optimizer.accumulated_iterations
                _dp_checks.check_clipping_and_noise(
                    optimizer.params,
                    self._param_names,
                    max_grad_norm=self.max_grad_norm,
                    noise_multiplier=self.noise_multiplier,
                    scale=float(scale) if self.loss_reduction == "mean" else 1.0,
                )
        if self.log_clipping:
            self._clipping.update(optimizer.params)
        self.accountant.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=self.sample_rate)

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
        norms = self._clipping.values()
        if trainer.world_size > 1:  # every rank's norms, padded to one length for all_gather
            count = trainer.strategy.all_gather(torch.tensor([norms.numel()], device=pl_module.device))
            longest = int(count.max())
            padded = torch.full((longest,), float("nan"), dtype=torch.float64, device=pl_module.device)
            padded[: norms.numel()] = norms.to(pl_module.device)
            norms = trainer.strategy.all_gather(padded).reshape(-1).cpu()
            norms = norms[~torch.isnan(norms)]
        self._clipping.reset()
        if norms.numel() == 0:
            return
        fraction = float((norms > self.max_grad_norm).to(torch.float64).mean())
        for key, value in ((names.DP_CLIP_FRACTION, fraction), (names.DP_GRAD_NORM_MEDIAN, float(norms.median()))):
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="mean")
        log_histogram(trainer, names.DP_GRAD_NORMS, norms.numpy(), step=max(0, trainer.global_step - 1))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._hooks is not None:
            self._hooks.cleanup()
            self._hooks = None

    # ----------------------------------------------------------------------------------- results
    @property
    def steps(self) -> int:
        """Optimizer steps recorded by the accountant (including those before a resume)."""
        return sum(int(t) for _, _, t in self.accountant.history)

    def epsilon(self, delta: Optional[float] = None) -> float:
        """The reference accountant's ε at ``delta`` (default: the callback's ``delta``)."""
        if not self.accountant.history:
            return 0.0
        return float(self.accountant.get_epsilon(delta=self.delta if delta is None else delta))

    # ----------------------------------------------------------------------------------- state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "accountant": self.accountant_mechanism,
            "history": [[float(s), float(p), int(t)] for s, p, t in self.accountant.history],
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "max_grad_norm": self.max_grad_norm,
        }

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        missing = {"version", "accountant", "history", "max_grad_norm"} - set(state_dict)
        if missing:
            raise RuntimeError(f"DPSGD state is missing {sorted(missing)}: refusing to restart privacy accounting at 0")
        if state_dict["version"] != STATE_VERSION:
            raise RuntimeError(f"DPSGD state version {state_dict['version']!r} is not {STATE_VERSION}")
        if state_dict["accountant"] != self.accountant_mechanism:
            raise RuntimeError(
                f"checkpoint accounted with {state_dict['accountant']!r}, this DPSGD uses {self.accountant_mechanism!r}"
            )
        if state_dict["max_grad_norm"] != self.max_grad_norm:
            raise RuntimeError(
                f"checkpoint trained with max_grad_norm={state_dict['max_grad_norm']}, this DPSGD has {self.max_grad_norm}"
            )
        self.accountant.history = [(float(s), float(p), int(t)) for s, p, t in state_dict["history"]]

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Dict[str, Any]
    ) -> None:
        if self.state_key not in checkpoint.get("callbacks", {}):
            raise RuntimeError(
                f"The checkpoint has no DPSGD state under {self.state_key!r}: its privacy history is unknown, so "
                "resuming would restart accounting at 0. Resume with the same DPSGD arguments as the original run."
            )

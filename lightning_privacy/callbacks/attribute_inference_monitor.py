"""Per-epoch data-dependent Bayes security against attribute inference (Cherubin et al. 2024, Algorithm 4)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from opacus.optimizers import DPOptimizer
from torch.nn import functional as F
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.attribute_ledger import AttributeLedger
from lightning_privacy.attributes import SensitiveAttribute
from lightning_privacy.callbacks._attribute_checks import CandidateCheck, check_monitor_arguments, look_up_attribute
from lightning_privacy.callbacks._opacus import (
    accountant_history,
    dp_optimizers,
    find_dpsgd,
    history_steps,
    next_step_mechanism,
)
from lightning_privacy.callbacks._strategies import full_tensors, is_fsdp
from lightning_privacy.callbacks.bayes_security_monitor import _float32_toward_safety
from lightning_privacy.functional.attribute_sensitivity import (
    attribute_sensitivity,
    hook_free_twin,
    sensitivity_rounding_allowance,
    sync_training_mode,
)

STATE_VERSION = 2  # 1: flat Σ R_t² per segment (loaded with a safe bound, see AttributeLedger.load_state_dict)


def default_batch_to_inputs_targets(batch: Any) -> Tuple[Any, Any]:
    """``(inputs, targets)`` from an ``(x, y)`` batch."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise MisconfigurationException(
        f"AttributeInferenceMonitor expects (inputs, targets) batches, got {type(batch).__name__}; pass "
        "`batch_to_inputs_targets=lambda batch: (inputs, targets)`."
    )


class AttributeInferenceMonitor(Callback):
    r"""Track the attribute sensitivity R_t of every DP-SGD step and log the safe β*_AI every epoch.

    Cherubin et al. (2024), Corollary 10 / Algorithm 4: at every optimizer step, at the weights the
    step uses, R_t is the largest distance between the clipped per-sample gradients of one batch example
    with its sensitive attribute set to two candidate values (see
    :mod:`lightning_privacy.functional.attribute_sensitivity`; maximum over the batch and all processes).
    Steps the monitor did not measure (e.g. before it was added to a resumed run) count with the worst case
    Rₜ = 2C.

    Precision: Rₜ is computed in float32 (the parameters' dtype if wider) outside autocast, whatever ``precision``
    the Trainer uses (16-bit weights and inputs are upcast exactly), plus an allowance of 1024·eps·C (1.2e-4·C in
    float32, :func:`~lightning_privacy.functional.attribute_sensitivity.sensitivity_rounding_allowance`), so that
    float rounding cannot put it below the exact value for the step's weights and batch (tested against a float64
    brute force under bf16-mixed on CNN, attention, LSTM and frozen-backbone models, where float32 alone came out up
    to 2.1e-7·C below). The allowance lowers β*_AI by 6e-6 (approximate Rₜ) and 9e-6 (exact) in the 30-epoch Adult
    reproduction and by at most 6e-5 on those test models (2 epochs at σ = 1): for Rₜ ≥ 0.023·C it moves Rₜ up by at
    most one of the levels below.

    Each epoch two values are logged (σ/p per accountant segment):

    - ``privacy/ai_bayes_security`` (``key``): the safe β*_AI, 1 − δ(ε = 0) of the composed per-step
      Poisson-subsampled Gaussian mechanisms whose outputs differ by Rₜ, from a pessimistic privacy-loss
      distribution (:class:`~lightning_privacy.attribute_ledger.AttributeLedger`). Each Rₜ is rounded *up*
      onto 128 levels per factor of two (< 0.55 % per step; 1.9e-4 of β*_AI at the Adult reproduction's
      mechanism) and the epoch's steps are composed, level by level, onto the stored distribution at epoch end:
      a median 6-11 ms per epoch in the Adult run (0.28 s at most, in the first epoch; 0.25 % of the run for two
      monitors), ≈ 1 ms per step when ``PrivacyBudgetStopping(threat="ai")`` reads it after every step. Decisions
      use this value.
    - ``privacy/ai_bayes_security_closed_form`` (``key + "_closed_form"``): the paper's
      1 − erf(√(Σₜ (pₜRₜ/σₜ)²) / (2√2·C)), an approximation that can overstate security (at p = 0.05,
      σ = 1, 400 steps with Rₜ = 2C: 0.3173 against 0.3059), shown for comparison.

    Since Rₜ ≤ 2C each is never below its β*_MIA counterpart, with equality when every Rₜ = 2C.

    Model: as in issue 14 and Cor. 10, step t is the pair whose two gradients sit at ±Rₜ/2 about the batch
    without the record (dp_accounting's ``REPLACE_ONE`` with sensitivity Rₜ/2); "safe" means never above that
    model's exact value. For Rₜ < 2C other placements of two clipped gradients at distance Rₜ can leak more
    (see :func:`~lightning_privacy.analysis.bayes_security.ai_bayes_security_exact`); β*_MIA bounds every
    placement.

    Privacy of the bound (Section 5.3): β*_AI depends on the training data and can leak MEMBERSHIP
    (not the attribute). Per-step ``privacy/ai_sensitivity`` is logged only with ``publish=True``;
    otherwise the monitor warns once. Publish β*_AI only where membership inference is not a concern.

    :class:`~lightning_privacy.PrivacyBudgetStopping` with ``threat="ai"`` calls
    :meth:`bayes_security_after_next_step`: the safe β*_AI with the worst case R = 2C for the next step.

    The attribute is a :class:`~lightning_privacy.functional.attributes.SensitiveAttribute` or the NAME of
    one, looked up at setup with the datamodule's ``sensitive_attribute(name)`` (what
    :class:`~lightning_privacy.data.AdultDataModule` offers), so ``attribute: age`` works in a
    LightningCLI config. The candidates must be on the model's input scale: on its first steps the
    monitor compares the values it will write with what the batch holds there and raises when they are
    far outside the column's observed range (raw ages into a standardised column) or a one-hot group's
    columns are not 0/1; the rule is in :mod:`lightning_privacy.functional.attributes`. Custom
    attributes cannot be checked.

    Args:
        attribute: a :class:`~lightning_privacy.functional.attributes.SensitiveAttribute`, or the name of
            one for the datamodule's ``sensitive_attribute(name)``.
        method: ``"approximate"`` (upper bound on R_t, safe side, O(|A|)) or ``"exact"`` (diameter).
        values: ``"all"``, ``"extremes"`` (domain knowledge, Section 5.4) or a subset of values.
        publish: log per-step R_t (``privacy/ai_sensitivity``) and do not warn.
        loss_fn: ``loss_fn(outputs, targets)``, the module's training loss (default cross-entropy).
        batch_to_inputs_targets: maps a training batch to ``(inputs, targets)`` (default: ``(x, y)``).
        chunk_size: examples per chunk of gradient computation (default: automatic).
        backend: ``"auto"``, ``"func"`` (torch.func, any module) or ``"linear"`` (Gram matrices for
            all-``nn.Linear`` models); see :func:`~lightning_privacy.functional.attribute_sensitivity.attribute_sensitivity`.
        key: metric key for the safe β*_AI (change it when several monitors run side by side); the closed
            form is logged under ``key + "_closed_form"``.
        accountant: an Opacus accountant to read instead of finding it through the trainer.
        check_candidates: check the candidates against the first batches (turn off only for
            deliberately out-of-range candidates).

    Attributes:
        attribute: the :class:`~lightning_privacy.functional.attributes.SensitiveAttribute` (for a name:
            the name until setup, then what the datamodule returned).
        tracked_attribute: ``attribute`` restricted to ``values`` (``None`` until a name is looked up).
        ledger: the :class:`~lightning_privacy.attribute_ledger.AttributeLedger` of the run (R_t rounded up onto
            levels and composed incrementally; Σ R_t² per segment for the closed form). A new one at every fit (a
            resumed fit restores the checkpoint's), so a monitor reused for another fit holds that fit's steps only.
        segments: the ledger's run-length record ``[{noise_multiplier, sample_rate, steps, sum_sq, measured}]``.
        max_sensitivity: the largest measured R_t.
        epochs: one record per epoch, ``{"epoch", "steps", "safe", "closed"}`` (the safe β*_AI and its closed form
            after that epoch; the report draws them), restarted with the ledger and saved in the state.

    Raises:
        MisconfigurationException: for bad arguments, when training is not Opacus DP-SGD, when a name
            cannot be looked up, or when the candidates do not fit the data.

    Example::

        >>> from lightning_privacy import AttributeInferenceMonitor
        >>> monitor = AttributeInferenceMonitor(attribute="age")  # AdultDataModule.sensitive_attribute("age")
        >>> monitor.state_key
        "AttributeInferenceMonitor{'attribute': 'age', 'method': 'approximate', 'values': 'all', 'key': 'privacy/ai_bayes_security'}"
        >>> # Trainer(callbacks=[DPSGD(noise_multiplier=3.5), monitor]).fit(model, datamodule=AdultDataModule())
        >>> # Or, with the datamodule at hand (raw ages 17..90, written standardised like the input column):
        >>> from lightning_privacy.data import AdultDataModule
        >>> dm = AdultDataModule()
        >>> dm.setup("fit")
        >>> AttributeInferenceMonitor(attribute=dm.sensitive_attribute("age"), values="extremes").tracked_attribute
        SensitiveAttribute.numeric(name='age', column=0, |A|=2, values=(17, 90))
    """

    report_order = 30  # the report's sections: DP-SGD first, then monitors, then audits

    def report_section(self, trainer: Any = None) -> Any:
        """This callback's section of the privacy report (:mod:`lightning_privacy.reporting`)."""
        from lightning_privacy.callbacks._sections import ai_section

        return ai_section(self, trainer)

    #: Metric columns this callback adds to the run's HPARAMS session (see ``callbacks/_hparams.py``).
    @property
    def hparams_metric_keys(self) -> Tuple[str, ...]:
        return (self.key,)

    @property
    def closed_form_key(self) -> str:
        """Metric key of the closed form: ``privacy/ai_bayes_security_closed_form`` for the default ``key``."""
        if self.key == names.AI_BAYES_SECURITY:
            return names.AI_BAYES_SECURITY_CLOSED_FORM
        return self.key + "_closed_form"

    def __init__(
        self,
        *,
        attribute: Union[SensitiveAttribute, str],
        method: str = "approximate",
        values: Union[str, Sequence[Any]] = "all",
        publish: bool = False,
        loss_fn: Optional[Callable[[Any, Any], Any]] = None,
        batch_to_inputs_targets: Optional[Callable[[Any], Tuple[Any, Any]]] = None,
        chunk_size: Optional[int] = None,
        backend: str = "auto",
        key: str = names.AI_BAYES_SECURITY,
        accountant: Optional[IAccountant] = None,
        check_candidates: bool = True,
    ) -> None:
        check_monitor_arguments(
            attribute, method, values, publish, check_candidates, chunk_size, backend, key, loss_fn, batch_to_inputs_targets
        )  # fmt: skip
        self.values = values if isinstance(values, str) else list(values)
        self.attribute, self._attribute_name = attribute, attribute if isinstance(attribute, str) else None
        self.tracked_attribute = self._select(attribute) if isinstance(attribute, SensitiveAttribute) else None
        self.method = method
        self.publish = publish
        self.loss_fn = loss_fn if loss_fn is not None else F.cross_entropy
        self.batch_to_inputs_targets = batch_to_inputs_targets or default_batch_to_inputs_targets
        self.chunk_size = chunk_size
        self.backend = backend
        self.key = key
        self.accountant = accountant
        self.check_candidates = check_candidates
        self._check: Optional[CandidateCheck] = None
        self.ledger = AttributeLedger()
        self.epochs: List[Dict[str, Any]] = []
        self._twin, self._batch, self._pending, self._warned = None, None, None, False
        self._unsharded_twin: Optional[Any] = None

    @property
    @override
    def state_key(self) -> str:
        values = self.values if isinstance(self.values, str) else repr(self.values)
        name = self._attribute_name or self.attribute.name
        return self._generate_state_key(attribute=name, method=self.method, values=values, key=self.key)

    # ------------------------------------------------------------------------------ results
    @property
    def segments(self) -> List[Dict[str, Any]]:
        return self.ledger.segments

    @property
    def max_sensitivity(self) -> float:
        return self.ledger.max_sensitivity

    @property
    def max_grad_norm(self) -> Optional[float]:
        return self.ledger.max_grad_norm

    @property
    def steps(self) -> int:
        """Optimizer steps accounted for (measured or counted at the worst case)."""
        return self.ledger.steps

    def bayes_security(self, extra_worst_case_step: Optional[Tuple[float, float]] = None) -> float:
        """Safe β*_AI for the steps so far (plus, optionally, one worst-case step R = 2C with the given (σ, p))."""
        if extra_worst_case_step is None:
            return self.ledger.bayes_security()
        self._need_max_grad_norm()
        sigma, rate = extra_worst_case_step
        return self.ledger.bayes_security_after_worst_case_step(noise_multiplier=sigma, sample_rate=rate)

    def bayes_security_closed_form(self, extra_worst_case_step: Optional[Tuple[float, float]] = None) -> float:
        """The paper's closed form (Cor. 10) for the same steps — an approximation that can overstate security."""
        if extra_worst_case_step is not None:
            self._need_max_grad_norm()
        return self.ledger.bayes_security_closed_form(extra_worst_case_step)

    def bayes_security_after_next_step(self, trainer: pl.Trainer) -> float:
        """Safe β*_AI if one more optimizer step with the worst case R = 2C were taken (for budget stopping)."""
        dpsgd = find_dpsgd(trainer)
        if dpsgd is not None:
            self._set_max_grad_norm(dpsgd.max_grad_norm)
        self._commit(trainer)
        mechanism = next_step_mechanism(trainer, self.accountant, who="AttributeInferenceMonitor")
        if self.max_grad_norm is None:
            raise MisconfigurationException(
                "AttributeInferenceMonitor cannot tell C before the first step of a user's make_private run; "
                "use lightning_privacy.DPSGD."
            )
        return self.bayes_security(extra_worst_case_step=mechanism)

    # ------------------------------------------------------------------------------ bookkeeping
    def _need_max_grad_norm(self) -> None:
        if self.max_grad_norm is None:
            raise MisconfigurationException("The clipping norm is not known yet (no DP optimizer step has been seen).")

    def _set_max_grad_norm(self, value: Any) -> None:
        if isinstance(value, (list, tuple)):
            raise MisconfigurationException(
                "AttributeInferenceMonitor supports flat clipping only (one max_grad_norm), not per-layer."
            )
        try:
            self.ledger.set_max_grad_norm(float(value))
        except ValueError as err:
            raise RuntimeError(str(err)) from err

    def _commit(self, trainer: pl.Trainer) -> None:
        """Align with the accountant: new steps get the pending R_t (last one) or the worst case 2C."""
        history = accountant_history(trainer, self.accountant)
        if history_steps(history) == self.steps:
            self._pending = None  # no step was taken (e.g. skipped by the optimizer)
            return
        if self.max_grad_norm is None and history_steps(history) > self.steps:
            optimizers = dp_optimizers(trainer)
            if not optimizers:
                raise MisconfigurationException(
                    "The accountant recorded steps but no Opacus DPOptimizer gives max_grad_norm."
                )
            self._set_max_grad_norm(optimizers[0].max_grad_norm)
        self.ledger.align(history, self._pending)
        self._pending = None

    # ------------------------------------------------------------------------------ attribute
    def _select(self, attribute: SensitiveAttribute) -> SensitiveAttribute:
        try:
            return attribute.select(self.values)
        except (TypeError, ValueError) as err:
            raise MisconfigurationException(
                f"`values`={self.values!r} does not fit attribute {attribute.name!r}: {err}"
            ) from err

    # ------------------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a reused monitor starts over; a resumed fit gets its ledger back in load_state_dict
            self.ledger, self.epochs = AttributeLedger(), []
        if self._attribute_name is not None:  # looked up again at every fit: the datamodule may differ
            self.attribute = look_up_attribute(trainer, self._attribute_name)
            self.tracked_attribute = self._select(self.attribute)
        # FSDP2 (ModelParallelStrategy): configure_model shards the module after setup, and a sharded module cannot be
        # copied; the twin is the module as it is now, called with the all-gathered parameters at every step
        self._unsharded_twin = hook_free_twin(pl_module) if stage == "fit" and is_fsdp(trainer) else None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._twin = None
        self._pending = None
        self._check = CandidateCheck(self.tracked_attribute, enabled=self.check_candidates)
        if not self.publish and not self._warned:
            rank_zero_warn(
                f"AttributeInferenceMonitor: {names.AI_BAYES_SECURITY} is data-dependent; publishing it can leak the "
                "MEMBERSHIP of training records (Cherubin et al. 2024, Section 5.3). Per-step R_t is not logged; "
                "keep the logs private where membership inference matters (publish=True to opt in)."
            )
            self._warned = True

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch  # the step's batch, used at the step's weights in on_before_optimizer_step

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if not isinstance(optimizer, DPOptimizer):
            raise MisconfigurationException(
                f"AttributeInferenceMonitor needs Opacus DP-SGD (a DPOptimizer), got {type(optimizer).__name__}; add "
                "lightning_privacy.DPSGD(...) to the callbacks."
            )
        self._set_max_grad_norm(optimizer.max_grad_norm)
        inputs, targets = self.batch_to_inputs_targets(self._batch)
        if self._check is not None and not self._check.done:
            self._check.update(trainer, inputs)
        if self._twin is None:
            self._twin = self._unsharded_twin if self._unsharded_twin is not None else hook_free_twin(pl_module)
        sync_training_mode(self._twin, pl_module)
        params, buffers = full_tensors(pl_module.named_parameters()), full_tensors(pl_module.named_buffers())
        dtype = next((p.dtype for p in pl_module.parameters() if p.requires_grad), torch.float32)
        self._pending = attribute_sensitivity(
            self._twin,
            inputs,
            targets,
            attribute=self.tracked_attribute,
            max_grad_norm=self.max_grad_norm,
            method=self.method,
            loss_fn=self.loss_fn,
            params=params,
            buffers=buffers,
            chunk_size=self.chunk_size,
            backend=self.backend,
            sync=True,
            rounding_allowance=sensitivity_rounding_allowance(dtype, max_grad_norm=self.max_grad_norm),
        )
        self._batch = None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        pending = self._pending
        self._commit(trainer)
        if self.publish and pending is not None:
            pl_module.log(names.AI_SENSITIVITY, pending, on_step=True, on_epoch=False, reduce_fx="max", sync_dist=False)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._commit(trainer)
        if self.max_grad_norm is None:
            return
        # Every rank holds the same R_t (max-reduced per step), hence the same values; "min" keeps it safe anyway.
        # The safe value is rounded down to float32 (what loggers store), so the logged number stays a lower bound.
        exact, closed = self.bayes_security(), self.bayes_security_closed_form()
        self.epochs.append({"epoch": trainer.current_epoch, "steps": self.steps, "safe": exact, "closed": closed})
        safe = _float32_toward_safety(exact, down=True)
        for key, value in ((self.key, safe), (self.closed_form_key, closed)):
            pl_module.log(key, value, on_step=False, on_epoch=True, reduce_fx="min", sync_dist=True)

    # ------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "ledger": self.ledger.state_dict(),
            "steps": self.steps,
            "epochs": [dict(e) for e in self.epochs],
        }

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        version = state_dict.get("version")
        required = {1: {"segments", "max_grad_norm"}, STATE_VERSION: {"ledger"}}.get(version)
        if required is None:
            raise RuntimeError(f"AttributeInferenceMonitor state version {version!r} is not {STATE_VERSION}")
        missing = required - set(state_dict)
        if missing:
            raise RuntimeError(
                f"AttributeInferenceMonitor state is missing {sorted(missing)}: refusing to restart R at 0"
            )
        ledger = AttributeLedger()
        ledger.load_state_dict(state_dict if version == 1 else state_dict["ledger"])  # 1: the ledger's v1 layout
        self.ledger = ledger
        self.epochs = [dict(e) for e in state_dict.get("epochs", [])]  # added later: older checkpoints have none

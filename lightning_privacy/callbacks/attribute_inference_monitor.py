"""Per-epoch data-dependent Bayes security against attribute inference (Cherubin et al. 2024, Algorithm 4)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from torch.nn import functional as F
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.attribute_ledger import AttributeLedger, load_monitor_state, monitor_state
from lightning_privacy.attributes import SensitiveAttribute
from lightning_privacy.callbacks._attribute_checks import (
    CandidateCheck,
    align_with_accountant,
    check_monitor_arguments,
    default_batch_to_inputs_targets,
    look_up_attribute,
    require_dp_optimizer,
    select_values,
    set_flat_max_grad_norm,
    warn_unpublished,
)
from lightning_privacy.callbacks.bayes_security_monitor import _float32_toward_safety
from lightning_privacy.dpsgd.run import find_dpsgd, next_step_mechanism
from lightning_privacy.dpsgd.strategies import full_tensors, is_fsdp
from lightning_privacy.functional.attribute_sensitivity import hook_free_twin, step_sensitivity


class AttributeInferenceMonitor(Callback):
    r"""Track the attribute sensitivity R_t of every DP-SGD step and log the safe β*_AI every epoch.

    Cherubin et al. (2024), Corollary 10 / Algorithm 4: at every optimizer step, at the weights the step uses, R_t is
    the largest distance between the clipped per-sample gradients of one batch example with its sensitive attribute
    set to two candidate values, over the batch and all processes (in float32 at least, with a rounding allowance:
    :func:`~lightning_privacy.functional.attribute_sensitivity.step_sensitivity`). Steps it did not measure (e.g.
    before it was added to a resumed run) count with the worst case R_t = 2C.

    Each epoch it logs the safe β*_AI that decisions use, ``privacy/ai_bayes_security`` (``key``): 1 − δ(ε = 0) of the
    composed per-step mechanisms whose outputs differ by R_t (two gradients at ±R_t/2, Cor. 10), each R_t rounded up
    onto 128 levels per factor of two (:mod:`lightning_privacy.attribute_ledger`, which gives the model, the grid and
    the cost); and the paper's closed form, which can overstate security, as ``key + "_closed_form"``. Since R_t ≤ 2C
    each is never below its β*_MIA counterpart. β*_AI depends on the training data and can leak MEMBERSHIP (Section
    5.3): per-step ``privacy/ai_sensitivity`` is logged only with ``publish=True``, otherwise the monitor warns once.

    The attribute is a :class:`~lightning_privacy.functional.attributes.SensitiveAttribute`, or the NAME of one that
    the datamodule's ``sensitive_attribute(name)`` returns at setup (``attribute: age`` in a LightningCLI config). On
    its first steps the monitor checks the candidates against the batches' column (on the model's input scale; the
    rule is in :mod:`lightning_privacy.functional.attributes`; custom attributes cannot be checked).

    Args:
        attribute: a :class:`~lightning_privacy.functional.attributes.SensitiveAttribute`, or a name for the
            datamodule's ``sensitive_attribute(name)``.
        method: ``"approximate"`` (upper bound on R_t, safe side, O(|A|)) or ``"exact"`` (diameter).
        values: ``"all"``, ``"extremes"`` (domain knowledge, Section 5.4) or a subset of values.
        publish: log per-step R_t (``privacy/ai_sensitivity``) and do not warn.
        loss_fn: ``loss_fn(outputs, targets)``, the module's training loss (default cross-entropy).
        batch_to_inputs_targets: maps a training batch to ``(inputs, targets)`` (default: ``(x, y)``).
        chunk_size: examples per chunk of gradient computation (default: automatic).
        backend: ``"auto"``, ``"func"`` or ``"gram"`` (formerly ``"linear"``); see
            :mod:`lightning_privacy.functional.attribute_sensitivity`.
        key: metric key for the safe β*_AI (change it when several monitors run side by side); the closed
            form is logged under ``key + "_closed_form"``.
        accountant: an Opacus accountant to read instead of finding it through the trainer.
        check_candidates: check the candidates against the first batches (off for deliberately out-of-range ones).

    Attributes:
        attribute: the :class:`~lightning_privacy.functional.attributes.SensitiveAttribute` (for a name:
            the name until setup, then what the datamodule returned).
        tracked_attribute: ``attribute`` restricted to ``values`` (``None`` until a name is looked up).
        ledger: the run's :class:`~lightning_privacy.attribute_ledger.AttributeLedger`, new at every fit (a resumed
            fit restores the checkpoint's): a monitor reused for another fit holds that fit's steps only.
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
        self.tracked_attribute = (
            select_values(attribute, self.values) if isinstance(attribute, SensitiveAttribute) else None
        )
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
            set_flat_max_grad_norm(self.ledger, dpsgd.max_grad_norm)
        self._commit(trainer)
        mechanism = next_step_mechanism(trainer, self.accountant, who="AttributeInferenceMonitor")
        if self.max_grad_norm is None:
            raise MisconfigurationException(
                "AttributeInferenceMonitor cannot tell C before the first step of a user's make_private run; "
                "use lightning_privacy.DPSGD."
            )
        return self.bayes_security(extra_worst_case_step=mechanism)

    def _need_max_grad_norm(self) -> None:
        if self.max_grad_norm is None:
            raise MisconfigurationException("The clipping norm is not known yet (no DP optimizer step has been seen).")

    def _commit(self, trainer: pl.Trainer) -> None:
        """Align with the accountant: new steps get the pending R_t (last one) or the worst case 2C."""
        align_with_accountant(self.ledger, trainer, self.accountant, self._pending)
        self._pending = None

    # ------------------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a reused monitor starts over; a resumed fit gets its ledger back in load_state_dict
            self.ledger, self.epochs = AttributeLedger(), []
        if self._attribute_name is not None:  # looked up again at every fit: the datamodule may differ
            self.attribute = look_up_attribute(trainer, self._attribute_name)
            self.tracked_attribute = select_values(self.attribute, self.values)
        # FSDP2 (ModelParallelStrategy): configure_model shards the module after setup, and a sharded module cannot be
        # copied; the twin is the module as it is now, called with the all-gathered parameters at every step
        self._unsharded_twin = hook_free_twin(pl_module) if stage == "fit" and is_fsdp(trainer) else None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._twin = None
        self._pending = None
        self._check = CandidateCheck(self.tracked_attribute, enabled=self.check_candidates)
        if not self.publish and not self._warned:
            warn_unpublished()
            self._warned = True

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch  # the step's batch, used at the step's weights in on_before_optimizer_step

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        require_dp_optimizer(optimizer)
        set_flat_max_grad_norm(self.ledger, optimizer.max_grad_norm)
        inputs, targets = self.batch_to_inputs_targets(self._batch)
        if self._check is not None and not self._check.done:
            self._check.update(trainer, inputs)
        if self._twin is None:
            self._twin = self._unsharded_twin if self._unsharded_twin is not None else hook_free_twin(pl_module)
        self._pending = step_sensitivity(
            self._twin,
            pl_module,
            inputs,
            targets,
            attribute=self.tracked_attribute,
            max_grad_norm=self.max_grad_norm,
            params=full_tensors(pl_module.named_parameters()),
            buffers=full_tensors(pl_module.named_buffers()),
            method=self.method,
            loss_fn=self.loss_fn,
            chunk_size=self.chunk_size,
            backend=self.backend,
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
        return monitor_state(self.ledger, self.epochs)

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.ledger, self.epochs = load_monitor_state(state_dict)

"""Stop training before the step that would break a privacy budget (β* or ε)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from typing_extensions import override

from lightning_privacy._validation import check_choice, check_open_unit, check_positive
from lightning_privacy.dpsgd.run import find_dpsgd, next_step_mechanism, run_ledger
from lightning_privacy.ledger import PrivacyLedger, epsilon_floor

THREATS = ("mia", "ai")


class PrivacyBudgetStopping(Callback):
    r"""Stop training before the optimizer step that would break a privacy budget.

    Budgets: ``min_bayes_security`` (β* must stay ≥ it) or ``max_epsilon`` (the accountant's ε at ``delta`` must
    stay ≤ it). Before every step (at the start of training and after each batch) this callback asks the run's
    :class:`~lightning_privacy.ledger.PrivacyLedger` whether one more step would break the budget, and sets
    ``trainer.should_stop`` if so, so the last model trained still meets the budget.

    For membership inference (``threat="mia"``) β* after the next step is known in advance: the ledger's safe
    value (pessimistic PLD, exact-or-lower) for the history plus one more step. The largest admissible step count
    for the current (σ, p) is found by bracketing and bisection, exact to one step, and re-used until the ledger
    composes new steps; the prediction is composed exactly as the monitor's next read will compose it, so the
    value the monitor logs after the stop equals the value the decision was made on. ε budgets use the run's own
    accountant the same way (by default the certified ε of the pessimistic PLD, add/remove: the next steps composed
    onto it as the next read will).

    For attribute inference (``threat="ai"``, β* budgets only) the decision is made on the monitor's safe β*_AI
    (the :class:`~lightning_privacy.AttributeInferenceMonitor` in the same trainer: pessimistic PLD over the measured
    R_t, never above the exact value; not the closed form, which can overstate). The next step's sensitivity is not
    known in advance, so it counts at the worst case R = 2C, which keeps the stop on the safe side.

    The decision is reduced across processes: if any rank stops, all stop. Lightning ignores ``should_stop`` until
    ``min_epochs``/``min_steps`` are reached, so :meth:`setup` raises when those would force training past the budget.
    A budget that the run's very first step would already break is refused at train start, before any step (a stop
    there would return an untrained model as if training had ended normally): the error gives what one step costs
    and the noise multiplier that would allow one epoch within the budget (from
    :meth:`~lightning_privacy.ledger.PrivacyLedger.calibrate`). The noise and the sample rate are known only once
    DPSGD has built the Poisson loader (its ``on_fit_start``), and a resumed ledger only after ``setup``, so this is
    the earliest point; a resumed run that has spent its budget still stops instead.

    Args:
        min_bayes_security: a β* budget in (0, 1).
        max_epsilon: an ε budget > 0 (at ``delta``; MIA threat).
        delta: δ of the ε budget; default: DPSGD's ``delta``.
        threat: ``"mia"`` or ``"ai"``.
        relation: ``"replace"`` or ``"add_remove"`` (MIA β* only).
        accountant: an Opacus accountant to read instead of finding it through the trainer.
        exact: deprecated; must be True (a closed-form decision could overstate security).

    Example::

        >>> from lightning_privacy import PrivacyBudgetStopping
        >>> PrivacyBudgetStopping(min_bayes_security=0.9).min_bayes_security
        0.9
        >>> PrivacyBudgetStopping(max_epsilon=3.0, delta=1e-5).max_epsilon
        3.0
        >>> PrivacyBudgetStopping(min_bayes_security=1.5)
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `min_bayes_security` must be in (0, 1), got 1.5
    """

    report_order = 40  # the report's sections: DP-SGD first, then monitors, then audits

    def report_section(self, trainer: Any = None) -> Any:
        """This callback's section of the privacy report (:mod:`lightning_privacy.reporting`)."""
        from lightning_privacy.callbacks._sections import stopping_section

        return stopping_section(self)

    def __init__(
        self,
        *,
        min_bayes_security: Optional[float] = None,
        max_epsilon: Optional[float] = None,
        delta: Optional[float] = None,
        threat: str = "mia",
        relation: str = "replace",
        accountant: Optional[IAccountant] = None,
        exact: bool = True,
    ) -> None:
        if (min_bayes_security is None) == (max_epsilon is None):
            raise MisconfigurationException(
                "Give exactly one budget: `min_bayes_security` or `max_epsilon`, got "
                f"min_bayes_security={min_bayes_security!r}, max_epsilon={max_epsilon!r}"
            )
        check_open_unit("min_bayes_security", min_bayes_security, exc=MisconfigurationException, optional=True)
        check_positive("max_epsilon", max_epsilon, exc=MisconfigurationException, optional=True)
        check_open_unit("delta", delta, exc=MisconfigurationException, optional=True, float_only=True)
        check_choice("threat", threat, THREATS, exc=MisconfigurationException)
        if threat == "ai" and max_epsilon is not None:
            raise MisconfigurationException("`max_epsilon` budgets the accountant's ε; use threat='mia' with it")
        check_choice("relation", relation, ("replace", "add_remove"), exc=MisconfigurationException)
        if exact is not True:
            raise MisconfigurationException(
                f"`exact={exact!r}` is no longer supported: stops are decided on the safe (exact-or-lower) β*, "
                "because the closed form can overstate security. Remove the argument."
            )
        self.min_bayes_security = None if min_bayes_security is None else float(min_bayes_security)
        self.max_epsilon = None if max_epsilon is None else float(max_epsilon)
        self.delta = delta
        self.threat = threat
        self.relation = relation
        self.accountant = accountant
        self.stopped_at_step: Optional[int] = None
        self._ledger: Optional[PrivacyLedger] = None

    @property
    @override
    def state_key(self) -> str:
        if self.max_epsilon is not None:
            return self._generate_state_key(max_epsilon=self.max_epsilon, delta=self.delta, threat=self.threat)
        return self._generate_state_key(min_bayes_security=self.min_bayes_security, threat=self.threat)

    # -------------------------------------------------------------------------------- decisions
    def ledger(self, trainer: pl.Trainer) -> PrivacyLedger:
        """The ledger the decisions are made on (DPSGD's, or one over the accountant of a user's make_private)."""
        if self._ledger is None:
            self._ledger = run_ledger(trainer, accountant=self.accountant, relation=self.relation, delta=self.delta)
        return self._ledger

    def bayes_security_after_next_step(self, trainer: pl.Trainer) -> float:
        """Safe β*_MIA, or β*_AI with the worst case R = 2C, if one more optimizer step were taken."""
        if self.threat == "ai":
            return self._ai_monitor(trainer).bayes_security_after_next_step(trainer)
        sigma, rate = next_step_mechanism(trainer, self.accountant, who="PrivacyBudgetStopping")
        return self.ledger(trainer).bayes_security_after(1, noise_multiplier=sigma, sample_rate=rate)

    def next_step_breaks_budget(self, trainer: pl.Trainer) -> bool:
        """Whether the next optimizer step would break the budget."""
        if self.threat == "ai":
            return self.bayes_security_after_next_step(trainer) < self.min_bayes_security
        sigma, rate = next_step_mechanism(trainer, self.accountant, who="PrivacyBudgetStopping")
        budget = (
            {"min_bayes_security": self.min_bayes_security}
            if self.max_epsilon is None
            else {"max_epsilon": self.max_epsilon}
        )
        return self.ledger(trainer).steps_within(noise_multiplier=sigma, sample_rate=rate, **budget) < 1

    def _ai_monitor(self, trainer: pl.Trainer) -> Any:
        from lightning_privacy.callbacks.attribute_inference_monitor import AttributeInferenceMonitor

        monitors = [cb for cb in trainer.callbacks if isinstance(cb, AttributeInferenceMonitor)]
        if not monitors:
            raise MisconfigurationException(
                "PrivacyBudgetStopping(threat='ai') needs an AttributeInferenceMonitor in Trainer(callbacks=[...])."
            )
        return monitors[0]

    def _check(self, trainer: pl.Trainer, *, first: bool = False) -> None:
        should_stop = trainer.strategy.reduce_boolean_decision(self.next_step_breaks_budget(trainer), all=False)
        if should_stop and first and self.ledger(trainer).steps == 0:
            raise MisconfigurationException(self._first_step_breaks(trainer))
        if should_stop and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped_at_step = trainer.global_step
            broken = (
                f"β*_{self.threat.upper()} below {self.min_bayes_security}"
                if self.max_epsilon is None
                else f"ε above {self.max_epsilon} at δ = {self.ledger(trainer).delta:g}"
            )
            rank_zero_info(
                f"PrivacyBudgetStopping: stopping after step {trainer.global_step}; one more step would take {broken}."
            )

    def _first_step_breaks(self, trainer: pl.Trainer) -> str:
        """The refusal of a budget that one step breaks: what a step costs, and the σ that allows one epoch."""
        sigma, rate = next_step_mechanism(trainer, self.accountant, who="PrivacyBudgetStopping")
        ledger = self.ledger(trainer)
        dpsgd = find_dpsgd(trainer)
        epoch = (dpsgd.steps_per_epoch if dpsgd is not None else None) or max(1, round(1 / rate))
        if self.max_epsilon is not None:
            budget, what = f"max_epsilon={self.max_epsilon:g}", f"ε (δ = {ledger.delta:g})"
            one = ledger.epsilon_after(1, noise_multiplier=sigma, sample_rate=rate)
            target = dict(target_epsilon=self.max_epsilon, delta=ledger.delta, accountant=ledger.mechanism)
            broken = f"{what} = {one:.4g} > {self.max_epsilon:g}"
        else:
            budget, what = f"min_bayes_security={self.min_bayes_security:g}", f"β*_{self.threat.upper()}"
            one = self.bayes_security_after_next_step(trainer)
            # β*_AI's worst case R = 2C is the replace relation's step (sensitivity 2C)
            relation = "replace" if self.threat == "ai" else self.relation
            target = dict(target_bayes_security=self.min_bayes_security, relation=relation)
            broken = f"{what} = {one:.4g} < {self.min_bayes_security:g}"
        start = (
            f"PrivacyBudgetStopping({budget}): the first optimizer step already breaks the budget (one step at "
            f"noise_multiplier={sigma:g}, sample_rate={rate:.4g} gives {broken}), so training would stop before it "
            "starts and return an untrained model."
        )
        try:
            allows = PrivacyLedger.calibrate(sample_rate=rate, steps=epoch, steps_per_read=epoch, **target)
        except ValueError:  # an ε budget below the accountant's floor: no noise allows even one step
            floor = epsilon_floor(accountant=ledger.mechanism, sample_rate=rate, steps=1, delta=ledger.delta)
            return (
                f"{start} No noise multiplier allows it: with the {ledger.mechanism!r} accountant ε at δ = "
                f"{ledger.delta:g} does not fall below {floor:.4g} whatever the noise. Give `max_epsilon` above "
                f"{floor:.4g}"
                + (" (or accountant='pld', whose floor is lower)." if ledger.mechanism not in ("pld", "prv") else ".")
            )
        return (
            f"{start} noise_multiplier={allows:g} allows one epoch ({epoch} steps) within the budget: pass "
            f"`DPSGD(noise_multiplier={allows:g})` (or more), or loosen the budget."
        )

    # -------------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.stopped_at_step = None  # a reused stopper starts over (a checkpoint's value is restored after setup)
        min_epochs = trainer.fit_loop.min_epochs or 0
        min_steps = trainer.fit_loop.epoch_loop.min_steps or 0
        if min_epochs > 0 or min_steps > 0:
            raise MisconfigurationException(
                f"Trainer(min_epochs={trainer.fit_loop.min_epochs}, min_steps={trainer.fit_loop.epoch_loop.min_steps}) "
                "makes Lightning ignore early stopping until they are reached, which could force training past "
                "the privacy budget. Remove min_epochs/min_steps when using PrivacyBudgetStopping."
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ledger = None
        self._check(trainer, first=True)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._check(trainer)

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"stopped_at_step": self.stopped_at_step}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.stopped_at_step = state_dict.get("stopped_at_step")

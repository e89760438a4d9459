"""Stop training before the step that would break a Bayes-security budget."""

from __future__ import annotations

from typing import Any, Dict, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from typing_extensions import override

from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.callbacks._opacus import accountant_history, next_step_mechanism

THREATS = ("mia", "ai")


class PrivacyBudgetStopping(Callback):
    r"""Stop training before the optimizer step that would take β* below ``min_bayes_security``.

    For membership inference (``threat="mia"``) the β* after the next step is known in advance: it
    depends only on the noise multiplier, sample rate and step count. Before every step (at the start
    of training and after each batch) this callback checks the history plus one more step and sets
    ``trainer.should_stop`` when that would fall below the minimum, so the last model trained still
    meets the budget. The closed form can overstate security (by up to ~0.01 for σ ≥ 1 and much more for
    σ < 1; Cherubin et al. 2024, Fig. 4), so by default (``exact=True``) the decision uses the exact
    PLD value: the largest admissible step count for the current (σ, p) is found once by bracketing and
    bisection and re-used until σ or p change. ``exact=False`` decides on the closed form alone
    (approximate, cheaper).

    For attribute inference (``threat="ai"``) the next step's sensitivity is not known in advance, so
    it assumes the worst case R = 2C for that step (via the
    :class:`~lightning_privacy.AttributeInferenceMonitor` in the same trainer), which keeps the stop on
    the safe side.

    The decision is reduced across processes: if any rank stops, all stop. Lightning ignores
    ``should_stop`` until ``min_epochs``/``min_steps`` are reached, so :meth:`setup` raises when those
    would force training past the budget.

    Args:
        min_bayes_security: the budget, β* in (0, 1).
        threat: ``"mia"`` or ``"ai"``.
        relation: ``"replace"`` or ``"add_remove"`` (MIA only).
        exact: decide MIA stops on the exact PLD value (safe) instead of the closed form (approximate).
        accountant: an Opacus accountant to read instead of finding it through the trainer.

    Example::

        >>> from lightning_privacy import PrivacyBudgetStopping
        >>> PrivacyBudgetStopping(min_bayes_security=0.9).min_bayes_security
        0.9
        >>> PrivacyBudgetStopping(min_bayes_security=1.5)
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `min_bayes_security` must be in (0, 1), got 1.5
    """

    def __init__(
        self,
        *,
        min_bayes_security: float,
        threat: str = "mia",
        relation: str = "replace",
        exact: bool = True,
        accountant: Optional[IAccountant] = None,
    ) -> None:
        if (
            isinstance(min_bayes_security, bool)
            or not isinstance(min_bayes_security, (int, float))
            or not (0 < min_bayes_security < 1)
        ):
            raise MisconfigurationException(f"`min_bayes_security` must be in (0, 1), got {min_bayes_security!r}")
        if threat not in THREATS:
            raise MisconfigurationException(f"`threat` must be one of {THREATS}, got {threat!r}")
        if relation not in ("replace", "add_remove"):
            raise MisconfigurationException(f"`relation` must be 'replace' or 'add_remove', got {relation!r}")
        self.min_bayes_security = float(min_bayes_security)
        self.threat = threat
        self.relation = relation
        self.accountant = accountant
        self.stopped_at_step: Optional[int] = None
        self.exact = exact
        self._cache: Dict[Any, int] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(min_bayes_security=self.min_bayes_security, threat=self.threat)

    # -------------------------------------------------------------------------------- decisions
    def bayes_security_after_next_step(self, trainer: pl.Trainer) -> float:
        """β*_MIA (closed form) or β*_AI (worst case R = 2C) if one more optimizer step were taken."""
        if self.threat == "ai":
            return self._ai_monitor(trainer).bayes_security_after_next_step(trainer)
        history = accountant_history(trainer, self.accountant)
        sigma, rate = next_step_mechanism(trainer, self.accountant, who="PrivacyBudgetStopping")
        return bs.mia_bayes_security(**bs.history_segments(history + [(sigma, rate, 1)]), relation=self.relation)

    def next_step_breaks_budget(self, trainer: pl.Trainer) -> bool:
        """Whether the next optimizer step would take β* below ``min_bayes_security``."""
        if self.threat == "ai" or not self.exact:
            return self.bayes_security_after_next_step(trainer) < self.min_bayes_security
        history = accountant_history(trainer, self.accountant)
        sigma, rate = next_step_mechanism(trainer, self.accountant, who="PrivacyBudgetStopping")
        if history and history[-1][:2] == (sigma, rate):
            prefix, done = history[:-1], history[-1][2]
        else:
            prefix, done = history, 0
        return done + 1 > self._max_steps(prefix, sigma, rate)

    def _max_steps(self, prefix: list, sigma: float, rate: float) -> int:
        """A step count k with exact β*(prefix + k steps at (σ, p)) ≥ the budget, within 0.2% of the
        largest such k and never above it (so stopping errs early); memoised per segment."""
        key = (tuple(prefix), sigma, rate)
        if key in self._cache:
            return self._cache[key]

        def beta(k: int, exact: bool) -> float:
            segments = bs.history_segments(list(prefix) + [(sigma, rate, k)])
            fn = bs.mia_bayes_security_exact if exact else bs.mia_bayes_security
            return fn(**segments, relation=self.relation)

        def largest(ok, lo: int, hi: int, tolerance: float) -> int:  # ok(lo) holds, ok(hi) fails
            while hi - lo > max(1, tolerance * lo):
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
            return lo

        def ok_exact(k: int) -> bool:
            return beta(k, True) >= self.min_bayes_security

        def ok_closed(k: int) -> bool:
            return beta(k, False) >= self.min_bayes_security

        if not ok_exact(1):
            result = 0
        else:
            hi = 2
            while ok_closed(hi):
                hi *= 2
            guess = max(1, largest(ok_closed, hi // 2, hi, 0.0))  # closed-form answer: cheap, exact to 1 step
            lo, hi = (guess, guess * 2) if ok_exact(guess) else (1, guess)
            while ok_exact(hi):
                lo, hi = hi, hi * 2
            if lo == 1 and hi == guess:  # tighten the bracket from above before bisecting
                probe = int(guess * 0.95)
                while probe > 1 and not ok_exact(probe):
                    hi, probe = probe, int(probe * 0.95)
                lo = max(1, probe)
            result = largest(ok_exact, lo, hi, 0.002)
        self._cache = {key: result}
        return result

    def _ai_monitor(self, trainer: pl.Trainer) -> Any:
        from lightning_privacy.callbacks.attribute_inference_monitor import AttributeInferenceMonitor

        monitors = [cb for cb in trainer.callbacks if isinstance(cb, AttributeInferenceMonitor)]
        if not monitors:
            raise MisconfigurationException(
                "PrivacyBudgetStopping(threat='ai') needs an AttributeInferenceMonitor in Trainer(callbacks=[...])."
            )
        return monitors[0]

    def _check(self, trainer: pl.Trainer) -> None:
        should_stop = trainer.strategy.reduce_boolean_decision(self.next_step_breaks_budget(trainer), all=False)
        if should_stop and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped_at_step = trainer.global_step
            rank_zero_info(
                f"PrivacyBudgetStopping: stopping after step {trainer.global_step}; one more step would take "
                f"β*_{self.threat.upper()} below {self.min_bayes_security}."
            )

    # -------------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
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
        self._check(trainer)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._check(trainer)

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"stopped_at_step": self.stopped_at_step}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.stopped_at_step = state_dict.get("stopped_at_step")

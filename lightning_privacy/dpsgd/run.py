"""Reading a DP-SGD run inside a Trainer: the DP optimizers, DPSGD itself, the accountant and its history.

Our :class:`~lightning_privacy.DPSGD` owns its accountant. A user's own ``PrivacyEngine.make_private``
leaves the accountant reachable only through the step hook it attaches to the ``DPOptimizer``
(``accountant.get_optimizer_hook_fn(sample_rate)`` — a closure over the accountant and the sample
rate); :func:`find_accountant` reads it from there (:func:`lightning_privacy._compat.accountant_from_step_hook`), and callers can
always pass the accountant explicitly instead.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from opacus.optimizers import DPOptimizer

from lightning_privacy import _compat

Segment = Tuple[float, float, int]  # (noise_multiplier, sample_rate, steps), Opacus' history order


def dp_optimizers(trainer: pl.Trainer) -> List[DPOptimizer]:
    """The Opacus ``DPOptimizer`` instances among the trainer's optimizers."""
    return [opt for opt in trainer.optimizers if isinstance(opt, DPOptimizer)]


class DPSGDRun:
    """The base of :class:`~lightning_privacy.DPSGD`: how the engine and the privacy callbacks recognise the run's
    DP-SGD among the Trainer's callbacks, without importing the callbacks layer.

    A subclass has ``ledger`` (:class:`~lightning_privacy.ledger.PrivacyLedger`), ``accountant``, ``delta``,
    ``noise_multiplier`` and ``sample_rate`` (``None`` until the fit starts).
    """

    ledger: Any
    delta: float

    @property
    def steps(self) -> int:
        """Optimizer steps recorded (including those before a resume)."""
        return self.ledger.steps

    @property
    def accountant(self) -> Any:
        """The Opacus accountant of this run (inside :attr:`ledger`)."""
        return self.ledger.accountant

    def record_epsilon(self, delta: Optional[float] = None) -> float:
        """The same run's ε at ``delta`` for one *row* (add/remove), whatever its privacy unit — beside a person's ε,
        what the unit changes. A row run: :meth:`epsilon` itself. A person's rows sampled one by one (ELS): the
        history's PLD for one row (group size 1: smaller than the person's). People sampled whole (ULS): removing one
        row of a sampled person moves their clipped gradient by up to 2C, so the history's PLD at sensitivity 2 — a
        row can be *less* protected than its person. A certified upper bound (the pessimistic PLD), 0 before a step.
        """
        from lightning_privacy.dpsgd.users import row_epsilon

        delta = self.delta if delta is None else delta
        if getattr(self, "privacy_unit", "example") == "example":
            return self.ledger.epsilon(delta)
        return row_epsilon(self.ledger.history, user_sampling=self.user_sampling, delta=delta)  # type: ignore[attr-defined]


def find_dpsgd(trainer: pl.Trainer) -> Optional[Any]:
    """Our DPSGD callback, if the trainer has one."""
    found = [cb for cb in trainer.callbacks if isinstance(cb, DPSGDRun)]
    return found[0] if found else None


def run_ledger(
    trainer: pl.Trainer,
    *,
    accountant: Optional[IAccountant] = None,
    relation: str = "replace",
    delta: Optional[float] = None,
) -> Any:
    """The run's :class:`~lightning_privacy.ledger.PrivacyLedger` for a reader (the monitor, the budget stopper).

    DPSGD's own ledger when it records this accountant with this relation and δ (``None``: DPSGD's); otherwise —
    a user's own ``make_private``, another relation or δ — a new ledger over the same accountant.
    """
    from lightning_privacy.ledger import PrivacyLedger

    dpsgd = find_dpsgd(trainer)
    found = find_accountant(trainer, accountant)
    groups = dpsgd.ledger.group_size if dpsgd is not None and dpsgd.accountant is found else 1
    if groups > 1 and relation != "add_remove":
        raise MisconfigurationException(
            f"relation={relation!r} cannot be read from this run: it protects people whose {groups} rows are each "
            "sampled on their own (DPSGD(privacy_unit='user', user_sampling=False)), accounted for adding or removing "
            "a person's rows; pass relation='add_remove'."
        )
    if (
        dpsgd is not None
        and dpsgd.accountant is found
        and dpsgd.ledger.relation == relation
        and delta in (None, dpsgd.ledger.delta)
    ):
        return dpsgd.ledger
    delta = delta or (dpsgd.delta if dpsgd is not None else 1e-5)
    unit = getattr(dpsgd.ledger, "unit", "example") if dpsgd is not None and dpsgd.accountant is found else "example"
    return PrivacyLedger(accountant=found, delta=delta, relation=relation, group_size=groups, unit=unit)


def find_accountant(trainer: pl.Trainer, accountant: Optional[IAccountant] = None) -> IAccountant:
    """The accountant that records the DP-SGD steps of this training run.

    Order: an explicitly given accountant, then our DPSGD callback's, then the accountant behind the
    step hook of the (single) ``DPOptimizer`` that a user's ``make_private`` created.

    Raises:
        MisconfigurationException: when training is not private or no accountant can be found.
    """
    if accountant is not None:
        return accountant
    dpsgd = find_dpsgd(trainer)
    if dpsgd is not None and dpsgd.accountant is not None:
        return dpsgd.accountant
    optimizers = dp_optimizers(trainer)
    if not optimizers:
        raise MisconfigurationException(
            "No Opacus DPOptimizer found among the trainer's optimizers: training is not private. Add "
            "`lightning_privacy.DPSGD(...)` to `Trainer(callbacks=[...])`, or make the module private "
            "with Opacus' `PrivacyEngine.make_private` and pass `accountant=privacy_engine.accountant`."
        )
    found = _compat.accountant_from_step_hook(optimizers[0])
    if found is not None:
        return found
    raise MisconfigurationException(
        "Found a DPOptimizer but not its accountant; pass `accountant=privacy_engine.accountant` to the monitor."
    )


def accountant_history(trainer: pl.Trainer, accountant: Optional[IAccountant] = None) -> List[Segment]:
    """The run-length history ``[(noise_multiplier, sample_rate, steps), ...]`` of this run."""
    return [(float(s), float(p), int(t)) for s, p, t in find_accountant(trainer, accountant).history]


def next_step_mechanism(
    trainer: pl.Trainer, accountant: Optional[IAccountant] = None, *, who: str
) -> Tuple[float, float]:
    """``(noise_multiplier, sample_rate)`` the next optimizer step will use.

    Known in advance from our DPSGD; for a user's ``make_private`` run, the last accountant segment.

    Raises:
        MisconfigurationException: before the first step of a run without DPSGD (naming ``who``).
    """
    dpsgd = find_dpsgd(trainer)
    if dpsgd is not None and dpsgd.noise_multiplier is not None and dpsgd.sample_rate is not None:
        return float(dpsgd.noise_multiplier), float(dpsgd.sample_rate)
    history = accountant_history(trainer, accountant)
    if history:
        return history[-1][0], history[-1][1]
    raise MisconfigurationException(
        f"{who} cannot tell the noise multiplier and sample rate before the first step of a user's make_private "
        "run; use lightning_privacy.DPSGD."
    )


def history_steps(history: List[Segment]) -> int:
    """Total optimizer steps recorded in an accountant history."""
    return sum(int(t) for _, _, t in history)

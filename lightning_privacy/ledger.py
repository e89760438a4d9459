"""``PrivacyLedger``: the one record of a private training run's privacy state.

Owned by :class:`~lightning_privacy.DPSGD` (``dpsgd.ledger``) and saved in its ``state_dict``; every reader — the
Bayes-security monitor, the attribute monitor, the budget stopper, the report, ``lightning-privacy plan`` — asks the
ledger instead of re-reading Opacus' accountant.

It holds
- the DP-SGD history: an accountant that records every optimizer step; its ε at δ is the run's ε. The default,
  ``"pld"`` (:class:`PLDAccountant`), is the package's own pessimistic privacy-loss distribution for add/remove — the
  distribution :class:`~lightning_privacy.claims.Claim`, β* and the TPR bounds come from — so ε is a certified upper
  bound and one accountant speaks for the whole run. Measured over 30 runs (q 0.004–0.05, 500–5,000 steps, ε
  0.5–8; ``benchmarks/results/accountant_accuracy.md``): at most +6.1e-6 (δ = 1e-5) and +5.8e-3 (δ = 1e-8) above
  dp_accounting's pessimistic PLD on the same grid and never below it; at most +2.2e-3 and +5.8e-3 above it at its
  default grid 1e-4 (the ledger's grid is p/σ/10 within [1e-5, 1e-3]; at δ = 1e-8 the round-off allowances added to
  δ dominate). Opacus' ``"rdp"`` (0.2.0's default: looser, 4.56 where the PLD certifies 4.18 for σ = 2, q = 0.1, 300
  steps), ``"prv"`` and ``"gdp"`` (an approximation, not a bound) stay available by name;
- the safe Bayes security against membership inference: 1 − δ(ε = 0) of the composed mechanism (Cherubin et al.
  2024, Prop. 8) from a pessimistic privacy-loss distribution (PLD);
- the paper's closed form beside it (Cor. 7; an approximation that can overstate security);
- predictions for the budget stopper (how many more steps keep β* or ε within a budget) and the one calibration
  routine (σ for a β* or ε target) that the planner, ``DPSGD(target_…)`` and the stopper share.

Both PLDs are composed one chunk per run of steps at one (σ, p), in order: the runs that ended are composed once onto
a stored PLD, the current one onto a copy when a value is read (its self-composition is a function of its length
alone). So ε, β* and the TPR bounds after T steps do not depend on when or how often they were read, nor on a resume
from a checkpoint: the same number to the last digit (``tests/test_accountant.py``). A resumed ledger recomposes
them from its history; the saved chunks (the runs) are checked against it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from opacus.accountants import IAccountant, RDPAccountant, create_accountant

from lightning_privacy.analysis import bayes_security as bs

__all__ = ["ACCOUNTANTS", "DEFAULT_ACCOUNTANT", "PLDAccountant", "PrivacyLedger", "Segment", "accountant_label"]

ACCOUNTANTS = ("pld", "rdp", "prv", "gdp")
DEFAULT_ACCOUNTANT = "pld"
_LABELS = {
    "pld": "PLD (add/remove), certified upper bound",
    "rdp": "Opacus RDP (add/remove), upper bound",
    "prv": "Opacus PRV (add/remove), upper estimate",
    "gdp": "Opacus GDP (add/remove), CLT approximation, not a bound",
}
STATE_VERSION = 1
Segment = Tuple[float, float, int]  # (noise_multiplier, sample_rate, steps), Opacus' history order
_SIGMA_DECIMALS = 4  # calibrated σ are rounded up to this many decimals (towards more noise)


def accountant_label(mechanism: str) -> str:
    """How ε of an accountant reads, said once where a person reads ε.

    Example::

        >>> accountant_label("pld")
        'PLD (add/remove), certified upper bound'
    """
    return _LABELS.get(mechanism, f"{mechanism} accountant (add/remove)")


def _runs(history: Sequence[Segment]) -> List[Segment]:
    """``history`` as runs: adjacent segments of one (σ, p) merged, empty ones dropped (a function of the steps)."""
    out: List[Segment] = []
    for sigma, rate, count in history:
        if int(count) <= 0:
            continue
        if out and out[-1][:2] == (float(sigma), float(rate)):
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + int(count))
        else:
            out.append((float(sigma), float(rate), int(count)))
    return out


def _extends(before: Sequence[Segment], after: Sequence[Segment]) -> bool:
    """Whether the runs ``after`` are the runs ``before`` with steps added at the end (never fewer or others)."""
    if not before:
        return True
    if len(after) < len(before) or list(after[: len(before) - 1]) != list(before[:-1]):
        return False
    last, same = before[-1], after[len(before) - 1]
    return same[:2] == last[:2] and same[2] >= last[2]


def _check_chunks(chunks: Sequence[Sequence[float]], history: Sequence[Segment], key: str) -> None:
    """A saved ledger's chunks (``[p, σ, steps(, sensitivity)]``) must be steps of its history, in its order."""
    try:
        saved = _runs([(float(c[1]), float(c[0]), int(c[2])) for c in chunks])
    except (TypeError, ValueError, IndexError) as err:
        raise RuntimeError(f"Privacy ledger state's {key!r} is not a list of [p, σ, steps]: {chunks!r}") from err
    if not _extends(saved, _runs(history)):
        raise RuntimeError(
            f"Privacy ledger state's {key!r} ({saved}) are not the steps of its history ({_runs(history)}): "
            "refusing to restart accounting"
        )


class _RunPLD:
    """The pessimistic PLD of a history, composed one chunk per run (a stretch of steps at one (σ, p)), in order.

    The runs before the last are composed once onto a stored PLD; the last, still growing, is composed onto a copy
    of it when a value is read (its k-fold self-composition is a function of k alone: cached squares, one product
    per set bit of k). So the value depends on the history only — not on when or how often it was read, nor on a
    resume — and a read costs a few convolutions of the run's size.
    """

    def __init__(self, relation: str, group_size: int = 1) -> None:
        self.relation = relation
        self.group_size = group_size  # k > 1: a group of k rows each sampled on its own (ComposedPLD's group_size)
        self._closed: Any = None  # ComposedPLD of every run before the last, one chunk per run
        self._seen: List[Segment] = []  # the runs of the last history read (privacy state never goes back)
        self._value: Optional[Tuple[Tuple[int, Segment], Any]] = None  # (key, ComposedPLD of every run)

    def _empty(self) -> Any:
        from lightning_privacy.analysis.composition import ComposedPLD

        return ComposedPLD(relation=self.relation, group_size=self.group_size)

    def _runs_of(self, history: Sequence[Segment]) -> List[Segment]:
        runs = _runs(history)
        if not _extends(self._seen, runs):
            seen, now = sum(t for *_, t in self._seen), sum(t for *_, t in runs)
            raise RuntimeError(
                f"The accountant's history ({now} steps: {runs}) does not continue the one composed before ({seen} "
                f"steps: {self._seen}): the history was rewritten; privacy state must never go back."
            )
        self._seen = runs
        if self._closed is None:
            self._closed = self._empty()
        for sigma, rate, count in runs[len(self._closed.chunks) : -1]:  # runs that ended since the last read
            self._closed.compose(sample_rate=rate, noise_multiplier=sigma, steps=count)
        return runs

    def pld(self, history: Sequence[Segment]) -> Any:
        """The composed PLD of ``history`` (read-only; an empty one before the first step)."""
        runs = self._runs_of(history)
        if not runs:
            return self._empty()
        key = (len(runs), runs[-1])
        if self._value is None or self._value[0] != key:
            sigma, rate, count = runs[-1]
            self._value = (key, self._closed.after(sample_rate=rate, noise_multiplier=sigma, steps=count))
        return self._value[1]

    def pld_after(self, history: Sequence[Segment], steps: int, *, noise_multiplier: float, sample_rate: float) -> Any:
        """The composed PLD of ``history`` with ``steps`` more steps at (σ, p): the value a read will report then."""
        runs = self._runs_of(history)
        sigma, rate = float(noise_multiplier), float(sample_rate)
        if steps <= 0:
            return self.pld(history)
        if runs and runs[-1][:2] == (sigma, rate):  # the last run grows
            return self._closed.after(sample_rate=rate, noise_multiplier=sigma, steps=runs[-1][2] + steps)
        return self.pld(history).after(sample_rate=rate, noise_multiplier=sigma, steps=steps)  # the last run ends

    def bayes_security_after(
        self, history: Sequence[Segment], steps: int, *, noise_multiplier: float, sample_rate: float
    ) -> float:
        """β* of :meth:`pld_after` without its last convolution (never above the value a read will report)."""
        runs = self._runs_of(history)
        sigma, rate = float(noise_multiplier), float(sample_rate)
        if steps <= 0:
            return self.pld(history).bayes_security()
        if runs and runs[-1][:2] == (sigma, rate):
            return self._closed.bayes_security_after(
                sample_rate=rate, noise_multiplier=sigma, steps=runs[-1][2] + steps
            )
        return self.pld(history).bayes_security_after(sample_rate=rate, noise_multiplier=sigma, steps=steps)


class PLDAccountant(IAccountant):
    """Opacus' accountant interface over the package's pessimistic privacy-loss distribution, for add/remove.

    Records steps as Opacus' accountants do (run-length ``history``, the DP optimizer's step hook works unchanged);
    :meth:`get_epsilon` returns the ε at δ of the
    :class:`~lightning_privacy.analysis.composition.ComposedPLD` of the history, an upper bound on the mechanism's
    true ε (discretised by connect-the-dots, truncated and rounded on the safe side; finite beyond ε = 50 by
    :meth:`~lightning_privacy.analysis.composition.ComposedPLD.epsilon_uncapped`). The PLD is composed one chunk per
    run of steps at one (σ, p), whatever the reads: ε after T steps is the same number whether it was read every
    step, every epoch, once at the end or across a resume (tested to the last digit).

    Example::

        >>> accountant = PLDAccountant()
        >>> for _ in range(300):
        ...     accountant.step(noise_multiplier=2.0, sample_rate=0.1)
        >>> round(accountant.get_epsilon(1e-5), 3)  # dp_accounting's pessimistic PLD: 4.183; Opacus' RDP: 4.564
        4.183
    """

    def __init__(self, group_size: int = 1) -> None:
        super().__init__()
        self.group_size = group_size  # k > 1: ε of adding or removing k rows each sampled on its own
        self._runs = _RunPLD("add_remove", group_size)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, rate, count = self.history[-1]
            self.history[-1] = (sigma, rate, count + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def __len__(self) -> int:
        return len(self.history)

    @classmethod
    def mechanism(cls) -> str:
        return "pld"

    def composed_pld(self) -> Any:
        """The add/remove PLD of every recorded step (read-only; one chunk per run of steps at one (σ, p))."""
        return self._runs.pld(self.history)

    def composed_pld_after(self, steps: int, *, noise_multiplier: float, sample_rate: float) -> Any:
        """The add/remove PLD after ``steps`` more steps at (σ, p): the one :meth:`composed_pld` will return then."""
        return self._runs.pld_after(self.history, steps, noise_multiplier=noise_multiplier, sample_rate=sample_rate)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """ε at ``delta`` of the steps recorded, a certified upper bound (0 before the first step)."""
        if not any(t > 0 for _, _, t in self.history):
            return 0.0
        return float(self.composed_pld().epsilon_uncapped(delta))

    def load_chunks(self, chunks: Sequence[Sequence[float]]) -> None:
        """Check saved chunks against the restored ``history`` (they are its steps, in order; else RuntimeError).

        ε is recomposed from the history (one chunk per run), so a state saved with one chunk per read — before
        the composition stopped depending on the reads — gives the ε an uninterrupted run gives now.
        """
        _check_chunks(chunks, self.history, "epsilon_chunks")
        self._runs = _RunPLD("add_remove", self.group_size)


def _make_accountant(mechanism: str, group_size: int = 1) -> IAccountant:
    return PLDAccountant(group_size) if mechanism == "pld" else create_accountant(mechanism=mechanism)


def _epsilon_of(mechanism: str, history: Sequence[Segment], delta: float) -> float:
    """ε at δ of ``history`` under a fresh accountant of ``mechanism`` (the run's own is not touched)."""
    if not any(t > 0 for _, _, t in history):
        return 0.0
    accountant = _make_accountant(mechanism)
    accountant.history = [(float(s), float(p), int(t)) for s, p, t in history if t > 0]
    return float(accountant.get_epsilon(delta=delta))


def epsilon_floor(*, accountant: str, sample_rate: float, steps: int, delta: float) -> float:
    """The accountant's ε at ``delta`` for ``steps`` steps at noise_multiplier 1e6: below it no σ can take ε.

    RDP converts to (ε, δ) over a finite set of orders, so its ε never falls below about log(1/δ)/(max order − 1)
    (0.10 at δ = 1e-5); PRV's floor is its discretisation (about 0.01). NaN where the accountant cannot evaluate it.
    """
    try:
        return float(_epsilon_of(accountant, [(1e6, sample_rate, steps)], delta))
    except (ValueError, ArithmeticError):
        return float("nan")


def _unreachable(
    target_bayes_security: Optional[float],
    target_epsilon: Optional[float],
    delta: float,
    accountant: str,
    sample_rate: float,
    steps: int,
) -> str:
    """Why no σ ≤ 1e6 meets a target: the accountant's ε floor (what ε never falls below, whatever the noise)."""
    run = f"{steps} step(s) at sample_rate={sample_rate:.4g}"
    if target_epsilon is None:
        return f"No noise_multiplier below 1e6 gives target_bayes_security={target_bayes_security:g} for {run}."
    floor = f"{epsilon_floor(accountant=accountant, sample_rate=sample_rate, steps=steps, delta=delta):.4g}"
    other = " (or accountant='pld', whose floor is lower)" if accountant not in ("pld", "prv") else ""
    return (
        f"No noise_multiplier meets target_epsilon={target_epsilon:g} at delta={delta:g} for {run}: with the "
        f"{accountant!r} accountant ε does not fall below {floor} whatever the noise (its value at noise_multiplier"
        f"=1e6). Give an ε budget above {floor}{other}."
    )


def _identity(fpr: Any) -> Union[float, np.ndarray]:
    """The TPR bound before any step: no attack beats guessing."""
    return np.asarray(fpr, dtype=float) if np.ndim(fpr) else float(fpr)


class PrivacyLedger:
    """The privacy state of one DP-SGD run: history, ε, safe β*, closed form, predictions, calibration.

    Args:
        accountant: ``"pld"`` (default: the package's pessimistic PLD, add/remove, a certified upper bound),
            Opacus' ``"rdp"``, ``"prv"`` or ``"gdp"``, or an existing Opacus accountant to wrap (a user's own
            ``make_private`` run; its history is read, never rewritten).
        delta: δ of the run's ε.
        relation: neighbouring relation of the Bayes-security values, ``"replace"`` or ``"add_remove"``.
        group_size: k ≥ 1; k > 1: every value is for adding or removing a group of k rows each Poisson-sampled on its
            own (a person's at most k rows under example-level sampling, ``DPSGD(privacy_unit="user",
            user_sampling=False)``): :class:`~lightning_privacy.analysis.composition.ComposedPLD`'s ``group_size``,
            the ``"pld"`` accountant and ``relation="add_remove"`` only.
        unit: whose privacy the values are: ``"example"`` (a row) or ``"person"`` (``DPSGD(privacy_unit="user")``);
            saved, and a resumed ledger of another unit is refused.

    Example:
        >>> ledger = PrivacyLedger(delta=1e-5)
        >>> for _ in range(200):
        ...     ledger.step(noise_multiplier=1.0, sample_rate=0.05)
        >>> ledger.steps
        200
        >>> round(ledger.bayes_security_closed_form(), 4), round(ledger.bayes_security(), 4)
        (0.4795, 0.4695)
        >>> ledger.bayes_security() <= ledger.bayes_security_closed_form()  # the closed form overstates here (dp_accounting: 0.4695)
        True
    """

    def __init__(
        self,
        *,
        accountant: Union[str, IAccountant] = DEFAULT_ACCOUNTANT,
        delta: float = 1e-5,
        relation: str = "replace",
        group_size: int = 1,
        unit: str = "example",
    ) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"Expected argument `group_size` to be an int >= 1, but got {group_size!r}.")
        if unit not in ("example", "person"):
            raise ValueError(f"Expected argument `unit` to be 'example' or 'person', but got {unit!r}.")
        self.unit = unit
        mechanism = accountant if isinstance(accountant, str) else accountant.mechanism()
        if group_size > 1 and (mechanism != "pld" or relation != "add_remove"):
            raise ValueError(
                f"A ledger of groups (group_size={group_size}) needs accountant='pld' and relation='add_remove' (the "
                f"group PLD), got accountant={accountant!r}, relation={relation!r}."
            )
        self.group_size = group_size
        if isinstance(accountant, IAccountant):
            self.accountant = accountant
            self.mechanism = accountant.mechanism()
        elif accountant in ACCOUNTANTS:
            self.accountant = _make_accountant(accountant, group_size)
            self.mechanism = accountant
        else:
            raise ValueError(
                f"Expected argument `accountant` to be one of {ACCOUNTANTS} or an Opacus accountant, but got {accountant!r}."
            )
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ValueError(f"Expected argument `delta` to be in (0, 1), but got {delta!r}.")
        self.delta = float(delta)
        self.relation = bs._check_relation(relation)
        self._rdp_cache: Dict[Tuple[float, float], np.ndarray] = {}  # (σ, p) -> RDP curve of one step
        self._beta = _RunPLD(self.relation, group_size)  # the PLD of β* (and of the relation's TPR bounds)
        self._other: Dict[str, _RunPLD] = {}  # relation -> the PLD of the same history for the other relation
        self._allowed: Dict[Any, Tuple[int, int]] = {}  # memoised step budgets (see steps_within)

    @property
    def _pld(self) -> Any:
        """The stored PLD of β*: every recorded step, one chunk per run (see :class:`_RunPLD`)."""
        return self._beta.pld(self.history)

    # ----------------------------------------------------------------------------------------------------- recording
    def step(self, *, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` optimizer steps at (σ, p) (DPSGD's optimizer hook records one at a time)."""
        if steps == 1:
            self.accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
            return
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"Expected argument `steps` to be a whole number >= 0, but got {steps!r}.")
        history = self.accountant.history
        if history and history[-1][:2] == (noise_multiplier, sample_rate):
            history[-1] = (noise_multiplier, sample_rate, history[-1][2] + steps)
        elif steps:
            history.append((noise_multiplier, sample_rate, steps))

    @property
    def history(self) -> List[Segment]:
        """``[(noise_multiplier, sample_rate, steps), ...]`` run-length segments, as Opacus keeps them."""
        return [(float(s), float(p), int(t)) for s, p, t in self.accountant.history]

    @property
    def steps(self) -> int:
        """Optimizer steps recorded (including those before a resume)."""
        return sum(t for _, _, t in self.history)

    def segments(self) -> Dict[str, np.ndarray]:
        """The history as keyword arguments of :mod:`lightning_privacy.analysis.bayes_security`."""
        return bs.history_segments(self.history)

    # -------------------------------------------------------------------------------------------------------- values
    def epsilon(self, delta: Optional[float] = None) -> float:
        """The run's ε at ``delta`` (default: the ledger's δ), add/remove, by the ledger's accountant
        (:attr:`epsilon_label` says which and whether it is a bound); 0 before the first step.

        The default PLD accountant composes one chunk per run of steps at one (σ, p), so ε does not depend on when
        or how often it is read (:class:`PLDAccountant`). For Opacus' RDP accountant the per-step RDP curve of each
        (σ, p) is computed once and scaled by the step count — the same arithmetic as ``RDPAccountant.get_epsilon``
        (which recomputes it on every call, ~20 ms), so the value is identical (tested) and a per-epoch read costs
        microseconds.
        """
        if not self.history:
            return 0.0
        delta = self.delta if delta is None else delta
        if type(self.accountant) is RDPAccountant:
            return self._rdp_epsilon(self.accountant.history, delta)
        return float(self.accountant.get_epsilon(delta=delta))

    @property
    def epsilon_label(self) -> str:
        """How this ledger's ε reads: its accountant, the relation (add/remove) and whether it is a bound."""
        return accountant_label(self.mechanism)

    def _rdp_epsilon(self, history: Sequence[Segment], delta: float) -> float:
        """Opacus' RDP ε of ``history`` at ``delta`` from the cached per-step curves (0 without steps)."""
        from opacus.accountants.analysis import rdp as rdp_analysis

        history = [(s, p, t) for s, p, t in history if t > 0]  # a zero-step segment adds nothing (inf·0 would)
        if not history:
            return 0.0
        orders = RDPAccountant.DEFAULT_ALPHAS
        curves = []
        for sigma, rate, steps in history:
            per_step = self._rdp_cache.get((sigma, rate))
            if per_step is None:
                per_step = rdp_analysis.compute_rdp(q=rate, noise_multiplier=sigma, steps=1, orders=orders)
                self._rdp_cache[(sigma, rate)] = per_step
            curves.append(per_step * steps)
        eps, _ = rdp_analysis.get_privacy_spent(orders=orders, rdp=sum(curves), delta=delta)
        return float(eps)

    def bayes_security(self) -> float:
        """Safe β*_MIA: a certified lower bound on the true Bayes security (pessimistic PLD, 1 − δ(0))."""
        if self.steps == 0:
            self._beta.pld(self.history)  # a history rewritten to nothing still fails closed
            return 1.0
        return self._pld.bayes_security()

    def bayes_security_closed_form(self) -> float:
        """The paper's closed form (Cherubin et al. 2024, Cor. 7) — an approximation that may overstate; NaN for a
        ledger of groups (``group_size`` > 1), for which the paper has none."""
        if not self.history:
            return 1.0
        if self.group_size > 1:
            return float("nan")
        return bs.mia_bayes_security(**self.segments(), relation=self.relation)

    def tpr_bounds(
        self, fpr: Union[float, Sequence[float]], *, relation: Optional[str] = None
    ) -> Union[float, np.ndarray]:
        """Tightest valid TPR bound of any membership attack at ``fpr`` (the composed mechanism's trade-off curve).

        Args:
            fpr: false-positive rate(s) in [0, 1].
            relation: the game the bound is for: ``"replace"`` (Cherubin et al.'s Game 2, the relation of the
                Bayes-security values by default) or ``"add_remove"`` (the in/out game of RMIA, LiRA, LOSS and
                canary audits: the model trained with or without the example; Opacus' ε is for this relation).
                ``None``: the ledger's own ``relation``. Either curve comes from a pessimistic PLD of the same
                history; for add/remove it is the trade-off of the ordered pair (with, without the example) from
                both orders' privacy profiles, as dp_accounting's add/remove PLD gives it.

        Returns:
            The bound(s), a float or an array of the shape of ``fpr``.

        Example:
            >>> ledger = PrivacyLedger()
            >>> ledger.step(noise_multiplier=1.0, sample_rate=0.2, steps=150)
            >>> round(float(ledger.tpr_bounds(1e-3)), 3), round(float(ledger.tpr_bounds(1e-3, relation="add_remove")), 3)
            (0.937, 0.397)
        """
        return self.privacy_loss_distribution(relation).tpr_bound(fpr) if self._has_steps() else _identity(fpr)

    def _has_steps(self) -> bool:
        if self.steps == 0:
            self._beta.pld(self.history)  # a history rewritten to nothing still fails closed
        return self.steps > 0

    def privacy_loss_distribution(self, relation: Optional[str] = None) -> Any:
        """The pessimistic :class:`~lightning_privacy.analysis.composition.ComposedPLD` of the recorded history.

        ``relation=None`` (or the ledger's own) is the stored PLD whose chunks the checkpoint saves; the other
        relation's is composed from the same history on first use and kept up to date (not saved: it is derived
        from the history). Treat the returned object as read-only.

        Example:
            >>> ledger = PrivacyLedger()
            >>> ledger.step(noise_multiplier=1.0, sample_rate=0.01, steps=100)
            >>> ledger.privacy_loss_distribution("add_remove").relation, ledger.privacy_loss_distribution().steps
            ('add_remove', 100)
        """
        relation = self.relation if relation is None else bs._check_relation(relation)
        return self._runs_for(relation).pld(self.history)

    # --------------------------------------------------------------------------------------------------- predictions
    def _runs_for(self, relation: str) -> Any:
        """The :class:`_RunPLD` of ``relation``: β*'s, the accountant's (add/remove under PLD) or a derived one."""
        if relation == self.relation:
            return self._beta
        if relation == "add_remove" and isinstance(self.accountant, PLDAccountant):
            return self.accountant._runs  # the PLD ε comes from: one composition for both
        if self.group_size > 1:
            raise ValueError(f"This ledger accounts groups of {self.group_size} rows, for relation='add_remove' only.")
        if relation not in self._other:
            self._other[relation] = _RunPLD(relation)
        return self._other[relation]

    def bayes_security_after(self, steps: int, *, noise_multiplier: float, sample_rate: float) -> float:
        """Safe β*_MIA if ``steps`` more optimizer steps at (σ, p) were taken (the ledger is not changed).

        The value does not depend on when it is read, so the prediction is the value a read will report after those
        steps (less the allowances of the convolution it skips, ≲ 1e-12: never above it).
        """
        if steps < 0:
            raise ValueError(f"Expected argument `steps` to be >= 0, but got {steps!r}.")
        return self._beta.bayes_security_after(
            self.history, int(steps), noise_multiplier=noise_multiplier, sample_rate=sample_rate
        )

    def epsilon_after(self, steps: int, *, noise_multiplier: float, sample_rate: float) -> float:
        """The accountant's ε at the ledger's δ if ``steps`` more steps at (σ, p) were taken (the value a read will
        report then, for the PLD accountant)."""
        if isinstance(self.accountant, PLDAccountant):
            pld = self.accountant.composed_pld_after(steps, noise_multiplier=noise_multiplier, sample_rate=sample_rate)
            return float(pld.epsilon_uncapped(self.delta)) if pld.steps else 0.0
        history = self.history + [(noise_multiplier, sample_rate, steps)]
        if self.mechanism == "rdp":  # the stopper's bisection asks many times: reuse the cached RDP curves
            return self._rdp_epsilon(history, self.delta)
        return _epsilon_of(self.mechanism, history, self.delta)

    def steps_within(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        min_bayes_security: Optional[float] = None,
        max_epsilon: Optional[float] = None,
    ) -> int:
        """How many more steps at (σ, p) keep safe β*_MIA ≥ ``min_bayes_security`` or ε ≤ ``max_epsilon``.

        Exact to one step (bracketing and bisection; β* and ε are monotone in the step count). Both depend on the
        history only, so the answer is memoised as a step count from the history it was computed on and reused
        while every step since was taken at (σ, p): asking before every step is cheap.
        """
        if (min_bayes_security is None) == (max_epsilon is None):
            raise ValueError("Give exactly one of `min_bayes_security` or `max_epsilon`.")
        sigma, rate = float(noise_multiplier), float(sample_rate)
        if min_bayes_security is not None:
            key: Tuple[Any, ...] = ("beta", min_bayes_security, sigma, rate)

            def ok(k: int) -> bool:
                return self.bayes_security_after(k, noise_multiplier=sigma, sample_rate=rate) >= min_bayes_security
        else:
            key = ("epsilon", max_epsilon, sigma, rate)

            def ok(k: int) -> bool:
                return self.epsilon_after(k, noise_multiplier=sigma, sample_rate=rate) <= max_epsilon

        last = self.history[-1] if self.history else None
        cached = self._allowed.get(key)
        # reuse while every step since the reference point was taken at (σ, p)
        if cached is not None and last is not None and last[:2] == (sigma, rate):
            reference, allowed = cached
            since = self.steps - reference
            if 0 <= since <= last[2]:
                return max(0, allowed - since)
        reference = self.steps
        allowed = self._largest(ok, guess=None if cached is None else max(0, cached[1] - (self.steps - cached[0])))
        self._allowed[key] = (reference, allowed)
        return allowed

    @staticmethod
    def _largest(ok, guess: Optional[int] = None) -> int:
        """Largest k ≥ 0 with ok(k), for a monotone ok (True then False); 0 if ok(0) fails."""
        if guess is not None and ok(guess) and not ok(guess + 1):
            return guess
        if not ok(0):
            return 0
        lo, hi = 0, max(1, guess or 1)
        while ok(hi):
            lo, hi = hi, hi * 2
            if hi > 10**9:
                return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    # --------------------------------------------------------------------------------------------------- calibration
    @staticmethod
    def calibrate(
        *,
        sample_rate: float,
        steps: int,
        target_bayes_security: Optional[float] = None,
        target_epsilon: Optional[float] = None,
        delta: float = 1e-5,
        accountant: str = DEFAULT_ACCOUNTANT,
        relation: str = "replace",
        steps_per_read: Optional[int] = None,
        group_size: int = 1,
    ) -> float:
        """The smallest σ (rounded up to 1e-4) whose run of ``steps`` steps meets the target.

        For ``target_bayes_security`` the check is the ledger's own safe β*; for ``target_epsilon`` the accountant's
        ε at ``delta`` — with the default ``"pld"`` the certified add/remove ε (for Opacus' accountants
        ``get_noise_multiplier`` is the reference; this search never overwrites an accountant). Both are the values
        the run will read, whenever it reads them (``steps_per_read`` is accepted and changes nothing: the ledger's
        values do not depend on the reads). The returned σ always meets the target (checked): rounded up to 1e-4, so
        the certified ε at it is ≤ the target.

        Example:
            >>> PrivacyLedger.calibrate(sample_rate=0.01, steps=1000, target_epsilon=1.0, delta=1e-5)
            1.415
            >>> PrivacyLedger.calibrate(sample_rate=0.01, steps=1000, target_epsilon=1.0, delta=1e-5, accountant="rdp")
            1.5132
        """
        if (target_bayes_security is None) == (target_epsilon is None):
            raise ValueError("Give exactly one of `target_bayes_security` or `target_epsilon`.")
        if steps < 1 or int(steps) != steps:
            raise ValueError(f"Expected argument `steps` to be a whole number >= 1, but got {steps!r}.")
        if target_bayes_security is not None:
            if not 0 < target_bayes_security < 1:
                raise ValueError(
                    f"Expected argument `target_bayes_security` to be in (0, 1), but got {target_bayes_security!r}."
                )

            def ok(sigma: float) -> bool:
                run = _RunPLD(relation, group_size).pld([(sigma, sample_rate, steps)])  # what the run's ledger reads
                return run.bayes_security() >= target_bayes_security

            with warnings.catch_warnings():  # the closed form is only the search's starting point here
                warnings.simplefilter("ignore")
                start = bs.noise_multiplier_for(
                    target=target_bayes_security, sample_rate=sample_rate, steps=steps, relation=relation
                )
        else:
            if not target_epsilon > 0:
                raise ValueError(f"Expected argument `target_epsilon` to be > 0, but got {target_epsilon!r}.")

            if accountant == "pld":

                def ok(sigma: float) -> bool:
                    run = _RunPLD("add_remove", group_size).pld([(sigma, sample_rate, steps)])  # the run's ledger reads
                    return run.epsilon_uncapped(delta) <= target_epsilon
            else:

                def ok(sigma: float) -> bool:
                    return _epsilon_of(accountant, [(sigma, sample_rate, steps)], delta) <= target_epsilon

            start = 1.0
        lo, hi = start, start
        if ok(start):
            while lo > 1e-3 and ok(lo / 2):
                lo /= 2
            lo, hi = lo / 2, lo
        else:
            while not ok(hi):
                lo, hi = hi, hi * 2
                if hi > 1e6:
                    raise ValueError(
                        _unreachable(target_bayes_security, target_epsilon, delta, accountant, sample_rate, steps)
                    )
        while hi / lo > 1 + 1e-5:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        scale = 10**_SIGMA_DECIMALS
        sigma = math.ceil(hi * scale) / scale
        while not ok(sigma):  # guard against a non-monotone step of a discretised computation
            sigma = round(sigma + 1.0 / scale, _SIGMA_DECIMALS)
        return sigma

    # --------------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """Plain Python values (safe under ``torch.load(weights_only=True)``).

        ``chunks`` (and ``epsilon_chunks`` under the PLD accountant) are the runs the PLDs are composed of: they
        follow from the history and are saved for readers of the state (a version that composed one chunk per read
        recomposes them as they are).
        """
        return {
            "version": STATE_VERSION,
            "accountant": self.mechanism,
            "relation": self.relation,
            "history": [[s, p, t] for s, p, t in self.history],
            **({"group_size": self.group_size} if self.group_size > 1 else {}),
            **({"unit": self.unit} if self.unit != "example" else {}),
            "chunks": [list(c) for c in self._pld.chunks],
            **(
                {"epsilon_chunks": [list(c) for c in self.accountant.composed_pld().chunks]}
                if isinstance(self.accountant, PLDAccountant)
                else {}
            ),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a saved ledger; its PLDs are recomposed from the history (one chunk per run), so the values
        equal an uninterrupted run's, also for a state saved with one chunk per read.

        Raises:
            RuntimeError: on a missing key, another version, accountant or relation, or chunks that are not the
                steps of the history (privacy state fails closed).
        """
        missing = {"version", "accountant", "history"} - set(state)
        if missing:
            raise RuntimeError(f"Privacy ledger state is missing {sorted(missing)}: refusing to restart accounting")
        if state["version"] != STATE_VERSION:
            raise RuntimeError(f"Privacy ledger state version {state['version']!r} is not {STATE_VERSION}")
        if state["accountant"] != self.mechanism:
            raise RuntimeError(
                f"checkpoint accounted with {state['accountant']!r}, this ledger uses {self.mechanism!r}"
            )
        if state.get("relation", self.relation) != self.relation:
            raise RuntimeError(f"checkpoint used relation {state['relation']!r}, this ledger {self.relation!r}")
        if state.get("unit", "example") != self.unit:
            raise RuntimeError(
                f"checkpoint accounted the privacy of one {state.get('unit', 'example')}, this ledger one {self.unit}: "
                "the privacy unit of a run cannot change on resume"
            )
        if int(state.get("group_size", 1)) != self.group_size:
            raise RuntimeError(
                f"checkpoint accounted groups of {state.get('group_size', 1)} row(s), this ledger groups of "
                f"{self.group_size}: the privacy unit of a run cannot change on resume"
            )
        self.accountant.history = [(float(s), float(p), int(t)) for s, p, t in state["history"]]
        if state.get("chunks") is not None:
            _check_chunks(state["chunks"], self.history, "chunks")
        self._beta = _RunPLD(self.relation, self.group_size)
        if isinstance(self.accountant, PLDAccountant):
            self.accountant.load_chunks(state.get("epsilon_chunks") or [])
        self._allowed = {}
        self._other = {}

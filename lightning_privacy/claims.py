"""``Claim``: a privacy guarantee to test against audit evidence, and the verdict of a test.

An auditor usually holds a model and a *claimed* guarantee: the noise, sample rate and steps of a DP-SGD run, an
(ε, δ) pair, or a published :class:`~lightning_privacy.ledger.PrivacyLedger`. A :class:`Claim` turns any of them into
what the audits compare evidence with: the largest TPR any membership test may reach at each FPR in the in/out game
(the add/remove relation: the model trained with or without the example), and the claim's ε at its δ.
``audit_membership(..., claim=...)``, ``CanaryAudit(claim=...)`` and ``lightning-privacy audit membership
--claim-...`` return a verdict, ``"consistent"`` or ``"contradicted"`` at confidence 1 − α
(:mod:`lightning_privacy.analysis.claims`).

Example:
    >>> claim = Claim.dp_sgd(noise_multiplier=1.0, sample_rate=0.2, steps=150)
    >>> claim.relation, round(float(claim.tpr_bound(1e-3)), 3)  # dp_accounting's add/remove bound: 0.397
    ('add_remove', 0.397)
    >>> Claim.parse((1.0, 1e-5)).label
    '(ε = 1, δ = 1e-05)-DP'
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Dict, Optional, Sequence

import numpy as np

from lightning_privacy.analysis import claims as _claims

__all__ = ["RELATION", "Claim"]

RELATION = "add_remove"
"""The relation of the in/out game every claim is tested in."""

DEFAULT_DELTA = 1e-5
_EXPECTED = "a Claim, a PrivacyLedger, (noise_multiplier, sample_rate, steps[, delta]) or (epsilon, delta)"


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive(name: str, value: Any) -> float:
    if not _real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}")
    return float(value)


def _delta(value: Any, *, zero: bool) -> float:
    if not _real(value) or not (0 <= value < 1 if zero else 0 < value < 1):
        raise ValueError(f"`delta` must be in {'[0, 1)' if zero else '(0, 1)'}, got {value!r}")
    return float(value)


class Claim:
    """A claimed guarantee for the in/out game: a TPR bound at every FPR and an ε at a δ.

    Build it with :meth:`dp_sgd`, :meth:`epsilon_delta`, :meth:`from_ledger`, or :meth:`parse` (any of them, or a
    tuple). A DP-SGD claim's curve and ε come from a pessimistic privacy-loss distribution of the Poisson subsampled
    Gaussian for the add/remove relation (:class:`~lightning_privacy.analysis.composition.ComposedPLD`: never below
    the true curve, ε never below the true ε — the safe side for a test that must not contradict a true claim); its
    ε is that PLD's, which is at most the accountant's — above the PLD's loss cap of 50 from the same history
    recomposed with a wider cap (:meth:`~lightning_privacy.analysis.composition.ComposedPLD.epsilon_uncapped`: finite
    up to about 700, e.g. 58.78 for σ = 0.3, q = 1, 5 steps, as dp_accounting). An (ε, δ) claim's curve is Kairouz
    et al.'s.

    Attributes:
        kind: ``"dp_sgd"`` or ``"epsilon_delta"``.
        relation: ``"add_remove"``.
        delta: the claim's δ; ``epsilon``: its ε at that δ (``inf`` only where that is about 700 or more, or δ is
            below the PLD's round-off allowance, such as 1e-300).
        parameters: what the claim was built from (plain values).
        label: a short description for summaries and figures.
    """

    relation = RELATION

    def __init__(self, *, kind: str, delta: float, epsilon: float, parameters: Dict[str, Any], pld: Any = None):
        self.kind, self.delta, self.epsilon = kind, float(delta), float(epsilon)
        self.parameters = dict(parameters)
        self._pld = pld

    # ------------------------------------------------------------------------------------------------ building
    @classmethod
    def dp_sgd(
        cls,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        delta: float = DEFAULT_DELTA,
        group_size: int = 1,
    ) -> Claim:
        """``steps`` steps of a Poisson subsampled Gaussian at (σ, q), as DP-SGD with clipping norm C and noise σC.

        ``group_size`` k > 1: the same run's guarantee for adding or removing a group of k records (each sampled on its
        own: :class:`~lightning_privacy.analysis.composition.ComposedPLD`'s ``group_size``), what canaries inserted k
        times each audit (``LanguageModelCanaries.with_canaries(..., repetitions=k)``).

        Raises:
            ValueError: an argument out of range (named, with its value).

        Example:
            >>> claim = Claim.dp_sgd(noise_multiplier=2.0, sample_rate=0.1, steps=300)
            >>> round(claim.epsilon, 2), claim.label  # dp_accounting: 4.18 (Opacus RDP: 4.56)
            (4.18, 'DP-SGD σ = 2, q = 0.1, 300 steps (δ = 1e-05)')
            >>> pair = Claim.dp_sgd(noise_multiplier=2.0, sample_rate=0.1, steps=300, group_size=2)
            >>> round(pair.epsilon, 2), pair.label  # dp_accounting's MixtureGaussianPrivacyLoss: 9.53
            (9.53, 'DP-SGD σ = 2, q = 0.1, 300 steps, groups of 2 (δ = 1e-05)')
        """
        from lightning_privacy.ledger import PrivacyLedger

        sigma = _positive("noise_multiplier", noise_multiplier)
        if not _real(sample_rate) or not 0 < sample_rate <= 1:
            raise ValueError(f"`sample_rate` must be in (0, 1], got {sample_rate!r}")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise ValueError(f"`steps` must be an int >= 1, got {steps!r}")
        ledger = PrivacyLedger(delta=_delta(delta, zero=False))
        ledger.step(noise_multiplier=sigma, sample_rate=float(sample_rate), steps=int(steps))
        return cls.from_ledger(ledger, group_size=group_size)

    @classmethod
    def from_ledger(cls, ledger: Any, *, delta: Optional[float] = None, group_size: int = 1) -> Claim:
        """The guarantee of a :class:`~lightning_privacy.ledger.PrivacyLedger`'s history as it is now (a snapshot).

        Args:
            ledger: the ledger (e.g. ``DPSGD.ledger`` or :func:`lightning_privacy.checkpoints.privacy_ledger`).
            delta: the claim's δ (default: the ledger's).
            group_size: k ≥ 1; k > 1: the history's guarantee for a group of k records (see :meth:`dp_sgd`) — of k
                people for a person-level ledger (under example-level sampling, k times the ledger's rows per person).

        Raises:
            ValueError: a ledger without steps, a bad δ or group size.
        """
        if not ledger.steps:
            raise ValueError("`claim` is a PrivacyLedger without steps: it claims nothing to test")
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
            raise ValueError(f"`group_size` must be an int >= 1, got {group_size!r}")
        delta = ledger.delta if delta is None else _delta(delta, zero=False)
        history = ledger.history
        unit = getattr(ledger, "unit", "example")
        own = getattr(ledger, "group_size", 1)  # a person's k rows, each sampled on its own (ELS): k per claimed unit
        group_size = int(group_size) * own
        if group_size == own:
            pld = ledger.privacy_loss_distribution(RELATION).copy()
        else:
            from lightning_privacy.analysis.composition import ComposedPLD

            chunks = [[rate, sigma, steps] for sigma, rate, steps in history]
            pld = ComposedPLD.from_chunks(chunks, relation=RELATION, group_size=int(group_size))
        parameters: Dict[str, Any] = {"history": [list(seg) for seg in history], "steps": ledger.steps}
        if group_size > 1:
            parameters["group_size"] = int(group_size)
        if unit == "person":  # (a person-level ledger: the claim protects one person, never a row)
            parameters["unit"] = "person"
        if len(history) == 1:
            sigma, rate, steps = history[0]
            parameters.update(noise_multiplier=sigma, sample_rate=rate, steps=steps)
        epsilon = pld.epsilon_uncapped(delta)  # finite beyond the PLD's loss cap of 50 (up to about 700)
        return cls(kind="dp_sgd", delta=delta, epsilon=epsilon, parameters=parameters, pld=pld)

    @classmethod
    def epsilon_delta(cls, epsilon: float, delta: float) -> Claim:
        """(ε, δ)-DP for the add/remove relation.

        Example:
            >>> round(float(Claim.epsilon_delta(1.0, 1e-5).tpr_bound(0.01)), 4)
            0.0272
        """
        if not _real(epsilon) or not math.isfinite(epsilon) or epsilon < 0:
            raise ValueError(f"`epsilon` must be a finite number >= 0, got {epsilon!r}")
        eps = float(epsilon)
        return cls(kind="epsilon_delta", delta=_delta(delta, zero=True), epsilon=eps, parameters={"epsilon": eps})

    @classmethod
    def parse(cls, value: Any) -> Claim:
        """A :class:`Claim` from a Claim, a PrivacyLedger, ``(σ, q, T)``, ``(σ, q, T, δ)`` or ``(ε, δ)``.

        Raises:
            TypeError: anything else (naming ``claim`` and the value).
            ValueError: a value out of range.

        Example:
            >>> Claim.parse((1.0, 0.2, 150)).label
            'DP-SGD σ = 1, q = 0.2, 150 steps (δ = 1e-05)'
            >>> Claim.parse("eps=1")
            Traceback (most recent call last):
            ...
            TypeError: `claim` must be a Claim, a PrivacyLedger, (noise_multiplier, sample_rate, steps[, delta]) or (epsilon, delta), got 'eps=1'
        """
        if isinstance(value, Claim):
            return value
        if hasattr(value, "privacy_loss_distribution") and hasattr(value, "history"):
            return cls.from_ledger(value)
        if isinstance(value, (tuple, list)) and len(value) in (2, 3, 4):
            if len(value) == 2:
                return cls.epsilon_delta(*value)
            sigma, rate, steps, *rest = value
            return cls.dp_sgd(
                noise_multiplier=sigma, sample_rate=rate, steps=steps, delta=rest[0] if rest else DEFAULT_DELTA
            )
        raise TypeError(f"`claim` must be {_EXPECTED}, got {value!r}")

    # ------------------------------------------------------------------------------------------------- values
    @property
    def curve(self) -> str:
        """The trade-off curve the claim's tests read, in words (what a verdict says it was tested on)."""
        if self._pld is not None:
            return "the run's own trade-off curve (the ledger's PLD: add/remove, Poisson-subsampled Gaussian)"
        return "the (ε, δ) trade-off curve (Kairouz et al.)"

    def tpr_bound(self, fpr: Any) -> Any:
        """The largest TPR any membership test may reach at ``fpr`` under the claim (add/remove)."""
        if self._pld is not None:
            return self._pld.tpr_bound(fpr)
        return _claims.epsilon_delta_tpr_bound(fpr, epsilon=self.epsilon, delta=self.delta)

    @property
    def label(self) -> str:
        p = self.parameters
        if self.kind == "epsilon_delta":
            return f"(ε = {self.epsilon:g}, δ = {self.delta:g})-DP"
        if "noise_multiplier" in p:
            what = f"σ = {p['noise_multiplier']:g}, q = {p['sample_rate']:g}, {p['steps']} steps"
        else:
            what = f"{len(p['history'])} segments, {p['steps']} steps"
        group = f", groups of {p['group_size']}" if p.get("group_size", 1) > 1 else ""
        person = ", one person" if p.get("unit") == "person" else ""
        return f"DP-SGD {what}{group}{person} (δ = {self.delta:g})"

    def to_dict(self) -> Dict[str, Any]:
        """Plain values: kind, relation, δ, ε, label and the parameters."""
        eps = self.epsilon if math.isfinite(self.epsilon) else None
        return {
            "kind": self.kind,
            "relation": self.relation,
            "delta": self.delta,
            "epsilon": eps,
            "label": self.label,
            **self.parameters,
        }

    def __repr__(self) -> str:
        return f"Claim({self.label}, relation={self.relation!r}, epsilon={self.epsilon:.4g})"

    # ---------------------------------------------------------------------------------------------- verdicts
    def check_attack_scores(
        self,
        scores: Any,
        is_member: Any,
        *,
        alpha: float = 0.05,
        fprs: Sequence[float] = _claims.CLAIM_FPRS,
        seed: int = 0,
    ) -> _claims.ClaimVerdict:
        """The verdict from a membership attack's scores (:func:`~lightning_privacy.analysis.claims.check_attack_scores`).

        Example:
            >>> rng = np.random.default_rng(0)
            >>> member = np.r_[np.ones(500, bool), np.zeros(500, bool)]
            >>> scores = rng.normal(loc=3.0 * member)
            >>> Claim.epsilon_delta(1.0, 1e-5).check_attack_scores(scores, member).verdict
            'contradicted'
        """
        verdict = _claims.check_attack_scores(
            scores,
            is_member,
            tpr_bound=self.tpr_bound,
            epsilon=self.epsilon if math.isfinite(self.epsilon) else None,
            delta=self.delta,
            alpha=alpha,
            fprs=fprs,
            seed=seed,
        )
        return dataclasses.replace(verdict, curve=self.curve)

    def check_canaries(
        self, scores: Any, included: Any, *, alpha: float = 0.05, seed: int = 0, tests: str = "both"
    ) -> _claims.ClaimVerdict:
        """The verdict from a one-run canary audit (:func:`~lightning_privacy.analysis.claims.check_canaries`).

        ``tests="both"``: α split between the binomial test of the claim's (ε, δ) and the f-DP test of its trade-off
        curve; ``"fdp"``: all of α on the f-DP test (every parsed claim has a curve; an (ε, δ) claim Kairouz et al.'s).
        The curve implies the (ε, δ) pair, so the f-DP test alone is a valid test of the claim at level α; chosen before
        the scores are seen, it is the more powerful one for DP-SGD (``benchmarks/results/dp_violations.md``).

        ``included`` must be a Bernoulli(1/2) draw made before training: a count no such draw plausibly gives (exact
        two-sided binomial test at level 1e-6; all True, say) raises ``ValueError``, since it would make a true claim
        look contradicted (:func:`~lightning_privacy.analysis.canary.check_inclusion`).
        """
        if tests not in ("both", "fdp"):
            raise ValueError(f"`tests` must be 'both' or 'fdp', got {tests!r}")
        if tests == "fdp" and self.tpr_bound is None:
            raise ValueError(f"`tests='fdp'` needs a claim with a trade-off curve; {self.label} has none")
        epsilon = None if tests == "fdp" else self.epsilon
        verdict = _claims.check_canaries(
            scores, included, epsilon=epsilon, delta=self.delta, tpr_bound=self.tpr_bound, alpha=alpha, seed=seed
        )
        return dataclasses.replace(verdict, curve=self.curve)


def curve(claim: Claim, fpr: Optional[np.ndarray] = None) -> tuple:
    """``(fpr grid, claim's TPR bound)`` for a figure (log grid from 1e-4)."""
    grid = np.logspace(-4, 0, 121) if fpr is None else np.asarray(fpr, dtype=float)
    return grid, np.asarray(claim.tpr_bound(grid), dtype=float)

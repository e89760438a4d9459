"""``AttributeLedger``: the β*_AI record of a DP-SGD run, safe every time it is read.

Issue 14's counterpart of :class:`~lightning_privacy.ledger.PrivacyLedger` for attribute inference (Cherubin et
al. 2024, Cor. 10 / Algorithm 4). Each optimizer step t at (σ_t, p_t) is recorded with its measured attribute
sensitivity R_t (or as unmeasured, which counts at the worst case R_t = 2C). The ledger keeps

- the safe β*_AI: 1 − δ(ε = 0) of the composition of the per-step Poisson-subsampled Gaussian mechanisms whose
  neighbouring outputs differ by R_t, from a pessimistic privacy-loss distribution
  (:class:`~lightning_privacy.analysis.composition.ComposedPLD` with ``sensitivity = R_t/(2C)``). Steps differ, so
  each R_t/(2C) is rounded *up* onto :data:`~lightning_privacy.analysis.bayes_security.DEFAULT_SENSITIVITY_LEVELS`
  (128 levels per factor of two, from 1 down to 2⁻¹⁶; a level is < 0.55 % above the R_t it stands for; rounding up
  only adds leakage). The steps recorded since the last read wait as counts per (p, σ, level); a read composes
  them onto the stored PLD as one chunk (each level self-composed by its count, the levels composed with each
  other, then one convolution onto the stored distribution), so a read costs what the new steps cost, not a
  recomposition of the history. This is :func:`~lightning_privacy.analysis.bayes_security.ai_bayes_security_exact`
  computed incrementally, with its model: step t's two gradients at ±R_t/2 (issue 14, Cor. 10); for R_t < 2C other
  placements at distance R_t can leak more (see that function);
- the paper's closed form beside it (Cor. 10: 1 − erf(√Σ(p_t R_t/σ_t)² / (2√2·C)), an approximation that can
  overstate security), from run-length segments holding Σ R_t²;
- the prediction for the budget stopper: the safe β*_AI after one more step at the worst case R = 2C.

Grid and cost. 128 levels per factor of two move β*_AI by 1.9e-4 against unrounded levels (every R_t its own
level) at the Adult reproduction's p = 1/107, σ = 3.44 over 3,210 steps with R_t spread over [0.9, 1.4]·C (64 per
octave: 3.8e-4; 256: 9.6e-5), at ≈ 60 distinct levels per epoch (``benchmarks/ai_bayes_security_levels.py``). In the
Adult run itself (``examples/adult_attribute_inference.py``: 30 epochs of 107 steps, ≈ 17 s each) a read at epoch
end took a median 11 ms with the approximate diameter (23 levels per epoch) and 6 ms with the exact one (8 levels),
0.28 s at most (the first epoch, while the one-step distributions are computed and cached): 1.3 s over the whole
run for both monitors, 0.25 % of its time. Finer grids outgrow the one-step cache (128 entries; 256 levels per
octave cost ≈ 160 ms per epoch). Read after every step (as ``PrivacyBudgetStopping(threat="ai")`` does) a read is
one small convolution, ≈ 1 ms.

The state is plain Python (the composed chunks in their order plus the waiting counts); a restored ledger
recomposes the same chunks in the same order and so reads the same value to the last digit.

Example:
    >>> ledger = AttributeLedger(max_grad_norm=1.0)
    >>> for epoch in range(20):
    ...     for _ in range(20):
    ...         ledger.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=2.0)  # R_t = 2C: the MIA case
    ...     safe = ledger.bayes_security()
    >>> round(safe, 4), round(ledger.bayes_security_closed_form(), 4)  # the closed form overstates here
    (0.3059, 0.3173)
    >>> ledger.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=1.0, steps=400)
    >>> round(ledger.bayes_security(), 4), ledger.steps
    (0.2546, 800)
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lightning_privacy._validation import check_int, check_positive
from lightning_privacy.analysis import bayes_security as bs

__all__ = ["AttributeLedger"]

STATE_VERSION = 2
# Measured R_t may exceed 2C by the round-off of a float32 norm; beyond this relative margin it is an error.
_ROUNDOFF = 1e-6
_Key = Tuple[float, float, float]  # (sample_rate, noise_multiplier, level in units of 2C)


class AttributeLedger:
    """Per-step attribute sensitivities of one DP-SGD run: safe β*_AI (incremental PLD), closed form, prediction.

    Args:
        max_grad_norm: the clipping norm C; may be set later (:meth:`set_max_grad_norm`), before the first record.

    Attributes:
        max_grad_norm: C, or ``None`` until known.
        segments: run-length record ``[{noise_multiplier, sample_rate, steps, sum_sq, measured}]`` (Σ R_t² per
            segment: what the closed form needs).
        max_sensitivity: the largest measured R_t.
        compose_seconds: wall time spent composing (not saved; for cost measurements).

    Raises:
        ValueError: for a C that is not > 0, a changed C, or an R_t outside [0, 2C].
    """

    def __init__(self, *, max_grad_norm: Optional[float] = None) -> None:
        self.max_grad_norm: Optional[float] = None
        if max_grad_norm is not None:
            self.set_max_grad_norm(max_grad_norm)
        self.segments: List[Dict[str, Any]] = []
        self.max_sensitivity = 0.0
        self.compose_seconds = 0.0
        self._pending: Dict[_Key, int] = {}  # steps recorded but not composed yet, per (p, σ, level)
        self._groups: List[List[List[float]]] = []  # composed chunks: one list of [p, σ, steps, level] per read
        self._pld_state: Any = None
        self._interval: Optional[float] = None

    # ------------------------------------------------------------------------------------------------- recording
    def set_max_grad_norm(self, value: Any) -> None:
        """Fix C (a later different value raises: the recorded R_t would not be comparable)."""
        value = check_positive("max_grad_norm", value)
        if self.max_grad_norm is not None and value != self.max_grad_norm:
            raise ValueError(
                f"max_grad_norm changed from {self.max_grad_norm} (recorded state) to {value}: the recorded R_t are "
                "not comparable"
            )
        self.max_grad_norm = value

    def record(
        self, *, noise_multiplier: float, sample_rate: float, sensitivity: Optional[float], steps: int = 1
    ) -> None:
        """Record ``steps`` steps at (σ, p) with attribute sensitivity ``sensitivity`` = R_t each.

        ``sensitivity=None`` records unmeasured steps: they count at the worst case R_t = 2C.
        """
        if self.max_grad_norm is None:
            raise ValueError("Set `max_grad_norm` before recording steps (R_t is measured in units of 2C).")
        steps = check_int("steps", steps, minimum=0)
        if steps == 0:
            return
        two_c = 2.0 * self.max_grad_norm
        measured = sensitivity is not None
        r = two_c if sensitivity is None else float(sensitivity)
        if not (0.0 <= r <= two_c * (1.0 + _ROUNDOFF)):
            raise ValueError(
                f"`sensitivity` must be in [0, 2*max_grad_norm] = [0, {two_c:g}] (clipped gradients differ by at most "
                f"2C), got {sensitivity!r}"
            )
        r = min(r, two_c)  # R_t <= 2C holds by clipping; only float round-off can put it above
        sigma, rate = float(noise_multiplier), float(sample_rate)
        levels, _ = bs.sensitivity_levels([r], max_grad_norm=self.max_grad_norm)
        if levels.size:  # R_t = 0: the step cannot leak the attribute
            key = (rate, sigma, float(levels[0]))
            self._pending[key] = self._pending.get(key, 0) + steps
        last = self.segments[-1] if self.segments else None
        if last and (last["noise_multiplier"], last["sample_rate"], last["measured"]) == (sigma, rate, measured):
            last["steps"] += steps
            last["sum_sq"] += steps * r * r
        else:
            self.segments.append(
                dict(noise_multiplier=sigma, sample_rate=rate, steps=steps, sum_sq=steps * r * r, measured=measured)
            )
        if measured:
            self.max_sensitivity = max(self.max_sensitivity, r)

    def align(self, history: Sequence[Tuple[float, float, int]], pending: Optional[float] = None) -> None:
        """Catch up with an accountant's run-length ``history`` ``[(σ, p, steps), ...]`` of the same run.

        The steps beyond those recorded count at the worst case R = 2C, except the last one when ``pending`` (the
        R_t measured at that step) is given. Needs ``max_grad_norm``.

        Raises:
            RuntimeError: the history holds fewer steps than the ledger (the ledger belongs to another run).

        Example::

            >>> ledger = AttributeLedger(max_grad_norm=1.0)
            >>> ledger.align([(1.0, 0.1, 3)], pending=0.5)  # two unmeasured steps, then the measured one
            >>> [(s["steps"], s["measured"]) for s in ledger.segments], ledger.max_sensitivity
            ([(2, False), (1, True)], 0.5)
        """
        total, tracked = sum(int(n) for _, _, n in history), self.steps
        if total < tracked:
            raise RuntimeError(
                f"AttributeInferenceMonitor has {tracked} steps but the accountant only {total}: the monitor state "
                "belongs to another run."
            )
        start = 0
        for sigma, rate, n in history:  # the new steps are positions [tracked, total)
            lo, hi = max(start, tracked), min(start + n, total)
            start += n
            if lo >= hi:
                continue
            measured_here = pending is not None and hi == total
            unmeasured = hi - lo - (1 if measured_here else 0)
            if unmeasured:
                self.record(noise_multiplier=sigma, sample_rate=rate, sensitivity=None, steps=unmeasured)
            if measured_here:
                self.record(noise_multiplier=sigma, sample_rate=rate, sensitivity=pending)

    @property
    def steps(self) -> int:
        """Steps recorded (measured or counted at the worst case)."""
        return sum(int(s["steps"]) for s in self.segments)

    @property
    def chunks(self) -> List[List[List[float]]]:
        """The composed chunks, one per read that found new steps: ``[[p, σ, steps, level], ...]`` per chunk."""
        return [[list(row) for row in group] for group in self._groups]

    # ---------------------------------------------------------------------------------------------------- values
    @property
    def _pld(self) -> Any:
        if self._pld_state is None:
            from lightning_privacy.analysis.composition import ComposedPLD

            self._pld_state = ComposedPLD(relation="replace", value_discretization_interval=self._interval)
        return self._pld_state

    def _sync(self) -> None:
        """Compose the waiting steps onto the stored PLD as one chunk (levels in a fixed order)."""
        if not self._pending:
            return
        start = time.perf_counter()
        group = [[p, sigma, count, level] for (p, sigma, level), count in sorted(self._pending.items())]
        p, sigma, count, level = (list(col) for col in zip(*group))
        self._pld.compose(sample_rate=p, noise_multiplier=sigma, steps=count, sensitivity=level)
        self._interval = self._pld.value_discretization_interval
        self._groups.append(group)
        self._pending = {}
        self.compose_seconds += time.perf_counter() - start

    def bayes_security(self) -> float:
        """Safe β*_AI: never above the exact value of the per-step mechanisms (1.0 before any step)."""
        self._sync()
        return self._pld.bayes_security() if self._pld_state is not None else 1.0

    def bayes_security_closed_form(self, extra_worst_case_step: Optional[Tuple[float, float]] = None) -> float:
        """The paper's closed form (Cor. 10), optionally with one more step (σ, p) at R = 2C; may overstate."""
        rows = [(s["noise_multiplier"], s["sample_rate"], s["steps"], math.sqrt(s["sum_sq"])) for s in self.segments]
        if extra_worst_case_step is not None:
            rows.append((*extra_worst_case_step, 1, 2.0 * self.max_grad_norm))
        if not rows:
            return 1.0
        sigma, rate, steps, root = (list(col) for col in zip(*rows))
        return bs.ai_bayes_security(
            sample_rate=rate, noise_multiplier=sigma, max_grad_norm=self.max_grad_norm, sensitivities=root, steps=steps
        )

    def bayes_security_after_worst_case_step(self, *, noise_multiplier: float, sample_rate: float) -> float:
        """Safe β*_AI if one more step at (σ, p) with the worst case R = 2C were taken (the ledger is not changed).

        The waiting steps are composed first (as a read would), then the extra step is evaluated without a
        convolution; the result is never above the value a composition of that step would report.
        """
        self._sync()
        return self._pld.bayes_security_after(
            sample_rate=float(sample_rate), noise_multiplier=float(noise_multiplier), steps=1, sensitivity=1.0
        )

    # ----------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """Plain Python values (safe under ``torch.load(weights_only=True)``); saving composes nothing."""
        return {
            "version": STATE_VERSION,
            "max_grad_norm": self.max_grad_norm,
            "segments": [dict(s) for s in self.segments],
            "max_sensitivity": self.max_sensitivity,
            "value_discretization_interval": self._interval,
            "chunks": [[list(row) for row in group] for group in self._groups],
            "pending": [[p, sigma, level, count] for (p, sigma, level), count in self._pending.items()],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a saved ledger; the PLD is recomposed chunk by chunk in the saved order.

        A version-1 state (Σ R_t² per segment, from before the exact value) is loaded with each step of a
        measured segment bounded by min(2C, √Σ R_t²) — safe, loose for long segments.

        Raises:
            RuntimeError: on a missing key, an unknown version, or chunks that do not add up to the recorded steps
                (privacy state fails closed).
        """
        missing = {"version", "segments", "max_grad_norm"} - set(state)
        if missing:
            raise RuntimeError(f"Attribute ledger state is missing {sorted(missing)}: refusing to restart R_t at 0")
        if state["version"] not in (1, STATE_VERSION):
            raise RuntimeError(f"Attribute ledger state version {state['version']!r} is not {STATE_VERSION}")
        c = state["max_grad_norm"]
        self.max_grad_norm = None if c is None else float(c)
        self.segments = [dict(s) for s in state["segments"]]
        self.max_sensitivity = float(state.get("max_sensitivity", 0.0))
        self._pld_state, self._groups, self._pending = None, [], {}
        if state["version"] == 1:
            self._interval = None
            for s in self.segments:
                levels, counts = bs.sensitivity_levels(
                    [min(math.sqrt(s["sum_sq"]), 2.0 * self.max_grad_norm * math.sqrt(s["steps"]))],
                    max_grad_norm=self.max_grad_norm,
                    steps=[s["steps"]],
                )
                for level, count in zip(levels.tolist(), counts.tolist()):
                    key = (float(s["sample_rate"]), float(s["noise_multiplier"]), level)
                    self._pending[key] = self._pending.get(key, 0) + int(count)
            return
        self._interval = state.get("value_discretization_interval")
        for group in state.get("chunks", []):
            p, sigma, count, level = (list(col) for col in zip(*group))
            self._pld.compose(sample_rate=p, noise_multiplier=sigma, steps=count, sensitivity=level)
            self._groups.append([list(row) for row in group])
        for p, sigma, level, count in state.get("pending", []):
            self._pending[(float(p), float(sigma), float(level))] = int(count)
        accounted = sum(int(row[2]) for group in self._groups for row in group) + sum(self._pending.values())
        if accounted > self.steps:
            raise RuntimeError(
                f"attribute ledger chunks hold {accounted} steps but the segments only {self.steps}: the state is "
                "inconsistent"
            )

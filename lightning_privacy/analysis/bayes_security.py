"""Closed-form Bayes security of DP-SGD against membership and attribute inference.

Pure math (numpy/scipy; the exact values compose a pessimistic PLD with :mod:`lightning_privacy.analysis.composition`), after
Cherubin, Köpf, Paverd, Tople, Wutschitz, Zanella-Béguelin, *Closed-Form Bounds for DP-SGD against
Record-level Inference* (USENIX Security 2024).

Bayes security β* ∈ [0, 1] is one minus the largest advantage any attacker gains over guessing from
the prior; 1 means no leakage. For DP-SGD with Poisson sampling rate ``p``, noise multiplier ``σ``,
clipping norm ``C`` and ``T`` steps, against a training-time attacker who sees every update:

- membership inference (Corollary 7): β*_MIA ≈ 1 − erf(p·√T / (√2·σ)), i.e. ``erfc`` of that;
- attribute inference (Corollary 10): β*_AI ≈ 1 − erf(p·‖R‖ / (2√2·σ·C)) with the per-step
  sensitivities R_t ≤ 2C, so β*_AI ≥ β*_MIA.

Both are *approximations*: they replace the Gaussian mixture produced by subsampling with a single
Gaussian (Proposition 4). :func:`mia_bayes_security_exact` gives a certified lower bound for MIA through
Proposition 8 (β* = 1 − δ(ε=0)) from a pessimistic privacy-loss distribution
(:class:`~lightning_privacy.analysis.composition.ComposedPLD`), :func:`ai_bayes_security_exact` the same for
attribute inference over the measured sensitivities, and :func:`mia_tradeoff_curve` the tight bound on an
attack's TPR at each FPR (the composed mechanism's trade-off curve; Proposition 9's line is its ε = 0 term).
The closed form overstates security slightly for σ ≥ 1 at p = 1e-3 (≤ 0.0143 up to 50 epochs; the paper's
Fig. 4 says ≤ 0.01), by up to 0.03 at the larger sample rates of real DP-SGD (p = 0.01, σ = 1, 50 epochs:
0.4795 vs 0.4500) and substantially for σ < 1 (0.043 at σ = 0.8), so report the exact value.

Every function accepts a DP-SGD history made of segments — equal-length 1-D sequences of
``sample_rate``, ``noise_multiplier`` and ``steps`` (scalars broadcast) — as Opacus keeps it in
``accountant.history``; :func:`history_segments` converts that list. Segments compose by adding
their squared Gaussian distances: the erf argument is √(Σᵢ stepsᵢ·pᵢ²/σᵢ²)/√2.

Example:
    >>> from lightning_privacy.analysis import bayes_security as bs
    >>> round(bs.mia_bayes_security(sample_rate=1e-3, noise_multiplier=2.0, steps=50_000), 4)
    0.911
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import special

from ._checks import expect_choice, real_array

__all__ = [
    "RELATIONS",
    "DEFAULT_SENSITIVITY_LEVELS",
    "history_segments",
    "mia_bayes_security",
    "mia_bayes_security_exact",
    "mia_tradeoff_curve",
    "ai_bayes_security",
    "ai_bayes_security_exact",
    "sensitivity_levels",
    "approximation_error",
    "noise_multiplier_for",
    "noise_multiplier_for_exact",
    "tpr_upper_bound",
    "epsilon_estimate",
]

#: Neighbouring relations: ``"replace"`` (substitute one record; the paper's MIA game, Δ = 2C per
#: step) and ``"add_remove"`` (add or remove one record; Δ = C per step, so the erf argument halves).
RELATIONS = ("replace", "add_remove")

#: Default PLD grid of the exact functions: ``None`` lets :class:`~lightning_privacy.analysis.composition.ComposedPLD`
#: choose it from the first segment (a tenth of the per-step distance 2p/σ, within [1e-5, 1e-3]; see
#: :func:`~lightning_privacy.analysis.composition.default_value_discretization_interval`), which keeps β* within
#: ≈ 5e-4 of a 4× finer grid from p = 1e-3 to 0.5 and σ = 0.3 to 5.
DEFAULT_VALUE_DISCRETIZATION_INTERVAL = None

#: Sensitivity levels of :func:`ai_bayes_security_exact` in units of 2C: 2^(−k/128) for k = 0 … 2048, i.e. 128
#: levels per factor of two from 1 down to 2^−16 ≈ 1.5e-5. Rounding R_t/(2C) up to the next level raises it by
#: < 0.55 % (β* moves by ≲ 1e-3 even if every step is rounded by the full step).
DEFAULT_SENSITIVITY_LEVELS = np.exp2(-np.arange(2048, -1, -1) / 128.0)

#: Smallest admissible level (units of 2C): below it the composed PLD's losses vanish in round-off (a level of
#: 5e-309 gave β* = 0). Rounding R_t up to it is safe and costs < 1e-11 of β* per step.
MIN_SENSITIVITY_LEVEL = 1e-12

# Rounding step of noise_multiplier_for (always rounded up, i.e. towards more noise).
_SIGMA_DECIMALS = 4


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------
def _check_relation(relation: Any) -> str:
    return expect_choice("relation", relation, RELATIONS)


def _check_probability(name: str, value: Any, *, low_open: bool, high_open: bool) -> float:
    arr = real_array(name, value)
    if arr.ndim != 0:
        raise TypeError(f"Expected argument `{name}` to be a scalar, but got {value!r}.")
    x = float(arr)
    lo_ok = x > 0.0 if low_open else x >= 0.0
    hi_ok = x < 1.0 if high_open else x <= 1.0
    if not (lo_ok and hi_ok):
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ValueError(f"Expected argument `{name}` to be in {interval}, but got {value!r}.")
    return x


def _segments(sample_rate: Any, noise_multiplier: Any, steps: Any, *, integer_steps: bool = False):
    """Validate and broadcast a (possibly segmented) DP-SGD description to three 1-D arrays."""
    named = {"sample_rate": sample_rate, "noise_multiplier": noise_multiplier, "steps": steps}
    arrays = {k: real_array(k, v) for k, v in named.items()}
    lengths = {k: a.shape[0] for k, a in arrays.items() if a.ndim == 1}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "Expected `sample_rate`, `noise_multiplier` and `steps` to be scalars or 1-D sequences of one "
            f"length (one entry per history segment), but got lengths {lengths}."
        )
    n = next(iter(lengths.values())) if lengths else 1
    p, sigma, t = (np.broadcast_to(arrays[k], (n,)).astype(float) for k in named)
    if np.any((p <= 0.0) | (p > 1.0)):
        raise ValueError(f"Expected argument `sample_rate` to be in (0, 1], but got {sample_rate!r}.")
    if np.any(sigma <= 0.0):
        raise ValueError(f"Expected argument `noise_multiplier` to be > 0, but got {noise_multiplier!r}.")
    if np.any(t < 0.0):
        raise ValueError(f"Expected argument `steps` to be >= 0, but got {steps!r}.")
    if integer_steps and np.any(t != np.round(t)):
        raise ValueError(f"Expected argument `steps` to be whole numbers of optimizer steps, but got {steps!r}.")
    return p, sigma, t


def _scalar_segment(sample_rate: Any, noise_multiplier: Any, steps: Any):
    """Fast path for one plain-number segment: validated floats, or None to use the array path."""
    values = (sample_rate, noise_multiplier, steps)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    p, sigma, t = (float(v) for v in values)
    if not (0.0 < p <= 1.0 and 0.0 < sigma < math.inf and 0.0 <= t < math.inf):
        return None  # let the array path raise its precise message
    return p, sigma, t


def _mia_erf_argument(p: np.ndarray, sigma: np.ndarray, t: np.ndarray, relation: str) -> float:
    x = math.sqrt(float(np.sum(t * p**2 / sigma**2))) / math.sqrt(2.0)
    return x / 2.0 if relation == "add_remove" else x


# --------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------
def history_segments(history: Iterable[Sequence[float]]) -> dict:
    """Split an Opacus-style accountant history into the keyword arguments of this module.

    Args:
        history: ``[(noise_multiplier, sample_rate, steps), ...]`` as in Opacus'
            ``accountant.history`` (the order of Opacus, not of this module's keywords).
            May be empty (no step taken yet).

    Returns:
        ``{"sample_rate": array, "noise_multiplier": array, "steps": array}`` (1-D float arrays of
        the same length), ready for ``mia_bayes_security(**segments)``.

    Raises:
        TypeError: If an entry is not a triple of numbers.
        ValueError: If a value is out of range (p ∉ (0, 1], σ ≤ 0, steps < 0 or not whole).

    Example:
        >>> seg = history_segments([(1.0, 0.01, 100), (2.0, 0.01, 300)])
        >>> seg["steps"].tolist(), seg["noise_multiplier"].tolist()
        ([100.0, 300.0], [1.0, 2.0])
        >>> round(mia_bayes_security(**seg), 4)
        0.8948
    """
    rows = []
    for i, entry in enumerate(history):
        try:
            sigma, rate, steps = entry
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"Expected argument `history` to hold (noise_multiplier, sample_rate, steps) triples, but entry {i} is {entry!r}."
            ) from exc
        rows.append((sigma, rate, steps))
    if not rows:
        empty = np.zeros(0)
        return {"sample_rate": empty.copy(), "noise_multiplier": empty.copy(), "steps": empty.copy()}
    sigma, rate, steps = (list(col) for col in zip(*rows))
    p, s, t = _segments(rate, sigma, steps, integer_steps=True)
    return {"sample_rate": p, "noise_multiplier": s, "steps": t}


def mia_bayes_security(*, sample_rate: Any, noise_multiplier: Any, steps: Any, relation: str = "replace") -> float:
    """Approximate Bayes security of DP-SGD against membership inference (closed form).

    Cherubin et al. (2024), Corollary 7: β*_MIA ≈ 1 − erf(p·√T / (√2·σ)), computed as ``erfc`` for
    precision. Over history segments the erf argument is √(Σᵢ Tᵢ·pᵢ²/σᵢ²)/√2. With
    ``relation="add_remove"`` one record is added or removed instead of replaced (sensitivity C
    instead of 2C), which halves the argument.

    This is an approximation (Proposition 4), not a bound. Measured against
    :func:`mia_bayes_security_exact` at p = 1e-3 (``benchmarks/bayes_security_vs_pld.py``) it
    overstates security, by ≤ 0.0005 for σ = 2 up to 50 epochs, 0.0143 for σ = 1 at 50 epochs (the
    paper says ≤ 0.01 for σ ≥ 1) and 0.043 for σ = 0.8 at 50 epochs (0.780 vs 0.737). With
    ``"add_remove"`` the gap is larger (σ = 1, 50 epochs: 0.911 vs 0.884; σ = 2: 0.955 vs 0.952),
    because the add/remove mixture is not symmetric; prefer the exact value there.

    Args:
        sample_rate: Poisson sampling rate p = L/N, in (0, 1]; scalar or one per segment.
        noise_multiplier: σ > 0 (noise std / max_grad_norm); scalar or one per segment.
        steps: optimizer steps T ≥ 0; scalar or one per segment. Non-integer values are accepted
            for planning (e.g. ``epochs / sample_rate``).
        relation: ``"replace"`` (the paper's MIA game) or ``"add_remove"``.

    Returns:
        β* in [0, 1] (1.0 when no step was taken).

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range, segment lengths differ, or ``relation`` is unknown.

    Example:
        >>> round(mia_bayes_security(sample_rate=1e-3, noise_multiplier=1.0, steps=50_000), 4)
        0.8231
        >>> round(mia_bayes_security(sample_rate=1e-3, noise_multiplier=1.0, steps=50_000, relation="add_remove"), 4)
        0.911
        >>> round(mia_bayes_security(sample_rate=[1e-3, 1e-3], noise_multiplier=[1.0, 1.0], steps=[20_000, 30_000]), 4)
        0.8231
    """
    relation = _check_relation(relation)
    scalar = _scalar_segment(sample_rate, noise_multiplier, steps)
    if scalar is not None:
        p, sigma, t = scalar
        x = p * math.sqrt(t) / (math.sqrt(2.0) * sigma)
        return math.erfc(x / 2.0 if relation == "add_remove" else x)
    p, sigma, t = _segments(sample_rate, noise_multiplier, steps)
    return float(special.erfc(_mia_erf_argument(p, sigma, t, relation)))


def _check_grid(value_discretization_interval: Any) -> Optional[float]:
    if value_discretization_interval is None:
        return None
    vdi = real_array("value_discretization_interval", value_discretization_interval)
    if vdi.ndim != 0 or not 0.0 < float(vdi) <= 1.0:
        raise ValueError(
            "Expected argument `value_discretization_interval` to be None or a scalar in (0, 1], but got "
            f"{value_discretization_interval!r}."
        )
    return float(vdi)


def _composed_mia(
    sample_rate: Any, noise_multiplier: Any, steps: Any, relation: str, value_discretization_interval: Any
):
    """Validated segments composed into a ComposedPLD (None when no step was taken)."""
    relation = _check_relation(relation)
    p, sigma, t = _segments(sample_rate, noise_multiplier, steps, integer_steps=True)
    grid = _check_grid(value_discretization_interval)
    if not np.any(t > 0):
        return None
    from .composition import ComposedPLD

    return ComposedPLD(relation=relation, value_discretization_interval=grid).compose(
        sample_rate=p, noise_multiplier=sigma, steps=t
    )


def mia_bayes_security_exact(
    *,
    sample_rate: Any,
    noise_multiplier: Any,
    steps: Any,
    relation: str = "replace",
    value_discretization_interval: Optional[float] = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Bayes security against membership inference from a pessimistic privacy-loss distribution (safe side).

    Proposition 8 of Cherubin et al. (2024): for two secrets, β* = 1 − δ(ε = 0). δ(0) is computed from the
    privacy-loss distribution of the Poisson-subsampled Gaussian mechanism under dp_accounting's
    ``REPLACE_ONE`` (or ``ADD_OR_REMOVE_ONE``, both orders) pair, composed over every step of every segment by
    :class:`~lightning_privacy.analysis.composition.ComposedPLD`: connect-the-dots discretisation, tail
    truncation and floating-point round-off only ever *increase* δ, so the returned β* is a lower bound on the
    true Bayes security (it errs towards less security).

    The default grid is chosen from the first segment (:data:`DEFAULT_VALUE_DISCRETIZATION_INTERVAL`); the
    value is then within ≈ 5e-4 of a 4× finer grid. One call composes T steps by repeated squaring, ≈ 2·log₂T
    convolutions (milliseconds to ~1 s); a run that needs the value every epoch should keep a
    :class:`~lightning_privacy.analysis.composition.ComposedPLD` and compose each epoch onto it.

    Args:
        sample_rate: Poisson sampling rate p, in (0, 1]; scalar or one per segment.
        noise_multiplier: σ > 0; scalar or one per segment.
        steps: whole number of optimizer steps ≥ 0; scalar or one per segment.
        relation: ``"replace"`` (REPLACE_ONE) or ``"add_remove"`` (ADD_OR_REMOVE_ONE).
        value_discretization_interval: PLD grid spacing in (0, 1], or ``None`` for the automatic grid.
            Smaller is tighter and slower.

    Returns:
        β* in [0, 1] (1.0 when no step was taken).

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range, ``steps`` is not whole, segment lengths differ,
            or ``relation`` is unknown.

    Example:
        >>> round(mia_bayes_security_exact(sample_rate=1e-3, noise_multiplier=2.0, steps=50_000), 3)
        0.91
        >>> round(mia_bayes_security_exact(sample_rate=1e-3, noise_multiplier=0.8, steps=50_000), 3)
        0.737
    """
    pld = _composed_mia(sample_rate, noise_multiplier, steps, relation, value_discretization_interval)
    return 1.0 if pld is None else pld.bayes_security()


def mia_tradeoff_curve(
    *,
    sample_rate: Any,
    noise_multiplier: Any,
    steps: Any,
    fpr: Any,
    relation: str = "replace",
    value_discretization_interval: Optional[float] = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> Union[np.ndarray, float]:
    """Tightest valid upper bound on a membership attack's TPR at each FPR (the trade-off curve of DP-SGD).

    Any test between the outputs of neighbouring datasets of a mechanism with privacy profile δ(ε) satisfies,
    for every ε ≥ 0, TPR ≤ e^ε·FPR + δ(ε) and TPR ≤ 1 − e^{−ε}(1 − δ(ε) − FPR); the minimum over ε is the
    mechanism's trade-off curve (its f-DP function). It is computed from the composed pessimistic PLD of
    :func:`mia_bayes_security_exact`, whose minimum over ε is attained at one of its atoms and evaluated there
    exactly, so the result is never below the true curve (a valid bound) and never above Proposition 9's line
    TPR ≤ 1 + FPR − β* (the ε = 0 term, with β* from :func:`mia_bayes_security_exact`). At low FPR it is
    far tighter: p = 0.02, σ = 1.5, 1,000 steps give 0.0126 / 0.070 / 0.334 at FPR 0.001 / 0.01 / 0.1, where
    Proposition 9 gives 0.331 / 0.340 / 0.430.

    For ``"add_remove"`` the pair is not symmetric: the first inequality uses δ of (with the target ‖ without)
    and the second δ of (without ‖ with) — dp_accounting's remove and add distributions — i.e. the curve of the
    membership game in which a positive means "the target was in the training set". ``"replace"`` is symmetric.

    Args:
        sample_rate: Poisson sampling rate p, in (0, 1]; scalar or one per segment.
        noise_multiplier: σ > 0; scalar or one per segment.
        steps: whole number of optimizer steps ≥ 0; scalar or one per segment.
        fpr: false-positive rate(s) in [0, 1]; scalar or 1-D array.
        relation: ``"replace"`` or ``"add_remove"``.
        value_discretization_interval: PLD grid spacing, or ``None`` for the automatic grid.

    Returns:
        The TPR bound(s), each in [fpr, 1]: a float for a scalar ``fpr``, else an array of its shape.

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range, segment lengths differ or ``relation`` is unknown.

    Example:
        >>> tpr = mia_tradeoff_curve(sample_rate=0.02, noise_multiplier=1.5, steps=1000, fpr=[0.001, 0.01, 0.1])
        >>> [round(float(t), 4) for t in tpr]
        [0.0126, 0.0702, 0.3336]
        >>> beta = mia_bayes_security_exact(sample_rate=0.02, noise_multiplier=1.5, steps=1000)
        >>> round(tpr_upper_bound(bayes_security=beta, fpr=0.001), 3)  # Proposition 9
        0.331
    """
    alpha = real_array("fpr", fpr)
    if np.any((alpha < 0.0) | (alpha > 1.0)):
        raise ValueError(f"Expected argument `fpr` to be in [0, 1], but got {fpr!r}.")
    pld = _composed_mia(sample_rate, noise_multiplier, steps, relation, value_discretization_interval)
    if pld is None:  # no step: no test beats guessing
        return float(alpha) if alpha.ndim == 0 else alpha.copy()
    return pld.tpr_bound(alpha)


def _ai_arguments(sample_rate: Any, noise_multiplier: Any, max_grad_norm: Any, sensitivities: Any, steps: Any):
    """Validated (p, σ, R, counts, C) of the attribute-inference functions, or None for no entries."""
    c = real_array("max_grad_norm", max_grad_norm)
    if c.ndim != 0 or not float(c) > 0.0:
        raise ValueError(f"Expected argument `max_grad_norm` to be a scalar > 0, but got {max_grad_norm!r}.")
    c = float(c)
    r = real_array("sensitivities", sensitivities)
    if r.ndim != 1:
        raise ValueError(
            f"Expected argument `sensitivities` to be a 1-D sequence (one R_t per step), but got {sensitivities!r}."
        )
    if np.any(r < 0.0):
        raise ValueError(f"Expected argument `sensitivities` to be >= 0, but got {sensitivities!r}.")
    if steps is None:
        counts = np.ones_like(r)
    else:
        counts = real_array("steps", steps)
        if counts.ndim != 1 or counts.shape != r.shape:
            raise ValueError(
                f"Expected argument `steps` to have one entry per sensitivity ({r.shape[0]}), but got {steps!r}."
            )
    for name, value in (("sample_rate", sample_rate), ("noise_multiplier", noise_multiplier)):
        arr = real_array(name, value)
        if arr.ndim == 1 and arr.shape != r.shape:
            raise ValueError(
                f"Expected argument `{name}` to be a scalar or have one entry per sensitivity ({r.shape[0]}), "
                f"but got {arr.shape[0]} entries: {value!r}."
            )
    if r.shape[0] == 0:
        return None
    p, sigma, counts = _segments(sample_rate, noise_multiplier, counts)
    cap = 2.0 * c * np.sqrt(counts)
    # Tolerate float round-off in caller-side norms (relative 1e-9); anything beyond is an error.
    bad = r > cap * (1.0 + 1e-9)
    if np.any(bad):
        i = int(np.argmax(bad))
        what = "2*max_grad_norm" if steps is None else "2*max_grad_norm*sqrt(steps)"
        raise ValueError(
            f"Expected every entry of `sensitivities` to be <= {what} = {cap[i]:.6g} (clipped gradients differ by "
            f"at most 2C), but got {r[i]!r} at index {i}; were the gradients clipped to max_grad_norm={max_grad_norm!r}?"
        )
    return p, sigma, r, counts, c


def ai_bayes_security(
    *,
    sample_rate: Any,
    noise_multiplier: Any,
    max_grad_norm: float,
    sensitivities: Any,
    steps: Any = None,
) -> float:
    """Approximate Bayes security of DP-SGD against attribute inference (data-dependent closed form).

    Cherubin et al. (2024), Corollary 10 / Algorithm 4:
    β*_AI ≈ 1 − erf(√(Σₜ (pₜ·Rₜ/σₜ)²) / (2√2·C)), where Rₜ is the largest distance, over the records of
    batch t, between clipped per-example gradients of the same record with its sensitive attribute set
    to two different values. With constant p and σ this is the paper's 1 − erf(p‖R‖/(2√2σC)).
    Since Rₜ ≤ 2C the result is ≥ :func:`mia_bayes_security`, with equality when every Rₜ = 2C.

    Rₜ computed with the approximate diameter (2·maxₐ‖ḡₐ − mean‖, Section 5.4) is an upper bound on the
    exact one, so the β*_AI it gives is a lower (safe-side) bound on the exact-diameter β*_AI.

    The value depends on the training data; publishing it can leak membership (Section 5.3).

    Args:
        sample_rate: Poisson sampling rate, in (0, 1]; scalar or one per entry of ``sensitivities``.
        noise_multiplier: σ > 0; scalar or one per entry of ``sensitivities``.
        max_grad_norm: clipping norm C > 0.
        sensitivities: 1-D sequence of Rₜ ≥ 0, one per step, each ≤ 2C. With ``steps`` given, entry i
            instead aggregates ``steps[i]`` steps as √(Σ Rₜ²) over them and must be ≤ 2C·√steps[i].
        steps: optional number of steps aggregated by each entry of ``sensitivities``.

    Returns:
        β*_AI in [0, 1] (1.0 for no steps or all-zero sensitivities).

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If a value is out of range (including Rₜ > 2C) or lengths differ.

    Example:
        >>> ai = ai_bayes_security(sample_rate=0.01, noise_multiplier=1.0, max_grad_norm=1.0,
        ...                        sensitivities=[0.5] * 1000)
        >>> mia = mia_bayes_security(sample_rate=0.01, noise_multiplier=1.0, steps=1000)
        >>> round(ai, 4), round(mia, 4)
        (0.937, 0.7518)
    """
    args = _ai_arguments(sample_rate, noise_multiplier, max_grad_norm, sensitivities, steps)
    if args is None:
        return 1.0
    p, sigma, r, _, c = args
    x = math.sqrt(float(np.sum((p * r / sigma) ** 2))) / (2.0 * math.sqrt(2.0) * c)
    return float(special.erfc(x))


def _check_levels(levels: Any) -> np.ndarray:
    arr = real_array("levels", levels)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"Expected argument `levels` to be a non-empty 1-D sequence, but got {levels!r}.")
    if not (np.all(np.diff(arr) > 0.0) and arr[0] >= MIN_SENSITIVITY_LEVEL and arr[-1] == 1.0):
        raise ValueError(
            f"Expected argument `levels` to increase strictly from a value >= {MIN_SENSITIVITY_LEVEL:g} to exactly 1.0 "
            "(units of 2C), "
            f"but got {levels!r}."
        )
    return arr


def _per_step_sensitivity(r: np.ndarray, c: float, aggregated: bool) -> np.ndarray:
    """R_t/(2C) of every step of each entry; an aggregate √(Σ R_t²) bounds each of its R_t (and 2C does)."""
    bound = np.minimum(r, 2.0 * c) if aggregated else r
    return np.minimum(bound / (2.0 * c), 1.0)  # > 1 only by the round-off tolerated in _ai_arguments


def _round_up(s: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the smallest level ≥ s (−1 for s = 0: a step that cannot leak)."""
    idx = np.searchsorted(levels, s, side="left")
    return np.where(s > 0.0, np.minimum(idx, levels.size - 1), -1)


def sensitivity_levels(
    sensitivities: Any,
    *,
    max_grad_norm: float,
    steps: Any = None,
    levels: Any = DEFAULT_SENSITIVITY_LEVELS,
) -> Tuple[np.ndarray, np.ndarray]:
    """Round per-step attribute sensitivities R_t *up* onto a grid of levels and count the steps per level.

    The helper behind :func:`ai_bayes_security_exact`, for monitors that compose incrementally: compose the
    returned levels as ``ComposedPLD.compose(sample_rate=p, noise_multiplier=σ, steps=counts,
    sensitivity=levels)`` (one segment per level). A level ≥ R_t/(2C) describes a step at least as leaky
    (its two outputs differ by more), so the composition is a safe-side bound; steps with R_t = 0 cannot leak
    and are left out.

    Args:
        sensitivities: 1-D sequence of R_t ≥ 0, one per step, each ≤ 2C. With ``steps`` given, entry i
            aggregates ``steps[i]`` steps as √(Σ R_t²) (the convention of :func:`ai_bayes_security`); each
            of those steps is then bounded by min(2C, entry), which is safe but loose — prefer per-step values.
        max_grad_norm: clipping norm C > 0.
        steps: optional number of steps aggregated by each entry of ``sensitivities``.
        levels: increasing levels in (0, 1] ending at 1.0, in units of 2C (default
            :data:`DEFAULT_SENSITIVITY_LEVELS`, 128 per factor of two).

    Returns:
        ``(values, counts)``: the levels used (increasing, in units of 2C) and the number of steps at each.

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If a value is out of range (including R_t > 2C) or lengths differ.

    Example:
        >>> values, counts = sensitivity_levels([2.0, 1.0, 0.99, 0.0, 2.0], max_grad_norm=1.0)
        >>> values.round(4).tolist(), counts.tolist()  # 0.99/2 = 0.495 is rounded up to 2^(-129/128)
        ([0.4973, 0.5, 1.0], [1, 1, 2])
    """
    args = _ai_arguments(1.0, 1.0, max_grad_norm, sensitivities, steps)
    grid = _check_levels(levels)
    if args is None:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    _, _, r, counts, c = args
    if steps is not None and np.any(counts != np.round(counts)):
        raise ValueError(f"Expected argument `steps` to be whole numbers of optimizer steps, but got {steps!r}.")
    idx = _round_up(_per_step_sensitivity(r, c, steps is not None), grid)
    totals = np.bincount(idx[idx >= 0], weights=counts[idx >= 0], minlength=grid.size)
    used = np.nonzero(totals > 0)[0]
    return grid[used].copy(), np.rint(totals[used]).astype(np.int64)


def ai_bayes_security_exact(
    *,
    sample_rate: Any,
    noise_multiplier: Any,
    max_grad_norm: float,
    sensitivities: Any,
    steps: Any = None,
    levels: Any = DEFAULT_SENSITIVITY_LEVELS,
    value_discretization_interval: Optional[float] = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Bayes security against attribute inference from the composed PLD over the measured sensitivities.

    Issue 14's exact counterpart of :func:`ai_bayes_security` (Cherubin et al. 2024, Cor. 10):
    β*_AI = 1 − δ(ε = 0) of the composition of the per-step mechanisms, step t being the Poisson-subsampled
    Gaussian whose two neighbouring outputs differ by R_t — dp_accounting's ``REPLACE_ONE`` pair with
    sensitivity R_t/2 (in units of σC), i.e. :class:`~lightning_privacy.analysis.composition.ComposedPLD`
    with ``sensitivity = R_t/(2C)``. Steps differ, so each R_t/(2C) is rounded *up* onto ``levels``
    (:func:`sensitivity_levels`) and each level is self-composed by its count; rounding up only adds
    leakage. With every R_t = 2C this is :func:`mia_bayes_security_exact`.

    Cost: one discretised step per distinct (p, σ, level) — about 1-5 ms each, cached — plus ≈ 2·log₂(count)
    small convolutions per level and one per level onto the composition; a run whose R_t span one octave uses
    at most 128 levels. Rounding moves each R_t up by < 0.55 %.

    Model caveat: this pair puts the two gradients of the record symmetrically about the rest of the batch
    (±R_t/2), as issue 14 specifies. Clipped gradients usually have norm C; two of norm C at distance R_t < 2C
    (or, e.g., C and 0) give a leakier pair for the same R_t — at p = 0.05, σ = 1, 400 steps, R_t = C, the
    pair (C, 0) alone gives β* ≈ 0.542 against 0.618 here. So for R_t < 2C this value is the exact β*_AI of
    the symmetric model, not a bound over every gradient configuration; :func:`mia_bayes_security_exact` is.

    Args:
        sample_rate: Poisson sampling rate, in (0, 1]; scalar or one per entry of ``sensitivities``.
        noise_multiplier: σ > 0; scalar or one per entry of ``sensitivities``.
        max_grad_norm: clipping norm C > 0.
        sensitivities: 1-D sequence of Rₜ ≥ 0, one per step, each ≤ 2C. With ``steps`` given, entry i
            aggregates ``steps[i]`` steps as √(Σ Rₜ²) and must be ≤ 2C·√steps[i]; every step of the entry is
            then bounded by min(2C, entry) (safe, but loose: prefer per-step values).
        steps: optional whole number of steps aggregated by each entry of ``sensitivities``.
        levels: sensitivity levels in units of 2C (see :func:`sensitivity_levels`).
        value_discretization_interval: PLD grid, or ``None`` for the automatic grid of the smallest p/σ.

    Returns:
        β*_AI in [0, 1] (1.0 for no steps or all-zero sensitivities).

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If a value is out of range (including Rₜ > 2C) or lengths differ.

    Example:
        Issue 14's case (p = 0.05, σ = 1, 400 steps): the closed form overstates at Rₜ = 2C.

        >>> kw = dict(sample_rate=0.05, noise_multiplier=1.0, max_grad_norm=1.0)
        >>> round(ai_bayes_security(**kw, sensitivities=[2.0] * 400), 4), round(ai_bayes_security_exact(**kw, sensitivities=[2.0] * 400), 4)
        (0.3173, 0.3059)
        >>> round(ai_bayes_security(**kw, sensitivities=[1.0] * 400), 4), round(ai_bayes_security_exact(**kw, sensitivities=[1.0] * 400), 4)
        (0.6171, 0.6179)
    """
    args = _ai_arguments(sample_rate, noise_multiplier, max_grad_norm, sensitivities, steps)
    grid = _check_levels(levels)
    interval = _check_grid(value_discretization_interval)
    if args is None:
        return 1.0
    p, sigma, r, counts, c = args
    if steps is not None and np.any(counts != np.round(counts)):
        raise ValueError(f"Expected argument `steps` to be whole numbers of optimizer steps, but got {steps!r}.")
    idx = _round_up(_per_step_sensitivity(r, c, steps is not None), grid)
    groups: dict = {}
    for rate, sig, level, count in zip(p, sigma, idx, counts):
        if level >= 0 and count > 0:
            key = (float(rate), float(sig), int(level))
            groups[key] = groups.get(key, 0) + int(round(count))
    if not groups:
        return 1.0
    from .composition import ComposedPLD, default_value_discretization_interval

    keys = sorted(groups)
    if interval is None:
        interval = min(
            default_value_discretization_interval(sample_rate=rate, noise_multiplier=sig) for rate, sig, _ in keys
        )
    pld = ComposedPLD(relation="replace", value_discretization_interval=interval)
    pld.compose(
        sample_rate=[k[0] for k in keys],
        noise_multiplier=[k[1] for k in keys],
        steps=[groups[k] for k in keys],
        sensitivity=[float(grid[k[2]]) for k in keys],
    )
    return pld.bayes_security()


def approximation_error(*, sample_rate: Any, noise_multiplier: Any, steps: Any) -> float:
    """Proven bound on the error of the closed forms (Proposition 4 used twice in Theorem 6).

    Appendix A bounds the total variation between one subsampled Gaussian mixture and its Gaussian
    approximation by √(KL/2) with KL ≤ (pT − p²T)/(2σ²), i.e. √(pT(1−p))/(2σ). Theorem 6 applies this
    to both secrets (triangle inequality), so the closed-form β* can exceed the true one by at most

        err = 2·√(pT(1−p))/(2σ) = √(Σᵢ Tᵢ·pᵢ(1−pᵢ)/σᵢ²)   (summing KL over segments).

    This is a *worst-case* bound and is loose: it exceeds 1 (vacuous) for typical training lengths
    (p = 1e-3, σ = 2, 50 epochs gives 3.5) although the measured error there is < 0.001. It is
    returned unclipped so callers can see how vacuous it is; use :func:`mia_bayes_security_exact`
    for a tight check.

    Args:
        sample_rate: Poisson sampling rate, in (0, 1]; scalar or one per segment.
        noise_multiplier: σ > 0; scalar or one per segment.
        steps: optimizer steps ≥ 0; scalar or one per segment.

    Returns:
        The error bound (≥ 0; values ≥ 1 carry no information).

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range or segment lengths differ.

    Example:
        >>> round(approximation_error(sample_rate=1e-3, noise_multiplier=2.0, steps=1_000), 4)
        0.4997
    """
    p, sigma, t = _segments(sample_rate, noise_multiplier, steps)
    return float(math.sqrt(float(np.sum(t * p * (1.0 - p) / sigma**2))))


def noise_multiplier_for(*, target: float, sample_rate: float, steps: float, relation: str = "replace") -> float:
    """Smallest noise multiplier whose closed-form β*_MIA reaches ``target`` (Equation 4).

    Solves Equation 4 of Cherubin et al. (2024), σ = p·√T / (√2·erf⁻¹(1 − β*)) (half of that for
    ``"add_remove"``), rounds *up* to 4 decimals and verifies ``mia_bayes_security(σ) ≥ target``.

    The guarantee is with respect to the closed form, which overstates security for σ < 1; a
    ``UserWarning`` is raised when the result is below 1 (check it with
    :func:`mia_bayes_security_exact`).

    Args:
        target: desired Bayes security, in (0, 1).
        sample_rate: Poisson sampling rate p, in (0, 1].
        steps: number of optimizer steps T > 0 (``epochs / sample_rate`` for whole epochs).
        relation: ``"replace"`` or ``"add_remove"``.

    Returns:
        σ > 0, a multiple of 1e-4.

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range or ``relation`` is unknown.

    Example:
        Purchase-100 in the paper (N = 197,324, L = 512, 20 epochs, β* ≥ 0.9 gives σ ≈ 1.8):

        >>> p = 512 / 197_324
        >>> noise_multiplier_for(target=0.9, sample_rate=p, steps=20 / p)
        1.8128
    """
    relation = _check_relation(relation)
    target = _check_probability("target", target, low_open=True, high_open=True)
    for name, value in (("sample_rate", sample_rate), ("steps", steps)):
        if real_array(name, value).ndim != 0:
            raise TypeError(f"Expected argument `{name}` to be a scalar, but got {value!r}.")
    p, _, t = _segments(sample_rate, 1.0, steps)
    if not float(t[0]) > 0.0:
        raise ValueError(f"Expected argument `steps` to be > 0, but got {steps!r}.")
    factor = 2.0 if relation == "add_remove" else 1.0
    sigma = float(p[0]) * math.sqrt(float(t[0])) / (factor * math.sqrt(2.0) * float(special.erfinv(1.0 - target)))
    scale = 10**_SIGMA_DECIMALS
    sigma = math.ceil(sigma * scale) / scale
    while mia_bayes_security(sample_rate=p[0], noise_multiplier=sigma, steps=t[0], relation=relation) < target:
        sigma = round(sigma + 1.0 / scale, _SIGMA_DECIMALS)
    if sigma < 1.0:
        warnings.warn(
            f"noise_multiplier_for: the planned noise_multiplier={sigma} is below 1, where the closed form "
            "overstates Bayes security (Cherubin et al. 2024, Fig. 4); check it with mia_bayes_security_exact.",
            UserWarning,
            stacklevel=2,
        )
    return sigma


def noise_multiplier_for_exact(
    *,
    target: float,
    sample_rate: float,
    steps: int,
    relation: str = "replace",
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Noise multiplier whose *exact* (pessimistic PLD) β*_MIA reaches ``target``.

    Starts from :func:`noise_multiplier_for` (Equation 4). If the PLD value at that σ already meets
    the target it is returned; otherwise σ is bracketed upwards and bisected to a relative width of
    1e-4, then rounded up to 4 decimals. The result always satisfies
    ``mia_bayes_security_exact(...) >= target`` (checked). Because the PLD is pessimistic this is a
    safe plan even where the closed form overstates security (σ < 1). Costs about 10-20 PLD
    evaluations (seconds) when the closed-form plan falls short.

    Args:
        target: desired Bayes security, in (0, 1).
        sample_rate: Poisson sampling rate p, in (0, 1].
        steps: whole number of optimizer steps T > 0.
        relation: ``"replace"`` or ``"add_remove"``.
        value_discretization_interval: PLD grid spacing (see :func:`mia_bayes_security_exact`).

    Returns:
        σ > 0, a multiple of 1e-4, ≥ the closed-form plan.

    Raises:
        TypeError: If an argument is not numeric.
        ValueError: If an argument is out of range or ``relation`` is unknown.

    Example:
        >>> noise_multiplier_for(target=0.9, sample_rate=0.05, steps=200, relation="add_remove")
        2.8136
        >>> noise_multiplier_for_exact(target=0.9, sample_rate=0.05, steps=200, relation="add_remove",
        ...                            value_discretization_interval=1e-3)
        2.8867
    """
    relation = _check_relation(relation)
    _segments(sample_rate, 1.0, steps, integer_steps=True)  # validates steps as whole numbers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # below-1 warning: this function fixes exactly that
        lo = noise_multiplier_for(target=target, sample_rate=sample_rate, steps=steps, relation=relation)

    def ok(sigma: float) -> bool:
        beta = mia_bayes_security_exact(
            sample_rate=sample_rate,
            noise_multiplier=sigma,
            steps=steps,
            relation=relation,
            value_discretization_interval=value_discretization_interval,
        )
        return beta >= target

    if ok(lo):
        return lo
    hi = lo * 1.02
    while not ok(hi):
        lo, hi = hi, hi * 1.1
    while hi / lo > 1.0 + 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    scale = 10**_SIGMA_DECIMALS
    sigma = math.ceil(hi * scale) / scale
    while not ok(sigma):  # guard against a non-monotone step of the discretised PLD
        sigma = round(sigma + 1.0 / scale, _SIGMA_DECIMALS)
    return sigma


def tpr_upper_bound(*, bayes_security: float, fpr: float, prior: float = 0.5) -> float:
    """Largest true-positive rate any attacker can reach at a given false-positive rate.

    Proposition 9 of Cherubin et al. (2024): TPR ≤ 1 + FPR − β* when the prior π = Pr[member] ≤ 1/2
    (with equality attainable at π = 1/2), and TPR ≤ π/(1−π)·(1 + FPR − β*) otherwise. The result is
    capped at 1, which is itself a valid bound on a rate (not a loosening).

    Args:
        bayes_security: β* in [0, 1].
        fpr: false-positive rate in [0, 1].
        prior: probability π that the target is a member, in (0, 1).

    Returns:
        Upper bound on the TPR, in [0, 1].

    Raises:
        TypeError: If an argument is not a real scalar.
        ValueError: If an argument is out of range.

    Example:
        Figure 7 of the paper (p = 1e-4, σ = 2, 50 epochs): TPR@FPR=0.1 ≤ 0.128, TPR@0.01 ≤ 0.038.

        >>> b = mia_bayes_security(sample_rate=1e-4, noise_multiplier=2.0, steps=500_000)
        >>> round(tpr_upper_bound(bayes_security=b, fpr=0.1), 3), round(tpr_upper_bound(bayes_security=b, fpr=0.01), 3)
        (0.128, 0.038)
    """
    beta = _check_probability("bayes_security", bayes_security, low_open=False, high_open=False)
    fpr = _check_probability("fpr", fpr, low_open=False, high_open=False)
    prior = _check_probability("prior", prior, low_open=True, high_open=True)
    bound = 1.0 + fpr - beta
    if prior > 0.5:
        bound *= prior / (1.0 - prior)
    return float(min(1.0, bound))


def epsilon_estimate(*, bayes_security: float, delta: float) -> float:
    """Rough ε implied by a Bayes security value (Section 4.2.1; loose, for orientation only).

    From Humphries et al.'s bound Adv ≤ (e^ε − 1 + 2δ)/(e^ε + 1) with Adv = 1 − β*, any (ε, δ)-DP
    guarantee consistent with β* needs ε ≥ log((2 − 2δ − β*)/β*). This is a *lower* estimate of ε
    and the paper calls it loose; it is not an accountant. Returns 0.0 when δ alone explains the
    advantage (β* ≥ 1 − δ; ε ≥ 0 always) and ``inf`` for β* = 0.

    Args:
        bayes_security: β* in [0, 1].
        delta: δ in [0, 1).

    Returns:
        ε ≥ 0 (possibly ``inf``).

    Raises:
        TypeError: If an argument is not a real scalar.
        ValueError: If an argument is out of range.

    Example:
        >>> round(epsilon_estimate(bayes_security=0.9, delta=1e-5), 4)
        0.2007
    """
    beta = _check_probability("bayes_security", bayes_security, low_open=False, high_open=False)
    delta = _check_probability("delta", delta, low_open=False, high_open=True)
    if beta == 0.0:
        return math.inf
    return float(max(0.0, math.log((2.0 - 2.0 * delta - beta) / beta)))

"""Incrementally composed, pessimistic privacy-loss distributions (PLDs) of DP-SGD.

Pure math (numpy/scipy; no torch). :class:`ComposedPLD` keeps the privacy-loss distribution of every
Poisson-subsampled Gaussian step taken so far and composes new steps onto it, so the exact Bayes security
β* = 1 − δ(ε = 0) (Cherubin et al. 2024, Prop. 8), δ(ε), ε(δ) and the tight trade-off curve (TPR bound at
each FPR) of the composed mechanism cost one convolution per update instead of a recomposition of the whole
history. Composition is associative, so the composed PLD of ``a`` chunks then ``b`` chunks is the PLD of all
``a + b`` steps — exactly in arithmetic, and up to the safety allowances below in floating point: composing one
chunk per read moved ε by up to +3.4e-5 against one chunk for the run (``benchmarks/results/accountant_accuracy.md``),
so the ledger composes one chunk per run of steps at one (σ, p), whenever it is read
(:class:`~lightning_privacy.ledger.PLDAccountant`). The k-fold self-composition of one step is a function of k alone
(cached squares, one product per set bit of k).

Every number is on the safe side: δ(ε) and TPR bounds are upper bounds, β* and ε(δ)'s privacy are lower
bounds, for the neighbouring relation's worst-case pair, including discretisation, tail truncation and
floating-point round-off:

- **Discretisation** (connect-the-dots, Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, *Connect the Dots:
  Tighter Discrete Approximations of Privacy Loss Distributions*, PETS 2022). The privacy loss of one step
  is a decreasing function of the output x; the losses of every interval between two grid points
  ε_k < ε_{k+1} are replaced by two atoms at ε_k and ε_{k+1} carrying the interval's P- and Q-mass. The pair
  of two-atom distributions dominates (is Blackwell-more-informative than) the interval's pair, so the
  discretised pair dominates the mechanism: its δ equals the true δ at every grid point, is the chord in e^ε
  between them (true δ is convex in e^ε) and stays an upper bound under any composition. Unlike
  dp_accounting's implementation (second differences of δ, whose round-off at fine grids adds up to 1e-7
  spurious mass per step), the interval masses are computed from Gaussian tail functions with relative
  precision, so the round-off is ≈ 1e-11 of mass per step, and the construction is vectorised.
- **Truncation** only moves mass towards larger losses (the far left tail onto the first kept atom, the far
  right tail to +∞): δ(ε) can only grow. One step drops at most 1e-16 from each tail, a convolution of the
  stored PLD 5e-13, a self-composed chunk of m steps m·(log₂m + 1)·1e-18 (2e-11 at 10⁶ steps), and losses beyond
  ±:data:`LOSS_CAP` = 50 are moved to ±50 or +∞ (a PLD has P[L ≤ −50] ≤ e^{−50}; mass above 50 changes δ(ε)
  by < e^{ε−50}); so :meth:`ComposedPLD.epsilon` is ``inf`` where ε(δ) is about 50 or more, and
  :meth:`ComposedPLD.epsilon_uncapped` recomposes the history with a wider cap there.
- **Round-off** of each FFT convolution is bounded after Higham (*Accuracy and Stability of Numerical
  Algorithms*, 2nd ed., §24.1): ‖ĉ − c‖₁ ≤ √L·‖ĉ − c‖₂ ≤ 16·u·√L·log₂L·(‖a‖₂ + ‖b‖₂) for FFT length L
  and unit round-off u; that mass is added at +∞. Negative round-off values are set to 0 (adds mass).
  Sums in the queries add n·u-sized allowances. These amount to ≲ 1e-9 over 10⁶ steps.

Grid. ``value_discretization_interval=None`` (the default) chooses the grid from the first composed chunk:
one tenth of the per-step Gaussian distance μ₁ = 2p/σ (p/σ for add/remove), rounded down onto 1-2-5 steps
and clipped to [1e-5, 1e-3] (:func:`default_value_discretization_interval`). Connect-the-dots' error grows
with the grid relative to the spread of one step's privacy loss, so a grid proportional to μ₁ keeps the
error of β* below ≈ 5e-4 against a 10× finer grid at every p and σ, at a support of ≈ 100·√T points after
T steps. At p = 0.01, σ = 1 (grid 1e-3, 100 steps per epoch, 50 epochs) one epoch's update costs ≈ 1.5 ms
on one core (``benchmarks/bayes_security_vs_pld.py``). A grid chosen from the first chunk stays fixed: a
run whose σ later grows or p shrinks a lot gets safe but looser values unless it passes a finer grid.

Example:
    >>> pld = ComposedPLD()
    >>> for epoch in range(20):
    ...     _ = pld.compose(sample_rate=0.05, noise_multiplier=1.0, steps=20)
    >>> pld.steps, round(pld.bayes_security(), 4)
    (400, 0.3059)
    >>> round(pld.bayes_security_after(sample_rate=0.05, noise_multiplier=1.0, steps=20), 4)
    0.2941
    >>> [round(float(t), 3) for t in pld.tpr_bound([0.001, 0.01, 0.1])]  # Proposition 9: 0.695, 0.704, 0.794
    [0.151, 0.392, 0.778]
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import fft as sp_fft
from scipy import optimize, special

from ._checks import expect_choice, expect_real, real_array

__all__ = ["ComposedPLD", "LOSS_CAP", "WIDER_LOSS_CAPS", "default_value_discretization_interval"]

#: Privacy losses are kept in [−LOSS_CAP, LOSS_CAP]; larger ones go to +∞, smaller ones are raised to −LOSS_CAP.
LOSS_CAP = 50.0
#: The wider loss caps :meth:`ComposedPLD.epsilon_uncapped` tries, in order, where ε(δ) is beyond :data:`LOSS_CAP`
#: (e^ε must stay finite in double precision: it overflows past 709.78).
WIDER_LOSS_CAPS = (200.0, 700.0)
_WIDE_POINTS = 100_000  # the wider grid is cap / _WIDE_POINTS: at most 2·_WIDE_POINTS + 1 atoms in [−cap, cap]
#: Grid bounds of the automatic choice (:func:`default_value_discretization_interval`).
MIN_VALUE_DISCRETIZATION_INTERVAL = 1e-5
MAX_VALUE_DISCRETIZATION_INTERVAL = 1e-3
# Mass dropped from each tail of one step's distribution (moved to +∞ or onto the first kept atom).
_STEP_TAIL_MASS = 2e-16
# Mass truncated from the two tails of the stored PLD per convolution (split between the tails).
_TAIL_MASS = 1e-12
# Mass truncated per step of a self-composed piece (a square or product of m steps drops ≤ m times this).
_PIECE_TAIL = 1e-18
_U = float(np.finfo(float).eps)
_RELATIONS = ("replace", "add_remove")

_Number = Union[int, float]


# --------------------------------------------------------------------------------------------------
# grid
# --------------------------------------------------------------------------------------------------
def default_value_discretization_interval(*, sample_rate: float, noise_multiplier: float, relation: str = "replace"):
    """The grid :class:`ComposedPLD` picks when none is given: μ₁/10 on 1-2-5 steps, within [1e-5, 1e-3].

    μ₁ = 2p/σ (``"replace"``; p/σ for ``"add_remove"``) is the per-step distance of the closed form
    (Cherubin et al. 2024, Cor. 7); the connect-the-dots error of β* is ≲ 5e-4 for grids ≤ μ₁/10 (measured
    against a 10× finer grid for p ∈ [1e-3, 0.5], σ ∈ [0.3, 5], up to 10⁶ steps).

    Args:
        sample_rate: Poisson sampling rate p, in (0, 1].
        noise_multiplier: σ > 0.
        relation: ``"replace"`` or ``"add_remove"``.

    Returns:
        The privacy-loss grid spacing.

    Raises:
        TypeError: If an argument is not a real number.
        ValueError: If an argument is out of range.

    Example:
        >>> default_value_discretization_interval(sample_rate=0.01, noise_multiplier=1.0)
        0.001
        >>> default_value_discretization_interval(sample_rate=1e-3, noise_multiplier=2.0)
        0.0001
        >>> default_value_discretization_interval(sample_rate=1e-3, noise_multiplier=5.0)
        2e-05
    """
    relation = _check_relation(relation)
    p = _scalar("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
    sigma = _scalar("noise_multiplier", noise_multiplier, low=0.0, high=math.inf, low_open=True, high_open=True)
    mu = (2.0 if relation == "replace" else 1.0) * p / sigma
    target = mu / 10.0
    if target >= MAX_VALUE_DISCRETIZATION_INTERVAL:
        return MAX_VALUE_DISCRETIZATION_INTERVAL
    exponent = math.floor(math.log10(target))
    for mantissa in (5, 2, 1):
        value = float(f"{mantissa}e{exponent}")
        if value <= target:
            return max(value, MIN_VALUE_DISCRETIZATION_INTERVAL)
    return max(float(f"5e{exponent - 1}"), MIN_VALUE_DISCRETIZATION_INTERVAL)  # pragma: no cover - rounding edge


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------
def _check_relation(relation: Any) -> str:
    return expect_choice("relation", relation, _RELATIONS)


_scalar = expect_real


def _check_grid(value: Any) -> Optional[float]:
    if value is None:
        return None
    return _scalar("value_discretization_interval", value, low=0.0, high=1.0, low_open=True)


def _segment_arrays(sample_rate: Any, noise_multiplier: Any, steps: Any, sensitivity: Any):
    """Validate and broadcast one or more segments to four equal-length 1-D arrays."""
    named = {
        "sample_rate": sample_rate,
        "noise_multiplier": noise_multiplier,
        "steps": steps,
        "sensitivity": sensitivity,
    }
    arrays = {name: real_array(name, value) for name, value in named.items()}
    lengths = {k: a.shape[0] for k, a in arrays.items() if a.ndim == 1}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "Expected `sample_rate`, `noise_multiplier`, `steps` and `sensitivity` to be scalars or 1-D sequences "
            f"of one length (one entry per segment), but got lengths {lengths}."
        )
    n = next(iter(lengths.values())) if lengths else 1
    p, sigma, t, s = (np.broadcast_to(arrays[k], (n,)) for k in named)
    if np.any((p <= 0.0) | (p > 1.0)):
        raise ValueError(f"Expected argument `sample_rate` to be in (0, 1], but got {sample_rate!r}.")
    if np.any(sigma <= 0.0):
        raise ValueError(f"Expected argument `noise_multiplier` to be > 0, but got {noise_multiplier!r}.")
    if np.any((t < 0.0) | (t != np.round(t))):
        raise ValueError(f"Expected argument `steps` to be whole numbers >= 0, but got {steps!r}.")
    if np.any((s < 0.0) | (s > 1.0)):
        raise ValueError(
            "Expected argument `sensitivity` to be in [0, 1] (in units of the full per-step sensitivity: 2C for "
            f"replace, C for add/remove), but got {sensitivity!r}."
        )
    return [(float(a), float(b), int(c), float(d)) for a, b, c, d in zip(p, sigma, t, s)]


# --------------------------------------------------------------------------------------------------
# dense PMFs on the grid
# --------------------------------------------------------------------------------------------------
class _Pmf:
    """P-distribution of the privacy loss on grid points (offset + i)·Δ, plus a mass at +∞ (read-only)."""

    __slots__ = ("offset", "probs", "inf", "finite", "_suffix")

    def __init__(self, offset: int, probs: np.ndarray, inf: float):
        probs = np.ascontiguousarray(probs, dtype=float)
        probs.flags.writeable = False
        self.offset = int(offset)
        self.probs = probs
        self.inf = float(inf)
        self.finite = float(probs.sum())
        self._suffix = None

    @property
    def mass(self) -> float:
        return self.finite + self.inf

    def suffix(self, interval: float):
        """Grid losses and suffix sums S1[j] = Σ_{i≥j} p_i, S2[j] = Σ_{i≥j} p_i·e^{−L_i} (S1[n] = S2[n] = 0)."""
        if self._suffix is None:
            n = self.probs.size
            losses = (self.offset + np.arange(n)) * interval
            s1 = np.zeros(n + 1)
            s2 = np.zeros(n + 1)
            s1[:-1] = np.cumsum(self.probs[::-1])[::-1]
            s2[:-1] = np.cumsum((self.probs * np.exp(-losses))[::-1])[::-1]
            self._suffix = (losses, s1, s2)
        return self._suffix


def _trim(offset: int, probs: np.ndarray, inf: float, cap: int, tail: float) -> _Pmf:
    """Pessimistic clean-up: negatives to 0, losses > cap and a right tail of mass ≤ tail/2 to +∞, losses < −cap
    and a left tail of mass ≤ tail/2 onto the first kept atom (mass only ever moves to larger losses)."""
    probs = np.maximum(probs, 0.0)
    n = probs.size
    keep = min(n, cap - offset + 1)  # indices ≥ keep have loss > cap
    if keep <= 0:
        return _Pmf(cap, np.zeros(1), inf + float(probs.sum()))
    if keep < n:
        inf += float(probs[keep:].sum())
        probs = probs[:keep]
    low = -cap - offset  # indices < low have loss < −cap
    if low >= probs.size:
        return _Pmf(-cap, np.array([float(probs.sum())]), inf)
    if low > 0:
        moved = float(probs[:low].sum())
        probs = probs[low:].copy()
        probs[0] += moved
        offset += low
    n = probs.size
    if tail > 0.0 and n > 1:
        half = tail / 2.0
        left = min(int(np.searchsorted(np.cumsum(probs), half, side="right")), n - 1)
        right = min(int(np.searchsorted(np.cumsum(probs[::-1]), half, side="right")), n - 1 - left)
        if right > 0:
            inf += float(probs[n - right :].sum())
        if left > 0:
            moved = float(probs[:left].sum())
            probs = probs[left : n - right].copy()
            probs[0] += moved
            offset += left
        elif right > 0:
            probs = probs[: n - right]
    return _Pmf(offset, probs, inf)


_LONG = np.longdouble
_U_LONG = float(np.finfo(_LONG).eps)  # 2^−64 with x87 extended precision; = _U where long double is double


def _fft_roundoff(size: int, a: np.ndarray, b: np.ndarray, unit: float = _U) -> float:
    """Bound on the ℓ1 round-off of an FFT convolution of length ``size`` (see the module docstring)."""
    norms = float(np.linalg.norm(a)) + float(np.linalg.norm(b))
    return 16.0 * unit * math.sqrt(size) * max(1.0, math.log2(size)) * norms


def _convolve(a: _Pmf, b: _Pmf, cap: int, tail: float, precise: bool = False) -> _Pmf:
    """Composition of two PLDs: the distribution of the sum of independent losses (FFT convolution).

    ``precise`` runs the FFT in long double (where the platform has it): used for self-compositions, whose
    round-off is amplified by every later copy of the piece, at ~3× the cost."""
    n = a.probs.size + b.probs.size - 1
    inf = a.inf * b.mass + a.finite * b.inf
    if a.probs.size == 1 or b.probs.size == 1:  # exact: a scaled shift
        out = np.convolve(a.probs, b.probs)
    else:
        size = sp_fft.next_fast_len(n, real=True)
        if precise:
            x, y = a.probs.astype(_LONG), b.probs.astype(_LONG)
            out = sp_fft.irfft(sp_fft.rfft(x, size) * sp_fft.rfft(y, size), size)[:n].astype(float)
            inf += _fft_roundoff(size, a.probs, b.probs, _U_LONG) + _U * a.mass * b.mass  # + rounding to double
        else:
            out = sp_fft.irfft(sp_fft.rfft(a.probs, size) * sp_fft.rfft(b.probs, size), size)[:n]
            inf += _fft_roundoff(size, a.probs, b.probs)
    return _trim(a.offset + b.offset, out, inf, cap, tail)


def _power(key: tuple, base: _Pmf, k: int, cap: int) -> _Pmf:
    """k-fold self-composition of one step's PMF ``base``: the product, lowest bit first, of the squares
    base^(2^i) for the set bits of k. The squares are cached (``key`` names the step) and do not depend on k, so
    the result is a function of (step, k) alone — the PLD of a run of k steps is the same however the run was
    reached — and a read of a growing run costs one product per set bit. A square of m steps is truncated with
    m·:data:`_PIECE_TAIL` and a product of m steps likewise, so the truncated mass of k steps is
    ≤ k·(log₂k + 1)·_PIECE_TAIL (2e-11 at 10⁶ steps)."""
    result: Optional[_Pmf] = None
    held = 0
    for level in range(k.bit_length()):
        if not (k >> level) & 1:
            continue
        square = _square(key, base, level, cap)
        held += 1 << level
        result = square if result is None else _convolve(result, square, cap, _PIECE_TAIL * held)
    return result


def _square(key: tuple, base: _Pmf, level: int, cap: int) -> _Pmf:
    """base^(2^level) by repeated squaring in long double (its round-off is amplified by every later square), cached."""
    if level == 0:
        return base
    hit = _SQUARES.get(key + (level,))
    if hit is not None:
        return hit[0]
    half = _square(key, base, level - 1, cap)
    return _SQUARES.put(key + (level,), (_convolve(half, half, cap, _PIECE_TAIL * 2**level, precise=True),))[0]


# --------------------------------------------------------------------------------------------------
# one Poisson-subsampled Gaussian step, discretised with connect-the-dots
# --------------------------------------------------------------------------------------------------
# Directions (x is the output in units of the noise; P is the distribution the loss is drawn from):
#   "replace": P = (1−q)N(0, σ²) + qN(−s, σ²),  Q = (1−q)N(0, σ²) + qN(s, σ²)   (symmetric)
#   "remove":  P = (1−q)N(0, σ²) + qN(−s, σ²),  Q = N(0, σ²)                     (add/remove, P = with the record)
#   "add":     P = N(0, σ²),                     Q = (1−q)N(0, σ²) + qN(s, σ²)   (add/remove, the other order)
# These are dp_accounting's REPLACE, REMOVE and ADD pairs; the loss L(x) = log P(x)/Q(x) decreases in x.
def _components(direction: str, q: float, s: float, k: int = 1):
    # k records each sampled at rate q: j ~ Binomial(k, q) of them in the step (k = 1: weights 1 − q and q exactly)
    w = [math.comb(k, j) * q**j * (1.0 - q) ** (k - j) for j in range(k + 1)]
    mixture_p = [(w[j], -j * s) for j in range(k + 1)]
    mixture_q = [(w[j], j * s) for j in range(k + 1)]
    single = [(1.0, 0.0)]
    pq = {"replace": (mixture_p, mixture_q), "remove": (mixture_p, single), "add": (single, mixture_q)}[direction]
    return tuple([(w, m) for w, m in comps if w > 0.0] for comps in pq)


def _group_losses(direction: str, x: np.ndarray, q: float, sigma: float, s: float, k: int) -> np.ndarray:
    """The privacy loss at outputs ``x`` of a step with a group of k records (remove or add; decreasing in x)."""
    comps = _components(direction, q, s, k)[0 if direction == "remove" else 1]
    logw = np.log([w for w, _ in comps])[:, None]
    shift = np.array([m for _, m in comps])[:, None]  # remove: −j·s; add: +j·s
    exponents = logw + (2.0 * x[None, :] * shift - shift * shift) / (2.0 * sigma * sigma)
    total = special.logsumexp(exponents, axis=0)
    return total if direction == "remove" else -total


def _inverse_group_loss(direction: str, eps: np.ndarray, q: float, sigma: float, s: float, k: int) -> np.ndarray:
    """x with loss(x) = ε for a group of k records, by bisection on [−span, span] (the loss is decreasing in x); the
    bracket's end where the loss never reaches ε inside it (the caller clips to its tails' range, inside it)."""
    span = 60.0 * sigma + 2.0 * k * s
    lo, hi = np.full(eps.shape, -span), np.full(eps.shape, span)  # loss(lo) ≥ ε ≥ loss(hi) where reached
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not np.any((mid > lo) & (mid < hi)):
            break
        above = _group_losses(direction, mid, q, sigma, s, k) >= eps
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return 0.5 * (lo + hi)


def _inverse_loss(direction: str, eps: np.ndarray, q: float, sigma: float, s: float, k: int = 1) -> np.ndarray:
    """The output x at which the loss equals ε (±inf where the loss never reaches ε)."""
    if k > 1:
        return _inverse_group_loss(direction, eps, q, sigma, s, k)
    v = sigma * sigma / s
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if direction == "replace":  # x = v·(−asinh(α·sinh(ε/2)) − ε/2), α = (1−q)/q·exp(s²/2σ²), in logs (α overflows)
            log_alpha = (math.log1p(-q) if q < 1.0 else -math.inf) - math.log(q) + s * s / (2.0 * sigma * sigma)
            half = np.abs(eps) / 2.0
            log_y = log_alpha + half + np.log1p(-np.exp(-2.0 * half)) - math.log(2.0)  # log |α·sinh(ε/2)|
            small = np.arcsinh(np.exp(np.minimum(log_y, 20.0)))
            large = log_y + np.log1p(np.sqrt(1.0 + np.exp(-2.0 * np.maximum(log_y, 20.0))))
            return v * (-np.sign(eps) * np.where(log_y < 20.0, small, large) - eps / 2.0)
        if direction == "remove":  # e^L = 1 − q + q·exp(−(2xs + s²)/2σ²), L > log(1 − q)
            arg = np.expm1(eps) + q
            return np.where(arg > 0.0, -v * (np.log(np.where(arg > 0, arg, 1.0)) - math.log(q)) - s / 2.0, np.inf)
        arg = np.expm1(-eps) + q  # "add": e^{−L} = 1 − q + q·exp((2xs − s²)/2σ²), L < −log(1 − q)
        return np.where(arg > 0.0, v * (np.log(np.where(arg > 0, arg, 1.0)) - math.log(q)) + s / 2.0, -np.inf)


def _loss(direction: str, x: float, q: float, sigma: float, s: float, k: int = 1) -> float:
    p_comps, q_comps = _components(direction, q, s, k)
    logpdf = lambda comps: special.logsumexp(
        [-((x - m) ** 2) / (2 * sigma * sigma) for _, m in comps], b=[w for w, _ in comps]
    )
    return float(logpdf(p_comps) - logpdf(q_comps))


def _gauss_interval(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """P(lo < Z ≤ hi) for a standard normal Z, with relative precision in both tails."""
    left = special.ndtr(hi) - special.ndtr(lo)
    right = special.ndtr(-lo) - special.ndtr(-hi)
    return np.maximum(np.where(lo >= 0.0, right, left), 0.0)


def _interval_mass(comps, lo: np.ndarray, hi: np.ndarray, sigma: float) -> np.ndarray:
    return sum(w * _gauss_interval((lo - m) / sigma, (hi - m) / sigma) for w, m in comps)


def _log_tail(comps, x: float, sigma: float, left: bool) -> float:
    sign = 1.0 if left else -1.0
    return float(
        special.logsumexp([special.log_ndtr(sign * (x - m) / sigma) for _, m in comps], b=[w for w, _ in comps])
    )


def _single_step(direction: str, q: float, sigma: float, s: float, interval: float, cap: int, k: int = 1) -> _Pmf:
    """Connect-the-dots PMF of one step's privacy loss (pessimistic; see the module docstring); ``k`` > 1: of a
    group of k records, each sampled independently (remove / add only)."""
    if s == 0.0:
        return _Pmf(0, np.ones(1), 0.0)
    p_comps, q_comps = _components(direction, q, s, k)
    target = math.log(_STEP_TAIL_MASS / 2.0)
    span = 60.0 * sigma + 2.0 * k * s
    x_left = optimize.brentq(lambda x: _log_tail(p_comps, x, sigma, True) - target, -span, span, xtol=1e-12)
    x_right = optimize.brentq(lambda x: _log_tail(p_comps, x, sigma, False) - target, -span, span, xtol=1e-12)
    # grid range with one spare point on each side, so that rounding in the losses cannot leave the end points
    # inside the range of losses (they must bracket L(x_right) … L(x_left))
    k_lo = max(math.floor(_loss(direction, x_right, q, sigma, s, k) / interval) - 1, -cap)
    k_hi = max(min(math.ceil(_loss(direction, x_left, q, sigma, s, k) / interval) + 1, cap), k_lo + 1)
    eps = np.arange(k_lo, k_hi + 1) * interval
    xs = np.clip(_inverse_loss(direction, eps, q, sigma, s, k), x_left, x_right)  # non-increasing in k
    if k_lo > -cap:  # ε_{k_lo} < L(x_right): every output up to x_right has a loss above ε_{k_lo}
        xs[0] = x_right
    if k_hi < cap:  # ε_{k_hi} > L(x_left)
        xs[-1] = x_left
    lo_x, hi_x = xs[1:], xs[:-1]
    a = _interval_mass(p_comps, lo_x, hi_x, sigma)  # P-mass of losses in (ε_k, ε_{k+1}]
    b = _interval_mass(q_comps, lo_x, hi_x, sigma)  # Q-mass of the same outputs
    # Two atoms at ε_k, ε_{k+1} with P-masses (low, a − low) and Q-masses (low·e^{−ε_k}, (a − low)·e^{−ε_{k+1}}).
    low = (b * np.exp(eps[:-1]) - a * math.exp(-interval)) / -math.expm1(-interval)
    low = np.clip(low, 0.0, a)
    probs = np.zeros(eps.size)
    probs[:-1] += low
    probs[1:] += a - low
    # outputs beyond x_right (losses below the first interval) move up to ε_{k_lo + 1}, beyond x_left to +∞
    probs[1] += float(_interval_mass(p_comps, np.array([xs[0]]), np.array([np.inf]), sigma)[0])
    inf = float(_interval_mass(p_comps, np.array([-np.inf]), np.array([xs[-1]]), sigma)[0])
    return _trim(k_lo, probs, inf, cap, 0.0)


class _LRU:
    """A small LRU cache of PMFs bounded by entries and by total array size."""

    def __init__(self, entries: int, elements: int):
        self.entries, self.elements = entries, elements
        self.data: OrderedDict[tuple, Tuple[_Pmf, ...]] = OrderedDict()

    def get(self, key):
        value = self.data.get(key)
        if value is not None:
            self.data.move_to_end(key)
        return value

    def put(self, key, value):
        self.data[key] = value
        size = lambda v: sum(p.probs.size for p in v)
        while len(self.data) > 1 and (
            len(self.data) > self.entries or sum(size(v) for v in self.data.values()) > self.elements
        ):
            self.data.popitem(last=False)
        return value


_STEPS = _LRU(entries=128, elements=8_000_000)
_POWERS = _LRU(entries=32, elements=8_000_000)
_SQUARES = _LRU(entries=96, elements=8_000_000)


def _directions(relation: str) -> Tuple[str, ...]:
    return ("replace",) if relation == "replace" else ("remove", "add")


def _chunk(relation: str, interval: float, cap: int, p: float, sigma: float, steps: int, s: float, k: int = 1):
    """The PMFs (one per direction) of ``steps`` identical steps (of a group of ``k`` records), cached."""
    key = (relation, interval, cap, p, sigma, s, steps, k)
    hit = _POWERS.get(key)
    if hit is not None:
        return hit
    out = []
    for direction in _directions(relation):
        step_key = (direction, interval, cap, p, sigma, s, k)
        single = _STEPS.get(step_key)
        if single is None:
            single = _STEPS.put(step_key, (_single_step(direction, p, sigma, s, interval, cap, k),))
        out.append(_power(step_key, single[0], steps, cap))
    return _POWERS.put(key, tuple(out))


# --------------------------------------------------------------------------------------------------
# queries on one PMF
# --------------------------------------------------------------------------------------------------
def _delta(pmf: _Pmf, interval: float, eps: np.ndarray) -> np.ndarray:
    """Upper bound on δ(ε) = E_P[(1 − e^{ε−L})₊] (hockey-stick divergence) at each ε."""
    losses, s1, s2 = pmf.suffix(interval)
    idx = np.searchsorted(losses, eps, side="right")  # first atom with loss > ε
    value = pmf.inf + s1[idx] - np.exp(eps) * s2[idx]
    return np.maximum(value, 0.0) + 4.0 * (pmf.probs.size + 1) * _U * pmf.mass


def _epsilon(pmf: _Pmf, interval: float, delta: float) -> float:
    """Smallest ε ≥ 0 whose δ(ε) (as :func:`_delta` bounds it) is ≤ ``delta``; inf if none."""
    losses, s1, s2 = pmf.suffix(interval)
    slack = 4.0 * (pmf.probs.size + 1) * _U * pmf.mass
    target = delta - slack
    if pmf.inf >= target:
        return math.inf
    grid = np.maximum(pmf.inf + s1[1:] - np.exp(losses) * s2[1:], 0.0)  # δ at each atom (non-increasing)
    start = int(np.searchsorted(losses, 0.0, side="right"))  # first atom with loss > 0
    at_zero = pmf.inf + s1[start] - s2[start]
    if at_zero <= target and _delta(pmf, interval, np.zeros(1))[0] <= delta:
        return 0.0
    # last atom j ≥ start − 1 with δ(L_j) > target; δ(ε) = inf + S1 − e^ε·S2 on (L_j, L_{j+1}] with sums from j + 1
    above = np.nonzero(grid[start:] > target)[0]
    j = start + int(above[-1]) if above.size else start - 1
    upper, lower = pmf.inf + s1[j + 1] - target, s2[j + 1]
    if lower <= 0.0:  # pragma: no cover - only the mass at +∞ is left, handled above
        return math.inf
    eps = math.log(upper / lower) if upper > 0 else 0.0
    eps = max(eps, losses[j] if j >= 0 else 0.0, 0.0)
    eps = float(np.nextafter(eps * (1.0 + 4.0 * _U), math.inf))
    step = max(abs(eps), 1.0) * 1e-13
    while _delta(pmf, interval, np.array([eps]))[0] > delta:  # round-off of the closed-form step: move up
        eps += step
        step *= 2.0
    return eps


def _tpr_candidates(upper: _Pmf, lower: _Pmf, interval: float, fpr: np.ndarray) -> np.ndarray:
    """min over ε of e^ε·α + δ_{P‖Q}(ε) (``upper``'s PMF) and 1 − e^{−ε}(1 − δ_{Q‖P}(ε) − α) (``lower``'s),
    at every FPR α. Both are piecewise monotone in ε between atoms with one minimum; the candidates are the
    atoms next to it and ε = 0."""
    out = np.ones_like(fpr)
    # family 1: f(ε) = e^ε·α + δ_up(ε); on (L_j, L_{j+1}) f' = e^ε (α − S2[j+1]); minimum at the first atom with S2[j+1] ≤ α
    losses, s1, s2 = upper.suffix(interval)
    n = losses.size
    slack_up = 8.0 * (n + 1) * _U * upper.mass
    k = np.searchsorted(-s2, -fpr, side="left")  # first k with S2[k] ≤ α
    for shift in (-2, -1, 0, 1):
        j = np.clip(k - 1 + shift, 0, n - 1)
        e = np.exp(losses[j])
        value = upper.inf + s1[j + 1] + e * (fpr - s2[j + 1]) + slack_up * (1.0 + e * fpr)
        out = np.minimum(out, value)
    out = np.minimum(out, fpr + _delta(upper, interval, np.zeros(1))[0])
    # family 2: g(ε) = 1 − S2(ε) − e^{−ε}(F(ε) − α) with F(ε) = mass − inf − S1(ε) = P-mass of losses ≤ ε
    losses, s1, s2 = lower.suffix(interval)
    n = losses.size
    slack_low = 8.0 * (n + 1) * _U * lower.mass
    below = np.cumsum(lower.probs)  # F at each atom
    k = np.searchsorted(below, fpr, side="left")  # first atom with F ≥ α
    excess = 1.0 - lower.mass  # ≤ 0 when round-off added mass; keeps g an upper bound
    for shift in (-2, -1, 0, 1):
        j = np.clip(k + shift, 0, n - 1)
        e = np.exp(-losses[j])
        value = 1.0 - s2[j + 1] - e * (below[j] + excess - fpr) + slack_low * (1.0 + e)
        out = np.minimum(out, value)
    out = np.minimum(out, fpr + _delta(lower, interval, np.zeros(1))[0])
    return np.clip(out, fpr, 1.0)


# --------------------------------------------------------------------------------------------------
# public class
# --------------------------------------------------------------------------------------------------
SegmentLike = Union[Dict[str, _Number], Sequence[_Number]]


class ComposedPLD:
    """The pessimistic privacy-loss distribution of a DP-SGD run, composed one chunk at a time.

    Each :meth:`compose` call adds ``steps`` identical Poisson-subsampled Gaussian steps: their PLD is the
    ``steps``-fold self-composition of one step's (a product of cached squares: a function of ``steps`` alone)
    and is convolved onto the stored PLD once. All values are safe-side bounds for the neighbouring relation's
    worst case (module docstring): :meth:`delta` and :meth:`tpr_bound` are upper bounds, :meth:`bayes_security` a
    lower bound.

    ``sensitivity`` scales one step's sensitivity in units of the full per-step sensitivity of the relation:
    for ``"replace"`` the two neighbouring outputs of a step differ by at most 2C (dp_accounting's
    ``REPLACE_ONE`` with sensitivity 1 and σ in units of C), so ``sensitivity = R/(2C)`` models steps whose
    outputs differ by R (Cherubin et al. 2024, Cor. 10's R_t); for ``"add_remove"`` the unit is C.

    The state is the list :attr:`chunks` (plain Python numbers, for checkpoints);
    :meth:`from_chunks` recomposes it, one :meth:`compose` per chunk in the saved order, which gives the same
    numbers bit for bit on the same platform.

    Args:
        relation: ``"replace"`` (substitute one record; the paper's membership game) or ``"add_remove"``.
        value_discretization_interval: grid of the privacy loss; ``None`` picks
            :func:`default_value_discretization_interval` from the first composed chunk.
        loss_cap: losses are kept in [−loss_cap, loss_cap]: larger ones go to +∞, smaller ones are raised to
            −loss_cap (default :data:`LOSS_CAP` = 50; :meth:`epsilon_uncapped` composes with wider ones).
        group_size: k ≥ 1 (``"add_remove"`` only for k > 1): the PLD of adding or removing a group of k records,
            each Poisson-sampled on its own, so a step carries j ~ Binomial(k, p) of them and the sensitivity is at
            most j (their clipped gradients' sum): the mixture of Gaussians N(j·s, σ²) with binomial weights against
            N(0, σ²), in both orders (dp_accounting's ``MixtureGaussianPrivacyLoss``; the vector mechanism is dominated
            by the scalar one, Choquette-Choo et al. 2023, Cor. 4.7). The connect-the-dots construction is the same;
            the outputs at each grid loss come from bisection (to adjacent doubles) instead of a closed form. This is
            the guarantee a canary inserted k times is audited against.

    Attributes:
        relation: the neighbouring relation.
        value_discretization_interval: the grid (``None`` until the first chunk when automatic).
        loss_cap: the loss cap.
        steps: number of steps composed so far.
        chunks: ``[[sample_rate, noise_multiplier, steps, sensitivity], ...]`` in composition order.

    Raises:
        ValueError: If ``relation`` is unknown or the grid is not in (0, 1].
        TypeError: If the grid is not a real number.

    Example:
        >>> pld = ComposedPLD(relation="replace")
        >>> _ = pld.compose(sample_rate=0.01, noise_multiplier=1.0, steps=100)
        >>> _ = pld.compose(sample_rate=0.01, noise_multiplier=1.0, steps=100)
        >>> round(pld.bayes_security(), 4), pld.chunks
        (0.8803, [[0.01, 1.0, 100, 1.0], [0.01, 1.0, 100, 1.0]])
        >>> again = ComposedPLD.from_chunks(pld.chunks)
        >>> again.bayes_security() == pld.bayes_security()
        True
        >>> round(pld.epsilon(1e-5), 3), float(pld.delta(pld.epsilon(1e-5))) <= 1e-5
        (1.228, True)
    """

    def __init__(
        self,
        *,
        relation: str = "replace",
        value_discretization_interval: Optional[float] = None,
        loss_cap: float = LOSS_CAP,
        group_size: int = 1,
    ) -> None:
        self._relation = _check_relation(relation)
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"Expected `group_size` to be an int >= 1, but got {group_size!r}.")
        if group_size > 1 and self._relation != "add_remove":
            raise ValueError(f"`group_size`={group_size} needs relation='add_remove', got {relation!r}.")
        self._group = int(group_size)
        self._interval = _check_grid(value_discretization_interval)
        self._loss_cap = _scalar("loss_cap", loss_cap, low=0.0, high=math.inf, low_open=True, high_open=True)
        self._pmfs: Optional[Tuple[_Pmf, ...]] = None  # one per direction; None: no step yet
        self._chunks: List[List[_Number]] = []

    # ------------------------------------------------------------------------------------------- state
    @property
    def relation(self) -> str:
        return self._relation

    @property
    def value_discretization_interval(self) -> Optional[float]:
        return self._interval

    @property
    def loss_cap(self) -> float:
        return self._loss_cap

    @property
    def group_size(self) -> int:
        return self._group

    @property
    def steps(self) -> int:
        return int(sum(c[2] for c in self._chunks))

    @property
    def chunks(self) -> List[List[_Number]]:
        return [list(c) for c in self._chunks]

    @property
    def size(self) -> int:
        """Grid points of the stored distribution (the cost of the next convolution grows with it)."""
        return 0 if self._pmfs is None else max(p.probs.size for p in self._pmfs)

    def __repr__(self) -> str:
        return (
            f"ComposedPLD(relation={self._relation!r}, value_discretization_interval={self._interval!r}, "
            + (f"group_size={self._group}, " if self._group > 1 else "")
            + f"steps={self.steps}, chunks={len(self._chunks)}, size={self.size})"
        )

    def copy(self) -> ComposedPLD:
        """An independent copy (the distributions are immutable and shared, so this is cheap)."""
        other = ComposedPLD(
            relation=self._relation,
            value_discretization_interval=self._interval,
            loss_cap=self._loss_cap,
            group_size=self._group,
        )
        other._pmfs = self._pmfs
        other._chunks = self.chunks
        return other

    @classmethod
    def from_chunks(
        cls,
        chunks: Iterable[Sequence[_Number]],
        *,
        relation: str = "replace",
        value_discretization_interval: Optional[float] = None,
        loss_cap: float = LOSS_CAP,
        group_size: int = 1,
    ) -> ComposedPLD:
        """Rebuild a :class:`ComposedPLD` from its :attr:`chunks` (one :meth:`compose` per chunk, in order).

        Args:
            chunks: ``[[sample_rate, noise_multiplier, steps], ...]`` or with a fourth entry ``sensitivity``.
            relation: the relation of the saved object.
            value_discretization_interval: the grid of the saved object (``None`` if it was automatic).
            loss_cap: the loss cap of the saved object.
            group_size: its group size.

        Returns:
            A :class:`ComposedPLD` equal to the saved one (bit for bit when it was built one chunk per call).

        Raises:
            TypeError: If a chunk is not a sequence of 3 or 4 numbers.
            ValueError: If a value is out of range.

        Example:
            >>> ComposedPLD.from_chunks([[0.01, 1.0, 100], [0.02, 1.5, 50, 0.5]]).steps
            150
        """
        out = cls(
            relation=relation,
            value_discretization_interval=value_discretization_interval,
            loss_cap=loss_cap,
            group_size=group_size,
        )
        for i, chunk in enumerate(chunks):
            if isinstance(chunk, (str, bytes)) or not hasattr(chunk, "__len__") or len(chunk) not in (3, 4):
                raise TypeError(
                    "Expected every entry of `chunks` to be [sample_rate, noise_multiplier, steps(, sensitivity)], "
                    f"but entry {i} is {chunk!r}."
                )
            p, sigma, steps = chunk[0], chunk[1], chunk[2]
            out.compose(
                sample_rate=p, noise_multiplier=sigma, steps=steps, sensitivity=chunk[3] if len(chunk) == 4 else 1.0
            )
        return out

    # ----------------------------------------------------------------------------------------- updates
    def _ensure_grid(self, segments) -> float:
        if self._interval is None:
            p, sigma = segments[0][0], segments[0][1]
            self._interval = default_value_discretization_interval(
                sample_rate=p, noise_multiplier=sigma, relation=self._relation
            )
        return self._interval

    def _chunk_pmfs(self, segments) -> Optional[Tuple[_Pmf, ...]]:
        interval = self._ensure_grid(segments)
        cap = int(math.ceil(self._loss_cap / interval))
        combined = None
        for p, sigma, steps, s in segments:
            if steps == 0 or s == 0.0:
                continue
            pmfs = _chunk(self._relation, interval, cap, p, sigma, steps, s, self._group)
            combined = (
                pmfs if combined is None else tuple(_convolve(a, b, cap, _TAIL_MASS) for a, b in zip(combined, pmfs))
            )
        return combined

    def compose(self, *, sample_rate: Any, noise_multiplier: Any, steps: Any, sensitivity: Any = 1.0) -> ComposedPLD:
        """Compose ``steps`` more steps (in place) and record them as chunks.

        Scalars describe one chunk; 1-D sequences of one length describe several segments composed in order
        (one chunk each; the segments are first composed with each other, then onto the stored distribution
        with one convolution).

        Args:
            sample_rate: Poisson sampling rate p, in (0, 1]; scalar or one per segment.
            noise_multiplier: σ > 0; scalar or one per segment.
            steps: whole number of steps ≥ 0; scalar or one per segment.
            sensitivity: per-step sensitivity in [0, 1] in units of the relation's full sensitivity
                (``R/(2C)`` for replace); scalar or one per segment.

        Returns:
            ``self``.

        Raises:
            TypeError: If an argument is not numeric.
            ValueError: If an argument is out of range or segment lengths differ.

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=[0.01, 0.01], noise_multiplier=[1.0, 2.0], steps=[100, 300])
            >>> pld.steps, round(pld.bayes_security(), 4)
            (400, 0.8907)
        """
        segments = [seg for seg in _segment_arrays(sample_rate, noise_multiplier, steps, sensitivity) if seg[2] > 0]
        if not segments:
            return self
        chunk = self._chunk_pmfs(segments)
        if chunk is not None:
            cap = int(math.ceil(self._loss_cap / self._interval))
            if self._pmfs is None:
                self._pmfs = chunk
            else:
                self._pmfs = tuple(_convolve(a, b, cap, _TAIL_MASS) for a, b in zip(self._pmfs, chunk))
        self._chunks.extend([list(seg) for seg in segments])
        return self

    def after(self, *, sample_rate: Any, noise_multiplier: Any, steps: Any, sensitivity: Any = 1.0) -> ComposedPLD:
        """A copy with more steps composed; ``self`` is not changed (see :meth:`compose` for the arguments).

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=0.01, noise_multiplier=1.0, steps=100)
            >>> later = pld.after(sample_rate=0.01, noise_multiplier=1.0, steps=100)
            >>> pld.steps, later.steps
            (100, 200)
        """
        return self.copy().compose(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, sensitivity=sensitivity
        )

    # ----------------------------------------------------------------------------------------- queries
    def delta(self, epsilon: Any) -> Union[float, np.ndarray]:
        """Upper bound on δ(ε) of the composed mechanism (both orders of an add/remove pair).

        Args:
            epsilon: ε ≥ 0, scalar or 1-D array.

        Returns:
            δ(ε) as a float, or an array of the shape of ``epsilon``.

        Raises:
            TypeError: If ``epsilon`` is not numeric.
            ValueError: If an ε is negative or NaN.

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=0.01, noise_multiplier=1.0, steps=1000)
            >>> [round(float(d), 4) for d in pld.delta([0.0, 1.0])]
            [0.2644, 0.033]
        """
        eps = _nonnegative_array("epsilon", epsilon)
        if self._pmfs is None:
            out = np.zeros_like(eps)
        else:
            flat = np.ravel(eps)
            out = np.max([_delta(p, self._interval, flat) for p in self._pmfs], axis=0).reshape(eps.shape)
            out = np.minimum(out, 1.0)
        return float(out) if out.ndim == 0 else out

    def epsilon(self, delta: float) -> float:
        """Smallest ε ≥ 0 with δ(ε) ≤ ``delta`` (rounded up; ``inf`` if the mass at +∞ exceeds δ).

        Args:
            delta: δ in (0, 1).

        Returns:
            ε ≥ 0, an upper bound on the mechanism's ε at ``delta``.

        Raises:
            TypeError: If ``delta`` is not a real number.
            ValueError: If ``delta`` is not in (0, 1).

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=0.01, noise_multiplier=1.0, steps=1000)
            >>> round(pld.epsilon(1e-5), 3)
            2.844
        """
        d = _scalar("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        if self._pmfs is None:
            return 0.0
        return max(_epsilon(p, self._interval, d) for p in self._pmfs)

    def epsilon_uncapped(self, delta: float) -> float:
        """:meth:`epsilon`, also finite where ε is beyond :attr:`loss_cap` (up to :data:`WIDER_LOSS_CAPS`' last, 700).

        Losses above the cap are moved to +∞ (safe), so where ε(δ) is near or above the cap (50 by default)
        :meth:`epsilon` is ``inf``. Then the chunks are recomposed with each cap of :data:`WIDER_LOSS_CAPS` in turn,
        on a grid of cap / 100 000 (or this one's, if coarser), identical chunks grouped (composition commutes), and
        the first finite ε is returned: an upper bound on ε at ``delta`` like :meth:`epsilon`'s (every such PLD is
        pessimistic), within 0.05 of dp_accounting's PLD ε at grid 1e-3 up to ε ≈ 350
        (``tests/analysis/test_composition.py``). ``inf`` only beyond the last cap: e^ε overflows a double past 709.

        Args:
            delta: δ in (0, 1).

        Returns:
            ε ≥ 0, an upper bound on the mechanism's ε at ``delta`` (``inf`` if none is found below the last cap).

        Raises:
            TypeError: If ``delta`` is not a real number.
            ValueError: If ``delta`` is not in (0, 1).

        Example:
            >>> pld = ComposedPLD(relation="add_remove").compose(sample_rate=1.0, noise_multiplier=0.3, steps=5)
            >>> pld.epsilon(1e-5), round(pld.epsilon_uncapped(1e-5), 2)  # dp_accounting: 58.78
            (inf, 58.78)
        """
        eps = self.epsilon(delta)
        if math.isfinite(eps):
            return eps
        grouped: Dict[Tuple[float, float, float], int] = {}
        for p, sigma, steps, s in self._chunks:
            grouped[(p, sigma, s)] = grouped.get((p, sigma, s), 0) + int(steps)
        keys = list(grouped)
        for cap in WIDER_LOSS_CAPS:
            if cap <= self._loss_cap:
                continue
            wide = ComposedPLD(
                relation=self._relation,
                value_discretization_interval=max(self._interval, cap / _WIDE_POINTS),
                loss_cap=cap,
                group_size=self._group,
            ).compose(
                sample_rate=[k[0] for k in keys],
                noise_multiplier=[k[1] for k in keys],
                steps=[grouped[k] for k in keys],
                sensitivity=[k[2] for k in keys],
            )
            eps = wide.epsilon(delta)
            if math.isfinite(eps):
                return eps
        return math.inf

    def bayes_security(self) -> float:
        """Lower bound on the Bayes security β* = 1 − δ(0) of the composed mechanism (1.0 with no step).

        Example:
            >>> round(ComposedPLD().compose(sample_rate=0.05, noise_multiplier=1.0, steps=400).bayes_security(), 4)
            0.3059
        """
        if self._pmfs is None:
            return 1.0
        return float(min(1.0, max(0.0, 1.0 - self.delta(0.0))))

    def tpr_bound(self, fpr: Any) -> Union[float, np.ndarray]:
        """Upper bound on the true-positive rate of any membership test at false-positive rate ``fpr``.

        The trade-off curve of the composed mechanism from its δ(ε) over all ε: for every ε ≥ 0 any test
        between the outputs with and without the target record satisfies TPR ≤ e^ε·FPR + δ_{P‖Q}(ε) and
        TPR ≤ 1 − e^{−ε}(1 − δ_{Q‖P}(ε) − FPR) (P: the target is a member). The minimum over ε of a
        discretised PLD is attained at one of its atoms, so it is evaluated there exactly: the result is the
        trade-off curve of the dominating discrete pair, never below the mechanism's true curve and never
        above Proposition 9's line FPR + 1 − β* (its ε = 0 term). For ``"add_remove"`` δ_{P‖Q} and
        δ_{Q‖P} are the two orders (dp_accounting's remove and add PLDs); ``"replace"`` is symmetric.

        Args:
            fpr: false-positive rate(s) in [0, 1], scalar or 1-D array.

        Returns:
            TPR bound(s) in [fpr, 1], a float or an array of the shape of ``fpr``.

        Raises:
            TypeError: If ``fpr`` is not numeric.
            ValueError: If an FPR is outside [0, 1] or NaN.

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=0.02, noise_multiplier=1.5, steps=1000)
            >>> [round(float(t), 4) for t in pld.tpr_bound([0.001, 0.01, 0.1])]
            [0.0126, 0.0702, 0.3336]
        """
        alpha = _nonnegative_array("fpr", fpr)
        if np.any(alpha > 1.0):
            raise ValueError(f"Expected argument `fpr` to be in [0, 1], but got {fpr!r}.")
        flat = np.ravel(alpha).astype(float)
        if self._pmfs is None:
            out = flat.copy()
        elif self._relation == "replace":
            out = _tpr_candidates(self._pmfs[0], self._pmfs[0], self._interval, flat)
        else:
            out = _tpr_candidates(self._pmfs[0], self._pmfs[1], self._interval, flat)
        out = out.reshape(alpha.shape)
        return float(out) if out.ndim == 0 else out

    def bayes_security_after(self, segments: Optional[Iterable[SegmentLike]] = None, /, **segment: Any) -> float:
        """β* after composing more steps, without changing ``self`` and without a convolution of the stored PLD.

        δ(0) of the composition of the stored distribution A with the new steps' B is
        Σᵢ aᵢ·δ_B(−Lᵢ) + (mass of A at +∞)·(mass of B), computed from B's suffix sums in O(|A| + |B|). It differs
        from ``after(...).bayes_security()`` only by the truncation and round-off allowances of the skipped
        convolution (≲ 1e-12), which are subtracted here, so the prediction is never above the value the
        composition will report.

        Args:
            segments: optional list of segments, each a dict with keys ``sample_rate``, ``noise_multiplier``,
                ``steps`` (and optionally ``sensitivity``) or a sequence in that order, composed in order.
            **segment: instead of ``segments``, the keyword arguments of :meth:`compose` for one segment.

        Returns:
            The predicted β* lower bound.

        Raises:
            TypeError: If both or neither of ``segments`` and keywords are given, or a value is not numeric.
            ValueError: If a value is out of range.

        Example:
            >>> pld = ComposedPLD().compose(sample_rate=0.01, noise_multiplier=1.0, steps=100)
            >>> predicted = pld.bayes_security_after(sample_rate=0.01, noise_multiplier=1.0, steps=1)
            >>> actual = pld.after(sample_rate=0.01, noise_multiplier=1.0, steps=1).bayes_security()
            >>> predicted <= actual < predicted + 1e-9
            True
        """
        parsed = _parse_segments(segments, segment)
        parsed = [seg for seg in parsed if seg[2] > 0]
        if not parsed:
            return self.bayes_security()
        if self._pmfs is None:
            probe = ComposedPLD(
                relation=self._relation,
                value_discretization_interval=self._interval,
                loss_cap=self._loss_cap,
                group_size=self._group,
            )
            pmfs = probe._chunk_pmfs(parsed)
            if pmfs is None:
                return 1.0
            interval = probe._interval
            return float(min(1.0, max(0.0, 1.0 - max(_delta(p, interval, np.zeros(1))[0] for p in pmfs))))
        chunk = self._chunk_pmfs(parsed)
        if chunk is None:
            return self.bayes_security()
        delta = max(_delta_of_composition(a, b, self._interval) for a, b in zip(self._pmfs, chunk))
        return float(min(1.0, max(0.0, 1.0 - delta)))


def _delta_of_composition(a: _Pmf, b: _Pmf, interval: float) -> float:
    """δ(0) of A ⊛ B without convolving: Σᵢ aᵢ·δ_B(−Lᵢ) + inf_A·mass_B, plus the allowances of a convolution."""
    losses_b, s1, s2 = b.suffix(interval)
    idx = np.arange(a.probs.size)
    # first atom j of B with loss > −L_i, i.e. b.offset + j > −(a.offset + i)
    j = np.clip(-(a.offset + idx) - b.offset + 1, 0, b.probs.size)
    losses_a = (a.offset + idx) * interval
    delta_b = b.inf + s1[j] - np.exp(-losses_a) * s2[j]
    value = float(np.dot(a.probs, np.maximum(delta_b, 0.0))) + a.inf * b.mass
    size = sp_fft.next_fast_len(a.probs.size + b.probs.size - 1, real=True)
    slack = _fft_roundoff(size, a.probs, b.probs) + _TAIL_MASS + 8.0 * (a.probs.size + b.probs.size + 2) * _U
    return value + slack


def _nonnegative_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
        raise TypeError(f"Expected argument `{name}` to be a real number or an array of them, but got {value!r}.")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Expected argument `{name}` to be a real number or an array of them, but got {value!r}."
        ) from exc
    if np.any(np.isnan(arr)) or np.any(arr < 0.0):
        raise ValueError(f"Expected argument `{name}` to be >= 0 (no NaN), but got {value!r}.")
    return arr


def _parse_segments(segments, keywords) -> List[Tuple[float, float, int, float]]:
    if (segments is None) == (not keywords):
        raise TypeError("Give either a list of segments or the keyword arguments of one segment, not both or neither.")
    if segments is None:
        return _segment_arrays(
            keywords.get("sample_rate"),
            keywords.get("noise_multiplier"),
            keywords.get("steps"),
            keywords.get("sensitivity", 1.0),
        )
    out = []
    for i, seg in enumerate(segments):
        if isinstance(seg, dict):
            unknown = set(seg) - {"sample_rate", "noise_multiplier", "steps", "sensitivity"}
            if unknown:
                raise TypeError(f"Unexpected keys {sorted(unknown)} in segment {i}: {seg!r}.")
            values = (
                seg.get("sample_rate"),
                seg.get("noise_multiplier"),
                seg.get("steps"),
                seg.get("sensitivity", 1.0),
            )
        elif hasattr(seg, "__len__") and len(seg) in (3, 4) and not isinstance(seg, (str, bytes)):
            values = (seg[0], seg[1], seg[2], seg[3] if len(seg) == 4 else 1.0)
        else:
            raise TypeError(
                "Expected every segment to be a dict or [sample_rate, noise_multiplier, steps(, sensitivity)], "
                f"but segment {i} is {seg!r}."
            )
        out.extend(_segment_arrays(*values))
    return out

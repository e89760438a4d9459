"""Data-resolved privacy profile of an L2-regularised logistic regression (numpy/scipy only).

LeBlond, Munoz, Lu et al. (2023), "Probing the Transition to Dataset-Level Privacy in ML Models Using
an Output-Specific and Data-Resolved Privacy Profile".

Setting (paper Sec. 3): rows ``x_i`` with ``‖x_i‖ ≤ 1``, labels ``y_i ∈ {−1, +1}``, linear model
``f·x`` without intercept, objective ``J(f) = (1/n) Σ ln(1 + exp(−y_i f·x_i)) + (Λ/2)‖f‖²`` and its
minimiser ``A(x)``. ε-DP by output perturbation (Chaudhuri et al., 2011): release ``A(x) + b`` with
density of ``b`` proportional to ``exp(−β‖b‖)``, ``β = nΛε/2``.

* :func:`worst_case_neighbours` — the model point ``A(y_i)`` of every leave-one-out neighbour ``y_i``,
  approximated without retraining by the far pole of the Okumura et al. sphere bound,
  ``A_wc(y_i) = 2R_i − A(x)`` (Sec. 5.1–5.2, Eqs. 17, 18, 22).
  :func:`worst_case_relative_error_bound` certifies how far that approximation can be off.
* :func:`privacy_losses` / :func:`privacy_profile` — ``|l(x, y_i, M)| = β |‖A(y_i) − M‖ − ‖A(x) − M‖|``
  (Eq. 9) for a released model point ``M`` and its ranking (Sec. 4.3). The ranking does not depend on ε.
* :func:`typical_profile` / :func:`transition_analysis` — the profile averaged over ``M ~ A(x) + b``
  (Sec. 5.4) and, over a grid of ε, the low- and high-ε plateaus of ``mean|l|/β`` with their onsets:
  the ε range worth trying.
* :func:`fit_logistic_regression` — the exact minimiser (scipy trust-region Newton), used to retrain
  without a row when validating :func:`worst_case_neighbours`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Sequence

import numpy as np
from scipy import linalg, optimize, special

__all__ = [
    "PrivacyProfile",
    "TransitionAnalysis",
    "TypicalProfile",
    "UnitBallScaler",
    "default_epsilon_grid",
    "fit_logistic_regression",
    "logistic_gradients",
    "noise_scale",
    "objective_gradient",
    "privacy_losses",
    "privacy_profile",
    "sample_output_noise",
    "sphere_bound",
    "transition_analysis",
    "typical_profile",
    "worst_case_neighbours",
    "worst_case_relative_error_bound",
]


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------
def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`{name}` must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")
    return value


def _count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"`{name}` must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value!r}")
    return int(value)


def _vector(name: str, value) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite, got {array!r}")
    return array


def _matrix(name: str, value, columns: int | None = None) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"`{name}` must be a non-empty 2-D array (rows, features), got shape {array.shape}")
    if columns is not None and array.shape[1] != columns:
        raise ValueError(f"`{name}` must have {columns} columns (the model's dimension), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite")
    return array


def _signed_labels(labels, rows: int) -> np.ndarray:
    array = np.asarray(labels)
    if array.shape != (rows,):
        raise ValueError(f"`labels` must have shape ({rows},), got {array.shape}")
    values = set(np.unique(array).tolist())
    if values <= {0, 1}:
        return np.where(array == 1, 1.0, -1.0)
    if values <= {-1, 1}:
        return array.astype(np.float64)
    raise ValueError(f"`labels` must take values in {{0, 1}} or {{-1, +1}}, got {sorted(values)}")


# ----------------------------------------------------------------------------------------------
# data scaling and the exact minimiser
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitBallScaler:
    """The paper's normalisation: standardise every column, then divide by the largest row norm.

    After :meth:`fit` the training rows satisfy ``‖x_i‖ ≤ 1`` (paper Sec. 2, footnote 2), as the
    sensitivity of output perturbation requires. The scaling is fitted on the data, which the DP
    guarantee does not account for (as in the paper); rows transformed later may exceed norm 1.

    Example::

        >>> x = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])
        >>> scaled = UnitBallScaler.fit(x).transform(x)
        >>> float(np.linalg.norm(scaled, axis=1).max())
        1.0
    """

    mean: np.ndarray
    std: np.ndarray
    max_norm: float

    @classmethod
    def fit(cls, features) -> UnitBallScaler:
        """Fit on ``features`` ``(n, d)``; constant columns keep scale 1."""
        x = _matrix("features", features)
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        norms = np.linalg.norm((x - mean) / std, axis=1)
        max_norm = float(norms.max())
        return cls(mean=mean, std=std, max_norm=max_norm if max_norm > 0 else 1.0)

    def transform(self, features) -> np.ndarray:
        """Scale ``features`` with the fitted statistics."""
        x = _matrix("features", features, self.mean.shape[0])
        return (x - self.mean) / self.std / self.max_norm


def logistic_gradients(weights, features, labels) -> np.ndarray:
    """Per-row gradients ``∇_f ln(1 + exp(−y_i f·x_i)) = −y_i σ(−y_i f·x_i) x_i``.

    Args:
        weights: ``(d,)`` model ``f``.
        features: ``(n, d)`` rows ``x_i``.
        labels: ``(n,)`` in ``{0, 1}`` (0 means −1) or ``{−1, +1}``.

    Returns:
        ``(n, d)`` array, row ``i`` the gradient of row ``i``'s loss at ``weights``.

    Example::

        >>> logistic_gradients([0.0, 0.0], [[1.0, 0.0], [0.0, 0.5]], [1, 0])
        array([[-0.5 ,  0.  ],
               [ 0.  ,  0.25]])
    """
    f = _vector("weights", weights)
    x = _matrix("features", features, f.shape[0])
    y = _signed_labels(labels, x.shape[0])
    return (-y * special.expit(-y * (x @ f)))[:, None] * x


def _objective(f: np.ndarray, x: np.ndarray, y: np.ndarray, lam: float):
    margins = y * (x @ f)
    value = np.mean(np.logaddexp(0.0, -margins)) + 0.5 * lam * f @ f
    s = special.expit(-margins)
    gradient = x.T @ (-y * s) / x.shape[0] + lam * f
    return value, gradient


def _hessian(f: np.ndarray, x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    s = special.expit(y * (x @ f))
    w = s * (1.0 - s) / x.shape[0]
    return (x * w[:, None]).T @ x + lam * np.eye(x.shape[1])


def objective_gradient(weights, features, labels, *, regularization: float) -> np.ndarray:
    """Gradient of ``J(f) = (1/n) Σ l_i(f) + (Λ/2)‖f‖²``; zero at the optimum ``A(x)``.

    By ``Λ``-strong convexity, ``‖f − A(x)‖ ≤ ‖∇J(f)‖ / Λ``: the norm certifies how far ``weights``
    are from the optimum that :func:`worst_case_neighbours` assumes.

    Example::

        >>> x, y = np.array([[0.6, 0.0], [0.0, -0.8]]), np.array([1, 0])
        >>> f = fit_logistic_regression(x, y, regularization=1.0)
        >>> bool(np.linalg.norm(objective_gradient(f, x, y, regularization=1.0)) < 1e-10)
        True
    """
    lam = _positive("regularization", regularization)
    f = _vector("weights", weights)
    x = _matrix("features", features, f.shape[0])
    y = _signed_labels(labels, x.shape[0])
    return _objective(f, x, y, lam)[1]


def fit_logistic_regression(
    features, labels, *, regularization: float, initial=None, gtol: float = 1e-12, max_iter: int = 200
) -> np.ndarray:
    """The exact minimiser ``A(x)`` of the L2-regularised logistic objective (no intercept).

    Uses scipy's trust-region Newton method (``method="trust-exact"``) with the analytic gradient and
    Hessian; the objective is ``Λ``-strongly convex, so the result is within ``gtol / Λ`` of the
    optimum. Warm-start with ``initial`` (e.g. ``A(x)`` when retraining without one row).

    Args:
        features: ``(n, d)`` rows.
        labels: ``(n,)`` in ``{0, 1}`` or ``{−1, +1}``.
        regularization: ``Λ > 0``.
        initial: starting point (default zeros).
        gtol: stop when ``‖∇J‖ < gtol``.
        max_iter: iteration cap.

    Returns:
        ``(d,)`` float64 weights.

    Raises:
        RuntimeError: if the solver stops with ``‖∇J‖ ≥ gtol``.

    Example::

        >>> x = np.array([[0.5, 0.1], [-0.3, 0.4], [0.2, -0.6]])
        >>> fit_logistic_regression(x, [1, 0, 1], regularization=1.0).round(4)
        array([ 0.1594, -0.1412])
    """
    lam = _positive("regularization", regularization)
    x = _matrix("features", features)
    y = _signed_labels(labels, x.shape[0])
    _positive("gtol", gtol)
    start = np.zeros(x.shape[1]) if initial is None else _vector("initial", initial)
    result = optimize.minimize(
        _objective,
        start,
        args=(x, y, lam),
        jac=True,
        hess=_hessian,
        method="trust-exact",
        options={"gtol": max(gtol, 1e-8), "maxiter": _count("max_iter", max_iter, 1)},
    )
    # Trust-region steps stall once objective differences reach rounding level; finish with plain
    # Newton steps, which need only the gradient and converge quadratically on this strongly
    # convex objective.
    f = result.x
    gradient = _objective(f, x, y, lam)[1]
    for _ in range(20):
        if np.linalg.norm(gradient) < gtol:
            break
        step = linalg.solve(_hessian(f, x, y, lam), gradient, assume_a="pos")
        candidate = f - step
        candidate_gradient = _objective(candidate, x, y, lam)[1]
        if np.linalg.norm(candidate_gradient) >= np.linalg.norm(gradient):
            break
        f, gradient = candidate, candidate_gradient
    gradient_norm = float(np.linalg.norm(gradient))
    if not gradient_norm < gtol:
        raise RuntimeError(f"logistic regression did not converge: ‖∇J‖ = {gradient_norm:.3g} >= gtol = {gtol:g}")
    return f


# ----------------------------------------------------------------------------------------------
# neighbour model points (Sec. 5.1-5.2)
# ----------------------------------------------------------------------------------------------
def _neighbour_inputs(weights, gradients, regularization: float):
    lam = _positive("regularization", regularization)
    f = _vector("weights", weights)
    g = _matrix("gradients", gradients, f.shape[0])
    if g.shape[0] < 2:
        raise ValueError(f"`gradients` needs one row per training row and n >= 2, got shape {g.shape}")
    return f, g, lam


def sphere_bound(weights, gradients, *, regularization: float) -> tuple[np.ndarray, np.ndarray]:
    """Okumura et al.'s ball holding ``A(y_i)`` for each leave-one-out neighbour (paper Eqs. 17, 18).

    ``R_i = (1 + 1/(2(n−1))) A(x) + ∇l_i[A(x)] / (2Λ(n−1))``,
    ``r_i = ‖A(x) + ∇l_i[A(x)]/Λ‖ / (2(n−1))``; ``A(x)`` lies on every sphere (Eq. 21).

    Args:
        weights: ``(d,)`` the optimum ``A(x)``.
        gradients: ``(n, d)`` per-row loss gradients at ``A(x)`` (:func:`logistic_gradients`); ``n`` is
            the training-set size.
        regularization: ``Λ``.

    Returns:
        ``(centres (n, d), radii (n,))``.

    Example::

        >>> centres, radii = sphere_bound([1.0, 0.0], [[-1.0, 0.5], [0.2, 0.0]], regularization=2.0)
        >>> centres
        array([[1.25 , 0.125],
               [1.55 , 0.   ]])
        >>> radii.round(4)
        array([0.2795, 0.55  ])
    """
    f, g, lam = _neighbour_inputs(weights, gradients, regularization)
    n = g.shape[0]
    centres = (1.0 + 1.0 / (2 * (n - 1))) * f + g / (2 * lam * (n - 1))
    radii = np.linalg.norm(f + g / lam, axis=1) / (2 * (n - 1))
    return centres, radii


def worst_case_neighbours(weights, gradients, *, regularization: float) -> np.ndarray:
    """``A_wc(y_i) = 2R_i − A(x) = A(x) + (A(x) + ∇l_i[A(x)]/Λ) / (n − 1)`` for every row (Eq. 22).

    The point of the sphere bound farthest from ``A(x)``: the paper's O(n·d) stand-in for retraining
    without row ``i`` (max relative deviation < 2·10⁻³ on 6 Adult features). It is exactly one Newton
    step of the leave-one-out objective from ``A(x)`` with the Hessian replaced by ``ΛI``;
    :func:`worst_case_relative_error_bound` bounds the deviation. Assumes ``weights`` is the optimum.

    Example::

        >>> worst_case_neighbours([1.0, 0.0], [[-1.0, 0.5], [0.2, 0.0]], regularization=2.0)
        array([[1.5 , 0.25],
               [2.1 , 0.  ]])
    """
    f, g, lam = _neighbour_inputs(weights, gradients, regularization)
    return f + (f + g / lam) / (g.shape[0] - 1)


def worst_case_relative_error_bound(features, *, regularization: float) -> float:
    """Upper bound on ``max_i ‖A_wc(y_i) − A(y_i)‖ / ‖A(y_i) − A(x)‖`` for the logistic loss.

    Derivation (ours, not in the paper): by the mean-value theorem for the leave-one-out gradient,
    ``A(y_i) − A(x) = H̄⁻¹ g_i`` with ``g_i = (ΛA(x) + ∇l_i)/(n−1)`` and ``H̄ = ΛI + L``, where
    ``0 ⪯ L ⪯ (1/(4(n−1))) Σ_j x_j x_jᵀ`` (the logistic curvature is at most 1/4), while
    ``A_wc(y_i) − A(x) = g_i / Λ``. Hence ``A_wc − A(y_i) = L(ΛI + L)⁻¹ g_i / Λ`` and the ratio is at
    most ``λ_max(L)/Λ ≤ λ_max(XᵀX) / (4(n−1)Λ)``. Exact when ``A(x)`` is the exact optimum.

    Example::

        >>> x = np.array([[0.1, 0.0], [0.0, 0.2], [0.1, 0.1]])
        >>> round(worst_case_relative_error_bound(x, regularization=1.0), 5)
        0.00663
    """
    lam = _positive("regularization", regularization)
    x = _matrix("features", features)
    if x.shape[0] < 2:
        raise ValueError(f"`features` needs n >= 2 rows, got shape {x.shape}")
    top = float(np.linalg.eigvalsh(x.T @ x)[-1])
    return top / (4.0 * (x.shape[0] - 1) * lam)


# ----------------------------------------------------------------------------------------------
# privacy losses and profile for one model point (Sec. 4.2-4.3)
# ----------------------------------------------------------------------------------------------
def noise_scale(*, epsilon: float, dataset_size: int, regularization: float) -> float:
    """``β = nΛε/2``: the rate of output-perturbation noise with density ∝ ``exp(−β‖b‖)``.

    Example::

        >>> noise_scale(epsilon=0.5, dataset_size=1000, regularization=1.0)
        250.0
    """
    eps = _positive("epsilon", epsilon)
    n = _count("dataset_size", dataset_size, 1)
    return n * _positive("regularization", regularization) * eps / 2.0


def _distance_differences(base: np.ndarray, neighbours: np.ndarray, model_point: np.ndarray) -> np.ndarray:
    """``|‖A(y_i) − M‖ − ‖A(x) − M‖|`` without cancellation."""
    delta = neighbours - base
    b = model_point - base
    to_neighbour = np.linalg.norm(delta - b, axis=1)
    to_base = float(np.linalg.norm(b))
    numerator = np.abs(np.einsum("ij,ij->i", delta, delta) - 2.0 * delta @ b)
    denominator = to_neighbour + to_base
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def _profile_inputs(base, neighbours, model_point):
    a = _vector("base", base)
    nb = _matrix("neighbours", neighbours, a.shape[0])
    m = _vector("model_point", model_point)
    if m.shape != a.shape:
        raise ValueError(f"`model_point` must have shape {a.shape}, got {m.shape}")
    return a, nb, m


def privacy_losses(base, neighbours, model_point, *, beta: float) -> np.ndarray:
    """``|l(x, y_i, M)| = β |‖A(y_i) − M‖ − ‖A(x) − M‖|`` for every neighbour ``i`` (Eq. 9).

    Args:
        base: ``(d,)`` ``A(x)``.
        neighbours: ``(n, d)`` ``A(y_i)`` (e.g. :func:`worst_case_neighbours`).
        model_point: ``(d,)`` the released model ``M``.
        beta: noise rate ``β`` (:func:`noise_scale`).

    Example::

        >>> privacy_losses([0.0, 0.0], [[2.0, 0.0], [0.0, 1.0]], [1.0, 0.0], beta=3.0)
        array([0.       , 1.2426407])
    """
    a, nb, m = _profile_inputs(base, neighbours, model_point)
    return _positive("beta", beta) * _distance_differences(a, nb, m)


@dataclass(frozen=True)
class PrivacyProfile:
    """Ranked privacy losses for one model point (paper Sec. 4.3), ascending as in the paper.

    Attributes:
        indices: ``(n,)`` training-row indices, least exposed first (``argsort`` of the losses).
        losses: ``(n,)`` ``|l(x, y_i, M)|`` in the same order.
        beta: the ``β`` used; ``losses / beta`` (and hence the ranking) does not depend on it.
    """

    indices: np.ndarray
    losses: np.ndarray
    beta: float

    def most_exposed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` most exposed rows as ``(indices, losses)``, largest loss first."""
        k = _count("k", k, 1)
        return self.indices[::-1][:k], self.losses[::-1][:k]


def privacy_profile(base, neighbours, model_point, *, beta: float) -> PrivacyProfile:
    """The privacy profile of ``model_point``: rows sorted by ``|l(x, y_i, M)|`` (stable sort).

    Example::

        >>> p = privacy_profile([0.0, 0.0], [[2.0, 0.0], [0.0, 1.0], [0.5, 0.5]], [1.0, 0.0], beta=1.0)
        >>> p.indices, p.losses.round(3)
        (array([0, 2, 1]), array([0.   , 0.293, 0.414]))
        >>> p.most_exposed(1)[0]
        array([1])
    """
    losses = privacy_losses(base, neighbours, model_point, beta=beta)
    order = np.argsort(losses, kind="stable")
    return PrivacyProfile(indices=order, losses=losses[order], beta=float(beta))


# ----------------------------------------------------------------------------------------------
# typical model points (Sec. 5.4)
# ----------------------------------------------------------------------------------------------
def sample_output_noise(dim: int, *, beta: float, size: int | None = None, seed=None) -> np.ndarray:
    """Sample ``b`` with density ∝ ``exp(−β‖b‖)`` in ``R^dim``: uniform direction, ``‖b‖ ~ Gamma(dim, 1/β)``.

    Args:
        dim: dimension ``d``.
        beta: rate ``β > 0``.
        size: number of samples (``None`` for one vector).
        seed: anything :func:`numpy.random.default_rng` accepts.

    Returns:
        ``(dim,)`` or ``(size, dim)``.

    Example::

        >>> b = sample_output_noise(3, beta=2.0, size=20000, seed=0)
        >>> round(float(np.linalg.norm(b, axis=1).mean()), 2)  # E‖b‖ = d/β
        1.5
    """
    d = _count("dim", dim, 1)
    rate = _positive("beta", beta)
    rng = np.random.default_rng(seed)
    count = 1 if size is None else _count("size", size, 1)
    directions = rng.standard_normal((count, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radii = rng.gamma(shape=d, scale=1.0 / rate, size=count)
    noise = directions * radii[:, None]
    return noise[0] if size is None else noise


def _noise_basis(dim: int, num_samples: int, seed) -> tuple[np.ndarray, np.ndarray]:
    """Unit directions and ``Gamma(d, 1)`` radii; ``b = (radius/β)·direction`` for any ``β``."""
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((num_samples, dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return directions, rng.gamma(shape=dim, scale=1.0, size=num_samples)


def _scaled_differences(sq: np.ndarray, proj: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """``|‖Δ − ρu‖ − ρ|`` from ``‖Δ‖²`` (n,), ``u·Δ`` (s, n), ``ρ`` (s,), cancellation-free."""
    rho = rho[:, None]
    numerator = np.abs(sq[None, :] - 2.0 * rho * proj)
    denominator = np.sqrt(np.maximum(rho * rho - 2.0 * rho * proj + sq[None, :], 0.0)) + rho
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


@dataclass(frozen=True)
class TypicalProfile:
    """The privacy profile averaged rank by rank over ``M ~ A(x) + b`` (paper Fig. 5).

    Attributes:
        epsilon: ε of the mechanism.
        beta: ``β = nΛε/2``.
        losses: ``(n,)`` mean ``|l(x, y_{i_M}, M)|`` at each rank (ascending); divide by ``beta``
            for the paper's normalised profile.
    """

    epsilon: float
    beta: float
    losses: np.ndarray


def typical_profile(
    base,
    neighbours,
    *,
    epsilon: float,
    dataset_size: int,
    regularization: float,
    num_samples: int = 200,
    seed=0,
) -> TypicalProfile:
    """Mean sorted profile over ``num_samples`` model points drawn from the mechanism (Monte Carlo).

    Example::

        >>> nb = np.array([[0.01, 0.0], [0.0, 0.02], [0.03, 0.0]])
        >>> tp = typical_profile(np.zeros(2), nb, epsilon=1e4, dataset_size=100, regularization=1.0)
        >>> (tp.losses / tp.beta).round(3)  # small noise: close to the distances 0.01, 0.02, 0.03
        array([0.01, 0.02, 0.03])
    """
    a = _vector("base", base)
    nb = _matrix("neighbours", neighbours, a.shape[0])
    beta = noise_scale(epsilon=epsilon, dataset_size=dataset_size, regularization=regularization)
    directions, radii = _noise_basis(a.shape[0], _count("num_samples", num_samples, 1), seed)
    delta = nb - a
    sq = np.einsum("ij,ij->i", delta, delta)
    total = np.zeros(nb.shape[0])
    for chunk in np.array_split(np.arange(num_samples), max(1, num_samples // 32)):
        d = _scaled_differences(sq, directions[chunk] @ delta.T, radii[chunk] / beta)
        total += np.sort(d, axis=1).sum(axis=0)
    return TypicalProfile(epsilon=float(epsilon), beta=beta, losses=beta * total / num_samples)


def default_epsilon_grid(
    base,
    neighbours,
    *,
    dataset_size: int,
    regularization: float,
    num: int = 41,
    margin: float = 1e3,
    quantiles: Sequence[float] = (0.5, 1.0),
) -> np.ndarray:
    """A log-spaced ε grid wide enough to show both plateaus of :func:`transition_analysis`.

    The transition of row ``i`` sits where the typical noise radius ``d/β`` meets
    ``δ_i = ‖A(y_i) − A(x)‖``; the grid spans ``margin`` beyond that for the smallest positive and the
    largest δ at the given ``quantiles`` of the sorted δ.

    Example::

        >>> grid = default_epsilon_grid(np.zeros(2), [[0.1, 0.0], [0.0, 0.2]], dataset_size=2,
        ...                             regularization=1.0, num=5)
        >>> round(float(grid[0]), 4), round(float(grid[-1]), 1)  # d/(δ_max·margin), d·margin/δ_min, as ε
        (0.01, 20000.0)
    """
    a = _vector("base", base)
    nb = _matrix("neighbours", neighbours, a.shape[0])
    dist = np.sort(np.linalg.norm(nb - a, axis=1))
    q = np.asarray(quantiles, dtype=np.float64)
    if q.ndim != 1 or q.size == 0 or np.any(~np.isfinite(q)) or np.any((q < 0) | (q > 1)):
        raise ValueError(f"`quantiles` must be a non-empty 1-D sequence in [0, 1], got {quantiles!r}")
    tracked = dist[np.rint(q * (dist.size - 1)).astype(int)]
    positive = tracked[tracked > 0]
    if positive.size == 0:
        raise ValueError("`neighbours` all equal `base` at the tracked ranks: no row moves the model, no transition")
    scale = _count("dataset_size", dataset_size, 1) * _positive("regularization", regularization) / 2.0
    dim = a.shape[0]
    beta_low = dim / positive.max() / _positive("margin", margin)
    beta_high = dim / positive.min() * margin
    return np.logspace(np.log10(beta_low / scale), np.log10(beta_high / scale), _count("num", num, 3))


@dataclass(frozen=True)
class TransitionAnalysis:
    """Three regimes of the typical privacy profile across ε (paper Sec. 5.4, Figs. 5-7).

    For each tracked rank ``k`` of the ascending profile, ``curves[k]`` is ``mean|l|/β`` (the mean
    distance difference) against ε. It is flat for small ε (``low_plateau``: the noise dwarfs every
    ``δ_i``, the limit ``|u·Δ_i|`` for random directions ``u``), rises through a transition, and is flat
    again for large ε (``high_plateau``: the limit ``δ_i = ‖A(y_i) − A(x)‖``).

    Attributes:
        epsilons, betas: ``(E,)`` the grid, ascending.
        quantiles: ``(R,)`` tracked profile quantiles; ``ranks`` ``(R,)`` their 0-based rank positions.
        curves: ``(R, E)`` Monte-Carlo ``mean|l|/β``.
        low_plateau, high_plateau: ``(R,)`` the ε→0 and ε→∞ limits (same noise directions).
        low_onsets: ``(R,)`` largest grid ε up to which the curve stays within ``tolerance`` of the
            gap above its low plateau — lowering ε below it gains no privacy.
        high_onsets: ``(R,)`` smallest grid ε from which it stays within ``tolerance`` of its high
            plateau — raising ε beyond it loses no more privacy.
        epsilon_low, epsilon_high: the recommended range: ``min(low_onsets)``, ``max(high_onsets)``.
        tolerance: the fraction of the plateau gap used.
    """

    epsilons: np.ndarray
    betas: np.ndarray
    quantiles: np.ndarray
    ranks: np.ndarray
    curves: np.ndarray
    low_plateau: np.ndarray
    high_plateau: np.ndarray
    low_onsets: np.ndarray
    high_onsets: np.ndarray
    epsilon_low: float
    epsilon_high: float
    tolerance: float

    @property
    def recommended_range(self) -> tuple[float, float]:
        """``(epsilon_low, epsilon_high)``: ε outside it is not worth trying on this dataset."""
        return self.epsilon_low, self.epsilon_high


def transition_analysis(
    base,
    neighbours,
    *,
    dataset_size: int,
    regularization: float,
    epsilons: Sequence[float] | None = None,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99, 1.0),
    num_samples: int = 200,
    tolerance: float = 0.05,
    seed=0,
) -> TransitionAnalysis:
    """Locate the two plateaus of the typical profile and the ε range worth trying (Sec. 5.4).

    The same ``num_samples`` noise directions and ``Gamma(d, 1)`` radii are reused at every ε (the
    noise at rate β is ``radius/β · direction``), so the curves are smooth in ε and the plateau limits
    are computed from the same directions.

    Args:
        base: ``(d,)`` ``A(x)``.
        neighbours: ``(n, d)`` ``A(y_i)`` (e.g. :func:`worst_case_neighbours`).
        dataset_size: ``n`` in ``β = nΛε/2``.
        regularization: ``Λ``.
        epsilons: ascending grid of ε > 0 (default :func:`default_epsilon_grid`).
        quantiles: profile quantiles in ``[0, 1]`` to track (1.0 is the most exposed row).
        num_samples: Monte-Carlo model points.
        tolerance: fraction of the plateau gap, in ``(0, 0.5)``.
        seed: for :func:`numpy.random.default_rng`.

    Raises:
        ValueError: for bad arguments, or when the grid does not reach both plateaus for every
            tracked rank (the message says which end to extend).

    Example::

        >>> rng = np.random.default_rng(0)
        >>> nb = rng.normal(scale=1e-3, size=(500, 3))
        >>> ta = transition_analysis(np.zeros(3), nb, dataset_size=500, regularization=1.0)
        >>> bool(ta.epsilon_low < ta.epsilon_high), bool(np.all(ta.high_plateau > ta.low_plateau))
        (True, True)
    """
    a = _vector("base", base)
    nb = _matrix("neighbours", neighbours, a.shape[0])
    n_rows = nb.shape[0]
    tol = _positive("tolerance", tolerance)
    if tol >= 0.5:
        raise ValueError(f"`tolerance` must be in (0, 0.5), got {tolerance!r}")
    q = np.asarray(quantiles, dtype=np.float64)
    if q.ndim != 1 or q.size == 0 or np.any(~np.isfinite(q)) or np.any((q < 0) | (q > 1)):
        raise ValueError(f"`quantiles` must be a non-empty 1-D sequence in [0, 1], got {quantiles!r}")
    if epsilons is None:
        epsilons = default_epsilon_grid(a, nb, dataset_size=dataset_size, regularization=regularization, quantiles=q)
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.ndim != 1 or eps.size < 3 or not np.all(np.isfinite(eps)) or np.any(eps <= 0) or np.any(np.diff(eps) <= 0):
        raise ValueError(f"`epsilons` must be a strictly increasing 1-D grid of >= 3 finite values > 0, got {eps!r}")
    ranks = np.rint(q * (n_rows - 1)).astype(int)
    betas = np.array([noise_scale(epsilon=e, dataset_size=dataset_size, regularization=regularization) for e in eps])
    num_samples = _count("num_samples", num_samples, 1)
    directions, radii = _noise_basis(a.shape[0], num_samples, seed)
    delta = nb - a
    sq = np.einsum("ij,ij->i", delta, delta)

    high = np.sort(np.sqrt(sq))[ranks]
    curves = np.zeros((ranks.size, eps.size))
    low = np.zeros(ranks.size)
    unique_ranks = np.unique(ranks)
    for chunk in np.array_split(np.arange(num_samples), max(1, num_samples // 32)):
        proj = directions[chunk] @ delta.T
        low += np.partition(np.abs(proj), unique_ranks, axis=1)[:, ranks].sum(axis=0)
        for j, beta in enumerate(betas):
            d = _scaled_differences(sq, proj, radii[chunk] / beta)
            curves[:, j] += np.partition(d, unique_ranks, axis=1)[:, ranks].sum(axis=0)
    curves /= num_samples
    low /= num_samples

    gap = high - low
    if np.any(gap <= 0):
        bad = q[gap <= 0]
        raise ValueError(f"no transition at `quantiles` {bad.tolist()}: the tracked rows do not move the model")
    fraction = (curves - low[:, None]) / gap[:, None]
    low_onsets = np.empty(ranks.size)
    high_onsets = np.empty(ranks.size)
    for r in range(ranks.size):
        below = fraction[r] <= tol
        if not below[0]:
            raise ValueError(
                f"`epsilons` does not reach the low-ε plateau for quantile {q[r]}: extend the grid below {eps[0]:.3g}"
            )
        low_onsets[r] = eps[np.argmin(below) - 1] if not below.all() else eps[-1]
        above = fraction[r] >= 1.0 - tol
        if not above[-1]:
            raise ValueError(
                f"`epsilons` does not reach the high-ε plateau for quantile {q[r]}: extend the grid above {eps[-1]:.3g}"
            )
        first = eps.size - np.argmin(above[::-1]) if not above.all() else 0
        high_onsets[r] = eps[first]
    return TransitionAnalysis(
        epsilons=eps,
        betas=betas,
        quantiles=q,
        ranks=ranks,
        curves=curves,
        low_plateau=low,
        high_plateau=high,
        low_onsets=low_onsets,
        high_onsets=high_onsets,
        epsilon_low=float(low_onsets.min()),
        epsilon_high=float(high_onsets.max()),
        tolerance=tol,
    )

"""Tests for lightning_privacy.analysis.privacy_profile (closed forms, retraining, sampling laws)."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from lightning_privacy.analysis import privacy_profile as pp


def _synthetic(n=300, d=4, seed=0):
    """Adult-like rows: standardised, one heavy outlier, scaled into the unit ball (paper Sec. 2)."""
    rng = np.random.default_rng(seed)
    raw = rng.normal(size=(n, d))
    raw[0] *= 25.0  # like capital-gain in Adult: the largest row sets the scale
    w = rng.normal(size=d)
    labels = (raw @ w + rng.normal(size=n) > 0).astype(int)
    return pp.UnitBallScaler.fit(raw).transform(raw), labels


@pytest.fixture(scope="module")
def fitted():
    x, y = _synthetic()
    base = pp.fit_logistic_regression(x, y, regularization=1.0)
    grads = pp.logistic_gradients(base, x, y)
    return x, y, base, grads


def test_unit_ball_scaler():
    x, _ = _synthetic()
    assert np.linalg.norm(x, axis=1).max() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="features"):
        pp.UnitBallScaler.fit(np.ones(3))


def test_fit_matches_sklearn_and_is_stationary(fitted):
    from sklearn.linear_model import LogisticRegression

    x, y, base, _ = fitted
    assert np.linalg.norm(pp.objective_gradient(base, x, y, regularization=1.0)) < 1e-12
    # sklearn minimises C Σ l + ½‖f‖², i.e. Λ = 1/(nC)
    ref = LogisticRegression(C=1.0 / len(y), fit_intercept=False, tol=1e-14, max_iter=10_000).fit(x, y)
    np.testing.assert_allclose(ref.coef_[0], base, rtol=1e-6, atol=1e-10)


def test_logistic_gradients_closed_form_vs_finite_differences(fitted):
    x, y, base, grads = fitted
    s = 2 * y - 1
    i, h = 7, 1e-6
    loss = lambda f: np.logaddexp(0.0, -s[i] * x[i] @ f)  # noqa: E731
    fd = np.array([(loss(base + h * e) - loss(base - h * e)) / (2 * h) for e in np.eye(len(base))])
    np.testing.assert_allclose(grads[i], fd, rtol=1e-6, atol=1e-12)
    # {0,1} and {-1,+1} labels give the same gradients
    np.testing.assert_array_equal(grads, pp.logistic_gradients(base, x, s))


def test_worst_case_matches_retraining_within_paper_tolerance(fitted):
    """Paper Sec. 5.1: max ‖A_wc(y) − A(y)‖ / ‖A(y) − A(x)‖ < 2·10⁻³ (exhaustive retraining)."""
    x, y, base, grads = fitted
    wc = pp.worst_case_neighbours(base, grads, regularization=1.0)
    bound = pp.worst_case_relative_error_bound(x, regularization=1.0)
    centres, radii = pp.sphere_bound(base, grads, regularization=1.0)
    ratios = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        exact = pp.fit_logistic_regression(x[keep], y[keep], regularization=1.0, initial=base)
        ratios.append(np.linalg.norm(wc[i] - exact) / np.linalg.norm(exact - base))
        assert np.linalg.norm(exact - centres[i]) <= radii[i] * (1 + 1e-9)  # inside the sphere
    assert max(ratios) < 2e-3
    assert max(ratios) <= bound  # our certified bound holds
    assert max(ratios) > 0.2 * bound  # and is not vacuous


def test_sphere_geometry(fitted):
    _, _, base, grads = fitted
    centres, radii = pp.sphere_bound(base, grads, regularization=1.0)
    np.testing.assert_allclose(np.linalg.norm(centres - base, axis=1), radii, rtol=1e-12)  # Eq. 21
    wc = pp.worst_case_neighbours(base, grads, regularization=1.0)
    np.testing.assert_allclose(wc, 2 * centres - base, rtol=1e-12, atol=1e-15)  # Eq. 22


def test_loss_zero_when_equidistant_and_bounded_by_distance(fitted):
    _, _, base, grads = fitted
    wc = pp.worst_case_neighbours(base, grads, regularization=1.0)
    i = 3
    delta = wc[i] - base
    normal = np.linalg.svd(delta[None, :])[2][1]  # orthogonal to delta
    for m in (base + delta / 2, base + delta / 2 + 5.0 * normal):  # on the bisecting hyperplane
        assert pp.privacy_losses(base, wc, m, beta=1e6)[i] == pytest.approx(0.0, abs=1e-9)
    at_base = pp.privacy_losses(base, wc, base, beta=2.0)
    np.testing.assert_allclose(at_base, 2.0 * np.linalg.norm(wc - base, axis=1), rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-1, 1), min_size=3, max_size=3),
    st.lists(st.floats(-1, 1), min_size=3, max_size=3),
    st.floats(0.01, 100),
)
def test_loss_properties(neighbour, model, beta):
    base = np.zeros(3)
    nb = np.array([neighbour])
    m = np.array(model)
    loss = pp.privacy_losses(base, nb, m, beta=beta)[0]
    direct = beta * abs(np.linalg.norm(nb[0] - m) - np.linalg.norm(m))
    assert loss == pytest.approx(direct, rel=1e-9, abs=1e-12)
    assert loss <= beta * np.linalg.norm(nb[0]) * (1 + 1e-12) + 1e-12  # triangle inequality


def test_profile_ranking_independent_of_epsilon(fitted):
    x, _, base, grads = fitted
    wc = pp.worst_case_neighbours(base, grads, regularization=1.0)
    m = base + pp.sample_output_noise(len(base), beta=1e4, seed=1)
    profiles = [
        pp.privacy_profile(base, wc, m, beta=pp.noise_scale(epsilon=e, dataset_size=len(x), regularization=1.0))
        for e in (0.01, 1.0, 100.0)
    ]
    for p in profiles[1:]:
        np.testing.assert_array_equal(p.indices, profiles[0].indices)
        np.testing.assert_allclose(p.losses / p.beta, profiles[0].losses / profiles[0].beta, rtol=1e-12)
    assert np.all(np.diff(profiles[0].losses) >= 0)
    top, losses = profiles[0].most_exposed(5)
    assert losses[0] == profiles[0].losses.max() and len(top) == 5


@pytest.mark.parametrize("dim", [1, 2, 6])
def test_noise_radius_law_is_gamma(dim):
    beta = 3.0
    b = pp.sample_output_noise(dim, beta=beta, size=20_000, seed=dim)
    radii = np.linalg.norm(b, axis=1)
    assert stats.kstest(radii, stats.gamma(a=dim, scale=1 / beta).cdf).pvalue > 1e-3
    # directions uniform: the mean unit vector vanishes
    assert np.linalg.norm((b / radii[:, None]).mean(axis=0)) < 0.03
    if dim == 1:  # density ∝ exp(−β|b|) is the Laplace law
        assert stats.kstest(b[:, 0], stats.laplace(scale=1 / beta).cdf).pvalue > 1e-3


def test_noise_scale():
    assert pp.noise_scale(epsilon=0.1, dataset_size=30162, regularization=1.0) == pytest.approx(1508.1)
    with pytest.raises(ValueError, match="`epsilon` must be a finite number > 0, got -1"):
        pp.noise_scale(epsilon=-1, dataset_size=10, regularization=1.0)
    with pytest.raises(TypeError, match="`dataset_size` must be an int"):
        pp.noise_scale(epsilon=1.0, dataset_size=10.5, regularization=1.0)


def test_transition_plateaus_closed_form():
    """All rows identical: the low plateau is δ·E|cos θ| = δ Γ(d/2)/(√π Γ((d+1)/2)); the high is δ."""
    d, delta = 3, 1e-3
    nb = np.tile([delta, 0.0, 0.0], (50, 1))
    ta = pp.transition_analysis(np.zeros(d), nb, dataset_size=50, regularization=1.0, num_samples=4000)
    mean_cos = math.exp(special.gammaln(d / 2) - special.gammaln((d + 1) / 2)) / math.sqrt(math.pi)
    np.testing.assert_allclose(ta.high_plateau, delta)
    np.testing.assert_allclose(ta.low_plateau, delta * mean_cos, rtol=0.03)
    np.testing.assert_allclose(ta.curves[:, 0], ta.low_plateau, rtol=0.02)
    np.testing.assert_allclose(ta.curves[:, -1], ta.high_plateau, rtol=0.02)
    assert ta.epsilon_low < ta.epsilon_high


def test_transition_onsets_scale_inversely_with_distance():
    """β* ∝ 1/‖A(x) − A(y)‖ (Sec. 5.4): scaling every Δ by c scales the onsets by 1/c exactly."""
    rng = np.random.default_rng(3)
    nb = rng.normal(scale=1e-3, size=(200, 3))
    grid = np.logspace(-1, 6, 36)
    kw = dict(dataset_size=200, regularization=1.0, num_samples=64, seed=5)
    ta = pp.transition_analysis(np.zeros(3), nb, epsilons=grid, **kw)
    scaled = pp.transition_analysis(np.zeros(3), 10 * nb, epsilons=grid / 10, **kw)
    np.testing.assert_allclose(scaled.low_onsets, ta.low_onsets / 10, rtol=1e-9)
    np.testing.assert_allclose(scaled.high_onsets, ta.high_onsets / 10, rtol=1e-9)
    np.testing.assert_allclose(scaled.curves, 10 * ta.curves, rtol=1e-9)
    # more exposed ranks (larger δ) leave the low plateau at smaller ε
    assert np.all(np.diff(ta.low_onsets) <= 0)


def test_typical_profile_limits():
    nb = np.array([[1e-3, 0.0], [0.0, 2e-3], [3e-3, 0.0]])
    high = pp.typical_profile(np.zeros(2), nb, epsilon=1e9, dataset_size=3, regularization=1.0)
    np.testing.assert_allclose(high.losses / high.beta, [1e-3, 2e-3, 3e-3], rtol=1e-3)
    low = pp.typical_profile(np.zeros(2), nb, epsilon=1e-6, dataset_size=3, regularization=1.0, num_samples=2000)
    assert low.losses[-1] / low.beta < 3e-3 and np.all(np.diff(low.losses) >= 0)


def test_transition_errors():
    nb = np.random.default_rng(0).normal(scale=1e-3, size=(20, 2))
    kw = dict(dataset_size=20, regularization=1.0, num_samples=16)
    with pytest.raises(ValueError, match="extend the grid below"):
        pp.transition_analysis(np.zeros(2), nb, epsilons=[1e6, 1e7, 1e8], **kw)
    with pytest.raises(ValueError, match="extend the grid above"):
        pp.transition_analysis(np.zeros(2), nb, epsilons=[1e-3, 1e-2, 1e-1], **kw)
    with pytest.raises(ValueError, match="`epsilons` must be a strictly increasing"):
        pp.transition_analysis(np.zeros(2), nb, epsilons=[3.0, 2.0, 1.0], **kw)
    with pytest.raises(ValueError, match="`quantiles`"):
        pp.transition_analysis(np.zeros(2), nb, quantiles=[1.5], **kw)
    with pytest.raises(ValueError, match="`tolerance`"):
        pp.transition_analysis(np.zeros(2), nb, tolerance=0.7, **kw)
    with pytest.raises(ValueError, match="no row moves the model"):
        pp.default_epsilon_grid(np.zeros(2), np.zeros((3, 2)), dataset_size=3, regularization=1.0)


def test_input_errors():
    with pytest.raises(ValueError, match="`labels` must take values in"):
        pp.logistic_gradients([0.0], [[1.0], [0.5]], [2, 0])
    with pytest.raises(ValueError, match="`gradients` must have 2 columns"):
        pp.worst_case_neighbours([0.0, 1.0], [[1.0]], regularization=1.0)
    with pytest.raises(ValueError, match="`regularization` must be a finite number > 0, got 0.0"):
        pp.worst_case_neighbours([0.0], [[1.0], [2.0]], regularization=0.0)
    with pytest.raises(ValueError, match="`model_point` must have shape"):
        pp.privacy_losses([0.0, 0.0], [[1.0, 0.0]], [0.0], beta=1.0)


def test_analysis_imports_no_torch():
    code = (
        "import sys, lightning_privacy.analysis.privacy_profile; "
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""The one-run audit's headline never overstates, whatever the mechanism (issue 56).

Canaries simulated from (ε₀, 0)-DP mechanisms that are not Gaussian — randomized response (a canary's score is its
bit, flipped with probability 1/(1 + e^ε₀)) and Laplace (its bit plus Laplace noise of scale 1/ε₀) — and from
Gaussian ones, m = 1,000 independent canaries, α = 0.05, δ = 1e-5. The headline (``audit_canaries``' tightest bound,
the first number of its summary) combines only tests valid for every (ε, δ)-DP mechanism, so it exceeds the true ε in
at most α of audits (the issue's limit: 10 %); before, it read μ through the Gaussian curve and exceeded it in 58–100 %
of them. The Gaussian readings still overstate here (asserted, so the simulation shows the difference), and stay
sound where the mechanism is Gaussian. DP-SGD claims are tested on the run's own PLD curve: a true claim is contradicted
in at most α of simulated runs, half the claimed noise in most.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_privacy import names
from lightning_privacy.analysis.canary import epsilon_from_mu
from lightning_privacy.audits.canary import audit_canaries
from lightning_privacy.claims import Claim

M, ALPHA, DELTA, RUNS = 1000, 0.05, 1e-5, 100
HEADLINE_LIMIT = 0.10  # the issue's: at most 10 % of 100 simulated headlines above the true ε
BINOMIAL_LIMIT = ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / RUNS)  # α and three standard errors of 100 runs


def _randomized_response(rng: np.random.Generator, epsilon: float) -> tuple:
    included = rng.random(M) < 0.5
    keep = rng.random(M) < math.exp(epsilon) / (1.0 + math.exp(epsilon))
    return np.where(keep, included, ~included).astype(float), included


def _laplace(rng: np.random.Generator, epsilon: float) -> tuple:
    included = rng.random(M) < 0.5
    return included + rng.laplace(scale=1.0 / epsilon, size=M), included


def _gaussian(rng: np.random.Generator, mu: float) -> tuple:
    included = rng.random(M) < 0.5
    return mu * included + rng.normal(size=M), included


def _dp_sgd(rng: np.random.Generator, sigma: float, sample_rate: float = 0.1, steps: int = 300) -> tuple:
    """A white-box gradient canary's summed released coordinate over T steps (C = 1): its bit times Binomial(T, q)
    plus N(0, σ²T) — the post-processing of T Poisson-subsampled Gaussian steps."""
    included = rng.random(M) < 0.5
    signal = rng.binomial(steps, sample_rate, size=M) * included
    return signal + rng.normal(scale=sigma * math.sqrt(steps), size=M), included


def _audits(draw, parameter: float, seed: int, **kwargs):
    rng = np.random.default_rng(seed)
    for _ in range(RUNS):
        scores, included = draw(rng, parameter)
        yield audit_canaries(scores, included, delta=DELTA, alpha=ALPHA, **kwargs)


@pytest.mark.parametrize(
    ("draw", "parameter", "true_epsilon", "reading_over"),
    [
        (_randomized_response, 2.0, 2.0, 0.5),  # the issue: tightest above ε in 100 %, "ε ≥ 9.432"
        (_laplace, 1.0, 1.0, 0.5),  # the issue: 100 %, "ε ≥ 2.779"
        (_randomized_response, 1.0, 1.0, 0.3),
        (_laplace, 4.0, 4.0, 0.5),
    ],
    ids=["rr-2", "laplace-1", "rr-1", "laplace-4"],
)
def test_the_headline_is_sound_for_mechanisms_that_are_not_gaussian(draw, parameter, true_epsilon, reading_over):
    headline = binomial = reading = 0
    for result in _audits(draw, parameter, seed=56, independent=True):
        v = result.values
        assert result.tightest.sound and v[names.CANARY_EPSILON_LOWER_TIGHTEST] == result.tightest.epsilon_lower
        assert result.summary().startswith(f"Canary audit (scores, m = {M}): ε ≥ {result.tightest.epsilon_lower:.3f}")
        headline += v[names.CANARY_EPSILON_LOWER_TIGHTEST] > true_epsilon
        binomial += v[names.CANARY_EPSILON_LOWER] > true_epsilon
        reading += v[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING] > true_epsilon
    assert headline / RUNS <= HEADLINE_LIMIT, f"headline above ε = {true_epsilon} in {headline} of {RUNS} audits"
    assert binomial / RUNS <= BINOMIAL_LIMIT
    assert reading / RUNS >= reading_over  # the Gaussian reading overstates here: why it is never the headline


def test_the_headline_of_interacting_canaries_is_sound_too():
    """Without ``independent`` the headline is the f-DP test of the (ε, δ) curve alone (valid however canaries
    interact); on Laplace ε₀ = 1 canaries it stays below ε, the Gaussian f-DP reading does not always."""
    headline = reading = 0
    for result in _audits(_laplace, 1.0, seed=57):
        assert result.tightest.methods == ("fdp",)
        headline += result.values[names.CANARY_EPSILON_LOWER_TIGHTEST] > 1.0
        reading += result.values[names.CANARY_EPSILON_GDP_GAUSSIAN_READING] > 1.0
    assert headline / RUNS <= HEADLINE_LIMIT and reading > headline


@pytest.mark.parametrize("mu", [1.0, 2.0])
def test_on_gaussian_canaries_the_headline_and_the_readings_are_sound(mu):
    true_epsilon = epsilon_from_mu(mu=mu, delta=DELTA)
    over = {key: 0 for key in (names.CANARY_EPSILON_LOWER_TIGHTEST, names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING)}
    below_reading = 0
    for result in _audits(_gaussian, mu, seed=58, independent=True):
        for key in over:
            over[key] += result.values[key] > true_epsilon
        below_reading += (
            result.values[names.CANARY_EPSILON_LOWER_TIGHTEST]
            <= (result.values[names.CANARY_EPSILON_ORDERSTAT_GAUSSIAN_READING])
        )
    assert all(count / RUNS <= BINOMIAL_LIMIT for count in over.values()), over
    assert below_reading / RUNS >= 0.9  # what the sound headline gives up where the mechanism is Gaussian


def test_dp_sgd_claims_are_tested_on_their_own_curve():
    """Summed DP-SGD canary scores (q = 0.1, 300 steps, σ = 2.07: ε = 4.0 at δ = 1e-5): the true claim
    (``Claim.dp_sgd``, the ledger's PLD curve) is contradicted in at most α of runs and the headline never passes its ε;
    a claim of twice the noise (σ = 4.14, as if the run had half the noise it claims) is contradicted in most runs.
    The verdict says which curve it read."""
    truth = Claim.dp_sgd(noise_multiplier=2.07, sample_rate=0.1, steps=300)
    double = Claim.dp_sgd(noise_multiplier=4.14, sample_rate=0.1, steps=300)
    assert truth.epsilon == pytest.approx(4.0, abs=0.05)
    contradicted = {"truth": 0, "double": 0}
    headline_over = 0
    rng = np.random.default_rng(59)
    for _ in range(RUNS // 2):
        scores, included = _dp_sgd(rng, 2.07)
        for name, claim in (("truth", truth), ("double", double)):
            result = audit_canaries(scores, included, delta=DELTA, claim=claim, independent=True)
            contradicted[name] += result.claim_verdict.contradicted
            assert result.claim_verdict.curve == claim.curve
            assert "the ledger's PLD: add/remove, Poisson-subsampled Gaussian" in result.claim_verdict.sentence()
        headline_over += result.values[names.CANARY_EPSILON_LOWER_TIGHTEST] > truth.epsilon
    assert contradicted["truth"] / (RUNS // 2) <= ALPHA + 3.0 * math.sqrt(ALPHA * (1 - ALPHA) / (RUNS // 2))
    assert contradicted["double"] / (RUNS // 2) >= 0.8, contradicted
    assert headline_over == 0


def test_an_epsilon_delta_claim_is_tested_on_the_generic_curve_and_says_so():
    rng = np.random.default_rng(60)
    scores, included = _laplace(rng, 1.0)
    verdict = audit_canaries(scores, included, delta=DELTA, claim=(1.0, DELTA)).claim_verdict
    assert not verdict.contradicted and verdict.curve == "the (ε, δ) trade-off curve (Kairouz et al.)"
    assert verdict.sentence().endswith("; tested on the (ε, δ) trade-off curve (Kairouz et al.))")

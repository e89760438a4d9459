"""audit_canaries: the same numbers as CanaryAudit on the same scores; the four views; argument errors."""

import json

import numpy as np
import pytest

from lightning_privacy import DPSGD, CanaryAudit, names
from lightning_privacy.analysis.canary import canary_audit_from_scores, max_epsilon_lower
from lightning_privacy.audits import CanaryResult, audit_canaries
from tests.callbacks.test_canary_audit import _fit


def test_the_callback_and_a_direct_call_give_the_same_values():
    dpsgd, audit = DPSGD(noise_multiplier=1.0), CanaryAudit(num_canaries=200)
    _fit([dpsgd, audit], epochs=2)
    direct = audit_canaries(
        audit.scores,
        audit.included,
        delta=dpsgd.delta,
        kind="gradient",
        accountant_epsilon=dpsgd.epsilon(),
        claim=dpsgd.ledger,  # the callback's default claim: the run's own ledger
        independent=True,  # gradient canaries with the default score: the callback adds the order-statistic test
    )
    assert {**direct.values, **direct.metrics()} == audit.results
    assert direct.summary() == audit.summary()
    assert audit.results[names.CANARY_CLAIM_CONTRADICTED] == 0.0 and audit.result.verdict == "consistent"
    assert audit.result.claim.epsilon <= dpsgd.epsilon()  # the PLD's ε: at most the accountant's


def test_values_match_the_analysis_and_the_views():
    rng = np.random.default_rng(1)
    included = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 3.0 * included  # strongly leaky
    result = audit_canaries(scores, included, delta=1e-5, accountant_epsilon=20.0, kind="input")
    assert isinstance(result, CanaryResult)
    for method, key in (
        ("binomial", names.CANARY_EPSILON_LOWER),
        ("fdp", names.CANARY_EPSILON_LOWER_FDP),
        ("gdp", names.CANARY_EPSILON_GDP_GAUSSIAN_READING),
    ):
        ref = canary_audit_from_scores(scores=scores, included=included, delta=1e-5, method=method)
        assert result.values[key] == ref.epsilon_lower > 0
    # every guess right is impossible to beat: the ceiling is the all-correct bound at the Bonferroni level
    assert result.ceiling == pytest.approx(max_epsilon_lower(num_canaries=1000, alpha=0.05 / 27, delta=1e-5))
    assert result.epsilon_lower <= result.ceiling
    assert names.CANARY_EPSILON_OPTIMISTIC not in result.metrics()  # not a valid bound: not logged
    assert result.values[names.CANARY_EPSILON_OPTIMISTIC] >= result.epsilon_lower
    again = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert again["values"][names.CANARY_EPSILON_LOWER] == result.epsilon_lower
    assert again["details"]["binomial"]["k_plus"] == result.details["binomial"].k_plus
    fig = result.figure()
    assert len(fig.axes[0].patches) == 4  # accountant, the headline, binomial, the Gaussian reading
    assert result.values[names.CANARY_EPSILON_LOWER_TIGHTEST] == result.values[names.CANARY_EPSILON_LOWER_FDP]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delta": 1.0}, ValueError, r"`delta` to be in \[0, 1\)"),
        ({"delta": 1e-5, "alpha": 0.0}, ValueError, r"`alpha` to be in \(0, 1\)"),
        ({"delta": 1e-5, "correction": "none"}, ValueError, r"`correction` to be one of"),
        ({"delta": "x"}, TypeError, r"`delta` to be a real number"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        audit_canaries(np.zeros(10), np.ones(10, dtype=bool), **kwargs)


def test_an_inclusion_vector_that_is_no_fair_draw_is_refused():
    """All True used to make a true claim look contradicted (issue 37): scores with no signal, a claim of σ = 1."""
    scores = np.random.default_rng(3).normal(size=1000)
    for included in (np.ones(1000, bool), np.r_[np.ones(620, bool), np.zeros(380, bool)]):
        expected = rf"`included`.*{int(included.sum())} of 1000 canaries.*Draw it with a generator"
        with pytest.raises(ValueError, match=expected):
            audit_canaries(scores, included, delta=1e-5, claim=(1.0, 0.1, 100))
    fair = np.random.default_rng(4).random(1000) < 0.5
    assert audit_canaries(scores, fair, delta=1e-5, claim=(1.0, 0.1, 100)).verdict == "consistent"

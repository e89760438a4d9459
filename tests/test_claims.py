"""Claim: every way to state a guarantee gives the same curve and ε; a ledger claim is a snapshot; errors are named."""

import json
import math

import numpy as np
import pytest

from lightning_privacy.analysis.claims import epsilon_delta_tpr_bound
from lightning_privacy.claims import Claim
from lightning_privacy.ledger import PrivacyLedger

FPR = np.array([1e-3, 0.01, 0.1, 0.5])


def test_a_dp_sgd_claim_is_the_ledgers_add_remove_curve():
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=1.0, sample_rate=0.2, steps=150)
    claim = Claim.dp_sgd(noise_multiplier=1.0, sample_rate=0.2, steps=150)
    np.testing.assert_array_equal(claim.tpr_bound(FPR), ledger.tpr_bounds(FPR, relation="add_remove"))
    assert claim.relation == "add_remove" and claim.kind == "dp_sgd" and claim.delta == 1e-5
    pld = ledger.privacy_loss_distribution("add_remove")
    assert claim.epsilon == pld.epsilon(1e-5) <= ledger.epsilon()  # the PLD's ε: at most the accountant's (RDP)
    for form in ((1.0, 0.2, 150), [1.0, 0.2, 150, 1e-5], ledger, claim):
        parsed = Claim.parse(form)
        assert parsed.epsilon == claim.epsilon and parsed.label == claim.label
        np.testing.assert_array_equal(parsed.tpr_bound(FPR), claim.tpr_bound(FPR))
    assert Claim.parse((1.0, 0.2, 150, 1e-3)).epsilon < claim.epsilon  # a larger δ: a smaller ε


def test_an_epsilon_delta_claim_is_kairouz_curve():
    claim = Claim.parse((1.0, 1e-5))
    assert claim.kind == "epsilon_delta" and claim.epsilon == 1.0 and claim.delta == 1e-5
    np.testing.assert_array_equal(claim.tpr_bound(FPR), epsilon_delta_tpr_bound(FPR, epsilon=1.0, delta=1e-5))
    assert Claim.epsilon_delta(0.0, 0.0).tpr_bound(0.3) == pytest.approx(0.3)  # perfect privacy: chance


def test_a_ledger_claim_is_a_snapshot():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.0, sample_rate=0.1, steps=100)
    claim = Claim.from_ledger(ledger, delta=1e-6)
    before = claim.tpr_bound(FPR)
    ledger.step(noise_multiplier=1.0, sample_rate=0.1, steps=100)  # training goes on
    np.testing.assert_array_equal(claim.tpr_bound(FPR), before)
    assert claim.delta == 1e-6 and claim.parameters["steps"] == 100
    ledger.step(noise_multiplier=2.0, sample_rate=0.1, steps=10)
    mixed = Claim.from_ledger(ledger)
    assert mixed.label == "DP-SGD 2 segments, 210 steps (δ = 1e-05)" and "noise_multiplier" not in mixed.parameters


def test_to_dict_is_plain_json():
    out = json.loads(json.dumps(Claim.dp_sgd(noise_multiplier=2.0, sample_rate=0.1, steps=300).to_dict()))
    assert out["kind"] == "dp_sgd" and out["relation"] == "add_remove" and out["noise_multiplier"] == 2.0
    assert out["epsilon"] == pytest.approx(4.18, abs=0.01)  # dp_accounting's add/remove PLD: 4.183
    assert out["history"] == [[2.0, 0.1, 300]]
    # a δ below the mass at +∞: no finite ε, said as null
    tiny = Claim.dp_sgd(noise_multiplier=0.2, sample_rate=1.0, steps=1000, delta=1e-300)
    assert math.isinf(tiny.epsilon) and tiny.to_dict()["epsilon"] is None


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("eps=1", TypeError, "`claim` must be a Claim, a PrivacyLedger, .* got 'eps=1'"),
        ((1.0,), TypeError, "`claim` must be"),
        ((1, 2, 3, 4, 5), TypeError, "`claim` must be"),
        ((-1.0, 1e-5), ValueError, "`epsilon` must be a finite number >= 0, got -1.0"),
        ((math.inf, 1e-5), ValueError, "`epsilon` must be a finite number >= 0, got inf"),
        ((1.0, 1.0), ValueError, r"`delta` must be in \[0, 1\), got 1.0"),
        ((0.0, 0.1, 10), ValueError, "`noise_multiplier` must be a positive finite number, got 0.0"),
        ((1.0, 0.0, 10), ValueError, r"`sample_rate` must be in \(0, 1\], got 0.0"),
        ((1.0, 0.1, 2.5), ValueError, "`steps` must be an int >= 1, got 2.5"),
        ((1.0, 0.1, True), ValueError, "`steps` must be an int >= 1, got True"),
        ((1.0, 0.1, 10, 0.0), ValueError, r"`delta` must be in \(0, 1\), got 0.0"),
        (PrivacyLedger(), ValueError, "without steps"),
    ],
)
def test_bad_claims_name_the_argument_and_value(value, error, match):
    with pytest.raises(error, match=match):
        Claim.parse(value)


@pytest.mark.parametrize(("sigma", "rate", "steps"), [(0.3, 1.0, 4), (0.3, 1.0, 5), (0.4, 0.2, 50)])
def test_epsilon_is_finite_above_the_pld_loss_cap_and_matches_dp_accounting(sigma, rate, steps):
    """ε ≈ 50–62 (dp_accounting's add/remove PLD): the PLD's loss cap of 50 made it inf (issue 37, item 7)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    claim = Claim.dp_sgd(noise_multiplier=sigma, sample_rate=rate, steps=steps)
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3
    )
    accountant.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)
    reference = accountant.get_epsilon(1e-5)
    assert 49 < reference - 1e-9 <= claim.epsilon <= reference + 1e-3  # never below: the safe side for a claim
    assert accountant.get_delta(claim.epsilon) <= 1e-5 * (1 + 1e-9)
    assert claim.to_dict()["epsilon"] == claim.epsilon  # a number, no longer null


def test_check_canaries_refuses_an_inclusion_vector_that_is_no_fair_draw():
    claim = Claim.dp_sgd(noise_multiplier=1.0, sample_rate=0.1, steps=100)
    scores = np.random.default_rng(0).normal(size=500)  # no signal: the claim is true
    with pytest.raises(ValueError, match=r"`included`.*500 of 500 canaries included.*p = .* < 1e-06"):
        claim.check_canaries(scores, np.ones(500, bool))
    with pytest.raises(ValueError, match=r"`included`.*0 of 500"):
        claim.check_canaries(scores, np.zeros(500, bool), tests="fdp")
    assert not claim.check_canaries(scores, np.random.default_rng(1).random(500) < 0.5).contradicted

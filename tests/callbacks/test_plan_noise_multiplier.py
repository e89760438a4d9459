"""DPSGD's noise planning without a Trainer: a ``max_epochs`` other than the planned ``epochs`` warns, as does a
planned σ above 50; nothing else does."""

from __future__ import annotations

import warnings

import pytest

from lightning_privacy.dpsgd.settings import plan_noise_multiplier
from lightning_privacy.ledger import PrivacyLedger

PLAN = dict(
    sample_rate=0.1,
    steps_per_epoch=10,
    epochs=3,
    accountant="rdp",
    target_bayes_security=None,
    target_epsilon=2.0,
    delta=1e-5,
)


def test_a_max_epochs_above_the_planned_epochs_warns_and_no_other_does():
    expected = r"Trainer\(max_epochs=5\) exceeds the planned epochs=3: .*PrivacyBudgetStopping"
    with pytest.warns(UserWarning, match=expected):
        sigma = plan_noise_multiplier(**PLAN, max_epochs=5)
    for max_epochs in (None, 3):  # the plan (or no Trainer limit given): silent; fewer epochs warn (below)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert plan_noise_multiplier(**PLAN, max_epochs=max_epochs) == sigma
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=sigma, sample_rate=0.1, steps=30)
    assert ledger.epsilon() <= 2.0  # the plan meets the target after the planned 3 epochs


def test_a_max_epochs_below_the_planned_epochs_warns_with_the_epsilon_the_fit_ends_at():
    """Issue 55: σ planned for 5 epochs spent over 2 ended at ε 2.73 instead of the 4 asked, without a word."""
    plan = {**PLAN, "epochs": 5, "accountant": "pld", "target_epsilon": 4.0}
    with pytest.warns(UserWarning, match=r"Trainer\(max_epochs=2\) ends the fit before the planned DPSGD\(epochs=5\)"):
        sigma = plan_noise_multiplier(**plan, max_epochs=2)
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=sigma, sample_rate=0.1, steps=20)
    with pytest.warns(UserWarning) as caught:
        plan_noise_multiplier(**plan, max_epochs=2)
    message = str(caught[0].message)
    assert f"ends at ε = {ledger.epsilon():.4g} (δ = 1e-05)" in message and ledger.epsilon() < 3.9
    assert "DPSGD(target_epsilon=4.0, delta=1e-05, epochs=2)" in message  # the fix, with the user's own target
    with pytest.warns(UserWarning, match=r"ends at β\*_MIA = 0\.9\d+"):
        plan_noise_multiplier(**{**plan, "target_epsilon": None, "target_bayes_security": 0.9}, max_epochs=2)


@pytest.mark.parametrize("target", [1e-4, 1e-9])
def test_a_target_whose_noise_drowns_every_gradient_is_named_with_what_sigma_50_still_gives(target):
    """Issue 55: target_epsilon=1e-4 trained at σ = 7,632 (1e-9: 25,650) without a word."""
    plan = {**PLAN, "accountant": "pld", "target_epsilon": target}
    with pytest.warns(UserWarning, match=r"above 50: each step's noise is") as caught:
        sigma = plan_noise_multiplier(**plan)
    assert sigma > 50
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=50.0, sample_rate=0.1, steps=30)
    message = str(caught[0].message)
    assert f"DPSGD(target_epsilon={target!r}, delta=1e-05, epochs=3) plans noise_multiplier={sigma:.6g}" in message
    assert f"noise_multiplier=50 would still give ε = {ledger.epsilon():.4g} (δ = 1e-05)" in message
    with warnings.catch_warnings():  # a target σ ≤ 50 meets: silent
        warnings.simplefilter("error")
        assert plan_noise_multiplier(**{**plan, "target_epsilon": 0.1}) < 50

"""DPSGD's noise planning without a Trainer: a ``max_epochs`` beyond the planned ``epochs`` warns, and only then."""

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
    for max_epochs in (None, 3, 1):  # within the plan (or no Trainer limit given): silent
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert plan_noise_multiplier(**PLAN, max_epochs=max_epochs) == sigma
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=sigma, sample_rate=0.1, steps=30)
    assert ledger.epsilon() <= 2.0  # the plan meets the target after the planned 3 epochs

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.analysis import bayes_security as bs
from tests.callbacks._tiny import N, tiny_dataset, tiny_module, trainer

BATCH = 8  # p = 1/32: small enough for the closed form to overstate security at σ = 0.9
P = BATCH / N


def _loader():
    return DataLoader(tiny_dataset(), batch_size=BATCH, shuffle=True)


@pytest.mark.parametrize(("sigma", "budget"), [(0.9, 0.75), (1.5, 0.85)])
def test_stops_before_the_step_that_breaks_the_budget(sigma, budget, tmp_path):
    dp = DPSGD(noise_multiplier=sigma)
    stopper = PrivacyBudgetStopping(min_bayes_security=budget)
    t = trainer([dp, stopper], tmp_path, max_epochs=100)
    t.fit(tiny_module(), train_dataloaders=_loader())
    steps = dp.steps
    assert stopper.stopped_at_step == steps == t.global_step
    exact_now = bs.mia_bayes_security_exact(sample_rate=P, noise_multiplier=sigma, steps=steps)
    assert exact_now >= budget  # the model we keep meets the budget ...
    # ... and we stopped at most 0.2% of the steps early (the bisection tolerance)
    exact_later = bs.mia_bayes_security_exact(sample_rate=P, noise_multiplier=sigma, steps=int(steps * 1.002) + 2)
    assert exact_later < budget


def test_closed_form_mode_stops_on_the_closed_form(tmp_path):
    dp = DPSGD(noise_multiplier=1.5)
    stopper = PrivacyBudgetStopping(min_bayes_security=0.85, exact=False)
    trainer([dp, stopper], tmp_path, max_epochs=100).fit(tiny_module(), train_dataloaders=_loader())
    closed = [bs.mia_bayes_security(sample_rate=P, noise_multiplier=1.5, steps=k) for k in (dp.steps, dp.steps + 1)]
    assert closed[0] >= 0.85 > closed[1]


def test_budget_already_broken_trains_nothing(tmp_path):
    t = trainer([DPSGD(noise_multiplier=0.5), PrivacyBudgetStopping(min_bayes_security=0.99)], tmp_path, max_epochs=3)
    t.fit(tiny_module(), train_dataloaders=_loader())
    assert t.global_step == 0


def test_monitor_and_stopper_agree(tmp_path):
    monitor = BayesSecurityMonitor(exact="always")
    t = trainer(
        [DPSGD(noise_multiplier=1.5), monitor, PrivacyBudgetStopping(min_bayes_security=0.85)], tmp_path, max_epochs=100
    )
    t.fit(tiny_module(), train_dataloaders=_loader())
    assert monitor.final[names.MIA_BAYES_SECURITY_EXACT] >= 0.85


def test_min_epochs_that_could_force_training_past_the_budget_raise(tmp_path):
    with pytest.raises(MisconfigurationException, match="min_epochs"):
        trainer(
            [DPSGD(noise_multiplier=1.0), PrivacyBudgetStopping(min_bayes_security=0.9)], tmp_path, min_epochs=2
        ).fit(tiny_module(), train_dataloaders=_loader())
    with pytest.raises(MisconfigurationException, match="min_steps"):
        trainer(
            [DPSGD(noise_multiplier=1.0), PrivacyBudgetStopping(min_bayes_security=0.9)], tmp_path, min_steps=5
        ).fit(tiny_module(), train_dataloaders=_loader())


def test_attribute_threat_needs_its_monitor(tmp_path):
    with pytest.raises(MisconfigurationException, match="AttributeInferenceMonitor"):
        trainer(
            [DPSGD(noise_multiplier=1.0), PrivacyBudgetStopping(min_bayes_security=0.9, threat="ai")], tmp_path
        ).fit(tiny_module(), train_dataloaders=_loader())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_bayes_security": 0}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": 1.0}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": True}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": 0.9, "threat": "property"}, "`threat` must be one of"),
        ({"min_bayes_security": 0.9, "relation": "swap"}, "`relation`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        PrivacyBudgetStopping(**kwargs)


def test_state_key_and_state():
    stopper = PrivacyBudgetStopping(min_bayes_security=0.9)
    assert stopper.state_key == "PrivacyBudgetStopping{'min_bayes_security': 0.9, 'threat': 'mia'}"
    stopper.stopped_at_step = 7
    other = PrivacyBudgetStopping(min_bayes_security=0.9)
    other.load_state_dict(stopper.state_dict())
    assert other.stopped_at_step == 7

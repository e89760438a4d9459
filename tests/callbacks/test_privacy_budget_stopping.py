import re

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.ledger import PrivacyLedger
from tests.callbacks._tiny import N, tiny_dataset, tiny_module, trainer

BATCH = 8  # p = 1/32: small enough for the closed form to overstate security at σ = 0.9
P = BATCH / N


def _loader():
    return DataLoader(tiny_dataset(), batch_size=BATCH, shuffle=True)


@pytest.mark.parametrize(("sigma", "budget"), [(0.9, 0.75), (1.5, 0.85)])
def test_stops_before_the_step_that_breaks_the_budget(sigma, budget, tmp_path):
    dp = DPSGD(noise_multiplier=sigma)
    monitor = BayesSecurityMonitor()
    stopper = PrivacyBudgetStopping(min_bayes_security=budget)
    t = trainer([dp, monitor, stopper], tmp_path, max_epochs=100)
    t.fit(tiny_module(), train_dataloaders=_loader())
    steps = dp.steps
    assert stopper.stopped_at_step == steps == t.global_step
    # the model we keep meets the budget by the value the monitor logs ...
    assert monitor.final[names.MIA_BAYES_SECURITY] >= budget
    # ... and one more step would have broken it: the ledger's value for the same history plus one step
    assert dp.ledger.bayes_security_after(1, noise_multiplier=sigma, sample_rate=P) < budget
    # independent check of the stopping point against dp_accounting at a fine grid (0.1% of the steps)
    exact_now = bs.mia_bayes_security_exact(
        sample_rate=P, noise_multiplier=sigma, steps=steps, value_discretization_interval=2e-5
    )
    assert exact_now >= budget
    exact_later = bs.mia_bayes_security_exact(
        sample_rate=P, noise_multiplier=sigma, steps=int(steps * 1.01) + 2, value_discretization_interval=2e-5
    )
    assert exact_later < budget


def test_epsilon_budget_stops_before_the_breaking_step(tmp_path):
    from opacus.accountants import RDPAccountant

    dp = DPSGD(noise_multiplier=1.2, delta=1e-5, accountant="rdp")  # (Opacus' RDP: brute-forced below)
    stopper = PrivacyBudgetStopping(max_epsilon=2.0)
    t = trainer([dp, stopper], tmp_path, max_epochs=100)
    t.fit(tiny_module(), train_dataloaders=_loader())
    assert stopper.stopped_at_step == dp.steps == t.global_step > 0
    # brute force with Opacus' own accountant: the stop is the last step within the budget
    accountant = RDPAccountant()
    epsilons = []
    for _ in range(dp.steps + 1):
        accountant.step(noise_multiplier=1.2, sample_rate=P)
        epsilons.append(accountant.get_epsilon(delta=1e-5))
    assert epsilons[dp.steps - 1] <= 2.0 < epsilons[dp.steps]
    assert dp.epsilon() == pytest.approx(epsilons[dp.steps - 1])


def test_epsilon_budget_resumes_from_a_checkpoint(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = trainer(
        [DPSGD(noise_multiplier=1.2), PrivacyBudgetStopping(max_epsilon=2.0), ckpt],
        tmp_path,
        max_epochs=2,
        enable_checkpointing=True,
    )
    first.fit(tiny_module(), train_dataloaders=_loader())
    resumed_dp = DPSGD(noise_multiplier=1.2)
    resumed_stop = PrivacyBudgetStopping(max_epsilon=2.0)
    resumed = trainer([resumed_dp, resumed_stop], tmp_path, max_epochs=100)
    resumed.fit(tiny_module(), train_dataloaders=_loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    straight_dp = DPSGD(noise_multiplier=1.2)
    trainer([straight_dp, PrivacyBudgetStopping(max_epsilon=2.0)], tmp_path, max_epochs=100).fit(
        tiny_module(), train_dataloaders=_loader()
    )
    assert resumed_dp.steps == straight_dp.steps  # the resumed run stops at the same step as an unbroken one


EPOCH = N // BATCH  # 32 steps


@pytest.mark.parametrize(
    ("budget", "one_step"),
    [
        (dict(min_bayes_security=0.99), r"β\*_MIA = 0\.9\d+ < 0\.99"),
        (dict(max_epsilon=0.3), r"ε \(δ = 1e-05\) = \d\.\d+ > 0\.3"),
    ],
    ids=["bayes_security", "epsilon"],
)
def test_a_budget_the_first_step_breaks_is_refused_with_the_noise_that_allows_one_epoch(budget, one_step, tmp_path):
    """Not "stopping after step 0" and an untrained model: refused before any step, with the σ that fits an epoch."""
    model = tiny_module()
    before = [p.detach().clone() for p in model.parameters()]
    t = trainer([DPSGD(noise_multiplier=0.5), PrivacyBudgetStopping(**budget)], tmp_path, max_epochs=3)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(model, train_dataloaders=_loader())
    message = str(info.value)
    assert message.startswith(f"PrivacyBudgetStopping({next(iter(budget))}={next(iter(budget.values()))}): the first")
    assert re.search(rf"one step at noise_multiplier=0.5, sample_rate=0.03125 gives {one_step}\)", message)
    sigma = float(re.search(r"pass `DPSGD\(noise_multiplier=([\d.]+)\)` \(or more\)", message).group(1))
    assert f"noise_multiplier={sigma:g} allows one epoch ({EPOCH} steps) within the budget" in message
    assert t.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the σ named is the smallest (to 1e-4) that fits one epoch, by the stopper's own prediction ...
    assert PrivacyLedger(delta=1e-5).steps_within(noise_multiplier=sigma, sample_rate=P, **budget) >= EPOCH
    assert PrivacyLedger(delta=1e-5).steps_within(noise_multiplier=sigma - 1e-4, sample_rate=P, **budget) < EPOCH
    # ... and a run with it trains that epoch
    dp = DPSGD(noise_multiplier=sigma)
    trainer([dp, PrivacyBudgetStopping(**budget)], tmp_path, max_epochs=3).fit(
        tiny_module(), train_dataloaders=_loader()
    )
    assert dp.steps >= EPOCH


def test_a_resumed_run_that_spent_its_budget_stops_instead_of_refusing(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    dp = DPSGD(noise_multiplier=1.2)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = trainer(
        [dp, PrivacyBudgetStopping(max_epsilon=2.0), ckpt], tmp_path, max_epochs=100, enable_checkpointing=True
    )
    first.fit(tiny_module(), train_dataloaders=_loader())
    resumed_dp, resumed_stop = DPSGD(noise_multiplier=1.2), PrivacyBudgetStopping(max_epsilon=2.0)
    resumed = trainer([resumed_dp, resumed_stop], tmp_path, max_epochs=100)
    resumed.fit(tiny_module(), train_dataloaders=_loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed_dp.steps == dp.steps and resumed_stop.stopped_at_step == dp.steps


def test_monitor_and_stopper_agree(tmp_path):
    monitor = BayesSecurityMonitor()
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


@pytest.mark.filterwarnings("ignore:AttributeInferenceMonitor.*Section 5.3")
def test_attribute_threat_stops_on_the_safe_value(tmp_path):
    """threat="ai" at p = 1/32, σ = 0.9, where Cor. 10's closed form overstates β*_AI: the stop is decided on the
    monitor's safe value (pessimistic PLD over the recorded R_t), with the next step at the worst case R = 2C."""
    from lightning_privacy import AttributeInferenceMonitor
    from lightning_privacy.functional.attributes import SensitiveAttribute
    from tests.callbacks.test_attribute_inference_monitor import StepRecorder

    sigma, budget = 0.9, 0.75
    dp = DPSGD(noise_multiplier=sigma)
    monitor = AttributeInferenceMonitor(attribute=SensitiveAttribute.numeric(column=0, values=[-2.0, 0.0, 2.0]))
    recorder = StepRecorder(monitor)
    stopper = PrivacyBudgetStopping(min_bayes_security=budget, threat="ai")
    t = trainer([dp, monitor, recorder, stopper], tmp_path, max_epochs=100)
    t.fit(tiny_module(), train_dataloaders=_loader())
    assert stopper.stopped_at_step == dp.steps == t.global_step > 0
    rs = [r for _, _, r in recorder.steps]
    kw = dict(sample_rate=P, noise_multiplier=sigma, max_grad_norm=dp.max_grad_norm)
    # the kept model meets the budget by the exact value of its recorded R_t, and by the safe value below it ...
    assert bs.ai_bayes_security_exact(**kw, sensitivities=rs) >= monitor.bayes_security() >= budget
    # ... one more worst-case step would break it (decided on the safe value: never above the exact one) ...
    safe_next = stopper.bayes_security_after_next_step(t)
    assert safe_next < budget and safe_next <= bs.ai_bayes_security_exact(**kw, sensitivities=rs + [2.0]) + 1e-9
    # ... and the closed form, which the decision does not use, reads higher here
    assert monitor.bayes_security_closed_form(extra_worst_case_step=(sigma, P)) > safe_next


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_bayes_security": 0}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": 1.0}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": True}, "`min_bayes_security` must be in"),
        ({"min_bayes_security": 0.9, "threat": "property"}, "`threat` must be one of"),
        ({"min_bayes_security": 0.9, "relation": "swap"}, "`relation`"),
        ({}, "exactly one budget"),
        ({"min_bayes_security": 0.9, "max_epsilon": 1.0}, "exactly one budget"),
        ({"max_epsilon": -1.0}, "`max_epsilon` must be a positive"),
        ({"max_epsilon": 1.0, "delta": 2.0}, "`delta`"),
        ({"max_epsilon": 1.0, "threat": "ai"}, "use threat='mia'"),
        ({"min_bayes_security": 0.9, "exact": False}, "no longer supported"),
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

"""The glue between the privacy callbacks (issue 20, point 8).

Each test pins one thing a callback hands on — δ, the neighbouring relation, the accountant, the sample rate, the step
count — or the state it must drop between fits, against values computed independently: Opacus accountants built by
hand from the run's (σ, p, steps), dp_accounting's PLDs (``tests/test_ledger.dp_accounting_betas``), Lightning's own
step count. A callback reused for a second ``fit`` reports that fit alone.
"""

import warnings

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, AttributeInferenceMonitor, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.ledger import PrivacyLedger
from tests.callbacks._tiny import BATCH, N, TinyDataModule, tiny_dataset, tiny_loader, tiny_module, trainer
from tests.test_ledger import dp_accounting_betas

pytestmark = [
    pytest.mark.filterwarnings("ignore:GDP accounting is experimental"),
    pytest.mark.filterwarnings("ignore:AttributeInferenceMonitor.*Section 5.3"),
    pytest.mark.filterwarnings("ignore:The closed-form"),
    pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha"),
]

P = BATCH / N  # TinyDataModule: p = 1/8, 8 steps per epoch
STEPS_PER_EPOCH = N // BATCH
SMALL_BATCH = 8  # p = 1/32, 32 steps per epoch: budgets break within an epoch or two
P_SMALL = SMALL_BATCH / N
ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant, "gdp": GaussianAccountant}


def _small_loader():
    return DataLoader(tiny_dataset(), batch_size=SMALL_BATCH, shuffle=True)


def _epsilon(mechanism, *, sigma, rate, steps, delta):
    """ε at δ of ``steps`` steps at (σ, p) from a fresh Opacus accountant, or for "pld" (the default) dp_accounting's
    pessimistic PLD at grid 1e-4 (nothing of the run's is used)."""
    if mechanism == "pld":
        from dp_accounting.pld import privacy_loss_distribution as pld

        one = pld.from_gaussian_mechanism(
            standard_deviation=sigma, sampling_prob=rate, value_discretization_interval=1e-4
        )
        return float(one.self_compose(steps).get_epsilon_for_delta(delta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accountant = ACCOUNTANTS[mechanism]()
    accountant.history = [(sigma, rate, steps)]
    return float(accountant.get_epsilon(delta=delta))


def _approx(mechanism, value):
    """Opacus' accountants: the same computation (to 1e-9); the PLD: dp_accounting's, an independent one (2e-3)."""
    return pytest.approx(value, abs=2e-3) if mechanism == "pld" else pytest.approx(value, rel=1e-9)


def _beta_bracket(*, sigma, rate, steps, relation="replace", upper_grid=1e-3):
    """(lower, upper) bounds on the true β*_MIA from dp_accounting: its pessimistic PLD on a 1e-3 grid minus the
    grid's slack, and its optimistic PLD (an upper bound the safe value must never exceed; 1e-4 where it must be
    tight)."""
    segments = [(sigma, rate, steps)]
    lower = dp_accounting_betas(segments, pessimistic=True, grid=1e-3, relation=relation)[-1] - 1e-3
    upper = dp_accounting_betas(segments, pessimistic=False, grid=upper_grid, relation=relation)[-1]
    return float(lower), float(upper)


# ------------------------------------------------------------------------------------------------------------ δ
@pytest.mark.parametrize("mechanism", ["pld", "rdp", "prv", "gdp"])
def test_planned_epsilon_target_is_met_at_the_users_delta_with_the_users_accountant(mechanism, tmp_path):
    """DPSGD(target_epsilon=3, delta=1e-6, accountant=…) plans σ at δ = 1e-6 with that accountant: ε ≤ 3 there,
    and 1 % less noise would exceed it (a plan at δ = 1e-5, or with another accountant, misses one of the two)."""
    dp = DPSGD(target_epsilon=3.0, epochs=2, delta=1e-6, accountant=mechanism)
    t = trainer([dp], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    steps, sigma = t.global_step, dp.noise_multiplier
    assert steps == 2 * STEPS_PER_EPOCH
    epsilon = _epsilon(mechanism, sigma=sigma, rate=P, steps=steps, delta=1e-6)
    assert dp.epsilon() <= 3.0 < _epsilon(mechanism, sigma=0.99 * sigma, rate=P, steps=steps, delta=1e-6)
    assert dp.epsilon() == _approx(mechanism, epsilon)  # the run reports at its own δ too


@pytest.mark.parametrize("mechanism", ["pld", "rdp", "prv", "gdp"])
def test_dpsgd_and_monitor_report_epsilon_each_at_its_own_delta(mechanism, tmp_path):
    dp = DPSGD(noise_multiplier=1.0, delta=1e-6, accountant=mechanism)
    monitor = BayesSecurityMonitor(delta=1e-8)
    t = trainer([dp, monitor], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    steps = t.global_step
    at_run_delta = _epsilon(mechanism, sigma=1.0, rate=P, steps=steps, delta=1e-6)
    at_own_delta = _epsilon(mechanism, sigma=1.0, rate=P, steps=steps, delta=1e-8)
    assert at_own_delta > 1.05 * at_run_delta  # the two δ really give different ε
    assert dp.epsilon() == _approx(mechanism, at_run_delta)
    logged = float(t.callback_metrics[names.DP_EPSILON])
    own = monitor.ledger.epsilon()
    assert own <= logged <= own * (1 + 1e-6)  # float32, rounded up
    assert monitor.ledger.delta == 1e-8 and own == _approx(mechanism, at_own_delta)
    assert float(t.callback_metrics[names.DP_STEPS]) == steps
    assert float(t.callback_metrics[names.DP_SAMPLE_RATE]) == pytest.approx(P)


@pytest.mark.parametrize("delta", [None, 1e-7])
def test_monitor_delta_on_a_users_own_make_private(delta, tmp_path):
    """No DPSGD: the monitor's δ, or 1e-5 without one, for the logged ε and the ledger."""
    from tests.callbacks.test_bayes_security_monitor import _OwnOpacus

    monitor = BayesSecurityMonitor(delta=delta)
    t = trainer([monitor], tmp_path, max_epochs=1)
    t.fit(_OwnOpacus(8, hidden=(16,)), train_dataloaders=tiny_loader())
    expected = _epsilon("rdp", sigma=2.0, rate=P, steps=t.global_step, delta=delta or 1e-5)
    assert monitor.ledger.delta == (delta or 1e-5)
    assert expected <= float(t.callback_metrics[names.DP_EPSILON]) <= expected * (1 + 1e-6)


@pytest.mark.parametrize("mechanism", ["pld", "rdp", "gdp"])
def test_epsilon_budget_at_the_stoppers_own_delta(mechanism, tmp_path):
    """PrivacyBudgetStopping(max_epsilon=2, delta=1e-8) under DPSGD(delta=1e-5): ε at 1e-8 decides (22 steps with
    RDP instead of 141 at the run's δ)."""
    dp = DPSGD(noise_multiplier=1.2, delta=1e-5, accountant=mechanism)
    stopper = PrivacyBudgetStopping(max_epsilon=2.0, delta=1e-8)
    t = trainer([dp, stopper], tmp_path, max_epochs=10)
    t.fit(tiny_module(), train_dataloaders=_small_loader())
    stop = t.global_step
    assert stopper.stopped_at_step == stop > 0
    kw = dict(sigma=1.2, rate=P_SMALL, delta=1e-8)
    slack = 2e-3 if mechanism == "pld" else 0.0  # (dp_accounting's grid against the ledger's certified PLD)
    assert _epsilon(mechanism, **kw, steps=stop) <= 2.0 + slack and 2.0 - slack < _epsilon(
        mechanism, **kw, steps=stop + 1
    )


def test_stopper_without_delta_uses_dpsgds_delta_on_a_ledger_of_its_own(tmp_path):
    """relation="add_remove" gives the stopper a ledger of its own (DPSGD's is "replace"); its δ is still DPSGD's."""
    dp = DPSGD(noise_multiplier=1.2, delta=1e-8)
    stopper = PrivacyBudgetStopping(max_epsilon=2.0, relation="add_remove")
    t = trainer([dp, stopper], tmp_path, max_epochs=10)
    t.fit(tiny_module(), train_dataloaders=_small_loader())
    stop = t.global_step
    assert stopper.stopped_at_step == stop > 0
    kw = dict(sigma=1.2, rate=P_SMALL, delta=1e-8)
    assert _epsilon("pld", **kw, steps=stop) <= 2.0 + 2e-3 and 2.0 - 2e-3 < _epsilon("pld", **kw, steps=stop + 1)


def test_state_key_holds_the_delta_of_an_epsilon_budget():
    stopper = PrivacyBudgetStopping(max_epsilon=2.0, delta=1e-6)
    assert stopper.state_key == "PrivacyBudgetStopping{'max_epsilon': 2.0, 'delta': 1e-06, 'threat': 'mia'}"
    assert PrivacyBudgetStopping(max_epsilon=2.0, delta=1e-8).state_key != stopper.state_key


@pytest.mark.parametrize(("audit_delta", "run_delta"), [(1e-8, 1e-5), (None, 1e-7)])
def test_canary_audit_tests_the_claim_at_its_own_delta_else_dpsgds(audit_delta, run_delta, tmp_path):
    from lightning_privacy import CanaryAudit

    audit = CanaryAudit(num_canaries=50, delta=audit_delta)
    t = trainer([DPSGD(noise_multiplier=1.0, delta=run_delta), audit], tmp_path, max_epochs=1)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    delta = audit_delta or run_delta
    assert audit.details["binomial"].delta == delta
    expected = _epsilon("pld", sigma=1.0, rate=P, steps=t.global_step, delta=delta)
    assert audit.accountant_epsilon == _approx("pld", expected)


# ----------------------------------------------------------------------------------------------------- relation
def test_monitor_add_remove_relation_with_dpsgds_delta(tmp_path):
    """relation="add_remove": β* of ADD_OR_REMOVE_ONE (dp_accounting), while DPSGD's own ledger stays "replace";
    the monitor has no δ, so ε is at DPSGD's."""
    dp = DPSGD(noise_multiplier=1.0, delta=1e-6)
    monitor = BayesSecurityMonitor(relation="add_remove")
    t = trainer([dp, monitor], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    steps = t.global_step
    lower, upper = _beta_bracket(sigma=1.0, rate=P, steps=steps, relation="add_remove")
    logged = float(t.callback_metrics[names.MIA_BAYES_SECURITY])
    assert lower <= logged <= upper
    assert lower <= monitor.final[names.MIA_BAYES_SECURITY] <= upper
    closed = bs.mia_bayes_security(sample_rate=P, noise_multiplier=1.0, steps=steps, relation="add_remove")
    assert float(t.callback_metrics[names.MIA_BAYES_SECURITY_CLOSED_FORM]) == pytest.approx(closed, rel=1e-6)
    replace_lower, replace_upper = _beta_bracket(sigma=1.0, rate=P, steps=steps)
    assert replace_upper < lower  # the relations really differ here
    assert replace_lower <= dp.ledger.bayes_security() <= replace_upper
    expected = dp.ledger.epsilon(1e-6)
    assert expected <= float(t.callback_metrics[names.DP_EPSILON]) <= expected * (1 + 1e-6)
    assert expected == _approx("pld", _epsilon("pld", sigma=1.0, rate=P, steps=steps, delta=1e-6))


def test_stopper_add_remove_relation_stops_where_add_remove_breaks(tmp_path):
    """β* ≥ 0.9 at σ = 1, p = 1/32: 42 steps under add/remove (15 under replace)."""
    dp = DPSGD(noise_multiplier=1.0)
    stopper = PrivacyBudgetStopping(min_bayes_security=0.9, relation="add_remove")
    t = trainer([dp, stopper], tmp_path, max_epochs=5)
    t.fit(tiny_module(), train_dataloaders=_small_loader())
    stop = t.global_step
    assert stopper.stopped_at_step == stop > 0
    kw = dict(sigma=1.0, rate=P_SMALL, relation="add_remove")
    assert _beta_bracket(**kw, steps=stop)[0] >= 0.9 - 1e-3  # the kept model meets the budget
    assert _beta_bracket(**kw, steps=stop + 2, upper_grid=1e-4)[1] < 0.9  # and it did not stop early


def test_an_explicit_accountant_is_read_instead_of_dpsgds(tmp_path):
    """``accountant=``: the monitor reads that accountant even when DPSGD runs beside it."""
    own = RDPAccountant()
    own.history = [(2.0, P, 5)]
    monitor = BayesSecurityMonitor(accountant=own)
    t = trainer([DPSGD(noise_multiplier=1.0), monitor], tmp_path, max_epochs=1)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    assert float(t.callback_metrics[names.DP_STEPS]) == 5 and float(t.callback_metrics[names.DP_NOISE_MULTIPLIER]) == 2
    lower, upper = _beta_bracket(sigma=2.0, rate=P, steps=5)
    assert lower <= float(t.callback_metrics[names.MIA_BAYES_SECURITY]) <= upper


# ------------------------------------------------------------------------------------------------- looking ahead
def test_bayes_security_after_next_step_is_one_step_ahead(tmp_path):
    dp = DPSGD(noise_multiplier=1.0)
    stopper = PrivacyBudgetStopping(min_bayes_security=0.05)  # not reached
    t = trainer([dp, stopper], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    steps = t.global_step
    assert steps == 2 * STEPS_PER_EPOCH and stopper.stopped_at_step is None
    now_lower, _ = _beta_bracket(sigma=1.0, rate=P, steps=steps)
    next_lower, next_upper = _beta_bracket(sigma=1.0, rate=P, steps=steps + 1)
    assert next_upper < now_lower  # one step apart, the brackets do not overlap
    assert next_lower <= stopper.bayes_security_after_next_step(t) <= next_upper


# ---------------------------------------------------------------------------------------------------- reuse
def test_a_reused_monitor_reports_the_second_fit_alone(tmp_path):
    """Fit 1: one epoch at σ = 3 (β* ≈ 0.91); fit 2: two epochs at σ = 0.8 (β* ≈ 0.68, then 0.55). Fit 2's first
    epoch has as many steps as fit 1, so a value cached by step count would show fit 1's β* there."""
    monitor = BayesSecurityMonitor()
    trainer([DPSGD(noise_multiplier=3.0), monitor], tmp_path, max_epochs=1).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    first = monitor.final[names.MIA_BAYES_SECURITY]
    t = trainer([DPSGD(noise_multiplier=0.8), monitor], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    assert t.global_step == 2 * STEPS_PER_EPOCH
    brackets = [_beta_bracket(sigma=0.8, rate=P, steps=(e + 1) * STEPS_PER_EPOCH) for e in range(2)]
    assert brackets[0][1] < first
    assert [e["epoch"] for e in monitor.epochs] == [0, 1]  # the figure's records: fit 2's epochs only
    for record, (lower, upper) in zip(monitor.epochs, brackets):
        assert lower <= record["safe"] <= upper
    lower, upper = brackets[-1]
    assert lower <= float(t.callback_metrics[names.MIA_BAYES_SECURITY]) <= upper
    assert lower <= monitor.final[names.MIA_BAYES_SECURITY] <= upper
    assert float(t.callback_metrics[names.DP_NOISE_MULTIPLIER]) == pytest.approx(0.8)
    assert float(t.callback_metrics[names.DP_STEPS]) == t.global_step


def test_a_reused_monitor_that_resumes_gets_its_records_back(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    monitor = BayesSecurityMonitor()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer([DPSGD(noise_multiplier=1.2), monitor, ckpt], tmp_path, max_epochs=2, enable_checkpointing=True).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    t = trainer([DPSGD(noise_multiplier=1.2), monitor], tmp_path, max_epochs=3)
    t.fit(tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert [e["epoch"] for e in monitor.epochs] == [0, 1, 2]
    lower, upper = _beta_bracket(sigma=1.2, rate=P, steps=3 * STEPS_PER_EPOCH)
    assert lower <= monitor.final[names.MIA_BAYES_SECURITY] <= upper


def test_a_monitor_reused_for_a_fit_without_steps_keeps_nothing_of_the_first(tmp_path):
    monitor = BayesSecurityMonitor()
    trainer([DPSGD(noise_multiplier=1.0), monitor], tmp_path, max_epochs=1).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    assert monitor.final and monitor.epochs
    stopper = PrivacyBudgetStopping(min_bayes_security=0.99)  # broken by the first step: refused before any step
    t = trainer([DPSGD(noise_multiplier=1.0), monitor, stopper], tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException, match="the first optimizer step already breaks the budget"):
        t.fit(tiny_module(), datamodule=TinyDataModule())
    assert t.global_step == 0
    assert monitor.final == {} and monitor.final_closed_form is None and monitor.epochs == []


def test_a_reused_stopper_decides_on_each_fits_own_steps(tmp_path):
    """β* ≥ 0.9 at p = 1/32: fit 1 (σ = 1) stops; fit 2 (σ = 3, one epoch) never reaches the budget and takes every
    step; fit 3 (σ = 1.5) stops where σ = 1.5 alone breaks it."""
    stopper = PrivacyBudgetStopping(min_bayes_security=0.9)
    first = trainer([DPSGD(noise_multiplier=1.0), stopper], tmp_path, max_epochs=5)
    first.fit(tiny_module(), train_dataloaders=_small_loader())
    assert stopper.stopped_at_step == first.global_step > 0
    second = trainer([DPSGD(noise_multiplier=3.0), stopper], tmp_path, max_epochs=1)
    second.fit(tiny_module(), train_dataloaders=_small_loader())
    assert second.global_step == N // SMALL_BATCH and stopper.stopped_at_step is None
    third = trainer([DPSGD(noise_multiplier=1.5), stopper], tmp_path, max_epochs=5)
    third.fit(tiny_module(), train_dataloaders=_small_loader())
    stop = third.global_step
    assert stopper.stopped_at_step == stop > first.global_step
    assert _beta_bracket(sigma=1.5, rate=P_SMALL, steps=stop)[0] >= 0.9 - 1e-3
    assert _beta_bracket(sigma=1.5, rate=P_SMALL, steps=stop + 2, upper_grid=1e-4)[1] < 0.9


def test_a_reused_attribute_monitor_holds_the_second_fit_alone(tmp_path):
    from tests.callbacks.test_attribute_inference_monitor import ATTR, SIGMA, EpochLog, StepRecorder, _ledger_reads

    monitor = AttributeInferenceMonitor(attribute=ATTR)
    trainer([DPSGD(noise_multiplier=SIGMA), monitor], tmp_path, max_epochs=1).fit(
        tiny_module(), datamodule=TinyDataModule()
    )
    assert monitor.steps == STEPS_PER_EPOCH
    dp, recorder = DPSGD(noise_multiplier=SIGMA), StepRecorder(monitor)
    log = EpochLog(names.AI_BAYES_SECURITY)
    t = trainer([dp, monitor, recorder, log], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    assert monitor.steps == dp.steps == t.global_step == 2 * STEPS_PER_EPOCH
    assert all(s["measured"] for s in monitor.segments)  # nothing counted from the first fit
    rs = [r for _, _, r in recorder.steps]
    straight = _ledger_reads([rs[:STEPS_PER_EPOCH], rs[STEPS_PER_EPOCH:]], sigma=SIGMA, rate=P)
    assert monitor.bayes_security() == straight[-1]
    for row, value in zip(log.rows, straight):
        assert value - 1e-6 <= row[names.AI_BAYES_SECURITY] <= value


# ------------------------------------------------------------------------------------------------- boundaries
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_epochs=1),
        dict(min_steps=1),  # Lightning then sets min_epochs=1 too
        dict(min_epochs=0, min_steps=1),  # only min_steps
        dict(min_steps=0),  # Lightning turns it into min_epochs=1: the first epoch would ignore the stop
    ],
    ids=["min_epochs=1", "min_steps=1", "min_epochs=0-min_steps=1", "min_steps=0"],
)
def test_stopper_refuses_any_minimum_lightning_would_train_through(kwargs, tmp_path):
    with pytest.raises(MisconfigurationException, match="min_epochs/min_steps"):
        trainer([DPSGD(noise_multiplier=1.0), PrivacyBudgetStopping(min_bayes_security=0.9)], tmp_path, **kwargs).fit(
            tiny_module(), train_dataloaders=_small_loader()
        )


def test_stopper_accepts_min_epochs_and_min_steps_of_zero(tmp_path):
    stopper = PrivacyBudgetStopping(min_bayes_security=0.9)  # reached within the first epoch
    t = trainer([DPSGD(noise_multiplier=1.0), stopper], tmp_path, min_epochs=0, min_steps=0, max_epochs=5)
    t.fit(tiny_module(), train_dataloaders=_small_loader())
    assert 0 < t.global_step == stopper.stopped_at_step < N // SMALL_BATCH


@pytest.mark.parametrize("delta", [0.0, 1.0, 1, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda delta: DPSGD(noise_multiplier=1.0, delta=delta),
        lambda delta: BayesSecurityMonitor(delta=delta),
        lambda delta: PrivacyBudgetStopping(max_epsilon=1.0, delta=delta),
    ],
    ids=["DPSGD", "BayesSecurityMonitor", "PrivacyBudgetStopping"],
)
def test_delta_outside_the_open_unit_interval_is_refused(make, delta):
    with pytest.raises(MisconfigurationException, match="`delta` must be a float in"):
        make(delta)


def test_a_reused_dpsgd_composes_for_the_same_module_and_starts_over_for_another(tmp_path):
    dpsgd, model = DPSGD(noise_multiplier=1.0), tiny_module()
    trainer([dpsgd], tmp_path, max_epochs=1).fit(model, datamodule=TinyDataModule())
    reference = PrivacyLedger()  # the same PLD, composed one epoch at a time as the run reads it
    reference.step(noise_multiplier=1.0, sample_rate=P, steps=STEPS_PER_EPOCH)
    one_epoch = reference.epsilon()
    assert dpsgd.epsilon() == pytest.approx(one_epoch, rel=1e-12)
    trainer([dpsgd], tmp_path, max_epochs=1).fit(model, datamodule=TinyDataModule())  # the same model, trained on
    reference.step(noise_multiplier=1.0, sample_rate=P, steps=STEPS_PER_EPOCH)
    assert dpsgd.steps == 2 * STEPS_PER_EPOCH and dpsgd.epsilon() == pytest.approx(reference.epsilon(), rel=1e-12)
    trainer([dpsgd], tmp_path, max_epochs=1).fit(tiny_module(), datamodule=TinyDataModule())  # another model
    assert dpsgd.steps == STEPS_PER_EPOCH and dpsgd.epsilon() == pytest.approx(one_epoch, rel=1e-9)

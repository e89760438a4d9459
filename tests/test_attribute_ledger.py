"""AttributeLedger: safe β*_AI composed incrementally over the per-step R_t, against independent computations."""

import math
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.attribute_ledger import AttributeLedger, load_monitor_state, monitor_state
from lightning_privacy.ledger import PrivacyLedger


def _epochs(ledger, epochs, *, sigma=1.0, rate=0.05):
    """Record each epoch's R_t and read the safe value at its end; returns the values read."""
    values = []
    for rs in epochs:
        for r in rs:
            ledger.record(noise_multiplier=sigma, sample_rate=rate, sensitivity=r)
        values.append(ledger.bayes_security())
    return values


def test_maximal_sensitivity_is_the_membership_value():
    """R_t = 2C at every step: the ledger's β*_AI is the safe β*_MIA of the same steps, read at the same points — to
    the composition's rounding: the privacy ledger composes a run of steps at one (σ, p) from cached squares (its
    value independent of when it is read), the attribute ledger one chunk per read; they differ by 2.6e-11 here."""
    ai, mia = AttributeLedger(max_grad_norm=1.5), PrivacyLedger()
    for _ in range(5):
        for _ in range(20):
            ai.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=3.0)
        ai.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=None, steps=3)  # unmeasured: R = 2C too
        mia.step(noise_multiplier=1.0, sample_rate=0.05, steps=23)
        assert ai.bayes_security() == pytest.approx(mia.bayes_security(), abs=1e-9)
    assert ai.bayes_security_closed_form() == pytest.approx(mia.bayes_security_closed_form(), abs=1e-12)
    assert ai.bayes_security() < ai.bayes_security_closed_form()  # p = 0.05, σ = 1: the closed form overstates


def _dp_accounting_optimistic_betas(epochs, *, sigma, rate, grid=1e-3):
    """dp_accounting's optimistic β* (≥ the true value) of the unrounded per-step R_t, read after each epoch."""
    import warnings

    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    composed, out = None, []
    for rs in epochs:
        for r in rs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                one = pld_lib.from_gaussian_mechanism(
                    standard_deviation=sigma,
                    sensitivity=r / 2.0,  # REPLACE_ONE: outputs differ by 2 × sensitivity = R_t (C = 1)
                    sampling_prob=rate,
                    value_discretization_interval=grid,
                    pessimistic_estimate=False,
                    neighboring_relation=NeighboringRelation.REPLACE_ONE,
                )
            composed = one if composed is None else composed.compose(one)
        out.append(1.0 - float(composed.get_delta_for_epsilon(0.0)))
    return out


def test_every_read_is_safe_against_independent_computations():
    """Varying R_t over 5 epochs: every read is within 1e-3 of ai_bayes_security_exact on the R_t so far and never
    above it (+1e-9), and never above dp_accounting's optimistic PLD of the unrounded steps (≥ the true value)."""
    rng = np.random.default_rng(0)
    epochs = [rng.uniform(0.2, 2.0, size=12) for _ in range(5)]
    ledger = AttributeLedger(max_grad_norm=1.0)
    values = _epochs(ledger, epochs, sigma=0.8, rate=0.1)
    upper = _dp_accounting_optimistic_betas(epochs, sigma=0.8, rate=0.1)
    for e, value in enumerate(values, start=1):
        rs = np.concatenate(epochs[:e])
        exact = bs.ai_bayes_security_exact(sample_rate=0.1, noise_multiplier=0.8, max_grad_norm=1.0, sensitivities=rs)
        assert exact - 1e-3 <= value <= exact + 1e-9
        assert value <= upper[e - 1]
    assert ledger.bayes_security_closed_form() == pytest.approx(
        bs.ai_bayes_security(sample_rate=0.1, noise_multiplier=0.8, max_grad_norm=1.0, sensitivities=rs), rel=1e-12
    )
    assert values == sorted(values, reverse=True)


@settings(max_examples=10, deadline=None)
@given(
    epochs=st.lists(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=15), min_size=1, max_size=4),
    rate=st.floats(1e-2, 0.3),
    sigma=st.floats(0.5, 3.0),
)
def test_property_incremental_is_safe_and_restored_bit_for_bit(epochs, rate, sigma):
    ledger = AttributeLedger(max_grad_norm=1.0)
    values = _epochs(ledger, epochs, sigma=sigma, rate=rate)
    rs = [r for epoch in epochs for r in epoch]
    exact = bs.ai_bayes_security_exact(sample_rate=rate, noise_multiplier=sigma, max_grad_norm=1.0, sensitivities=rs)
    assert exact - 1e-3 <= values[-1] <= exact + 1e-9
    ledger.record(noise_multiplier=sigma, sample_rate=rate, sensitivity=0.7)  # a waiting step is saved too
    restored = AttributeLedger()
    restored.load_state_dict(pickle.loads(pickle.dumps(ledger.state_dict())))
    assert restored.bayes_security() == ledger.bayes_security()
    assert restored.state_dict() == ledger.state_dict()


def test_resumed_ledger_continues_like_the_straight_one():
    """Saved mid-epoch (one step waiting) and restored: every later read equals the straight run's, bit for bit."""
    rng = np.random.default_rng(1)
    epochs = [list(rng.uniform(0.5, 1.5, size=10)) for _ in range(4)]
    straight = _epochs(AttributeLedger(max_grad_norm=1.0), epochs)
    first = AttributeLedger(max_grad_norm=1.0)
    _epochs(first, epochs[:2])
    first.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=epochs[2][0])
    resumed = AttributeLedger()
    resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    assert _epochs(resumed, [epochs[2][1:], epochs[3]]) == straight[2:]


def test_next_worst_case_step_is_never_above_its_composition():
    ledger = AttributeLedger(max_grad_norm=2.0)
    _epochs(ledger, [[1.0, 2.5, 3.9]] * 3, sigma=1.2, rate=0.02)
    ledger.record(noise_multiplier=1.2, sample_rate=0.02, sensitivity=0.3)
    predicted = ledger.bayes_security_after_worst_case_step(noise_multiplier=1.2, sample_rate=0.02)
    assert ledger.bayes_security() > predicted  # predicting composed the waiting step, then added 2C
    ledger.record(noise_multiplier=1.2, sample_rate=0.02, sensitivity=4.0)
    assert predicted <= ledger.bayes_security() < predicted + 1e-9
    closed = ledger.bayes_security_closed_form()
    ledger.record(noise_multiplier=1.2, sample_rate=0.02, sensitivity=None)
    assert ledger.bayes_security_closed_form() < closed


def test_round_off_zero_and_bad_values():
    ledger = AttributeLedger(max_grad_norm=0.7)
    ledger.record(noise_multiplier=1.0, sample_rate=0.1, sensitivity=0.0, steps=50)
    assert ledger.bayes_security() == 1.0 and ledger.steps == 50  # R_t = 0 cannot leak
    ledger.record(noise_multiplier=1.0, sample_rate=0.1, sensitivity=1.4 * (1 + 5e-8))  # float32 round-off above 2C
    assert ledger.max_sensitivity == 1.4  # capped at 2C
    assert ledger.bayes_security() == pytest.approx(
        bs.mia_bayes_security_exact(sample_rate=0.1, noise_multiplier=1.0, steps=1), abs=1e-12
    )
    with pytest.raises(ValueError, match=r"`sensitivity` must be in \[0, 2\*max_grad_norm\]"):
        ledger.record(noise_multiplier=1.0, sample_rate=0.1, sensitivity=1.5)
    with pytest.raises(ValueError, match="max_grad_norm changed"):
        ledger.set_max_grad_norm(1.0)
    with pytest.raises(ValueError, match="Set `max_grad_norm`"):
        AttributeLedger().record(noise_multiplier=1.0, sample_rate=0.1, sensitivity=0.1)
    with pytest.raises(RuntimeError, match="missing"):
        AttributeLedger().load_state_dict({"version": 2})
    with pytest.raises(RuntimeError, match="version 7"):
        AttributeLedger().load_state_dict({"version": 7, "segments": [], "max_grad_norm": 1.0})


def test_version_1_state_loads_on_the_safe_side():
    """A checkpoint from before the exact value kept only Σ R_t² per segment: each step is bounded by
    min(2C, √Σ R_t²), never above what the steps really were."""
    rs = [0.5, 0.6, 0.4]
    v1 = {
        "version": 1,
        "max_grad_norm": 1.0,
        "max_sensitivity": 0.6,
        "segments": [
            dict(noise_multiplier=1.0, sample_rate=0.05, steps=3, sum_sq=sum(r * r for r in rs), measured=True),
            dict(noise_multiplier=1.0, sample_rate=0.05, steps=1, sum_sq=0.09, measured=True),
        ],
    }
    ledger = AttributeLedger()
    ledger.load_state_dict(v1)
    kw = dict(sample_rate=0.05, noise_multiplier=1.0, max_grad_norm=1.0)
    assert ledger.bayes_security() <= bs.ai_bayes_security_exact(**kw, sensitivities=rs + [0.3]) + 1e-9
    assert ledger.bayes_security() == pytest.approx(
        bs.ai_bayes_security_exact(**kw, sensitivities=[math.sqrt(0.77)] * 3 + [0.3])
    )
    assert ledger.bayes_security_closed_form() == pytest.approx(bs.ai_bayes_security(**kw, sensitivities=rs + [0.3]))
    assert ledger.steps == 4 and ledger.max_sensitivity == 0.6
    assert math.isclose(ledger.state_dict()["segments"][0]["sum_sq"], 0.77)


def test_align_catches_up_with_an_accountant_history_without_a_trainer():
    """New steps count at the worst case 2C, the last one at the measured R_t; a shorter history is another run."""
    ledger = AttributeLedger(max_grad_norm=1.0)
    ledger.align([(1.0, 0.1, 2)])
    ledger.align([(1.0, 0.1, 2), (2.0, 0.2, 3)], pending=0.25)
    assert [(s["noise_multiplier"], s["steps"], s["measured"]) for s in ledger.segments] == [
        (1.0, 2, False),
        (2.0, 2, False),
        (2.0, 1, True),
    ]
    assert ledger.steps == 5 and ledger.max_sensitivity == 0.25
    ledger.align([(1.0, 0.1, 2), (2.0, 0.2, 3)])  # nothing new: nothing recorded
    assert ledger.steps == 5
    with pytest.raises(RuntimeError, match="has 5 steps but the accountant only 4"):
        ledger.align([(1.0, 0.1, 4)])


def test_the_monitors_state_round_trips_in_either_version_without_a_trainer():
    """AttributeInferenceMonitor's state (version 2: the ledger and per-epoch values; version 1: the ledger's own v1
    layout at the top level, without epochs) loads here; an unknown version or a missing key is refused."""
    ledger = AttributeLedger(max_grad_norm=1.0)
    ledger.record(noise_multiplier=1.0, sample_rate=0.05, sensitivity=0.5, steps=3)
    epochs = [{"epoch": 0, "steps": 3, "safe": ledger.bayes_security(), "closed": 0.9}]
    state = monitor_state(ledger, epochs)
    assert state["version"] == 2 and state["steps"] == 3
    restored, restored_epochs = load_monitor_state(pickle.loads(pickle.dumps(state)))
    assert restored.bayes_security() == ledger.bayes_security() and restored_epochs == epochs
    v1 = {"version": 1, "max_grad_norm": 1.0, "segments": ledger.state_dict()["segments"]}
    old, old_epochs = load_monitor_state(v1)
    assert old.steps == 3 and old_epochs == [] and old.bayes_security() <= ledger.bayes_security() + 1e-12
    for bad, message in (({"version": 3}, "version 3 is not 2"), ({"version": 2}, "missing ['ledger']")):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            load_monitor_state(bad)

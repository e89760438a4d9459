"""PrivacyLedger: incremental safe β* against independent computations, resume, predictions, calibration."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.ledger import PrivacyLedger


def dp_accounting_betas(segments, *, pessimistic, grid=1e-4, reads=None, relation="replace"):
    """1 − δ(0) straight from dp_accounting after each segment (one PLD per segment, self-composed and composed on).

    ``pessimistic=False`` gives dp_accounting's optimistic estimate: a lower bound on δ(0), so an UPPER bound on the
    true β* that a safe value must never exceed. ``relation="add_remove"`` uses ``ADD_OR_REMOVE_ONE`` (sensitivity C).
    """
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    composed, out = None, []
    for sigma, rate, steps in segments:
        pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=sigma,
            sensitivity=1.0,
            sampling_prob=rate,
            value_discretization_interval=grid,
            pessimistic_estimate=pessimistic,
            use_connect_dots=pessimistic,
            neighboring_relation=(
                NeighboringRelation.REPLACE_ONE if relation == "replace" else NeighboringRelation.ADD_OR_REMOVE_ONE
            ),
        ).self_compose(steps)
        composed = pld if composed is None else composed.compose(pld)
        out.append(1.0 - composed.get_delta_for_epsilon(0.0))
    return out


def _dp_accounting_beta(segments, *, pessimistic, grid=1e-4):
    return dp_accounting_betas(segments, pessimistic=pessimistic, grid=grid)[-1]


def _run(ledger, epochs, steps_per_epoch, sigma, rate):
    values = []
    for _ in range(epochs):
        ledger.step(noise_multiplier=sigma, sample_rate=rate, steps=steps_per_epoch)
        values.append(ledger.bayes_security())
    return values


def test_safe_every_epoch_where_the_closed_form_overstates():
    """p = 0.05, σ = 1 (tight_bounds.md): the closed form is above the exact value at every epoch; ours is not."""
    ledger = PrivacyLedger()
    values = _run(ledger, 5, 20, 1.0, 0.05)  # 20 epochs in the slow training test of the monitor
    upper = dp_accounting_betas([(1.0, 0.05, 20)] * 5, pessimistic=False)  # ≥ the true β*
    lower = dp_accounting_betas([(1.0, 0.05, 20)] * 5, pessimistic=True)  # ≤ the true β*
    for epoch, (safe, hi, lo) in enumerate(zip(values, upper, lower), start=1):
        closed = bs.mia_bayes_security(sample_rate=0.05, noise_multiplier=1.0, steps=20 * epoch)
        assert closed > hi  # the closed form overstates the true β* at every epoch
        assert safe <= hi  # ours never does
        assert safe >= lo - 1e-3  # and is as tight as dp_accounting at a 10× finer grid, to 1e-3
    assert values == sorted(values, reverse=True)
    # the spec's end point: closed 0.3173 (Cor. 7) vs exact 0.3059 after 400 steps
    _run(ledger, 15, 20, 1.0, 0.05)
    assert bs.mia_bayes_security(sample_rate=0.05, noise_multiplier=1.0, steps=400) == pytest.approx(0.3173, abs=1e-4)
    assert ledger.bayes_security() == pytest.approx(0.3059, abs=1e-3)


@settings(max_examples=12, deadline=None)
@given(
    segments=st.lists(
        st.tuples(
            st.floats(min_value=0.3, max_value=5.0),
            st.floats(min_value=1e-3, max_value=0.5),
            st.integers(min_value=1, max_value=300),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_property_safe_and_rebuilt_from_state_bit_for_bit(segments):
    ledger = PrivacyLedger()
    for sigma, rate, steps in segments:
        half = steps // 2
        ledger.step(noise_multiplier=sigma, sample_rate=rate, steps=half)
        ledger.bayes_security()  # a read in the middle of a segment: chunks differ from the history's segments
        ledger.step(noise_multiplier=sigma, sample_rate=rate, steps=steps - half)
    value = ledger.bayes_security()
    assert value <= _dp_accounting_beta(segments, pessimistic=False, grid=3e-4) + 1e-9
    rebuilt = PrivacyLedger()
    rebuilt.load_state_dict(ledger.state_dict())
    assert rebuilt.bayes_security() == pytest.approx(value, abs=1e-12)
    assert rebuilt.history == ledger.history


def test_steps_within_is_exact_to_one_step():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.0, sample_rate=0.02, steps=150)
    ledger.bayes_security()
    ledger.step(noise_multiplier=1.0, sample_rate=0.02, steps=7)  # recorded, not yet composed
    k = ledger.steps_within(noise_multiplier=1.0, sample_rate=0.02, min_bayes_security=0.6)
    assert ledger.bayes_security_after(k, noise_multiplier=1.0, sample_rate=0.02) >= 0.6
    assert ledger.bayes_security_after(k + 1, noise_multiplier=1.0, sample_rate=0.02) < 0.6
    # the memoised answer moves with the steps taken
    ledger.step(noise_multiplier=1.0, sample_rate=0.02, steps=3)
    assert ledger.steps_within(noise_multiplier=1.0, sample_rate=0.02, min_bayes_security=0.6) == k - 3
    # and the value a read reports after taking them equals the prediction
    predicted = ledger.bayes_security_after(k - 3, noise_multiplier=1.0, sample_rate=0.02)
    ledger.step(noise_multiplier=1.0, sample_rate=0.02, steps=k - 3)
    assert predicted <= ledger.bayes_security() < predicted + 1e-9


def test_epsilon_budget_steps_against_opacus():
    ledger = PrivacyLedger(accountant="rdp", delta=1e-5)
    ledger.step(noise_multiplier=1.1, sample_rate=0.01, steps=500)
    k = ledger.steps_within(noise_multiplier=1.1, sample_rate=0.01, max_epsilon=1.5)
    accountant = RDPAccountant()
    accountant.history = [(1.1, 0.01, 500 + k)]
    assert accountant.get_epsilon(delta=1e-5) <= 1.5
    accountant.history = [(1.1, 0.01, 500 + k + 1)]
    assert accountant.get_epsilon(delta=1e-5) > 1.5
    ledger.step(noise_multiplier=1.1, sample_rate=0.01, steps=10)
    assert ledger.steps_within(noise_multiplier=1.1, sample_rate=0.01, max_epsilon=1.5) == k - 10


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_calibrate_epsilon_matches_opacus_get_noise_multiplier(accountant):
    sigma = PrivacyLedger.calibrate(sample_rate=0.01, steps=1000, target_epsilon=2.0, delta=1e-5, accountant=accountant)
    reference = get_noise_multiplier(
        target_epsilon=2.0, target_delta=1e-5, sample_rate=0.01, steps=1000, accountant=accountant
    )
    assert sigma == pytest.approx(reference, rel=0.01)
    check = PrivacyLedger(accountant=accountant, delta=1e-5)
    check.step(noise_multiplier=sigma, sample_rate=0.01, steps=1000)
    assert check.epsilon() <= 2.0  # ours meets the target (Opacus' search stops within a tolerance of it)
    check = PrivacyLedger(accountant=accountant, delta=1e-5)
    check.step(noise_multiplier=sigma - 2e-4, sample_rate=0.01, steps=1000)
    assert check.epsilon() > 2.0  # and is the smallest such σ to the rounding step


def test_calibrate_bayes_security_meets_the_target_as_a_run_reads_it():
    sigma = PrivacyLedger.calibrate(sample_rate=0.02, steps=500, target_bayes_security=0.8, steps_per_read=50)
    assert min(_run(PrivacyLedger(), 10, 50, sigma, 0.02)) >= 0.8
    assert min(_run(PrivacyLedger(), 10, 50, sigma - 2e-4, 0.02)) < 0.8
    assert sigma >= bs.noise_multiplier_for(target=0.8, sample_rate=0.02, steps=500)  # the closed form undershoots


def test_tpr_bounds_are_tight_and_valid():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.5, sample_rate=0.02, steps=1000)
    fpr = np.array([0.001, 0.01, 0.1])
    tight = ledger.tpr_bounds(fpr)
    prop9 = np.array([bs.tpr_upper_bound(bayes_security=ledger.bayes_security(), fpr=f) for f in fpr])
    assert np.all(tight <= prop9 + 1e-12) and np.all(tight >= fpr)
    # tight_bounds.md: ≈ 0.0126 / 0.070 / 0.334 against Prop. 9's 0.331 / 0.340 / 0.430
    assert tight == pytest.approx([0.0126, 0.070, 0.334], rel=0.1)
    assert prop9 == pytest.approx([0.331, 0.340, 0.430], abs=2e-3)


def test_history_rewritten_backwards_fails_closed():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.0, sample_rate=0.1, steps=10)
    ledger.bayes_security()
    ledger.accountant.history = []
    with pytest.raises(RuntimeError, match="never go back"):
        ledger.bayes_security()


def test_bad_arguments():
    with pytest.raises(ValueError, match="`accountant`"):
        PrivacyLedger(accountant="moments")
    with pytest.raises(ValueError, match="`delta`"):
        PrivacyLedger(delta=0.0)
    with pytest.raises(ValueError, match="exactly one"):
        PrivacyLedger.calibrate(sample_rate=0.1, steps=10)
    with pytest.raises(ValueError, match="`steps`"):
        PrivacyLedger.calibrate(sample_rate=0.1, steps=0, target_epsilon=1.0)
    assert math.isfinite(PrivacyLedger().bayes_security())


@pytest.mark.parametrize(
    "history", [[(1.0, 0.01, 1)], [(1.7, 1 / 107, 535)], [(0.8, 0.05, 20), (1.2, 0.02, 300), (0.8, 0.05, 7)]]
)
def test_rdp_epsilon_is_opacus_get_epsilon_exactly(history):
    """The cached per-step RDP curves give the very number Opacus' RDPAccountant computes from scratch."""
    ledger = PrivacyLedger(accountant="rdp")
    reference = RDPAccountant()
    for sigma, rate, steps in history:
        for _ in range(steps):
            ledger.step(noise_multiplier=sigma, sample_rate=rate)
        reference.history.append((sigma, rate, steps))
        for delta in (1e-5, 1e-3):
            assert ledger.epsilon(delta) == reference.get_epsilon(delta=delta)


def test_rdp_epsilon_after_is_a_fresh_opacus_accountant_exactly():
    """epsilon_after (the stopper's bisection) reuses the cached curves and still gives Opacus' number."""
    ledger = PrivacyLedger(accountant="rdp")
    for _ in range(30):
        ledger.step(noise_multiplier=1.1, sample_rate=0.02)
    for steps in (0, 1, 57):
        reference = RDPAccountant()
        reference.history = [(1.1, 0.02, 30)] + ([(0.9, 0.03, steps)] if steps else [])
        assert ledger.epsilon_after(steps, noise_multiplier=0.9, sample_rate=0.03) == reference.get_epsilon(1e-5)


# ---------------------------------------------------------------------------------- the in/out game (add/remove)
def _dp_accounting_curve(segments, fpr, *, pessimistic, grid=1e-4):
    """TPR ≤ min over a fine ε grid of e^ε·α + δ_remove(ε) and 1 − e^{−ε}(1 − δ_add(ε) − α), from dp_accounting's
    add/remove PLD (its remove and add directions: the two orders of the pair with / without the example)."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    composed = None
    for sigma, rate, steps in segments:
        pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=sigma,
            sampling_prob=rate,
            value_discretization_interval=grid,
            pessimistic_estimate=pessimistic,
            use_connect_dots=pessimistic,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        ).self_compose(steps)
        composed = pld if composed is None else composed.compose(pld)
    eps = np.linspace(0.0, 15.0, 30001)
    up = np.asarray(composed._pmf_remove.get_delta_for_epsilon(eps))
    low = np.asarray(composed._pmf_add.get_delta_for_epsilon(eps))
    fpr = np.asarray(fpr, dtype=float)[:, None]
    first = np.exp(eps) * fpr + up
    second = 1.0 - np.exp(-eps) * (1.0 - low - fpr)
    return np.clip(np.minimum(first.min(axis=1), second.min(axis=1)), fpr[:, 0], 1.0)


FPRS = np.array([1e-4, 1e-3, 0.018, 0.036, 0.09, 0.3])


def _ledger(segments):
    ledger = PrivacyLedger()  # its Bayes-security values stay replace's
    for sigma, rate, steps in segments:
        ledger.step(noise_multiplier=sigma, sample_rate=rate, steps=steps)
    return ledger


@pytest.mark.parametrize(
    "segments",
    [
        [(1.0, 0.2, 150)],
        [(3.0, 0.2, 150)],
        [(1.5, 0.02, 1000)],
        [(0.8, 0.05, 300), (1.2, 0.05, 200)],
    ],
)
def test_add_remove_curve_is_dp_accountings(segments):
    """The same pessimistic (connect-the-dots) PLD on the same grid: the same curve."""
    ledger = _ledger(segments)
    ours = ledger.tpr_bounds(FPRS, relation="add_remove")
    grid = ledger.privacy_loss_distribution("add_remove").value_discretization_interval
    np.testing.assert_allclose(ours, _dp_accounting_curve(segments, FPRS, pessimistic=True, grid=grid), atol=2e-6)
    assert np.all(ours <= ledger.tpr_bounds(FPRS) + 1e-12)  # add/remove is the tighter game
    assert ledger.relation == "replace" and ledger.tpr_bounds(FPRS, relation="replace") == pytest.approx(
        ledger.tpr_bounds(FPRS)
    )


@pytest.mark.parametrize("segments", [[(3.0, 0.2, 150)], [(1.5, 0.02, 1000)]])
def test_add_remove_curve_is_pessimistic_and_tight(segments):
    """Against dp_accounting on a 10× finer grid: never below its optimistic curve (a lower bound on the truth, up
    to its ε grid), at most 1e-4 above its pessimistic one (the difference of the two grids' discretisation)."""
    ours = _ledger(segments).tpr_bounds(FPRS, relation="add_remove")
    assert np.all(ours >= _dp_accounting_curve(segments, FPRS, pessimistic=False) - 1e-6)
    fine = _dp_accounting_curve(segments, FPRS, pessimistic=True)
    assert np.all(ours >= fine - 1e-6) and np.all(ours <= fine + 1e-4)


def test_add_remove_numbers_of_the_issue():
    """σ = 1, q = 0.2, 150 steps: 0.397 at FPR 1e-3 (replace: 0.937); σ = 3: 0.013 / 0.105 / 0.169 / 0.307."""
    for sigma, want in ((1.0, [0.397]), (3.0, [0.013, 0.105, 0.169, 0.307])):
        ledger = PrivacyLedger()
        ledger.step(noise_multiplier=sigma, sample_rate=0.2, steps=150)
        fpr = [1e-3, 0.018, 0.036, 0.09][: len(want)]
        np.testing.assert_allclose(ledger.tpr_bounds(fpr, relation="add_remove"), want, atol=5e-4)
    assert float(ledger.tpr_bounds(1e-3)) == pytest.approx(0.0707, abs=1e-3)  # σ = 3, replace


def test_the_other_relation_follows_the_history_and_a_resume():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.0, sample_rate=0.1, steps=50)
    first = float(ledger.tpr_bounds(0.01, relation="add_remove"))
    ledger.step(noise_multiplier=1.0, sample_rate=0.1, steps=50)  # composed onto the add/remove PLD as well
    second = float(ledger.tpr_bounds(0.01, relation="add_remove"))
    fresh = PrivacyLedger()
    fresh.step(noise_multiplier=1.0, sample_rate=0.1, steps=100)
    assert second > first and second == pytest.approx(float(fresh.tpr_bounds(0.01, relation="add_remove")), rel=1e-6)
    resumed = PrivacyLedger()
    resumed.load_state_dict(ledger.state_dict())
    assert float(resumed.tpr_bounds(0.01, relation="add_remove")) == pytest.approx(second, rel=1e-6)
    assert "add_remove" not in str(ledger.state_dict())  # derived from the history, not saved
    ledger.accountant.history = []
    with pytest.raises(RuntimeError, match="never go back"):
        ledger.tpr_bounds(0.01, relation="add_remove")
    with pytest.raises(ValueError, match="`relation`"):
        fresh.tpr_bounds(0.01, relation="swap")
    assert PrivacyLedger().tpr_bounds(0.2, relation="add_remove") == 0.2  # no step: chance


@pytest.mark.parametrize("max_grad_norm", [0.5, 3.0])
def test_a_fit_records_the_noise_multiplier_whatever_the_clipping_norm(max_grad_norm, tmp_path):
    """σ is the noise in units of C: ε and β* of a fit at C = 0.5 or 3 are those of σ, p, T at C = 1 (a ledger that
    recorded the noise's standard deviation σ·C instead would be wrong whenever C ≠ 1)."""
    import torch

    from lightning_privacy import DPSGD
    from tests.callbacks._tiny import BATCH, N, TinyWithLoader, trainer

    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.3, max_grad_norm=max_grad_norm, sampling_seed=0)
    trainer([dpsgd], tmp_path, max_epochs=1).fit(TinyWithLoader(8, hidden=(16,), lr=0.5))
    steps = N // BATCH
    assert dpsgd.ledger.history == [(1.3, BATCH / N, steps)]
    reference = PrivacyLedger(delta=dpsgd.delta)  # the same σ, p and T, accounted at C = 1
    reference.step(noise_multiplier=1.3, sample_rate=BATCH / N, steps=steps)
    assert dpsgd.epsilon() == pytest.approx(reference.epsilon(), rel=1e-12)
    assert dpsgd.ledger.bayes_security() == pytest.approx(reference.bayes_security(), rel=1e-12)

"""A user's mistake gets one sentence naming the argument and the fix, before any wasted work.

Each case is one a new user met (issue "The noise is as secret as the sampling ..."): an ε budget no noise can keep,
reference models that print Lightning's banners once per reference, and an Epsilon* estimate above the accountant's
certified ε shown without a word. (The CLI's ``--model`` message is in ``tests/test_cli_audit_any_model.py``, the
eval-mode switch in ``tests/callbacks/test_dpsgd_noise.py``.)
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, PrivacyBudgetStopping, names
from lightning_privacy.audits import audit_epsilon_star_from_losses
from lightning_privacy.ledger import PrivacyLedger, epsilon_floor
from lightning_privacy.models import TabularMLP
from lightning_privacy.references import train_references
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer


def test_the_rdp_floor_is_the_reason_a_tiny_epsilon_cannot_be_met():
    floor = epsilon_floor(accountant="rdp", sample_rate=0.125, steps=1, delta=1e-5)
    assert 0.05 < floor < 0.2  # log(1/δ)/(max order − 1): Opacus' orders stop at a finite order
    assert epsilon_floor(accountant="prv", sample_rate=0.125, steps=1, delta=1e-5) < floor
    with pytest.raises(ValueError, match=rf"target_epsilon=0.001 .*does not fall below {floor:.4g} whatever the noise"):
        PrivacyLedger.calibrate(sample_rate=0.125, steps=8, target_epsilon=0.001, accountant="rdp")


def test_a_target_epsilon_below_the_floor_is_refused_before_any_step(tmp_path):
    """The issue: ``DPSGD(target_epsilon=0.001, ...)`` raised "No noise multiplier below 1e6 meets the target."."""
    model = tiny_module()
    before = [p.detach().clone() for p in model.parameters()]
    t = trainer([DPSGD(target_epsilon=0.001, epochs=2, accountant="rdp")], tmp_path)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(model, train_dataloaders=tiny_loader())
    message = str(info.value)
    assert message.startswith("DPSGD(target_epsilon=0.001, delta=1e-05, epochs=2): No noise_multiplier meets")
    assert re.search(r"with the 'rdp' accountant ε does not fall below 0\.\d+ whatever the noise", message)
    assert "Give an ε budget above" in message and "accountant='pld'" in message
    assert t.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_max_epsilon_below_the_floor_is_refused_with_the_floor(tmp_path):
    """The issue: ``PrivacyBudgetStopping(max_epsilon=0.01)`` raised the ledger's search error."""
    t = trainer([DPSGD(noise_multiplier=1.0, accountant="rdp"), PrivacyBudgetStopping(max_epsilon=0.01)], tmp_path)
    with pytest.raises(MisconfigurationException) as info:
        t.fit(tiny_module(), train_dataloaders=tiny_loader())
    message = str(info.value)
    assert message.startswith("PrivacyBudgetStopping(max_epsilon=0.01): the first optimizer step already breaks")
    floor = epsilon_floor(accountant="rdp", sample_rate=1 / 8, steps=1, delta=1e-5)
    assert f"Give `max_epsilon` above {floor:.4g} (or accountant='pld', whose floor is lower)." in message
    assert "No noise multiplier allows it" in message and t.global_step == 0


def _population():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32)


@pytest.mark.parametrize("verbose", [False, True])
def test_reference_training_is_quiet_unless_asked(capfd, caplog, verbose):
    capfd.readouterr()
    caplog.set_level("INFO")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_references(
            lambda: TabularMLP(6, hidden=(8,)),
            _population(),
            num_references=2,
            trainer_kwargs=dict(max_epochs=1, callbacks=[]),
            dp_sgd=dict(noise_multiplier=1.0),
            progress=False,
            verbose=verbose,
        )
    out, err = capfd.readouterr()
    shown = out + err + caplog.text  # Lightning logs to stderr, or to pytest's log capture when it runs the test
    banners = "GPU available" in shown or "Trainer.fit` stopped" in shown
    assert banners is verbose, shown[-1500:]
    if not verbose:
        assert shown == "" and caught == []


def test_an_epsilon_star_above_the_accountants_epsilon_is_explained():
    """The issue: ε* = 1.74 (empirical 2.01, on 1 of 1,000 members) above the certified ε = 1.19, without a word."""
    rng = np.random.default_rng(3)
    members, nonmembers = rng.normal(0.8, 1.0, 1000), rng.normal(1.4, 1.0, 1000)
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=2.0, sample_rate=0.01, steps=200)
    eps = ledger.epsilon(1e-4)
    with pytest.warns(UserWarning, match="exceeds the accountant's certified ε") as record:
        result = audit_epsilon_star_from_losses(members, nonmembers, delta=1e-4, ledger=ledger)
    assert result.metrics()[names.EPSILON_STAR] > eps  # the premise: the estimate is above the bound
    (message,) = [w for w in result.warnings if "certified" in w]
    assert f"the accountant's certified ε = {eps:.3g} at δ = 0.0001" in message
    assert "Epsilon* is an estimate, not a lower bound" in message
    assert re.search(r"rests on \d+ of 1,000 members and \d+ of 1,000 non-members", message)
    assert f"({names.MIA_EPSILON_LOWER} = " in message and str(record[0].message).endswith(message)
    assert message in result.summary()
    # a run whose ε is larger than every estimate: no such warning
    generous = PrivacyLedger(delta=1e-5)
    generous.step(noise_multiplier=0.3, sample_rate=0.5, steps=200)
    quiet = audit_epsilon_star_from_losses(members, nonmembers, delta=1e-4, ledger=generous, warn=False)
    assert not any("certified" in w for w in quiet.warnings)

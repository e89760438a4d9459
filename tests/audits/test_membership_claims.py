"""The membership audit plays the in/out game: its region is add/remove, and it checks a claimed guarantee —
contradicted on a model trained without noise, consistent on the DP-SGD model the claim describes."""

from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, names
from lightning_privacy.audits import audit_membership
from lightning_privacy.claims import Claim
from lightning_privacy.ledger import PrivacyLedger
from lightning_privacy.models import TabularMLP

QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
)
N, D, BATCH, EPOCHS, SIGMA = 200, 20, 50, 40, 4.0
CLAIM = (SIGMA, BATCH / N, EPOCHS * N // BATCH)  # the DP-SGD recipe below: σ = 4, q = 0.25, 160 steps


@pytest.fixture(scope="module")
def data():
    """Random features with random labels: only memorisation tells members from non-members."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * N, D, generator=g), torch.randint(0, 2, (2 * N,), generator=g)
    members = DataLoader(TensorDataset(x[:N], y[:N]), batch_size=N)
    nonmembers = DataLoader(TensorDataset(x[N:], y[N:]), batch_size=N)
    train = DataLoader(TensorDataset(x[:N], y[:N]), batch_size=BATCH, shuffle=True)
    return members, nonmembers, train


def _fit(train, callbacks=(), **model_kwargs):
    torch.manual_seed(0)
    model = TabularMLP(D, hidden=(256,), **model_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=EPOCHS, callbacks=list(callbacks), **QUIET).fit(model, train)
    return model


@pytest.fixture(scope="module")
def plain(data):
    """Trained without noise (Adam, 40 epochs): it memorises its 200 rows."""
    return _fit(data[2], lr=1e-2, optimizer="adam")


@pytest.fixture(scope="module")
def private(data):
    """DP-SGD exactly as CLAIM says: σ = 4, C = 1, Poisson rate 50/200, 160 steps."""
    dpsgd = DPSGD(noise_multiplier=SIGMA, max_grad_norm=1.0, sampling_seed=0)
    return _fit(data[2], [dpsgd], lr=0.5), dpsgd


def test_the_region_is_the_in_out_games_add_remove_curve(data):
    """σ = 1, q = 0.2, 150 steps: the region at FPR 1e-3 is dp_accounting's add/remove bound 0.397 (replace: 0.937)."""
    from tests.test_ledger import _dp_accounting_curve

    members, nonmembers, _ = data
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.0, sample_rate=0.2, steps=150)
    torch.manual_seed(0)
    result = audit_membership(TabularMLP(D, hidden=(8,)), members, nonmembers, attack="loss", ledger=ledger)
    grid, bound = result.region
    at = float(np.interp(np.log(1e-3), np.log(grid), bound))
    reference = float(_dp_accounting_curve([(1.0, 0.2, 150)], [1e-3], pessimistic=True, grid=1e-3)[0])
    assert abs(at - reference) <= 0.005 and abs(at - 0.397) <= 0.005
    assert float(ledger.tpr_bounds(1e-3)) == pytest.approx(0.937, abs=1e-3)  # the replace game's looser curve
    assert result.ledger_tpr_bounds == tuple(
        float(ledger.tpr_bounds(p.fpr_high, relation="add_remove")) for p in result.tpr
    )
    assert result.relation == "add_remove" and result.to_dict()["relation"] == "add_remove"
    assert "accountant's bound" in result.summary() and "(add/remove)" in result.summary()
    ax = result.figure().axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "allowed by the accountant (add/remove)" in labels and "add/remove" in ax.get_title()


def test_a_model_trained_without_noise_contradicts_the_claim(data, plain):
    members, nonmembers, _ = data
    with pytest.warns(UserWarning, match="is contradicted at confidence 95%"):
        result = audit_membership(plain, members, nonmembers, attack="loss", claim=CLAIM)
    assert result.verdict == "contradicted" and result.claim.label == "DP-SGD σ = 4, q = 0.25, 160 steps (δ = 1e-05)"
    evidence = result.evidence
    assert evidence["kind"] in ("tpr_at_fpr", "epsilon_lower") and evidence["statistic"] > evidence["bound"]
    assert result.metrics()[names.LOSS_CLAIM_CONTRADICTED] == 1.0
    assert result.delta == 1e-5  # the claim's δ, for the ε lower bound too
    out = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert out["verdict"] == "contradicted" and out["evidence"] == evidence and out["claim"]["relation"] == "add_remove"
    assert out["claim"]["noise_multiplier"] == SIGMA and out["claim"]["steps"] == CLAIM[2]
    assert "| verdict | contradicted at confidence 95%" in result.summary()
    ax = result.figure().axes[0]
    claim_line = [line for line in ax.lines if line.get_label().startswith("claim DP-SGD")]
    assert len(claim_line) == 1 and claim_line[0].get_label().endswith("(add/remove): CONTRADICTED")
    x, y = claim_line[0].get_data()
    floor = 0.5 / N
    np.testing.assert_allclose(y, np.clip(result.claim.tpr_bound(x), floor, 1.0))


def test_the_dp_sgd_model_the_claim_describes_is_consistent(data, private):
    members, nonmembers, _ = data
    model, dpsgd = private
    assert dpsgd.ledger.history == [CLAIM]  # the claim is this run's recipe
    for claim in (CLAIM, dpsgd.ledger, Claim.from_ledger(dpsgd.ledger)):
        result = audit_membership(model, members, nonmembers, attack="loss", claim=claim, warn=False)
        assert result.verdict == "consistent" and result.evidence is None
        assert result.metrics()[names.LOSS_CLAIM_CONTRADICTED] == 0.0
    assert result.claim.epsilon <= dpsgd.epsilon()  # the PLD's ε at δ: at most the accountant's
    assert all(not t["contradicts"] for t in result.claim_verdict.tests)


def test_no_claim_no_verdict_and_bad_claims_are_named(data):
    members, nonmembers, _ = data
    model = TabularMLP(D, hidden=(8,))
    result = audit_membership(model, members, nonmembers, attack="loss")
    assert result.verdict is None and names.LOSS_CLAIM_CONTRADICTED not in result.metrics()
    assert result.to_dict()["claim"] is None and result.to_dict()["verdict"] is None
    with pytest.raises(TypeError, match="`claim` must be a Claim, a PrivacyLedger"):
        audit_membership(model, members, nonmembers, attack="loss", claim="epsilon=1")
    with pytest.raises(ValueError, match="`noise_multiplier` must be a positive finite number, got 0"):
        audit_membership(model, members, nonmembers, attack="loss", claim=(0, 0.1, 10))
    with pytest.raises(ValueError, match="`delta` must be in \\[0, 1\\), got 2"):
        audit_membership(model, members, nonmembers, attack="loss", claim=(1.0, 2))


def test_the_report_names_the_claim_and_its_verdict(data, plain):
    from lightning_privacy.report import audit_report

    members, nonmembers, _ = data
    result = audit_membership(plain, members, nonmembers, attack="loss", claim=CLAIM, warn=False)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in audit_report(result).splitlines()}
    assert rows["claim tested"][1] == result.claim.label and "add/remove" in rows["claim tested"][2]
    verdict = rows[f"`{names.LOSS_CLAIM_CONTRADICTED}`"]
    assert verdict[1] == "1" and verdict[2].startswith("contradicted at confidence 95%")

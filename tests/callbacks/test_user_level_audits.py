"""Audits at the privacy unit (issue 58, item 3): canary people in the one-run canary audit and membership attacks
scored per person.

The acceptance run: a person-level DP-SGD run with example-level sampling, each person k = 4 rows, σ = 1.5, q = 0.1,
100 steps (person ε = 18.85, a row's 3.54 at δ = 1e-5): 1,000 canary people of 4 gradient-canary rows each, included or
left out together and scored by the sum of their rows' scores, contradict the record-level claim (the same (σ, q, T)
for one row) and never the run's own person-level claim.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, CanaryAudit, audit_membership
from lightning_privacy.audits import canary_run as run
from lightning_privacy.audits.membership import per_person_scores
from lightning_privacy.claims import Claim
from lightning_privacy.models import TabularMLP
from tests.callbacks._tiny import D, N, tiny_dataset, trainer

K, SIGMA = 4, 1.5


def _fit(seed: int, *, user_sampling: bool, rows_per_canary=None):
    torch.manual_seed(seed)
    ids = [i // K for i in range(N)]  # 64 people of 4 rows
    dp = DPSGD(noise_multiplier=SIGMA, privacy_unit="user", user_ids=ids, max_examples_per_user=K,
               user_sampling=user_sampling, sample_rate=0.1, expected_batch_size=26)  # fmt: skip
    audit = CanaryAudit(num_canaries=1000, seed=seed, rows_per_canary=rows_per_canary)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([dp, audit], None, max_epochs=10).fit(
            TabularMLP(D, hidden=(512,), lr=0.1), DataLoader(tiny_dataset(), batch_size=26)
        )
    return dp, audit


def _verdict(audit, dp, claim):
    return run.audit_run(
        audit.canaries, kind="gradient", alpha=0.05, delta=None, correction="bonferroni", claim=claim, dpsgd=dp,
        score="released_minus_batch",
    ).verdict  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_canary_people_contradict_the_record_level_claim_and_never_the_person_level_one(seed):
    dp, audit = _fit(seed, user_sampling=False)
    assert audit.canaries.rows == K and not audit.canaries.whole  # (the default: the run's k, rows sampled alone)
    assert dp.steps == 100 and dp.epsilon() == pytest.approx(18.85, abs=0.01)
    row = Claim.dp_sgd(noise_multiplier=SIGMA, sample_rate=0.1, steps=dp.steps)
    assert row.epsilon == pytest.approx(3.54, abs=0.01)
    assert audit.result.verdict == "consistent" and audit.result.claim.parameters["group_size"] == K
    assert _verdict(audit, dp, row) == "contradicted"
    assert audit.result.epsilon_lower <= dp.epsilon()


def test_under_user_level_sampling_a_canary_person_joins_whole_with_its_clipped_gradient_split_over_its_rows():
    dp, audit = _fit(0, user_sampling=True)
    assert audit.canaries.rows == K and audit.canaries.whole and audit.result.verdict == "consistent"
    for step in range(5):  # a person's rows join a step together
        joined = audit.sampled(step).reshape(-1, K)
        assert (joined.all(axis=1) | ~joined.any(axis=1)).all()
    # the scores: each row's coordinate gets C/√k per step its person joined (plus noise): the sum over a person's
    # rows is √k·C per step, against row canaries' C
    counts = sum(audit.sampled(t).reshape(-1, K)[:, 0].astype(int) for t in range(dp.steps))
    signal = audit.canaries.person_scores()  # (released minus the batch: the canary's own terms plus noise)
    fit = np.polyfit(counts, signal, 1)[0]
    assert fit == pytest.approx(np.sqrt(K) * dp.max_grad_norm, rel=0.2)


def test_canary_people_are_gradient_canaries_scored_by_their_sum():
    with pytest.raises(MisconfigurationException, match=r"rows_per_canary=3.*kind='gradient'"):
        trainer([CanaryAudit("input", num_canaries=10, rows_per_canary=3)], None, max_epochs=1).fit(
            TabularMLP(D), DataLoader(tiny_dataset(), batch_size=26)
        )
    with pytest.raises(MisconfigurationException, match="rows_per_canary"):
        CanaryAudit(rows_per_canary=0)
    canaries = run.CanarySet("gradient", 4, seed=0, rows=3)
    canaries.draw(12, "trainable coordinates")
    assert len(canaries.canaries) == 12 and len(set(canaries.canaries)) == 12 and canaries.included.shape == (4,)
    with pytest.raises(ValueError, match=r"4 canary people of 3 rows need 12.*num_canaries ≤ 3"):
        run.CanarySet("gradient", 4, seed=0, rows=3).draw(11, "trainable coordinates")


def test_membership_is_scored_per_person_as_the_mean_of_their_rows():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, 5, generator=g), torch.randint(0, 2, (120,), generator=g)
    members, nonmembers = (DataLoader(TensorDataset(x[s], y[s]), batch_size=40) for s in (slice(0, 60), slice(60, 120)))
    model = torch.nn.Linear(5, 2)
    rows = audit_membership(model, members, nonmembers, attack="loss", warn=False)
    ids = ([f"m{i % 20}" for i in range(60)], [f"n{i % 15}" for i in range(60)])
    people = audit_membership(model, members, nonmembers, attack="loss", user_ids=ids, warn=False)
    assert people.scores.shape == (35,) and people.is_member.sum() == 20
    expected, member = per_person_scores(rows.scores, rows.is_member, ids, (60, 60))
    assert np.allclose(people.scores, expected) and (people.is_member == member).all()
    assert people.scores[0] == pytest.approx(rows.scores[[0, 20, 40]].mean())
    assert any("scored per person" in note for note in people.notes)
    with pytest.raises(ValueError, match="among both members and non-members"):
        audit_membership(model, members, nonmembers, attack="loss", user_ids=(ids[0], ["m0"] * 60), warn=False)
    with pytest.raises(ValueError, match="59 member ids for 60 member rows"):
        audit_membership(model, members, nonmembers, attack="loss", user_ids=(ids[0][:59], ids[1]), warn=False)


def test_epsilon_star_of_people_reads_each_person_s_mean_loss():
    from lightning_privacy import audit_epsilon_star
    from lightning_privacy.audits.epsilon_star import audit_epsilon_star_from_losses
    from lightning_privacy.functional.membership_loss import membership_losses_from_loader

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(400, 4, generator=g), torch.randint(0, 2, (400,), generator=g)
    model = torch.nn.Linear(4, 2)
    members, nonmembers = (
        DataLoader(TensorDataset(x[s], y[s]), batch_size=100) for s in (slice(0, 200), slice(200, 400))
    )
    ids = ([f"m{i % 50}" for i in range(200)], [f"n{i % 40}" for i in range(200)])
    people = audit_epsilon_star(model, members, nonmembers, user_ids=ids, delta=1e-3, warn=False)
    losses = [membership_losses_from_loader(model, loader).double().numpy() for loader in (members, nonmembers)]

    def mean(values, people):  # row i belongs to person i mod people
        return np.array([values[i::people].mean() for i in range(people)])

    expected = audit_epsilon_star_from_losses(mean(losses[0], 50), mean(losses[1], 40), delta=1e-3, warn=False)
    assert people.to_dict()["num_members"] == 50
    assert people.metrics() == pytest.approx(expected.metrics())

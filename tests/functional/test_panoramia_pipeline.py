"""The PANORAMIA pipeline end to end on small data: null cases, leakage, reproducibility, errors."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from lightning_privacy.data import AdultEncoder, AdultTable, load_adult
from lightning_privacy.functional.panoramia import fresh_copy, panoramia_audit, per_example_loss, summary_text
from lightning_privacy.generators import HeldOutRows, TabularGenerator


@pytest.fixture(scope="module")
def adult():
    table = load_adult("train").subset(np.arange(5000))
    encoder = AdultEncoder().fit(table)

    def encode(rows):
        return torch.from_numpy(encoder.transform(rows)), torch.as_tensor(np.asarray(rows.labels), dtype=torch.long)

    encode.width = encoder.num_features
    return table, encode


class Memoriser(nn.Module):
    """A toy target that memorised the labels of its training rows (exact-match lookup) — maximal leakage."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(x.shape[1], 2)
        self.memory = {tuple(row.tolist()): int(label) for row, label in zip(x, y)}

    def forward(self, x):
        out = self.linear(x)
        bonus = torch.zeros_like(out)
        for i, row in enumerate(x):
            label = self.memory.get(tuple(row.tolist()))
            if label is not None:
                bonus[i, label] = 8.0
        return out + bonus


def _linear(n_features):
    return nn.Sequential(nn.Linear(n_features, 16), nn.ReLU(), nn.Linear(16, 2))


def _audit(target, members, encode, **kw):
    kw.setdefault("helper", _linear(encode.width))
    kw.setdefault("helper_epochs", 2)
    kw.setdefault("num_thresholds", 30)
    return panoramia_audit(target, members, encode=encode, **kw)


@pytest.mark.parametrize("mia_features", ["target_loss", "calibrated"])
def test_leaking_target_gives_positive_epsilon(adult, mia_features):
    table, encode = adult
    members = table.subset(np.arange(1500))
    target = Memoriser(*encode(members))
    res = _audit(target, members, encode, audit_size=500, generator_size=500, seed=0, mia_features=mia_features)
    assert res.epsilon > 0.5
    assert res.c_plus_epsilon_lb > res.c_lb
    assert res.sizes == {
        "members": 1500,
        "generator": 500,
        "train_members": 500,
        "train_generated": 500,
        "audit": 500,
        "audit_members": int(res.labels.sum()),
        "helper_train": 500,
    }
    assert "NOT a lower bound" in summary_text(res)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_non_member_trained_target_gives_zero(adult, seed):
    """Real non-members (c = 0) and a target that never saw the audit rows: Proposition 2 makes
    {c+eps}_lb = 0 and c_lb = 0 except with probability <= beta."""
    table, encode = adult
    members, others, pool = (table.subset(np.arange(a, b)) for a, b in ((0, 1500), (1500, 3000), (3000, 5000)))
    torch.manual_seed(seed)
    target = Memoriser(*encode(others))
    res = _audit(
        target, members, encode, generator=HeldOutRows(pool, seed=seed), audit_size=500, generator_size=500, seed=seed
    )
    assert res.epsilon == 0.0 and res.c_lb == 0.0 and res.c_plus_epsilon_lb == 0.0
    leaking = _audit(
        Memoriser(*encode(members)),
        members,
        encode,
        generator=HeldOutRows(pool, seed=seed),
        audit_size=500,
        generator_size=500,
        seed=seed,
    )
    assert leaking.epsilon > 2.0


def test_non_member_target_with_generated_rows_stays_far_below_leaking(adult):
    """With a generator c_lb only lower-bounds c, so eps_tilde of a non-member target is small noise
    (the paper's semantics), far below the leaking target's."""
    table, encode = adult
    members, others = table.subset(np.arange(1500)), table.subset(np.arange(1500, 3000))
    torch.manual_seed(0)
    res = _audit(Memoriser(*encode(others)), members, encode, audit_size=500, generator_size=500, seed=0)
    assert res.epsilon < 0.5


@pytest.mark.parametrize("seed", [0, 1])
def test_generator_equal_to_data_gives_c_lb_about_zero(adult, seed):
    table, encode = adult
    members, held_out = table.subset(np.arange(1200)), table.subset(np.arange(1200, 3000))
    target = _linear(encode.width)
    res = _audit(
        target,
        members,
        encode,
        generator=HeldOutRows(held_out, seed=seed),
        audit_size=400,
        generator_size=400,
        seed=seed,
    )
    # P(c_lb > 0) <= beta / 2 when the "generator" is the data distribution itself
    assert res.c_lb == 0.0
    assert np.isnan(res.acceptance_rate)


def test_seeds_make_runs_reproducible(adult):
    table, encode = adult
    members = table.subset(np.arange(900))
    target = _linear(encode.width)
    a = _audit(target, members, encode, generator=TabularGenerator(seed=0), seed=3)
    b = _audit(target, members, encode, generator=TabularGenerator(seed=0), seed=3)
    c = _audit(target, members, encode, generator=TabularGenerator(seed=0), seed=4)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.baseline_scores, b.baseline_scores)
    assert np.array_equal(a.mia_scores, b.mia_scores) and a.epsilon == b.epsilon
    assert not np.array_equal(a.labels, c.labels)


def test_target_is_not_modified(adult):
    table, encode = adult
    members = table.subset(np.arange(900))
    target = _linear(encode.width).train()
    before = [p.detach().clone() for p in target.parameters()]
    _audit(target, members, encode, helper=None, generator=TabularGenerator(seed=0), seed=0)
    assert target.training and all(torch.equal(p, q) for p, q in zip(before, target.parameters()))


def test_fresh_copy_and_losses():
    model = _linear(4)
    model.register_forward_hook(lambda *a: None)
    copy = fresh_copy(model)
    assert not copy[0]._forward_hooks and not torch.equal(copy[0].weight, model[0].weight)
    loss = per_example_loss(model, torch.zeros(5, 4), torch.ones(5, dtype=torch.long))
    want = nn.functional.cross_entropy(model(torch.zeros(5, 4)), torch.ones(5, dtype=torch.long), reduction="none")
    assert np.allclose(loss, want.detach().numpy())


def test_errors(adult):
    table, encode = adult
    target = _linear(encode.width)
    with pytest.raises(ValueError, match="too little member data: `members` has 100 rows"):
        panoramia_audit(target, table.subset(np.arange(100)), encode=encode, audit_size=40, generator_size=50)
    with pytest.raises(ValueError, match="`audit_size` must be an int >= 20, got 5"):
        panoramia_audit(target, table, encode=encode, audit_size=5)
    with pytest.raises(TypeError, match="`members` must be a table .* got list"):
        panoramia_audit(target, [[1.0, 2.0]], encode=encode)
    with pytest.raises(TypeError, match="`target` must be a torch.nn.Module"):
        panoramia_audit(lambda x: x, table, encode=encode)
    with pytest.raises(ValueError, match="`encode` is required for table members"):
        panoramia_audit(target, table)
    with pytest.raises(ValueError, match="x.shape\\[0\\] == len\\(y\\)"):
        panoramia_audit(target, (np.zeros((10, 4)), np.zeros(9)))
    digits = load_digits()
    with pytest.raises(ValueError, match="`data` is table data but `pool` is arrays data"):
        panoramia_audit(
            target, table.subset(np.arange(600)), encode=encode, generator=HeldOutRows((digits.data, digits.target))
        )

    class WrongWidth:  # a generator whose rows lack a numeric column
        def fit(self, data):
            return self

        def sample(self, n):
            t = table.subset(np.arange(n))
            return AdultTable(t.numeric[:, :5], t.categorical, t.labels)

    with pytest.raises(ValueError, match="`members` and `generated D_out\\^tr` have mismatched shapes"):
        panoramia_audit(target, table.subset(np.arange(600)), encode=encode, generator=WrongWidth())
    with pytest.raises(ValueError, match="`mia_features` must be 'target_loss' or 'calibrated', got 'x'"):
        panoramia_audit(target, table, encode=encode, mia_features="x")
    with pytest.raises(ValueError, match="`classifier` must be 'auto', 'hgb' or 'torch', got 'svm'"):
        panoramia_audit(target, table, encode=encode, classifier="svm")


@pytest.mark.slow
def test_digits_with_torch_classifier():
    digits = load_digits()
    x, y = digits.images / 16.0, digits.target
    torch.manual_seed(0)
    target = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    members = (x[:900], y[:900])
    target = Memoriser2D(target, *members)
    res = panoramia_audit(
        target,
        members,
        helper=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)),
        helper_epochs=3,
        num_thresholds=30,
        seed=0,
    )
    assert res.mia_params["kind"] == "torch_cnn" and res.epsilon > 0.3


class Memoriser2D(nn.Module):
    """Image version of :class:`Memoriser` around a small network."""

    def __init__(self, net, x, y):
        super().__init__()
        self.net = net
        self.memory = {np.round(np.asarray(row, dtype=np.float32), 4).tobytes(): int(lab) for row, lab in zip(x, y)}

    def forward(self, x):
        out = self.net(x)
        bonus = torch.zeros_like(out)
        for i, row in enumerate(x):
            label = self.memory.get(np.round(row.numpy().astype(np.float32), 4).tobytes())
            if label is not None:
                bonus[i, label] = 8.0
        return out + bonus

"""Generators for PANORAMIA: protocol, fidelity, reproducibility, filtering and clear errors."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from lightning_privacy.data import AdultTable, load_adult
from lightning_privacy.generators import (
    BayesNetGenerator,
    DigitsGenerator,
    FilteredGenerator,
    Generator,
    HeldOutRows,
    TabularGenerator,
)


@pytest.fixture(scope="module")
def adult():
    return load_adult("train").subset(np.arange(4000))


@pytest.fixture(scope="module", params=["cart", "bayesnet"])
def fitted(adult, request):
    return (TabularGenerator if request.param == "cart" else BayesNetGenerator)(seed=0).fit(adult)


def _tv(a, b):
    va, ca = np.unique(a, return_counts=True)
    vb, cb = np.unique(b, return_counts=True)
    pa, pb = dict(zip(va, ca / ca.sum())), dict(zip(vb, cb / cb.sum()))
    return 0.5 * sum(abs(pa.get(k, 0) - pb.get(k, 0)) for k in set(pa) | set(pb))


def test_protocol():
    for gen in (
        TabularGenerator(),
        BayesNetGenerator(),
        DigitsGenerator(),
        HeldOutRows((np.zeros((2, 1)), np.zeros(2, int))),
    ):
        assert isinstance(gen, Generator)


def test_tabular_schema_and_values(adult, fitted):
    fake = fitted.sample(3000)
    assert isinstance(fake, AdultTable)
    assert fake.numeric.shape == (3000, 6) and fake.categorical.shape == (3000, 8) and len(fake) == 3000
    assert set(np.unique(fake.labels)) <= {0, 1}
    for j in range(6):  # every generated numeric value is a value the column takes
        assert np.all(np.isin(fake.numeric[:, j], adult.numeric[:, j]))
    for j in range(8):
        assert np.all(np.isin(fake.categorical[:, j], adult.categorical[:, j]))


def test_tabular_marginals_and_dependence(adult, fitted):
    fake = fitted.sample(8000)
    for j in range(8):
        assert _tv(fake.categorical[:, j], adult.categorical[:, j]) < 0.04
    assert abs(fake.labels.mean() - adult.labels.mean()) < 0.02
    assert abs(np.median(fake.numeric[:, 0]) - np.median(adult.numeric[:, 0])) <= 2
    # education (categorical col 1) determines education-num (numeric col 2): the network keeps it
    real_map = {e: set(adult.numeric[adult.categorical[:, 1] == e, 2]) for e in np.unique(adult.categorical[:, 1])}
    consistent = np.mean([n in real_map[e] for e, n in zip(fake.categorical[:, 1], fake.numeric[:, 2])])
    assert consistent > 0.97
    # label depends on marital status / relationship (a strong pairwise signal in Adult)
    married = adult.categorical[:, 2] == "Married-civ-spouse"
    fmarried = fake.categorical[:, 2] == "Married-civ-spouse"
    assert abs(fake.labels[fmarried].mean() - adult.labels[married].mean()) < 0.05


@pytest.mark.parametrize("cls", [TabularGenerator, BayesNetGenerator])
def test_tabular_is_reproducible(adult, cls):
    a = cls(seed=3).fit(adult).sample(50)
    b = cls(seed=3).fit(adult).sample(50)
    c = cls(seed=4).fit(adult).sample(50)
    assert np.array_equal(a.numeric, b.numeric) and np.array_equal(a.categorical, b.categorical)
    assert not np.array_equal(a.numeric, c.numeric)


def test_chow_liu_tree(adult):
    gen = BayesNetGenerator(max_parents=1).fit(adult)
    assert all(len(p) <= 1 for p in gen.parents.values())
    assert sorted(gen.order) == list(range(15)) and gen.order[0] == 14  # rooted at the label


def test_tabular_errors(adult):
    with pytest.raises(TypeError, match="TabularGenerator fits tables"):
        TabularGenerator().fit((np.zeros((3, 2)), np.zeros(3, int)))
    with pytest.raises(TypeError, match="must be a table"):
        TabularGenerator().fit(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="`max_parents` must be an int in \\[0, 3\\], got 5"):
        BayesNetGenerator(max_parents=5)
    with pytest.raises(ValueError, match="`max_bins` must be an int >= 2, got 1"):
        BayesNetGenerator(max_bins=1)
    with pytest.raises(ValueError, match="`min_samples_leaf` must be a positive int, got 0"):
        TabularGenerator(min_samples_leaf=0)
    with pytest.raises(TypeError, match="BayesNetGenerator fits tables"):
        BayesNetGenerator().fit((np.zeros((3, 2)), np.zeros(3, int)))
    with pytest.raises(ValueError, match="before fit"):
        TabularGenerator().sample(3)
    with pytest.raises(ValueError, match="at least 2 rows"):
        TabularGenerator().fit(adult.subset([0]))
    with pytest.raises(ValueError, match="`n` must be a non-negative int, got -1"):
        TabularGenerator().fit(adult).sample(-1)


def test_held_out_rows(adult):
    gen = HeldOutRows(adult.subset(np.arange(100)), seed=0).fit(adult)
    a, b = gen.sample(60), gen.sample(40)
    rows = sorted(map(tuple, np.r_[a.numeric, b.numeric]))
    assert rows == sorted(map(tuple, adult.numeric[:100]))  # every pool row once: without replacement
    with pytest.raises(ValueError, match="exceeds the 0 held-out rows"):
        gen.sample(1)
    with pytest.raises(ValueError, match="`data` is arrays data but `pool` is table data"):
        HeldOutRows(adult).fit((np.zeros((3, 2)), np.zeros(3, int)))


class _HalfBroken:
    """Half of the rows are impossible (age -100): the filter must remove them."""

    def __init__(self, base):
        self.base = base

    def fit(self, data):
        self.base.fit(data)
        return self

    def sample(self, n):
        t = self.base.sample(n)
        numeric = t.numeric.copy()
        numeric[::2, 0] = -100.0
        return AdultTable(numeric, t.categorical, t.labels)


def test_filter_removes_obviously_synthetic_rows(adult):
    gen = FilteredGenerator(_HalfBroken(BayesNetGenerator(seed=0)), threshold=0.1).fit(adult)
    out = gen.sample(500)
    assert len(out) == 500 and not np.any(out.numeric[:, 0] == -100.0)
    assert 0.3 < gen.acceptance_rate < 0.65
    assert np.all(gen.real_probability(out) >= 0.1)


def test_filter_errors():
    with pytest.raises(ValueError, match="`threshold` must be a float in \\[0, 1\\), got 1.0"):
        FilteredGenerator(TabularGenerator(), threshold=1.0)
    with pytest.raises(TypeError, match="`generator` must have fit"):
        FilteredGenerator(object())
    with pytest.raises(ValueError, match="before fit"):
        FilteredGenerator(TabularGenerator()).sample(2)


def test_digits_generator():
    digits = load_digits()
    x, y = digits.images[:900], digits.target[:900]
    gen = DigitsGenerator(seed=0).fit((x, y))
    fx, fy = gen.sample(2000)
    assert fx.shape == (2000, 8, 8) and set(np.unique(fy)) <= set(range(10))
    assert np.all(np.isin(fx, np.arange(17)))  # integral intensities 0..16
    # per-class mean image close to the real one; always-black pixels stay black
    for c in range(10):
        assert np.abs(fx[fy == c].mean(0) - x[y == c].mean(0)).max() < 2.5
    black = x.reshape(900, -1).max(0) == 0
    assert np.all(fx.reshape(2000, -1)[:, black] == 0)
    again = DigitsGenerator(seed=0).fit((x, y)).sample(5)
    first = DigitsGenerator(seed=0).fit((x, y)).sample(5)
    assert np.array_equal(again[0], first[0])


def test_digits_errors(adult):
    with pytest.raises(TypeError, match="DigitsGenerator fits"):
        DigitsGenerator().fit(adult)
    with pytest.raises(ValueError, match="at least 2 images per class"):
        DigitsGenerator().fit((np.zeros((3, 8, 8)), np.array([0, 0, 1])))
    with pytest.raises(ValueError, match="x.shape\\[0\\] == len\\(y\\)"):
        DigitsGenerator().fit((np.zeros((3, 8, 8)), np.array([0, 1])))

"""The O(batch) Poisson sampler draws the law the accountants assume: each row independently with probability p.

Statistical tests with fixed seeds (deterministic): χ² over the rows' inclusion counts, the batch size against
Binomial(N, p), independence of pairs of rows (adjacent rows too, where a gap-based draw could couple them), the
union over W ranks equal to one process, and N = 10⁸ without per-row memory. Thresholds are p-values of 1e-4.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy import stats

from lightning_privacy.dpsgd.sampling import PoissonBatchSampler, global_rows, secure_rows

N, P, STEPS = 40, 0.3, 6000


def _masks(draw) -> np.ndarray:
    masks = np.zeros((STEPS, N), dtype=bool)
    for t in range(STEPS):
        masks[t, draw(t)] = True
    return masks


SOURCES = {
    "seeded": lambda t: global_rows(11, t, N, P),
    "secure": lambda t: np.concatenate([secure_rows(r, 3, N, P) for r in range(3)]).astype(int),
}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def masks(request):
    return _masks(SOURCES[request.param])


def test_every_row_is_included_with_probability_p(masks):
    counts = masks.sum(axis=0)
    chi2 = float(((counts - STEPS * P) ** 2 / (STEPS * P * (1 - P))).sum())
    assert stats.chi2.sf(chi2, df=N) > 1e-4, counts
    assert abs(counts.mean() / STEPS - P) < 0.01


def test_the_batch_size_is_binomial(masks):
    sizes = masks.sum(axis=1)
    support = np.arange(N + 1)
    expected = STEPS * stats.binom.pmf(support, N, P)
    observed = np.bincount(sizes, minlength=N + 1)
    keep = expected >= 5  # pool the tails so every cell expects at least 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4


@pytest.mark.parametrize("pair", [(0, 1), (17, 18), (0, N - 1), (5, 30)])
def test_two_rows_are_independent(masks, pair):
    a, b = masks[:, pair[0]], masks[:, pair[1]]
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    assert stats.chi2_contingency(table, correction=False).pvalue > 1e-4, table
    assert abs(np.mean(a & b) - P * P) < 0.02


def test_steps_are_independent_draws_of_the_same_seed():
    """Consecutive steps of one seed: a row's inclusion at t and at t + 1 are independent."""
    masks = _masks(SOURCES["seeded"])
    a, b = masks[:-1].ravel(), masks[1:].ravel()
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    assert stats.chi2_contingency(table, correction=False).pvalue > 1e-4


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_the_ranks_batches_are_the_single_process_batch(world_size):
    kwargs = dict(num_samples=1001, sample_rate=0.05, steps=30, seed=4)
    single = list(PoissonBatchSampler(**kwargs))
    ranks = [list(PoissonBatchSampler(**kwargs, rank=r, world_size=world_size)) for r in range(world_size)]
    for r, batches in enumerate(ranks):
        assert len(batches) == 30 and all(i % world_size == r for batch in batches for i in batch)
    assert [sorted(sum(parts, [])) for parts in zip(*ranks)] == single
    assert single[0] == global_rows(4, 0, 1001, 0.05).tolist()


def test_p_one_takes_every_row_and_tiny_data_works():
    assert global_rows(0, 0, 5, 1.0).tolist() == [0, 1, 2, 3, 4]
    assert secure_rows(1, 2, 5, 1.0) == [1, 3]
    assert secure_rows(3, 4, 3, 0.5) == []  # a rank with no rows
    assert set(global_rows(0, 0, 1, 0.999999).tolist()) <= {0}


@pytest.mark.parametrize("draw", ["seeded", "secure"])
def test_a_hundred_million_rows_cost_memory_in_proportion_to_the_batch(draw):
    n, p = 10**8, 1e-5
    tracemalloc.start()
    try:
        rows = global_rows(3, 0, n, p) if draw == "seeded" else np.asarray(secure_rows(0, 4, n, p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    expected = n * p / (1 if draw == "seeded" else 4)
    assert abs(rows.size - expected) < 6 * np.sqrt(expected)
    assert peak < 1_000_000  # bytes: an O(N) draw would need ≥ 100 MB
    assert rows.max() < n and (np.diff(rows) > 0).all()


@pytest.mark.parametrize("draw", ["seeded", "secure"])
def test_no_end_effect_at_small_n(draw):
    """N = 7: every row, the last ones too, is drawn at rate p and the batch is empty with probability (1 − p)^N.

    A gap that runs past the end must end the draw, not land on the last row; at N = 40 that slip adds (1 − p)^40 ≈ 6e-7
    to row N − 1 and the tests above cannot see it, at N = 7 it adds 0.7⁷ = 0.082 (24 standard deviations here)."""
    n, p, steps = 7, 0.3, 20_000
    if draw == "seeded":
        sampler = PoissonBatchSampler(num_samples=n, sample_rate=p, steps=steps, seed=5)
        batches = list(sampler)
    else:
        batches = [secure_rows(0, 1, n, p) for _ in range(steps)]
    counts = np.bincount(np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]), minlength=n)
    assert counts.size == n  # no row beyond the end
    for row, count in enumerate(counts):  # each row on its own, Bonferroni over the 7 rows
        assert stats.binomtest(int(count), steps, p).pvalue > 1e-4 / n, (row, counts)
    chi2 = float(((counts - steps * p) ** 2 / (steps * p * (1 - p))).sum())
    assert stats.chi2.sf(chi2, df=n) > 1e-4, counts
    empty = sum(len(b) == 0 for b in batches)
    assert stats.binomtest(empty, steps, (1 - p) ** n).pvalue > 1e-4

"""RMIA, LiRA and LOSS: scores against hand-written loops, invariances, chance, the acceptance cases, the cache.

Two one-line changes to the attacks have no test, because no user could tell them apart from the code as it is
(issue 29's mutation run):

- RMIA's ``Pr(x) = ½ (Pr_IN + Pr_OUT)`` without the ``½`` (``- np.log(2.0)`` left out of ``_log_marginal``): every
  ratio ``Pr(·|θ) / Pr(·)``, of the audited examples and of the population points alike, is halved, so every
  likelihood ratio ``LR(x, z)`` and every fraction is unchanged; only the ``TIE_BREAK`` term moves, by less than
  ``TIE_BREAK / 4 = 2.5e-10``, and never across a fraction's step.
- RMIA's ``LR(x, z) ≥ γ`` compared strictly (``> γ``): the scores differ only for pairs whose ratio is exactly γ
  in floating point, which real losses essentially never produce. The paper's ``≥`` is pinned anyway on a
  constructed tie (``test_rmia_counts_a_population_point_whose_ratio_equals_gamma``).
"""

from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, names
from lightning_privacy.analysis import membership_attacks as ma
from lightning_privacy.audits import audit_membership
from lightning_privacy.data.adult import AdultEncoder, load_adult
from lightning_privacy.ledger import PrivacyLedger
from lightning_privacy.models import TabularMLP
from lightning_privacy.references import train_references

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


# ---------------------------------------------------------------------------------------------- scores by hand
def _p(loss):
    return 1.0 / (1.0 + np.exp(loss))


def _rmia_loop(tgt, ref, ptgt, pref, inside, pinside, gamma, a):
    """RMIA written out example by example, in probability space."""

    def marginal(column, ins):
        out_mean = np.mean([_p(v) for v, i in zip(column, ins) if not i])
        ins_vals = [_p(v) for v, i in zip(column, ins) if i]
        in_mean = np.mean(ins_vals) if ins_vals else a * out_mean + (1 - a)
        return 0.5 * (in_mean + out_mean)

    ratio_z = [_p(ptgt[j]) / marginal(pref[:, j], pinside[:, j]) for j in range(ptgt.size)]
    scores = []
    for i in range(tgt.size):
        ratio_x = _p(tgt[i]) / marginal(ref[:, i], inside[:, i])
        scores.append(np.mean([ratio_x / rz >= gamma for rz in ratio_z]))
    return np.array(scores)


@pytest.mark.parametrize("online", [False, True])
@pytest.mark.parametrize("a", [1.0, 0.3])
def test_rmia_equals_a_loop_over_pairs(online, a):
    rng = np.random.default_rng(1)
    k, n, m = 4, 30, 50
    tgt, ptgt = rng.normal(0, 1.5, n), rng.normal(0, 1.5, m)
    ref, pref = rng.normal(0, 1.5, (k, n)), rng.normal(0, 1.5, (k, m))
    inside = np.zeros((k, n), bool)
    if online:
        inside[:2] = True
        inside = rng.permuted(inside, axis=0)
    pinside = rng.random((k, m)) < 0.5
    pinside[0] = False  # every z has an OUT reference
    got = ma.rmia_scores(tgt, ref, ptgt, pref, inside=inside, population_inside=pinside, gamma=1.5, offline_a=a)
    want = _rmia_loop(tgt, ref, ptgt, pref, inside, pinside, 1.5, a)
    np.testing.assert_allclose(got, want, atol=ma.TIE_BREAK)
    assert np.all(got >= want) and np.all(got - want < ma.TIE_BREAK)


def test_rmia_leaves_out_population_points_no_reference_left_out():
    rng = np.random.default_rng(5)
    tgt, ref, ptgt, pref = rng.normal(size=20), rng.normal(size=(1, 20)), rng.normal(size=40), rng.normal(size=(1, 40))
    pinside = rng.random((1, 40)) < 0.5
    got = ma.rmia_scores(tgt, ref, ptgt, pref, population_inside=pinside, offline_a=0.4)
    keep = ~pinside[0]
    want = _rmia_loop(tgt, ref, ptgt[keep], pref[:, keep], np.zeros((1, 20), bool), pinside[:, keep], 2.0, 0.4)
    np.testing.assert_allclose(got, want, atol=ma.TIE_BREAK)
    with pytest.raises(ValueError, match="population points"):
        ma.rmia_scores(tgt, ref, ptgt, pref, population_inside=np.ones((1, 40), bool))


def test_lira_equals_the_gaussian_formulas():
    rng = np.random.default_rng(2)
    k, n = 4, 25
    tgt, ref = rng.normal(size=n), rng.normal(size=(k, n))
    phi, phi_ref = -tgt, -ref
    # offline, global variance: (φ − median_out) / std(all OUT φ)
    off = ma.lira_scores(tgt, ref)
    np.testing.assert_allclose(off, (phi - np.median(phi_ref, axis=0)) / np.std(phi_ref))
    # online: two IN, two OUT per example
    inside = rng.permuted(np.r_[np.ones((2, n), bool), np.zeros((2, n), bool)], axis=0)
    on = ma.lira_scores(tgt, ref, inside=inside)
    phi_in = np.where(inside, phi_ref, np.nan)
    phi_out = np.where(~inside, phi_ref, np.nan)
    mu_in, mu_out = np.nanmedian(phi_in, axis=0), np.nanmedian(phi_out, axis=0)
    want = stats.norm.logpdf(phi, mu_in, np.nanstd(phi_in)) - stats.norm.logpdf(phi, mu_out, np.nanstd(phi_out))
    np.testing.assert_allclose(on, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="IN reference for every example"):
        partial = inside.copy()
        partial[:, 0] = False
        ma.lira_scores(tgt, ref, inside=partial)


def test_offline_a_is_the_ratio_of_the_misses():
    losses = np.array([[-3.0, -2.0, 0.5, 1.0], [1.0, 0.0, -3.0, -1.0]])
    inside = np.array([[True, True, False, False], [False, False, True, True]])
    miss = 1 - _p(losses)
    want = np.mean([miss[0, :2].mean(), miss[1, 2:].mean()]) / np.mean([miss[0, 2:].mean(), miss[1, :2].mean()])
    assert ma.fit_offline_a(losses, inside) == pytest.approx(want)


def test_relabelling_flips_the_roc():
    rng = np.random.default_rng(3)
    member = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    scores = rng.normal(1.0 * member)
    fpr, tpr, _ = ma.roc_curve(scores, member)
    fpr_f, tpr_f, _ = ma.roc_curve(-scores, ~member)
    assert ma.auc(scores, member) == pytest.approx(ma.auc(-scores, ~member))
    assert ma.auc(scores, ~member) == pytest.approx(1 - ma.auc(scores, member))
    # the flipped rule's ROC is the original's read backwards with the axes swapped
    np.testing.assert_allclose(np.interp(0.3, fpr_f, tpr_f), np.interp(0.3, fpr, tpr), atol=0.02)


def test_tpr_intervals_cover_the_rate():
    rng = np.random.default_rng(4)
    member = np.r_[np.ones(2000, bool), np.zeros(2000, bool)]
    points = ma.tpr_at_fpr(rng.normal(2.0 * member), member, [0.01, 0.1])
    for p in points:  # the interval covers the true TPR of the threshold chosen on these scores
        assert p.fp <= p.fpr * p.num_nonmembers
        assert p.tpr_low <= stats.norm.sf(p.threshold - 2.0) <= p.tpr_high
        assert p.achieved_fpr <= p.fpr_high and stats.norm.sf(p.threshold) <= p.fpr_high


def test_tpr_and_fpr_limits_are_the_exact_binomial_intervals_at_one_minus_alpha():
    """Pins the level of both limits: the TPR interval and the FPR upper limit are the two-sided Clopper–Pearson
    interval at ``1 − alpha`` (scipy's exact binomial interval), not at ``1 − alpha/2`` or ``1 − 2·alpha``."""
    rng = np.random.default_rng(6)
    member = np.r_[np.ones(500, bool), np.zeros(400, bool)]
    scores = rng.normal(1.0 * member)
    for alpha in (0.05, 0.2):
        points = ma.tpr_at_fpr(scores, member, [0.0, 0.01, 0.1, 0.3], alpha=alpha)
        assert {p.fp for p in points} >= {0} and len({p.fp for p in points}) == 4  # FPR limits at 0 and above
        for p in points:
            tpr = stats.binomtest(p.tp, p.num_members).proportion_ci(confidence_level=1 - alpha, method="exact")
            fpr = stats.binomtest(p.fp, p.num_nonmembers).proportion_ci(confidence_level=1 - alpha, method="exact")
            assert (p.tpr_low, p.tpr_high) == pytest.approx((tpr.low, tpr.high), rel=1e-9, abs=1e-12), p
            assert p.fpr_high == pytest.approx(fpr.high, rel=1e-9), p


def test_lira_takes_per_example_variances_from_64_references():
    """Pins the switch of the documented rule "fewer than 64 references: global variances": at 63 references the
    default is the fixed variance, at 64 the per-example one (the two give other scores)."""
    rng = np.random.default_rng(7)
    assert ma.FIXED_VARIANCE_BELOW == 64
    for k, fixed in ((63, True), (64, False)):
        tgt, ref = rng.normal(size=12), rng.normal(size=(k, 12)) * np.linspace(0.2, 3.0, 12)  # spreads differ
        default = ma.lira_scores(tgt, ref)
        np.testing.assert_array_equal(default, ma.lira_scores(tgt, ref, fixed_variance=fixed))
        assert np.abs(default - ma.lira_scores(tgt, ref, fixed_variance=not fixed)).max() > 0.1, k


def test_rmia_counts_a_population_point_whose_ratio_equals_gamma():
    """RMIA's ``LR(x, z) ≥ γ`` (Zarifzadeh et al. 2024, Eq. 4): at γ = 1 an example with the same losses as a
    population point (the same ratio, computed alike) dominates it."""
    loss, ref = np.array([0.3, -5.0]), np.array([[0.1, 0.1]])  # the examples are the population points
    scores = ma.rmia_scores(loss, ref, loss, ref, gamma=1.0)
    np.testing.assert_allclose(scores, [0.5, 1.0], atol=ma.TIE_BREAK)  # each dominates itself and what it beats


class _Logits(torch.nn.Module):
    """A "model" whose input is its logits: the audited losses are exactly the ones written into the data."""

    def forward(self, x):
        return x


def _score_loader(scores):
    """Rows of label 0 with logits (s, 0): membership loss −s, so the LOSS attack's score is s."""
    logits = torch.zeros(len(scores), 2, dtype=torch.float64)
    logits[:, 0] = torch.from_numpy(scores)
    return DataLoader(TensorDataset(logits, torch.zeros(len(scores), dtype=torch.long)), batch_size=500)


def test_a_point_above_the_bound_whose_lower_limit_is_below_it_is_not_flagged():
    """Pins the region check on the TPR's lower limit: a point whose TPR estimate is above the accountant's bound
    but whose Clopper–Pearson lower limit is not is consistent with the guarantee (no warning, nothing in
    ``outside``); a ledger whose bound is below the lower limit is flagged."""
    rng = np.random.default_rng(0)
    members, nonmembers = _score_loader(rng.normal(1.0, 1.0, 1000)), _score_loader(rng.normal(0.0, 1.0, 1000))
    point = audit_membership(_Logits(), members, nonmembers, attack="loss").tpr[-1]  # TPR at FPR ≤ 0.1

    def ledger(sigma):
        out = PrivacyLedger(delta=1e-5)
        out.step(noise_multiplier=sigma, sample_rate=1.0)
        return out

    low, high = 0.5, 20.0  # the Gaussian mechanism's add/remove bound (the in/out game's) at the FPR limit falls with σ
    target = 0.5 * (point.tpr_low + point.tpr)
    for _ in range(40):
        mid = 0.5 * (low + high)
        low, high = (
            (mid, high) if ledger(mid).tpr_bounds(point.fpr_high, relation="add_remove") > target else (low, mid)
        )
    between = ledger(high)
    bound = float(between.tpr_bounds(point.fpr_high, relation="add_remove"))
    assert point.tpr_low < bound < point.tpr  # the case: the estimate beyond the bound, its lower limit not
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = audit_membership(_Logits(), members, nonmembers, attack="loss", ledger=between)
    assert not [w for w in caught if "guarantee is broken" in str(w.message)]
    assert result.outside == () and result.ledger_tpr_bounds[-1] == pytest.approx(bound)
    assert all(p.tpr_low <= b for p, b in zip(result.tpr, result.ledger_tpr_bounds))
    with pytest.warns(UserWarning, match="guarantee is broken"):  # a σ whose bound is below the lower limit
        flagged = audit_membership(_Logits(), members, nonmembers, attack="loss", ledger=ledger(4.0))
    assert len(flagged.outside) >= 1


# ------------------------------------------------------------------------------------------- models and data
@pytest.fixture(scope="module")
def adult():
    table = load_adult("train")
    x = torch.from_numpy(AdultEncoder().fit(table).transform(table)).float()
    y = torch.from_numpy(table.labels)
    rng = np.random.default_rng(0)
    idx = torch.from_numpy(rng.permutation(len(y))[:800])
    x, y = x[idx], y[idx].clone()
    flip = torch.from_numpy(rng.permutation(800)[:160])
    y[flip] = torch.from_numpy(rng.integers(0, 2, 160))  # a fifth of the rows carry random labels
    return x, y


def _loader(x, y, rows, shuffle=False):
    return DataLoader(TensorDataset(x[rows], y[rows]), batch_size=32, shuffle=shuffle)


def _factory(width):
    return lambda: TabularMLP(104, hidden=(width, width), lr=1e-3, optimizer="adam")


def _fit(model, loader, epochs, callbacks=()):
    pl.Trainer(max_epochs=epochs, accelerator="cpu", callbacks=list(callbacks), **QUIET).fit(model, loader)
    return model


@pytest.fixture(scope="module")
def overfit(adult, tmp_path_factory):
    x, y = adult
    mem, non, pop = slice(0, 200), slice(200, 400), slice(400, 800)
    torch.manual_seed(0)
    target = _fit(_factory(256)(), _loader(x, y, mem, True), 60)
    cache = tmp_path_factory.mktemp("refs")
    refs = train_references(
        _factory(256), _loader(x, y, pop), num_references=2, trainer_kwargs=dict(max_epochs=60), cache_dir=cache
    )
    return target, refs, cache, (_loader(x, y, mem), _loader(x, y, non), _loader(x, y, pop))


@pytest.mark.filterwarnings("ignore")
def test_rmia_beats_the_loss_attack_on_an_overfitted_mlp(overfit):
    target, refs, _, (mem, non, pop) = overfit
    loss = audit_membership(target, mem, non, attack="loss")
    rmia = audit_membership(target, mem, non, attack="rmia", references=refs, population_loader=pop)
    assert rmia.variant == "offline" and rmia.num_references == 2
    assert rmia.tpr[1].tpr > loss.tpr[1].tpr  # TPR at FPR 1%
    assert rmia.auc >= loss.auc - 0.02
    assert loss.auc > 0.6  # the model did over-fit
    m = rmia.metrics()
    assert set(m) == {
        names.RMIA_AUC,
        names.RMIA_TPR_AT_FPR_0_001,
        names.RMIA_TPR_AT_FPR_0_01,
        names.RMIA_TPR_AT_FPR_0_1,
        names.RMIA_EPSILON_LOWER,
    }
    assert m[names.RMIA_EPSILON_LOWER] > 0
    d = rmia.to_dict()
    json.dumps(d)
    assert d["num_members"] == 200 and len(d["scores"]) == 400 and d["is_member"][:200] == [True] * 200
    assert "RMIA (offline, 2 reference model(s))" in rmia.summary()
    assert type(rmia.figure()).__name__ == "Figure"


@pytest.mark.filterwarnings("ignore")
def test_a_second_audit_with_the_same_cache_trains_no_reference(overfit, adult):
    target, refs, cache, (mem, non, pop) = overfit
    assert refs.trained == 2 and sorted(p.name for p in cache.iterdir()) == [
        "reference_0.pt",
        "reference_1.pt",
        "references.json",
    ]
    again = train_references(_factory(256), pop, num_references=2, trainer_kwargs=dict(max_epochs=60), cache_dir=cache)
    assert again.trained == 0 and again.seconds == []
    a = audit_membership(target, mem, non, attack="lira", references=refs)
    b = audit_membership(target, mem, non, attack="lira", references=again)
    np.testing.assert_array_equal(a.scores, b.scores)
    with pytest.raises(ValueError, match="num_references"):
        train_references(_factory(256), pop, num_references=3, trainer_kwargs=dict(max_epochs=60), cache_dir=cache)
    x, y = adult
    with pytest.raises(ValueError, match="population_fingerprint"):
        train_references(
            _factory(256),
            _loader(x, y, slice(0, 400)),
            num_references=2,
            trainer_kwargs=dict(max_epochs=60),
            cache_dir=cache,
        )


@pytest.mark.filterwarnings("ignore")
def test_every_attack_reads_chance_on_a_model_that_never_saw_the_members():
    table = load_adult("train")
    x = torch.from_numpy(AdultEncoder().fit(table).transform(table)).float()
    idx = torch.from_numpy(np.random.default_rng(11).permutation(len(table))[:2000])
    x, y = x[idx], torch.from_numpy(table.labels)[idx]
    torch.manual_seed(1)
    target = _fit(_factory(64)(), _loader(x, y, slice(1600, 2000), True), 30)  # members were never trained on
    mem, non, pop = _loader(x, y, slice(0, 500)), _loader(x, y, slice(500, 1000)), _loader(x, y, slice(1000, 1600))
    refs = train_references(_factory(64), pop, num_references=2, trainer_kwargs=dict(max_epochs=30))
    for attack in ("loss", "lira", "rmia"):
        r = audit_membership(target, mem, non, attack=attack, references=refs, population_loader=pop)
        assert abs(r.auc - 0.5) < 0.06, (attack, r.auc)  # the AUC's sd under H0 with 500/500 is 0.018
        assert r.epsilon["epsilon_lower"] < 0.1, attack  # > 0 at most with probability α = 0.05 each


@pytest.mark.filterwarnings("ignore")
def test_online_references_hold_each_audited_example_in_half_of_them(adult):
    x, y = adult
    mem, non, pop = _loader(x, y, slice(0, 100)), _loader(x, y, slice(100, 200)), _loader(x, y, slice(200, 400))
    torch.manual_seed(2)
    target = _fit(_factory(64)(), _loader(x, y, slice(0, 100), True), 20)
    refs = train_references(_factory(64), pop, num_references=4, trainer_kwargs=dict(max_epochs=5), targets=(mem, non))
    assert refs.online and refs.inside_targets.shape == (4, 200)
    assert np.all(refs.inside_targets.sum(axis=0) == 2) and np.all(refs.inside_population.sum(axis=0) == 2)
    for attack in ("lira", "rmia"):
        r = audit_membership(target, mem, non, attack=attack, references=refs, population_loader=pop)
        assert r.variant == "online" and np.isfinite(r.scores).all()
    with pytest.raises(ValueError, match="other audited examples"):
        audit_membership(target, non, mem, attack="lira", references=refs)


@pytest.mark.filterwarnings("ignore")
def test_references_are_reproducible_and_leave_the_callers_stream_alone(adult):
    x, y = adult
    pop = _loader(x, y, slice(400, 600))
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    a = train_references(_factory(16), pop, num_references=1, trainer_kwargs=dict(max_epochs=2), seed=3)
    assert torch.equal(torch.rand(3), before)
    torch.manual_seed(99)  # another global state: the same references
    b = train_references(_factory(16), pop, num_references=1, trainer_kwargs=dict(max_epochs=2), seed=3)
    for p, q in zip(a.models[0].parameters(), b.models[0].parameters()):
        assert torch.equal(p, q)


@pytest.mark.filterwarnings("ignore")
def test_dp_sgd_references_train_with_dpsgd_and_the_cache_records_it(adult, tmp_path):
    x, y = adult
    pop = _loader(x, y, slice(400, 600))
    refs = train_references(
        _factory(16),
        pop,
        num_references=1,
        trainer_kwargs=dict(max_epochs=1),
        cache_dir=tmp_path,
        dp_sgd=dict(noise_multiplier=1.3, max_grad_norm=0.5),
    )
    recipe = json.loads((tmp_path / "references.json").read_text())["recipe"]
    (key,) = recipe["callbacks"]
    assert key.startswith("DPSGD") and "1.3" in key and "0.5" in key
    assert refs.trained == 1
    with pytest.raises(TypeError, match="dp_sgd"):
        train_references(_factory(16), pop, num_references=1, trainer_kwargs=dict(max_epochs=1), dp_sgd=1.3)


def test_bad_arguments_are_named(adult):
    x, y = adult
    loader = _loader(x, y, slice(0, 50))
    model = _factory(8)()
    with pytest.raises(ValueError, match="attack"):
        audit_membership(model, loader, loader, attack="shadow")
    with pytest.raises(ValueError, match="references"):
        audit_membership(model, loader, loader, attack="rmia")
    with pytest.raises(ValueError, match="max_epochs"):
        train_references(_factory(8), loader, num_references=1, trainer_kwargs={})
    with pytest.raises(ValueError, match="num_references"):
        train_references(_factory(8), loader, num_references=0, trainer_kwargs=dict(max_epochs=1))
    with pytest.raises(TypeError, match="population_loader"):
        train_references(_factory(8), [(x, y)], num_references=1, trainer_kwargs=dict(max_epochs=1))


# ----------------------------------------------------------------------------------------------- the region
@pytest.mark.filterwarnings("ignore")
def test_dp_sgd_attacks_stay_below_the_ledgers_bound(adult):
    x, y = adult
    mem, non, pop = slice(0, 200), slice(200, 400), slice(400, 800)
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, sampling_seed=0)
    torch.manual_seed(3)
    target = _fit(_factory(256)(), _loader(x, y, mem, True), 30, callbacks=[dp])
    refs = train_references(_factory(256), _loader(x, y, pop), num_references=2, trainer_kwargs=dict(max_epochs=30))
    for attack in ("loss", "rmia"):
        r = audit_membership(
            target,
            _loader(x, y, mem),
            _loader(x, y, non),
            attack=attack,
            references=refs,
            population_loader=_loader(x, y, pop),
            ledger=dp.ledger,
        )
        bounds = dp.ledger.tpr_bounds([0.01, 0.1], relation="add_remove")  # the in/out game's (tighter) curve
        for point, bound in zip(r.tpr[1:], bounds):
            assert point.tpr_low <= bound, (attack, point, bound)
        assert r.outside == () and r.ledger_tpr_bounds is not None
        assert r.region[1].min() >= 0 and np.all(np.diff(r.region[1]) >= -1e-12)


@pytest.mark.filterwarnings("ignore")
def test_an_attack_beyond_the_accountants_region_is_flagged(overfit):
    target, refs, _, (mem, non, pop) = overfit
    ledger = PrivacyLedger(delta=1e-5)
    ledger.step(noise_multiplier=50.0, sample_rate=0.01, steps=1)  # claims almost perfect privacy
    with pytest.warns(UserWarning, match="guarantee is broken"):
        r = audit_membership(target, mem, non, attack="rmia", references=refs, population_loader=pop, ledger=ledger)
    assert r.outside and "accountant allows at most" in r.summary()
    assert any("OUTSIDE" in t.get_text() for t in r.figure().axes[0].texts)

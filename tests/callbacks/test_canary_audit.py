"""CanaryAudit: canaries counted once per sampled step (also under DDP), determinism, resume, validity against the
accountant, power, input canaries, logging and configuration."""

import pickle
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, CanaryAudit, EpsilonStarAudit, names
from lightning_privacy.analysis.canary import canary_audit_from_scores
from lightning_privacy.callbacks import canary_audit as module
from lightning_privacy.models import TabularMLP
from tests._launch import run_ddp
from tests.callbacks._tiny import D, N, tiny_dataset, trainer

WIDE = 128  # TabularMLP(8, hidden=(128,)): 8·128 + 128 + 128·2 + 2 = 1410 trainable coordinates
COORDS = D * WIDE + WIDE + WIDE * 2 + 2
P_BATCH = 26  # ⌈256 / 26⌉ = 10 batches: sample rate p = 0.1


def _model(lr=0.5):
    return TabularMLP(D, hidden=(WIDE,), lr=lr)


def _loader(batch_size=P_BATCH):
    return DataLoader(tiny_dataset(), batch_size=batch_size, shuffle=True)


def _fit(callbacks, epochs=3, seed=0, tmp_path=None, **kwargs):
    torch.manual_seed(seed)
    t = trainer(callbacks, tmp_path, max_epochs=epochs, **kwargs)
    t.fit(_model(), _loader())
    return t


def _counts(audit, steps):
    """Σ_t of the canaries' per-step sampling, recomputed from the seed."""
    return sum(audit.sampled(t).astype(int) for t in range(steps))


# ------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(kind="labels"), "`kind` must be one of .*got 'labels'"),
        (dict(num_canaries=0), "`num_canaries` must be None or a positive int, got 0"),
        (dict(num_canaries=10.0), "`num_canaries` must be None or a positive int, got 10.0"),
        (dict(num_canaries=True), "`num_canaries` must be None or a positive int, got True"),
        (dict(seed=-1), "`seed` must be a non-negative int, got -1"),
        (dict(alpha=1.0), r"`alpha` must be in \(0, 1\), got 1.0"),
        (dict(delta=0.0), r"`delta` must be None or in \(0, 1\), got 0.0"),
        (dict(correction="none"), "`correction` must be one of .*got 'none'"),
        (dict(score="loss"), "`score` must be one of .*got 'loss'"),
        (dict(num_classes=1), "`num_classes` must be None or an int >= 2, got 1"),
    ],
)
def test_bad_arguments_name_argument_and_value(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        CanaryAudit(**kwargs)


def test_state_key_metric_keys_and_pickling():
    audit = CanaryAudit("input", num_canaries=50, seed=7)
    assert audit.state_key == "CanaryAudit{'kind': 'input', 'num_canaries': 50, 'seed': 7}"
    assert CanaryAudit.hparams_metric_keys == (names.CANARY_EPSILON_LOWER,)
    assert pickle.loads(pickle.dumps(audit)).state_key == audit.state_key


def test_gradient_canaries_need_dpsgd():
    with pytest.raises(MisconfigurationException, match="needs the DPSGD callback"):
        _fit([CanaryAudit(num_canaries=10)], epochs=1)


def test_more_canaries_than_coordinates_raises_naming_the_argument_and_the_largest_value():
    with pytest.raises(MisconfigurationException) as info:
        _fit([DPSGD(noise_multiplier=1.0), CanaryAudit(num_canaries=COORDS + 1)], epochs=1)
    assert str(info.value) == (
        f"CanaryAudit(kind='gradient'): num_canaries={COORDS + 1} needs as many trainable coordinates, but the run has "
        f"{COORDS}. Pass `CanaryAudit('gradient', num_canaries=m)` with m ≤ {COORDS} (at most one canary per "
        "trainable coordinate)."
    )


SMALL = D * 16 + 16 + 16 * 2 + 2  # TabularMLP(8, hidden=(16,)): 178 trainable coordinates, below the default 1000


def test_the_default_adapts_to_a_model_with_fewer_trainable_coordinates(tmp_path):
    """Head-only or LoRA fine-tuning: the default 1000 canaries would not fit; one canary per coordinate instead."""
    audit = CanaryAudit(seed=0)
    assert audit.state_key == "CanaryAudit{'kind': 'gradient', 'num_canaries': 1000, 'seed': 0}"
    torch.manual_seed(0)
    t = trainer([DPSGD(noise_multiplier=1.0), audit], tmp_path, max_epochs=2)
    t.fit(TabularMLP(D, hidden=(16,), lr=0.5), _loader())
    assert audit.num_canaries == SMALL and sorted(audit.canaries.canaries) == list(range(SMALL))
    assert audit.result is not None and audit.result.num_canaries == SMALL and audit.scores.shape == (SMALL,)
    assert audit.state_key.endswith("'num_canaries': 1000, 'seed': 0}")  # the key stays what was constructed
    state = audit.state_dict()
    resumed = CanaryAudit(seed=0)  # the default resumes the adapted set
    resumed.load_state_dict(state)
    assert resumed.num_canaries == SMALL and np.array_equal(resumed.included, audit.included)
    with pytest.raises(RuntimeError, match=f"num_canaries={SMALL}, this CanaryAudit has 1000"):
        CanaryAudit(num_canaries=1000, seed=0).load_state_dict(state)  # an explicit 1000 is another audit


def test_input_canaries_do_not_adapt_and_name_the_argument_and_the_largest_value():
    """A mislabelled copy per canary: all rows would make half the training set wrong, so no silent default."""
    with pytest.raises(MisconfigurationException) as info:
        _fit([CanaryAudit("input")], epochs=1)
    assert str(info.value).startswith(
        f"CanaryAudit(kind='input'): the default num_canaries=1000 needs as many training rows, but the run has {N}. "
        f"Pass `CanaryAudit('input', num_canaries=m)` with m ≤ {N} (each included canary is a mislabelled copy"
    )


# ------------------------------------------------------------------------------------------ the canaries
def test_scores_are_the_released_sum_minus_the_batch_in_units_of_the_clipped_sum():
    """σ → 0: every canary's score is C × (number of steps it was sampled), read from the released p.grad."""
    dp = DPSGD(noise_multiplier=1e-4, max_grad_norm=2.0)
    audit = CanaryAudit(num_canaries=300, seed=1)
    _fit([dp, audit], epochs=4)
    counts = _counts(audit, dp.steps)
    assert audit.canaries.steps == dp.steps == 40
    assert audit.scores == pytest.approx(2.0 * counts, abs=0.05)
    assert counts[audit.included].mean() == pytest.approx(0.1 * 40, rel=0.1)
    # "released" keeps the real data's gradient in the score: no longer the count alone
    released = CanaryAudit(num_canaries=300, seed=1, score="released")
    _fit([DPSGD(noise_multiplier=1e-4, max_grad_norm=2.0), released], epochs=4)
    assert np.abs(released.scores - 2.0 * counts).max() > 0.5


def _canary_state(audit):
    return dict(audit.state_dict(), sample_rate=audit._sample_rate)


def _ddp_worker():
    torch.set_num_threads(1)
    pl.seed_everything(0)  # every rank: the same initial weights
    audit = CanaryAudit(num_canaries=300, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = _fit(
            [DPSGD(noise_multiplier=1e-4), audit], epochs=3, strategy="ddp", devices=2, use_distributed_sampler=False
        )
    return dict(_canary_state(audit), rank=t.global_rank)


@pytest.mark.slow
def test_ddp_counts_each_canary_once(tmp_path):
    """Two gloo processes: the same scores on both ranks, each C × its sampled steps (not 2×), as in one process."""
    single = CanaryAudit(num_canaries=300, seed=5)
    _fit([DPSGD(noise_multiplier=1e-4), single], epochs=3)
    one = _canary_state(single)
    rank0, rank1 = run_ddp("tests.callbacks.test_canary_audit:_ddp_worker", tmp_path / "ddp")
    assert (rank0["rank"], rank1["rank"]) == (0, 1)
    assert rank0["scores"] == rank1["scores"]  # the all-reduced gradient: the same on every rank
    assert rank0["canaries"] == one["canaries"] and rank0["included"] == one["included"]
    assert rank0["steps"] == one["steps"] == 30
    assert rank0["sample_rate"] == pytest.approx(one["sample_rate"])
    counts = _counts(single, 30)
    assert np.asarray(one["scores"]) == pytest.approx(counts, abs=0.05)
    assert np.asarray(rank0["scores"]) == pytest.approx(counts, abs=0.05)


# ------------------------------------------------------------------------------------------ determinism, resume
def test_same_seed_same_audit():
    runs = []
    for _ in range(2):
        audit = CanaryAudit(num_canaries=400, seed=2)
        _fit([DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0), audit], epochs=2)
        runs.append(audit)
    assert np.array_equal(runs[0].scores, runs[1].scores)
    assert runs[0].results == runs[1].results
    assert runs[0].state_dict() == runs[1].state_dict()


def test_resume_equals_an_unbroken_run(tmp_path):
    def callbacks():
        # the noise of step t is a function of (noise_seed, t): the unbroken and the resumed run draw the same noise
        # at each step (their batches may differ, but a canary's score is C·[sampled] + noise whatever the batch)
        return [DPSGD(noise_multiplier=1.0, noise_seed=0), CanaryAudit(num_canaries=400, seed=2)]

    straight = callbacks()
    _fit(straight, epochs=4)
    first = callbacks()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    _fit([*first, ckpt], epochs=2, tmp_path=tmp_path, enable_checkpointing=True)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"][first[1].state_key]
    assert state["steps"] == 20 and len(state["scores"]) == 400  # plain values: loads with weights_only
    resumed = callbacks()
    torch.manual_seed(123)  # a different model init: the weights come from the checkpoint
    t = trainer(resumed, tmp_path, max_epochs=4)
    t.fit(_model(), _loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed[0].steps == straight[0].steps == 40
    assert resumed[1].state_dict()["canaries"] == straight[1].state_dict()["canaries"]
    assert np.array_equal(resumed[1].included, straight[1].included)
    assert np.allclose(resumed[1].scores, straight[1].scores, rtol=0, atol=1e-4)  # float32 sums of other batches
    gauss = names.CANARY_EPSILON_GAUSS  # reads the scores' values (the rest reads ranks): float32 sums move it a little
    assert resumed[1].results[gauss] == pytest.approx(straight[1].results[gauss], rel=1e-6)
    ranks = {k: v for k, v in resumed[1].results.items() if k != gauss}
    assert ranks == pytest.approx({k: v for k, v in straight[1].results.items() if k != gauss}, rel=1e-9)
    # without the saved state the resumed run would start the scores and the per-step sampling at 0
    assert np.abs(resumed[1].scores - first[1].scores).max() > 1.0


def test_state_is_strict():
    audit = CanaryAudit(num_canaries=20, seed=1)
    with pytest.raises(RuntimeError, match="missing"):
        audit.load_state_dict({"version": 1})
    state = CanaryAudit(num_canaries=20, seed=2).state_dict()
    with pytest.raises(RuntimeError, match="seed=2"):
        audit.load_state_dict(state)


# ------------------------------------------------------------------------------------------ validity and power
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bound_stays_below_the_accountant_at_sigma_1(seed):
    audits = [CanaryAudit(num_canaries=1000, seed=seed), CanaryAudit("input", num_canaries=100, seed=seed)]
    dp = DPSGD(noise_multiplier=1.0)
    _fit([dp, *audits], epochs=20, seed=seed)
    epsilon = dp.epsilon()
    for audit in audits:
        assert audit.accountant_epsilon == pytest.approx(epsilon)
        assert 0.0 <= audit.results[names.CANARY_EPSILON_LOWER] <= epsilon
        assert 0.0 <= audit.results[names.CANARY_EPSILON_GDP_GAUSSIAN_READING] <= epsilon
    assert audits[0].results[names.CANARY_EPSILON_LOWER] > 0.5  # white-box canaries do see the leakage


def test_power_of_gradient_canaries_on_a_weakly_private_run():
    """σ = 0.3, p = 0.1, 1000 canaries, 30 epochs (the issue's acceptance run, on the tiny data): ε ≥ 2."""
    dp = DPSGD(noise_multiplier=0.3)
    audit = CanaryAudit(num_canaries=1000)
    _fit([audit, dp], epochs=30)  # listed before DPSGD: the hook is registered at setup all the same
    assert dp.sample_rate == pytest.approx(0.1)
    r = audit.results
    assert r[names.CANARY_EPSILON_LOWER] >= 2.0 and r[names.CANARY_EPSILON_GDP_GAUSSIAN_READING] >= 2.0
    assert r[names.CANARY_EPSILON_LOWER] <= r[names.CANARY_EPSILON_LOWER_MAX] <= 4.8
    assert r[names.CANARY_EPSILON_LOWER] <= r[names.CANARY_EPSILON_OPTIMISTIC]
    # the logged value is the analysis module's on the same scores
    again = canary_audit_from_scores(scores=audit.scores, included=audit.included, delta=1e-5, seed=0)
    assert again.epsilon_lower == r[names.CANARY_EPSILON_LOWER]
    assert (again.num_guesses, again.num_correct) == (r[names.CANARY_GUESSES], r[names.CANARY_CORRECT])


def test_input_canaries_on_an_overfitting_model_without_dp():
    audit = CanaryAudit("input", num_canaries=200)
    _fit([audit], epochs=60, tmp_path=None)
    assert audit.accountant_epsilon is None
    assert audit.results[names.CANARY_EPSILON_LOWER] > 0.5
    assert audit.results[names.CANARY_EPSILON_GDP_GAUSSIAN_READING] > 0.5
    assert np.median(audit.scores[audit.included]) > np.median(audit.scores[~audit.included])


def test_input_canaries_join_the_training_set_before_poisson_sampling():
    audit = CanaryAudit("input", num_canaries=40, seed=4)
    dp = DPSGD(noise_multiplier=1.0)
    t = _fit([dp, audit], epochs=1)
    loader = t.train_dataloader
    included = int(audit.included.sum())
    assert len(loader.dataset) == N + included
    canaries = [loader.dataset[N + i] for i in range(included)]
    rows = np.asarray(audit.state_dict()["canaries"])[audit.included]
    labels = np.asarray(audit.state_dict()["labels"])[audit.included]
    source = tiny_dataset()
    for (x, y), row, label in zip(canaries, rows, labels):
        assert torch.equal(x, source[row][0]) and int(y) == label != int(source[row][1])  # a mislabeled copy
    assert dp.sample_rate == pytest.approx(1 / len(DataLoader(range(N + included), batch_size=P_BATCH)))


# ------------------------------------------------------------------------------------------ logging
def test_logs_scalars_summary_and_the_theory_vs_practice_figure(tmp_path, monkeypatch):
    drawn = {}
    original = module.theory_vs_practice_figure

    def spy(canary, others):
        drawn.update(others)
        return original(canary, others)

    monkeypatch.setattr(module, "theory_vs_practice_figure", spy)
    audit = CanaryAudit(num_canaries=300)
    star = EpsilonStarAudit()  # listed after the canary audit: its value is read in teardown
    loggers = [TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")]
    torch.manual_seed(0)
    t = trainer([DPSGD(noise_multiplier=1.0), audit, star], tmp_path, max_epochs=2, logger=loggers)
    t.fit(_model(), _loader(), DataLoader(tiny_dataset(1), batch_size=64))
    assert drawn == {names.EPSILON_STAR: pytest.approx(star.results[names.EPSILON_STAR])}
    events = EventAccumulator(str(next(Path(tmp_path, "tb").rglob("events.out.*")).parent)).Reload()
    scalars = events.Tags()["scalars"]
    for key in (names.CANARY_EPSILON_LOWER, names.CANARY_EPSILON_GDP_GAUSSIAN_READING, names.CANARY_CORRECT):
        assert key in scalars
        assert events.Scalars(key)[-1].step == t.global_step
    assert names.CANARY_EPSILON_OPTIMISTIC not in scalars  # not a valid bound: kept in results only
    assert names.CANARY_FIGURE in events.Tags()["images"]
    assert names.CANARY_SUMMARY + "/text_summary" in events.Tags()["tensors"]
    assert audit.results[names.CANARY_EPSILON_OPTIMISTIC] >= audit.results[names.CANARY_EPSILON_LOWER]
    assert "not a valid level-α bound" in audit.summary()


def test_fast_dev_run_skips_the_audit():
    audit = CanaryAudit(num_canaries=50)
    _fit([DPSGD(noise_multiplier=1.0), audit], epochs=1, fast_dev_run=2)
    assert audit.results == {}


def test_figure_without_dpsgd_or_other_audits():
    audit = CanaryAudit("input", num_canaries=50)
    _fit([audit], epochs=2)
    fig = module.theory_vs_practice_figure(audit, {})
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 3  # the headline, binomial and the Gaussian reading
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "canary ε lower bound (headline: any (ε, δ)-DP)" and "(if μ-GDP)" in labels[2]


def test_a_reused_audit_starts_over_for_another_model_and_continues_for_the_same():
    fresh = CanaryAudit(num_canaries=400, seed=2)
    _fit([DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0), fresh], epochs=2)
    reused = CanaryAudit(num_canaries=400, seed=2)
    _fit([DPSGD(noise_multiplier=1.0, sampling_seed=5), reused], epochs=1, seed=3)  # another model first
    _fit([DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0), reused], epochs=2)  # then the fresh audit's fit
    assert reused.state_dict() == fresh.state_dict()  # the second model's audit alone (it held 10 + 20 steps)
    assert reused.results == fresh.results
    model, dpsgd = _model(), DPSGD(noise_multiplier=1.0)
    for _ in range(2):  # the same model fitted twice: one audit over both fits
        trainer([dpsgd, reused], max_epochs=1).fit(model, _loader())
    assert reused.state_dict()["steps"] == 2 * 10


class _PerStep(CanaryAudit):
    """Records each step's score increment (released minus the batch's own sum, at every canary)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        before = self.scores
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.steps_values = [*getattr(self, "steps_values", []), self.scores - before]


def test_the_likelihood_ratio_score_is_the_per_step_log_likelihood_ratio_summed():
    """Same run twice (fixed masks and noise): the LR scores equal Σ_t log[(1−p) + p·exp((y_t C − C²/2)/(σC)²)] of the
    per-step values y_t that the default score sums, computed independently here."""
    sigma, clip = 0.7, 1.5
    runs = {}
    for score in ("released_minus_batch", "likelihood_ratio"):
        audit = _PerStep(num_canaries=300, seed=3, score=score)
        dpsgd = DPSGD(noise_multiplier=sigma, max_grad_norm=clip, sampling_seed=1, noise_seed=2)
        _fit([dpsgd, audit], epochs=2)
        runs[score] = audit
    linear, lr = runs["released_minus_batch"], runs["likelihood_ratio"]
    y = np.array(linear.steps_values)  # [steps, canaries]
    assert y.shape == (20, 300) and np.allclose(y.sum(axis=0), linear.scores)
    p = 0.1
    want = np.log((1 - p) + p * np.exp((y * clip - clip**2 / 2) / (sigma * clip) ** 2)).sum(axis=0)
    np.testing.assert_allclose(lr.scores, want, rtol=1e-9, atol=1e-9)
    assert np.array_equal(lr.included, linear.included)
    # included canaries score higher on average: the test separates them
    assert lr.scores[lr.included].mean() > lr.scores[~lr.included].mean()

"""AttributeInferenceMonitor: R_t per real step at the step's weights, β*_AI per epoch, resume, budget."""

import copy
import pickle
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_privacy import DPSGD, AttributeInferenceMonitor, BayesSecurityMonitor, PrivacyBudgetStopping, names
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.callbacks._attribute_checks import set_flat_max_grad_norm
from lightning_privacy.data import AdultDataModule
from lightning_privacy.functional.attribute_sensitivity import attribute_sensitivity, sensitivity_rounding_allowance
from lightning_privacy.functional.attributes import SensitiveAttribute
from lightning_privacy.models import TabularMLP
from tests._launch import run_ddp
from tests.callbacks._tiny import BATCH, N, TinyDataModule, tiny_loader, tiny_module, trainer

pytestmark = pytest.mark.filterwarnings("ignore:AttributeInferenceMonitor.*Section 5.3")
ATTR = SensitiveAttribute.numeric(column=0, values=[-2.0, -1.0, 0.0, 1.0, 2.0], name="x0")
SIGMA = 1.5
STEPS_PER_EPOCH = N // BATCH


class StepRecorder(Callback):
    """Snapshots the weights and batch each optimizer step uses (runs right after the monitor)."""

    def __init__(self, monitor):
        self.monitor, self.steps = monitor, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = [t.clone() for t in batch]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append(
            (
                copy.deepcopy({k: v.detach().clone() for k, v in pl_module.state_dict().items()}),
                self.batch,
                self.monitor._pending,
            )
        )


class EpochLog(Callback):
    """The values the monitor logged, read at each epoch end (runs after the monitor)."""

    def __init__(self, *keys):
        self.keys, self.rows = keys, []

    def on_train_epoch_end(self, trainer, pl_module):
        self.rows.append({k: float(trainer.callback_metrics[k]) for k in self.keys})


def _ledger_reads(epochs, *, sigma, rate):
    """A fresh AttributeLedger fed with recorded R_t and read at each epoch end (what a straight run reads)."""
    from lightning_privacy.attribute_ledger import AttributeLedger

    ledger, out = AttributeLedger(max_grad_norm=1.0), []
    for rs in epochs:
        for r in rs:
            ledger.record(noise_multiplier=sigma, sample_rate=rate, sensitivity=r)
        out.append(ledger.bayes_security())
    return out


def _fit(callbacks, tmp_path, **kwargs):
    t = trainer(callbacks, tmp_path, **kwargs)
    t.fit(tiny_module(), datamodule=TinyDataModule())
    return t


def test_tracks_every_step_at_the_weights_the_step_uses(tmp_path):
    dp = DPSGD(noise_multiplier=SIGMA)
    monitor = AttributeInferenceMonitor(attribute=ATTR, method="exact", publish=True)
    recorder = StepRecorder(monitor)
    t = _fit([dp, monitor, recorder, BayesSecurityMonitor(exact="never")], tmp_path, max_epochs=2)
    assert monitor.steps == dp.steps == t.global_step == 2 * STEPS_PER_EPOCH
    assert len(recorder.steps) == dp.steps
    model = tiny_module()
    for state, (x, y), r in recorder.steps[:: STEPS_PER_EPOCH - 1]:  # recompute some steps from scratch
        model.load_state_dict(state)
        allowance = sensitivity_rounding_allowance(torch.float32, max_grad_norm=dp.max_grad_norm)
        again = attribute_sensitivity(
            model, x, y, attribute=ATTR, max_grad_norm=dp.max_grad_norm, method="exact", rounding_allowance=allowance
        )
        assert r == pytest.approx(again, rel=1e-5)  # with the float32 rounding allowance, as the monitor adds it
    rs = torch.tensor([r for _, _, r in recorder.steps], dtype=torch.float64)
    assert 0 < float(rs.max()) <= 2 * dp.max_grad_norm and monitor.max_sensitivity == pytest.approx(float(rs.max()))
    kw = dict(sample_rate=dp.sample_rate, noise_multiplier=SIGMA, max_grad_norm=1.0, sensitivities=rs.numpy())
    closed, exact = bs.ai_bayes_security(**kw), bs.ai_bayes_security_exact(**kw)
    metrics = t.callback_metrics
    ai, mia = float(metrics[names.AI_BAYES_SECURITY]), float(metrics[names.MIA_BAYES_SECURITY])
    assert exact - 1e-3 <= monitor.bayes_security() <= exact + 1e-9  # the safe value, from the recorded R_t
    assert monitor.bayes_security() - 1e-6 <= ai <= monitor.bayes_security()  # logged as float32, rounded down
    assert float(metrics[names.AI_BAYES_SECURITY_CLOSED_FORM]) == pytest.approx(closed, rel=1e-6)
    assert monitor.bayes_security_closed_form() == pytest.approx(closed, rel=1e-12)
    assert ai >= mia  # R_t <= 2C
    assert names.AI_SENSITIVITY in metrics  # published per step on request


def test_logged_safe_value_every_epoch_against_independent_computations(tmp_path):
    """Each epoch the logged β*_AI is within 1e-3 of ai_bayes_security_exact on the R_t recorded so far and never
    above it; at the end it also agrees with dp_accounting composing the same levels; the closed form sits beside."""
    from tests.analysis.test_composition import _dp_accounting_beta

    dp = DPSGD(noise_multiplier=SIGMA)
    monitor = AttributeInferenceMonitor(attribute=ATTR)
    recorder = StepRecorder(monitor)
    log = EpochLog(names.AI_BAYES_SECURITY, names.AI_BAYES_SECURITY_CLOSED_FORM)
    _fit([dp, monitor, recorder, log], tmp_path, max_epochs=4)
    rs = [r for _, _, r in recorder.steps]
    kw = dict(sample_rate=dp.sample_rate, noise_multiplier=SIGMA, max_grad_norm=1.0)
    for epoch, row in enumerate(log.rows, start=1):
        so_far = rs[: epoch * STEPS_PER_EPOCH]
        exact = bs.ai_bayes_security_exact(**kw, sensitivities=so_far)
        assert exact - 1e-3 <= row[names.AI_BAYES_SECURITY] <= exact + 1e-9
        closed = bs.ai_bayes_security(**kw, sensitivities=so_far)
        assert row[names.AI_BAYES_SECURITY_CLOSED_FORM] == pytest.approx(closed, rel=1e-6)
    levels, counts = bs.sensitivity_levels(rs, max_grad_norm=1.0)
    reference = _dp_accounting_beta([(dp.sample_rate, SIGMA, n, s) for s, n in zip(levels, counts)], grid=1e-3)
    assert monitor.bayes_security() == pytest.approx(reference, abs=1e-3)
    assert len({round(float(s), 6) for s in levels}) > 1  # the R_t really spread over several levels


def test_approximate_is_below_exact_on_the_same_run(tmp_path):
    exact = AttributeInferenceMonitor(attribute=ATTR, method="exact")
    approx = AttributeInferenceMonitor(attribute=ATTR, method="approximate", key=names.AI_BAYES_SECURITY + "_approx")
    extremes = AttributeInferenceMonitor(
        attribute=ATTR, method="exact", values="extremes", key=names.AI_BAYES_SECURITY + "_ext"
    )
    with pytest.warns(UserWarning, match="Section 5.3"):
        _fit([DPSGD(noise_multiplier=SIGMA), exact, approx, extremes], tmp_path, max_epochs=1)
    # (values symmetric about their mean and nearly collinear clipped gradients make the approximate bound 2·max‖ḡₐ − v‖
    # equal to the diameter: then the two float32 computations may order them either way, by ~1e-7 — CI saw
    # 1.2891785 against 1.2891786 — far inside the 1.2e-4·C allowance both carry)
    rounding = 1e-6
    assert approx.bayes_security() <= exact.bayes_security() + rounding
    assert exact.bayes_security() <= extremes.bayes_security() + rounding
    assert approx.max_sensitivity >= exact.max_sensitivity - rounding
    assert exact.max_sensitivity >= extremes.max_sensitivity - rounding
    assert exact.state_key != approx.state_key != extremes.state_key


def test_dropout_model_works(tmp_path):
    monitor = AttributeInferenceMonitor(attribute=ATTR)
    t = trainer([DPSGD(noise_multiplier=SIGMA), monitor], tmp_path, max_epochs=1)
    t.fit(tiny_module(dropout=0.3), datamodule=TinyDataModule())
    assert monitor.steps == STEPS_PER_EPOCH and 0 < monitor.max_sensitivity <= 2.0
    assert 0 < monitor.bayes_security() < 1


def test_resume_continues_the_state(tmp_path):
    """A resumed run logs what a straight run with the same R_t logs, to the last digit."""
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = AttributeInferenceMonitor(attribute=ATTR)
    first_steps = StepRecorder(first)
    dp = DPSGD(noise_multiplier=SIGMA)
    _fit([dp, first, first_steps, ckpt], tmp_path, max_epochs=1, enable_checkpointing=True)
    resumed = AttributeInferenceMonitor(attribute=ATTR)
    resumed_steps = StepRecorder(resumed)
    t = trainer([DPSGD(noise_multiplier=SIGMA), resumed, resumed_steps], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt"))
    epochs = [[r for _, _, r in rec.steps] for rec in (first_steps, resumed_steps)]
    straight = _ledger_reads(epochs, sigma=SIGMA, rate=dp.sample_rate)
    assert first.bayes_security() == straight[0] and resumed.bayes_security() == straight[1]
    assert float(t.callback_metrics[names.AI_BAYES_SECURITY]) == pytest.approx(straight[1], abs=1e-7)
    assert resumed.steps == 2 * STEPS_PER_EPOCH
    assert resumed.segments[0]["sum_sq"] > first.segments[0]["sum_sq"]  # continued, not restarted
    assert all(s["measured"] for s in resumed.segments)
    assert resumed.bayes_security() < first.bayes_security()
    # the per-epoch records (the report's β*_AI figure) continue too: epoch 0 from the checkpoint, epoch 1 added
    assert [(e["epoch"], e["steps"]) for e in resumed.epochs] == [(0, STEPS_PER_EPOCH), (1, 2 * STEPS_PER_EPOCH)]
    assert [e["safe"] for e in resumed.epochs] == straight


def test_steps_the_monitor_did_not_see_count_as_worst_case(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    dp = DPSGD(noise_multiplier=SIGMA)
    _fit([dp, ckpt], tmp_path, max_epochs=1, enable_checkpointing=True)  # no monitor in the first run
    late = AttributeInferenceMonitor(attribute=ATTR)
    stopper = PrivacyBudgetStopping(min_bayes_security=0.01, threat="ai")  # asks for β*_AI before any new step
    t = trainer([DPSGD(noise_multiplier=SIGMA), late, stopper], tmp_path, max_epochs=2)
    t.fit(tiny_module(), datamodule=TinyDataModule(), ckpt_path=str(tmp_path / "last.ckpt"))
    unseen, seen = late.segments
    assert (unseen["measured"], unseen["steps"]) == (False, STEPS_PER_EPOCH) and seen["steps"] == STEPS_PER_EPOCH
    assert unseen["sum_sq"] == pytest.approx(STEPS_PER_EPOCH * 4.0)  # R = 2C per unseen step
    kw = dict(sample_rate=dp.sample_rate, noise_multiplier=SIGMA)
    assert late.bayes_security_closed_form() > bs.mia_bayes_security(**kw, steps=2 * STEPS_PER_EPOCH)
    # the unseen epoch alone is the membership value; the seen one (R_t < 2C) leaks less
    assert bs.mia_bayes_security_exact(**kw, steps=2 * STEPS_PER_EPOCH) - 1e-9 < late.bayes_security()
    assert late.bayes_security() <= bs.mia_bayes_security_exact(**kw, steps=STEPS_PER_EPOCH) + 1e-9


def test_state_dict_round_trip_is_plain_and_strict(tmp_path):
    monitor = AttributeInferenceMonitor(attribute=ATTR)
    monitor.ledger.set_max_grad_norm(1.0)
    rs = [0.5, 1.25, 0.75, 2.0]
    for r in rs:
        monitor.ledger.record(noise_multiplier=1.5, sample_rate=0.125, sensitivity=r)
    monitor.bayes_security()  # composed ...
    monitor.ledger.record(noise_multiplier=1.5, sample_rate=0.125, sensitivity=1.0)  # ... and one step waiting
    state = monitor.state_dict()
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True) == state  # plain values
    other = AttributeInferenceMonitor(attribute=ATTR)
    other.load_state_dict(pickle.loads(pickle.dumps(state)))
    kw = dict(sample_rate=0.125, noise_multiplier=1.5, max_grad_norm=1.0, sensitivities=rs + [1.0])
    assert other.bayes_security() == monitor.bayes_security() <= bs.ai_bayes_security_exact(**kw) + 1e-9
    assert other.bayes_security_closed_form() == pytest.approx(bs.ai_bayes_security(**kw), rel=1e-12)
    with pytest.raises(RuntimeError, match="missing"):
        other.load_state_dict({"version": 1})
    with pytest.raises(RuntimeError, match="missing"):
        other.load_state_dict({"version": 2})
    with pytest.raises(RuntimeError, match="version None"):
        other.load_state_dict({})
    with pytest.raises(RuntimeError, match="max_grad_norm changed"):
        set_flat_max_grad_norm(other.ledger, 2.0)  # (what the monitor calls with the optimizer's C)
    assert monitor.state_key == (
        "AttributeInferenceMonitor{'attribute': 'x0', 'method': 'approximate', 'values': 'all', "
        "'key': 'privacy/ai_bayes_security'}"
    )
    pickle.loads(pickle.dumps(monitor))


def test_next_step_bound_assumes_the_worst_case_and_budget_stopping_uses_it(tmp_path):
    """The stop is decided on the safe β*_AI: the kept model meets the budget by the exact value of its recorded
    R_t, and one more step at R = 2C would break it."""
    monitor = AttributeInferenceMonitor(attribute=ATTR)
    recorder = StepRecorder(monitor)
    dp = DPSGD(noise_multiplier=1.0)  # one worst-case step alone leaves β* ≈ 0.90 at p = 1/8
    budget = 0.9
    stopper = PrivacyBudgetStopping(min_bayes_security=budget, threat="ai")
    t = _fit([dp, monitor, recorder, stopper], tmp_path, max_epochs=20)
    assert 0 < dp.steps < 20 * STEPS_PER_EPOCH and stopper.stopped_at_step == dp.steps
    rs = [r for _, _, r in recorder.steps]
    kw = dict(sample_rate=dp.sample_rate, noise_multiplier=1.0, max_grad_norm=1.0)
    assert bs.ai_bayes_security_exact(**kw, sensitivities=rs) >= monitor.bayes_security() >= budget  # kept model
    worst = monitor.bayes_security(extra_worst_case_step=(1.0, dp.sample_rate))
    assert monitor.bayes_security_after_next_step(t) == worst < budget
    assert worst <= bs.ai_bayes_security_exact(**kw, sensitivities=rs + [2.0]) + 1e-9
    assert monitor.bayes_security_closed_form(extra_worst_case_step=(1.0, dp.sample_rate)) == pytest.approx(
        bs.ai_bayes_security(**kw, sensitivities=rs + [2.0]), rel=1e-12
    )


def test_non_private_training_is_rejected(tmp_path):
    with pytest.raises(MisconfigurationException, match="DPOptimizer"):
        _fit([AttributeInferenceMonitor(attribute=ATTR)], tmp_path, max_epochs=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(attribute=""), "`attribute`"),
        (dict(attribute=3), "`attribute`"),
        (dict(attribute="age", values="middle"), "`values`"),
        (dict(attribute="age", values=7), "`values`"),
        (dict(check_candidates="no"), "`check_candidates`"),
        (dict(method="full"), "`method`"),
        (dict(values="middle"), "`values`"),
        (dict(publish="yes"), "`publish`"),
        (dict(chunk_size=0), "`chunk_size`"),
        (dict(backend="jax"), "`backend`"),
        (dict(key=""), "`key`"),
        (dict(loss_fn=3), "`loss_fn`"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        AttributeInferenceMonitor(**({"attribute": ATTR} | kwargs))


def test_batches_that_are_not_pairs_need_a_converter(tmp_path):
    class DictModule(type(tiny_module())):
        def training_step(self, batch, batch_idx):
            return super().training_step((batch["x"], batch["y"]), batch_idx)

    from torch.utils.data import DataLoader

    from tests.callbacks._tiny import tiny_dataset

    ds = tiny_dataset()
    loader = DataLoader([{"x": x, "y": y} for x, y in ds], batch_size=BATCH)
    monitor = AttributeInferenceMonitor(attribute=ATTR, batch_to_inputs_targets=lambda b: (b["x"], b["y"]))
    trainer([DPSGD(noise_multiplier=SIGMA), monitor], tmp_path, max_epochs=1).fit(
        DictModule(8, hidden=(16,)), train_dataloaders=loader
    )
    assert monitor.steps > 0 and monitor.max_sensitivity > 0
    with pytest.raises(MisconfigurationException, match="batch_to_inputs_targets"):
        trainer([DPSGD(noise_multiplier=SIGMA), AttributeInferenceMonitor(attribute=ATTR)], tmp_path, max_epochs=1).fit(
            DictModule(8, hidden=(16,)), train_dataloaders=loader
        )


def _ddp_worker():
    torch.set_num_threads(1)
    pl.seed_everything(0)  # every rank: the same initial weights
    monitor = AttributeInferenceMonitor(attribute=ATTR, method="exact")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer(
            [DPSGD(noise_multiplier=SIGMA), BayesSecurityMonitor(exact="never"), monitor],
            max_epochs=1,
            strategy="ddp",
            devices=2,
            use_distributed_sampler=False,
        )
        t.fit(tiny_module(), datamodule=TinyDataModule())
    keys = (names.AI_BAYES_SECURITY, names.AI_BAYES_SECURITY_CLOSED_FORM, names.MIA_BAYES_SECURITY)
    return {
        "rank": t.global_rank,
        "metrics": {k: float(t.callback_metrics[k]) for k in keys},
        "steps": monitor.steps,
        "max_sensitivity": monitor.max_sensitivity,
    }


@pytest.mark.slow
def test_two_process_ddp_training_tracks_r_t(tmp_path):
    """Under DDP every rank computes R_t of its share and takes the max over ranks (a collective per step)."""
    ranks = run_ddp("tests.callbacks.test_attribute_inference_monitor:_ddp_worker", tmp_path / "ddp")
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # the max over ranks: the same value on every rank
    assert ranks[0]["steps"] == ranks[1]["steps"] == STEPS_PER_EPOCH  # every rank saw every step
    assert ranks[0]["max_sensitivity"] == ranks[1]["max_sensitivity"] > 0
    m = ranks[0]["metrics"]
    ai, mia = m[names.AI_BAYES_SECURITY], m[names.MIA_BAYES_SECURITY]
    assert mia < ai < 1.0
    assert mia < m[names.AI_BAYES_SECURITY_CLOSED_FORM] < 1.0


# ------------------------------------------------------------------------------ attribute by name, candidate check
@pytest.fixture(scope="module")
def adult():
    dm = AdultDataModule(batch_size=256)
    dm.setup("fit")
    return dm


def _fit_adult(adult, callbacks, tmp_path, batches=2):
    t = trainer([DPSGD(noise_multiplier=SIGMA), *callbacks], tmp_path, max_epochs=1, limit_train_batches=batches)
    t.fit(TabularMLP(adult.num_features, hidden=(16,)), datamodule=adult)
    return t


def test_raw_ages_into_the_standardised_column_fail_with_the_fix(adult, tmp_path):
    raw_ages = SensitiveAttribute.numeric(column=0, values=range(17, 91), name="age")  # no encode: raw years
    with pytest.raises(MisconfigurationException) as info:
        _fit_adult(adult, [AttributeInferenceMonitor(attribute=raw_ages)], tmp_path)
    message = str(info.value)
    for part in (
        "attribute 'age'",
        "input column 0",
        "observed range is [-1.",  # the standardised column ...
        "range over [17, 90]",  # ... and the raw candidates
        "datamodule.sensitive_attribute('age')",
        "attribute: age",
        "`encode=`",
        "check_candidates=False",
    ):
        assert part in message, (part, message)


def test_name_and_datamodule_attribute_pass_the_check_and_agree(adult, tmp_path):
    by_name = AttributeInferenceMonitor(attribute="age")
    by_object = AttributeInferenceMonitor(
        attribute=adult.sensitive_attribute("age"), key=names.AI_BAYES_SECURITY + "_o"
    )
    one_hot = AttributeInferenceMonitor(attribute="race", key=names.AI_BAYES_SECURITY + "_race")
    t = _fit_adult(adult, [by_name, by_object, one_hot], tmp_path)
    assert by_name.tracked_attribute.values == tuple(range(17, 91)) and by_name.tracked_attribute.column == 0
    assert by_name.attribute.name == "age" and by_name.attribute.encode is not None  # what the report reads
    assert by_name._check.done and by_object._check.done and one_hot._check.done
    logged = float(t.callback_metrics[names.AI_BAYES_SECURITY])
    assert 0 < logged < 1 and logged == pytest.approx(float(t.callback_metrics[names.AI_BAYES_SECURITY + "_o"]))
    assert 0 < float(t.callback_metrics[names.AI_BAYES_SECURITY + "_race"]) < 1
    assert by_name.state_key == by_object.state_key.replace("_o'", "'")


def test_one_hot_attribute_over_columns_that_are_not_one_hot_fails(adult, tmp_path):
    wrong = SensitiveAttribute.one_hot(columns=[0, 1], values=["a", "b"], name="group")  # age and fnlwgt
    with pytest.raises(MisconfigurationException, match=r"attribute 'group' is a one-hot group.*other than 0 and 1"):
        _fit_adult(adult, [AttributeInferenceMonitor(attribute=wrong)], tmp_path)
    sex, race = adult.encoder.one_hot_groups["sex"], adult.encoder.one_hot_groups["race"]
    two_groups = SensitiveAttribute.one_hot(columns=[sex.columns[0], race.columns[0], race.columns[-1]], name="mix")
    with pytest.raises(MisconfigurationException, match=r"rows of the batch hold a 1 in several.*`columns=`"):
        _fit_adult(adult, [AttributeInferenceMonitor(attribute=two_groups)], tmp_path)


def test_the_check_waits_for_enough_rows_then_raises(tmp_path):
    far = SensitiveAttribute.numeric(column=0, values=[100.0, 200.0, 300.0], name="far")  # tiny data is N(0, 1)
    t = trainer([DPSGD(noise_multiplier=SIGMA), AttributeInferenceMonitor(attribute=far)], tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException, match="attribute 'far'"):
        t.fit(tiny_module(), datamodule=TinyDataModule())
    assert t.global_step >= 2  # batches of ~32 rows: the rule needs 128 values, so it decided at a later step


def test_opting_out_and_custom_attributes_are_not_checked(adult, tmp_path):
    raw_ages = SensitiveAttribute.numeric(column=0, values=[17, 90], name="age")
    custom = SensitiveAttribute.custom(
        substitute=lambda x, v: torch.cat([torch.full_like(x[:, :1], v), x[:, 1:]], dim=1), values=[17.0, 90.0]
    )
    off = AttributeInferenceMonitor(attribute=raw_ages, check_candidates=False)
    unchecked = AttributeInferenceMonitor(attribute=custom, key=names.AI_BAYES_SECURITY + "_custom")
    _fit_adult(adult, [off, unchecked], tmp_path, batches=1)
    assert off.steps == unchecked.steps == 1 and unchecked._check.done


def test_a_name_needs_a_datamodule_with_sensitive_attribute(adult, tmp_path):
    with pytest.raises(MisconfigurationException, match=r"attribute='age'.*no datamodule"):
        trainer([DPSGD(noise_multiplier=SIGMA), AttributeInferenceMonitor(attribute="age")], tmp_path).fit(
            tiny_module(), train_dataloaders=tiny_loader()
        )
    with pytest.raises(MisconfigurationException, match=r"attribute='age'.*TinyDataModule has no such method"):
        _fit([DPSGD(noise_multiplier=SIGMA), AttributeInferenceMonitor(attribute="age")], tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException, match=r"attribute='height'.*failed.*one-hot group"):
        _fit_adult(adult, [AttributeInferenceMonitor(attribute="height")], tmp_path)
    with pytest.raises(MisconfigurationException, match=r"`values`=\[200\] does not fit attribute 'age'"):
        _fit_adult(adult, [AttributeInferenceMonitor(attribute="age", values=[200])], tmp_path)

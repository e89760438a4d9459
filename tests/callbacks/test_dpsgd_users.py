"""User-level DP (issue 58): ``DPSGD(privacy_unit="user", user_ids=..., max_examples_per_user=k, user_sampling=...)``.

References independent of the engine: a float64 loop over the step's people (each person's rows' gradients by
``torch.autograd.grad`` on each row alone, summed or averaged, clipped to C as one vector, summed); dp_accounting's
PLDs (the Poisson-subsampled Gaussian at the people's rate; the mixture of Gaussians of Charles et al. for a person's k
rows each sampled on its own); the sampler's batches read back row by row.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, names
from lightning_privacy.claims import Claim
from lightning_privacy.dpsgd import functional
from lightning_privacy.dpsgd.sampling import PoissonBatchSampler
from lightning_privacy.dpsgd.users import People, fold, person_index
from tests.callbacks.test_dpsgd_functional import TiedLM

dp_pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
C = 0.5
F64 = torch.float64
N = 64


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, 2, (N,), generator=g))


def _ids(seed=0, people=12):
    g = torch.Generator().manual_seed(seed + 1)
    return [f"p{int(v)}" for v in torch.randint(0, people, (N,), generator=g)]


def _trainer(callbacks, steps):
    return pl.Trainer(
        max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip


class FirstSteps(pl.Callback):
    """The weights each step starts from, its rows (from DPSGD's sampler) and DPSGD's pre-noise clipped sums."""

    def __init__(self, dpsgd):
        self.dpsgd, self.records = dpsgd, []
        dpsgd.register_before_noise_hook(self._hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.rows = list(trainer.train_dataloader.batch_sampler.recent[self.dpsgd.ledger.steps])

    def _hook(self, optimizer):
        sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]
        self.records.append((self.state, self.rows, sums))


def loop_over_people(make, state, rows, data, ids, reduction, step_loss):
    """Σ over the step's people of clip(Σ or mean of their rows' gradients, each row alone), float64."""
    twin = make().double()
    twin.load_state_dict(state)
    params = [p for p in twin.parameters() if p.requires_grad]
    people = {}
    for r in rows:
        people.setdefault(ids[r], []).append(r)
    total = [torch.zeros_like(p) for p in params]
    for own in people.values():
        grads = [torch.autograd.grad(step_loss(twin, data[r]), params) for r in own]
        person = [sum(parts) / (len(own) if reduction == "mean" else 1) for parts in zip(*grads)]
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in person)))
        total = [t + min(1.0, C / (norm + 1e-6)) * g for t, g in zip(total, person)]
    return total, people


def _mlp_loss(twin, row):
    x, y = row
    return F.cross_entropy(twin.net(x[None]), y[None])


def _lm_loss(twin, row):
    ids, _ = row
    return functional.example_loss(twin.training_step((ids[None], torch.zeros(1)), 0))


@pytest.mark.parametrize("mode", ["hooks", "functional", "auto"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_each_person_is_clipped_as_a_whole_exactly_on_an_mlp(mode, reduction):
    data, ids = _rows(), _ids()
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=3, privacy_unit="user",
                  user_ids=ids, max_examples_per_user=4, user_reduction=reduction, sample_rate=0.3,
                  exactness_rate=1.0, neighbour_rate=1.0)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 4).fit(MLP().double(), DataLoader(data, batch_size=16))
    several = 0
    for state, rows, sums in seen.records:
        expected, people = loop_over_people(MLP, state, rows, data, ids, reduction, _mlp_loss)
        several += any(len(own) > 1 for own in people.values())
        scale = max(float(e.abs().max()) for e in expected) or 1.0
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-10 * scale
    assert several  # (people with several rows in a step: the sum before the norm matters)
    assert dpsgd.neighbours.steps == 4 and 0 < dpsgd.neighbours.max_ratio <= 1 + 1e-6  # a person moves S by ≤ C


@pytest.mark.parametrize("mode", ["functional", "auto"])
def test_each_person_is_clipped_as_a_whole_exactly_on_a_tied_language_model(mode):
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randint(0, 13, (N, 6), generator=g), torch.zeros(N))
    ids = _ids(2, people=10)
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=1, privacy_unit="user",
                  user_ids=ids, max_examples_per_user=3, sample_rate=0.3)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 2).fit(TiedLM().double(), DataLoader(data, batch_size=16))
    assert dpsgd.grad_sample_mode == "functional"
    for state, rows, sums in seen.records:
        expected, _ = loop_over_people(TiedLM, state, rows, data, ids, "sum", _lm_loss)
        scale = max(float(e.abs().max()) for e in expected)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-10 * scale


def test_each_person_is_clipped_as_a_whole_exactly_on_a_stock_hugging_face_gpt2():
    """The stock tied-head GPT-2 (``tests/callbacks/_stock_models.py``: Hugging Face's own ``.loss``) under the
    default auto mode, which trains it in functional mode."""
    pytest.importorskip("transformers")
    from tests.callbacks._stock_models import GPT2, _tokens

    data, ids = _tokens(N), _ids(3, people=10)
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, sampling_seed=1, privacy_unit="user", user_ids=ids,
                  max_examples_per_user=3, sample_rate=0.3)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 2).fit(GPT2().double(), DataLoader(data, batch_size=16))
    assert dpsgd.grad_sample_mode == "functional"

    def loss(twin, row):
        tokens, label = row
        return twin.training_step((tokens[None], label[None]), 0)

    for state, rows, sums in seen.records:
        expected, people = loop_over_people(GPT2, state, rows, data, ids, "sum", loss)
        assert any(len(own) > 1 for own in people.values())
        scale = max(float(e.abs().max()) for e in expected)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-9 * scale


def test_user_level_sampling_takes_all_or_none_of_a_person_s_kept_rows_and_ranks_split_people():
    ids = _ids(4, people=9)
    people = People(ids, max_examples_per_user=3, seed=11)
    one = PoissonBatchSampler(num_samples=people.num_people, sample_rate=0.4, steps=40, seed=2,
                              units=people.rows_of_people)  # fmt: skip
    ranks = [PoissonBatchSampler(num_samples=people.num_people, sample_rate=0.4, steps=40, seed=2, rank=r,
                                 world_size=2, units=people.rows_of_people) for r in range(2)]  # fmt: skip
    for batch, *shares in zip(one, *ranks):
        assert sorted(batch) == sorted(shares[0] + shares[1])
        assert not {people.person_of[r] for r in shares[0]} & {people.person_of[r] for r in shares[1]}
        for person in {int(people.person_of[r]) for r in batch}:
            assert sorted(r for r in batch if people.person_of[r] == person) == people.rows_of(person).tolist()
            assert len(people.rows_of(person)) <= 3


def test_the_contribution_bound_leaves_rows_out_by_a_choice_per_person_fixed_before_training():
    ids = ["a"] * 7 + ["b"] * 2 + ["c"] * 5
    people = People(ids, max_examples_per_user=3, seed=0)
    assert (people.num_people, people.rows_left_out, people.people_capped) == (3, 6, 2)
    kept = people.rows_of(0)
    assert len(kept) == 3 and set(kept) <= set(range(7)) and people.rows_of(1).tolist() == [7, 8]
    without_b = People(ids[:7] + ids[9:], max_examples_per_user=3, seed=0)  # another person removed: a's choice stays
    assert without_b.rows_of(0).tolist() == kept.tolist()
    assert (without_b.rows_of(1) + 2).tolist() == people.rows_of(2).tolist()
    choices = {tuple(People(ids, max_examples_per_user=3, seed=s).rows_of(0)) for s in range(20)}
    assert len(choices) > 5  # a random choice, keyed by the seed
    els = PoissonBatchSampler(num_samples=people.num_kept, sample_rate=0.9, steps=30, seed=0, units=people.kept_rows)
    drawn = {r for batch in els for r in batch}
    assert drawn <= set(people.kept_rows(np.arange(people.num_kept)).tolist()) and len(drawn) == 8


def test_fold_and_person_index_number_people_by_first_appearance():
    people = People(["x", "y", "x", "z"], max_examples_per_user=None, seed=0)
    index, counts = person_index(people, [3, 0, 2, 1])
    assert index.tolist() == [0, 1, 1, 2] and counts.tolist() == [1, 2, 1]
    g = torch.arange(4.0)[:, None]
    assert fold(g, index, counts, "sum").tolist() == [[0.0], [3.0], [3.0]]


def test_the_person_s_epsilon_is_dp_accounting_s_under_both_samplings():
    data, ids = _rows(), _ids()
    for uls in (True, False):
        dpsgd = DPSGD(noise_multiplier=1.2, sampling_seed=0, privacy_unit="user", user_ids=ids, max_examples_per_user=4,
                      user_sampling=uls, sample_rate=0.25)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer([dpsgd], 20).fit(MLP().double(), DataLoader(data, batch_size=16))
        if uls:
            reference = dp_pld.from_gaussian_mechanism(
                standard_deviation=1.2, sampling_prob=0.25, value_discretization_interval=1e-3
            ).self_compose(20)
        else:  # Charles et al.: j ~ Binomial(k, q) of the person's rows in a step
            weights = [float(stats.binom.pmf(j, 4, 0.25)) for j in range(5)]
            reference = dp_pld.from_mixture_gaussian_mechanism(
                1.2, list(range(5)), weights, value_discretization_interval=1e-3
            ).self_compose(20)
        assert dpsgd.epsilon() == pytest.approx(reference.get_epsilon_for_delta(1e-5), rel=1e-3)
        assert dpsgd.ledger.unit == "person" and dpsgd.steps == 20
        row = dpsgd.record_epsilon()
        assert row > dpsgd.epsilon() if uls else row < dpsgd.epsilon()  # ULS: a row moves S by 2C; ELS: 1 of k rows
        settings = dpsgd.privacy_settings()
        assert settings[names.DP_PRIVACY_UNIT] == "person" and settings[names.DP_MAX_EXAMPLES_PER_USER] == 4
        assert settings[names.DP_USER_SAMPLING] == ("people" if uls else "rows")
        claim = Claim.from_ledger(dpsgd.ledger)
        assert claim.epsilon == pytest.approx(dpsgd.epsilon(), rel=1e-9) and "one person" in claim.label


def test_planning_for_a_person_under_example_level_sampling_needs_more_noise():
    data, ids = _rows(), _ids()
    sigmas = {}
    for unit in ("example", "user"):
        extra = dict(privacy_unit="user", user_ids=ids, max_examples_per_user=4, user_sampling=False)
        dpsgd = DPSGD(target_epsilon=3.0, epochs=2, sampling_seed=0, sample_rate=0.25,
                      **(extra if unit == "user" else {}))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer([dpsgd], 8).fit(MLP().double(), DataLoader(data, batch_size=16))
        sigmas[unit] = dpsgd.noise_multiplier
        assert dpsgd.epsilon() <= 3.0
    assert sigmas["user"] > 1.5 * sigmas["example"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(privacy_unit="person"), r"privacy_unit='person'.*'example'.*'user'"),
        (dict(privacy_unit="user"), r"needs `user_ids`"),
        (dict(user_ids=["a"]), r"user_ids=.*privacy_unit='user'"),
        (dict(privacy_unit="user", user_ids=["a"], max_examples_per_user=0), r"max_examples_per_user=0.*≥ 1"),
        (dict(privacy_unit="user", user_ids=["a"], user_sampling=False), r"user_sampling=False.*max_examples_per_user"),
        (dict(privacy_unit="user", user_ids=["a"], user_reduction="max"), r"user_reduction='max'"),
        (dict(privacy_unit="user", user_ids=["a"], grad_sample_mode="ghost"), r"ghost.*cross terms"),
        (
            dict(privacy_unit="user", user_ids=["a"], max_examples_per_user=2, user_sampling=False, accountant="rdp"),
            r"accountant='rdp'.*only accountant='pld'",
        ),
    ],
)
def test_bad_user_level_arguments_are_refused_in_one_sentence(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        DPSGD(noise_multiplier=1.0, **kwargs)


def test_bad_user_ids_for_the_dataset_are_refused_at_fit_start():
    data = _rows()
    for ids, match in (
        (["a"] * 10, r"10 ids for a train dataset of 64 rows"),
        (["a"] * 63 + [None], r"no person for 1 row\(s\).*row 63"),
        ("person", r"user_ids='person'.*row 0.*no field 'person'"),
    ):
        dpsgd = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=ids, sampling_seed=0)
        with pytest.raises(MisconfigurationException, match=match), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer([dpsgd], 1).fit(MLP().double(), DataLoader(data, batch_size=16))


def test_user_ids_may_name_a_field_of_the_rows():
    rows = [{"x": torch.randn(6, dtype=torch.float64), "y": i % 2, "person": i // 4} for i in range(32)]

    class DictMLP(MLP):
        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch["x"]), batch["y"], reduction="none")

    dpsgd = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids="person", max_examples_per_user=2,
                  sampling_seed=0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd], 3).fit(DictMLP().double(), DataLoader(rows, batch_size=8))
    assert dpsgd.people.num_people == 8 and dpsgd.people.rows_left_out == 16 and dpsgd.steps == 3


def test_a_resume_with_another_unit_or_bound_is_refused():
    data, ids = _rows(), _ids()
    dpsgd = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=ids, max_examples_per_user=4, sampling_seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd], 2).fit(MLP().double(), DataLoader(data, batch_size=16))
    state = dpsgd.state_dict()
    for other in (DPSGD(noise_multiplier=1.0),
                  DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=ids, max_examples_per_user=5)):  # fmt: skip
        with pytest.raises(RuntimeError, match="privacy unit"):
            other.load_state_dict(state)
    again = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=ids, max_examples_per_user=4)
    again.load_state_dict(state)
    assert again.steps == 2 and again.epsilon() == dpsgd.epsilon()


def test_the_guide_s_planned_noise_for_a_person_of_four_rows_is_the_ledger_s():
    from lightning_privacy.ledger import PrivacyLedger

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "guides" / "user_level.md").read_text().split())
    row = PrivacyLedger.calibrate(sample_rate=0.25, steps=8, target_epsilon=3.0)
    person = PrivacyLedger.calibrate(sample_rate=0.25, steps=8, target_epsilon=3.0, relation="add_remove", group_size=4)
    assert f"σ = {person:.2f} for a person of k = 4 rows against {row:.2f} for a row" in text


def test_the_monitor_and_the_stopper_read_the_person_s_ledger():
    from lightning_privacy import BayesSecurityMonitor, PrivacyBudgetStopping

    data, ids = _rows(), _ids()
    extra = dict(privacy_unit="user", user_ids=ids, max_examples_per_user=4, user_sampling=False, sample_rate=0.25)
    with pytest.raises(MisconfigurationException, match=r"relation='replace'.*pass relation='add_remove'"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer([DPSGD(noise_multiplier=2.0, **extra), BayesSecurityMonitor()], 4).fit(
                MLP().double(), DataLoader(data, batch_size=16)
            )
    dpsgd = DPSGD(noise_multiplier=2.0, **extra)
    monitor = BayesSecurityMonitor(relation="add_remove")
    stopper = PrivacyBudgetStopping(max_epsilon=4.0, relation="add_remove")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, monitor, stopper], 40).fit(MLP().double(), DataLoader(data, batch_size=16))
    assert monitor.ledger is dpsgd.ledger and monitor.ledger.group_size == 4
    assert dpsgd.epsilon() <= 4.0 and dpsgd.steps < 40  # the person's budget stopped the fit
    row = DPSGD(noise_multiplier=2.0, sample_rate=0.25)  # the same steps for a row: far less ε
    row.ledger.step(noise_multiplier=2.0, sample_rate=0.25, steps=dpsgd.steps)
    assert row.epsilon() < dpsgd.epsilon() / 2


def test_the_statement_states_the_person_and_refuses_a_ledger_of_another_unit(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_privacy.checkpoints import dpsgd_state_digest
    from lightning_privacy.statement import privacy_statement

    data, ids = _rows(), _ids()
    dpsgd = DPSGD(noise_multiplier=2.0, privacy_unit="user", user_ids=ids, max_examples_per_user=4,
                  user_sampling=False, sample_rate=0.25, sampling_seed=0)  # fmt: skip
    trainer = pl.Trainer(
        max_steps=6, callbacks=[dpsgd, ModelCheckpoint(dirpath=tmp_path, filename="final")], logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP().double(), DataLoader(data, batch_size=16))
    statement = privacy_statement(tmp_path / "final.ckpt")
    assert statement.consistency["status"] == "consistent"
    assert statement.epsilon == pytest.approx(dpsgd.epsilon(), rel=1e-9)
    text = statement.to_markdown()
    assert (
        "| privacy unit | person, at most 4 rows | every ε, β\\* and bound is for adding or removing one person" in text
    )
    assert statement.to_dict()["guarantee"]["row_epsilon"] == pytest.approx(dpsgd.record_epsilon(), rel=1e-9)
    assert "| ε of one row at δ = 1e-05 |" in text and dpsgd.record_epsilon() < dpsgd.epsilon()
    checkpoint = torch.load(tmp_path / "final.ckpt", map_location="cpu", weights_only=True)
    state = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("DPSGD"))
    state["ledger"].pop("group_size")  # a ledger of rows under a statement of people (digest recomputed: no accident)
    state["digest"] = dpsgd_state_digest(state)
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    edited = privacy_statement(tmp_path / "edited.ckpt")
    assert edited.consistency["status"] == "inconsistent"
    assert any(
        "protects one person of 4 rows" in p and "accounts one person" in p for p in edited.consistency["problems"]
    )


class _Validated(MLP):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True)


def _ddp_worker(mode):
    torch.set_num_threads(1)
    pl.seed_everything(0)  # every rank: the same initial weights
    data, ids = _rows(), _ids()
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=3, privacy_unit="user",
                  user_ids=ids, max_examples_per_user=4, sample_rate=0.3)  # fmt: skip
    seen = FirstSteps(dpsgd)
    model = _Validated().double()
    trainer = pl.Trainer(
        max_steps=2, callbacks=[dpsgd, seen], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", strategy="ddp", devices=2, use_distributed_sampler=False,
        limit_val_batches=1,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
    return [
        {"state": {k: v.tolist() for k, v in state.items()}, "rows": rows, "sums": [s.tolist() for s in sums]}
        for state, rows, sums in seen.records
    ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hooks", "functional"])
def test_under_ddp_the_ranks_split_people_and_their_sums_are_the_loop_over_the_step_s_people(tmp_path, mode):
    from tests._launch import run_ddp

    data, ids = _rows(), _ids()
    rank0, rank1 = run_ddp("tests.callbacks.test_dpsgd_users:_ddp_worker", tmp_path / "ddp", mode=mode)
    for a, b in zip(rank0, rank1):
        assert not {ids[r] for r in a["rows"]} & {ids[r] for r in b["rows"]}  # a person on one rank only
        state = {k: torch.tensor(v, dtype=torch.float64) for k, v in a["state"].items()}
        expected, _ = loop_over_people(MLP, state, a["rows"] + b["rows"], data, ids, "sum", _mlp_loss)
        total = [torch.tensor(x, dtype=F64) + torch.tensor(y, dtype=F64) for x, y in zip(a["sums"], b["sums"])]
        assert max(float((s - e).abs().max()) for s, e in zip(total, expected)) < 1e-10


def test_user_level_sampling_where_only_ghost_clipping_runs_fsdp2_is_refused_in_a_sentence():
    from lightning_privacy.dpsgd import install

    dpsgd = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=["a"], max_examples_per_user=2)
    dpsgd.grad_sample_mode = "ghost"  # (what FSDP2's strategy resolves every mode to)
    with pytest.raises(
        MisconfigurationException, match=r"ghost mode here \(the strategy's only mode\).*user_sampling=False"
    ):
        install._units_of_batch(dpsgd, None, None)
    els = DPSGD(noise_multiplier=1.0, privacy_unit="user", user_ids=["a"], max_examples_per_user=2, user_sampling=False)
    els.grad_sample_mode = "ghost"
    assert install._units_of_batch(els, None, None) is None  # rows clipped one by one: ghost clips them


def test_example_level_sampling_runs_in_ghost_mode_each_kept_row_clipped():
    data, ids = _rows(), _ids()
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode="ghost", sampling_seed=3, privacy_unit="user",
                  user_ids=ids, max_examples_per_user=2, user_sampling=False, sample_rate=0.3)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 3).fit(MLP().double(), DataLoader(data, batch_size=16))
    kept = set(dpsgd.people.kept_rows(np.arange(dpsgd.people.num_kept)).tolist())
    for state, rows, sums in seen.records:
        assert set(rows) <= kept
        row_ids = [f"row{r}" for r in range(N)]  # each row its own "person": per-example clipping
        expected, _ = loop_over_people(MLP, state, rows, data, row_ids, "sum", _mlp_loss)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-10

"""Clipping rules (issue 59, item 2): ``DPSGD(clipping="automatic", stability=γ)`` — Bu et al.'s AUTO-S, each gradient
scaled by 1/(‖gᵢ‖ + γ) — in every mode that runs it, against a float64 per-example loop; accounted as a fixed C = 1;
its bad arguments refused in one sentence; saved, checked on resume and stated."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, names
from tests.callbacks.test_dpsgd_users import MLP, FirstSteps, _ids, _mlp_loss, _rows, _trainer

GAMMA = 0.01


def automatic_loop(state, rows, data, ids=None, gamma=GAMMA):
    """Σ over the step's units (rows, or people) of gᵤ / (‖gᵤ‖ + γ), float64, each row's gradient alone."""
    twin = MLP().double()
    twin.load_state_dict(state)
    params = list(twin.parameters())
    units = {}
    for r in rows:
        units.setdefault(r if ids is None else ids[r], []).append(r)
    total = [torch.zeros_like(p) for p in params]
    for own in units.values():
        grads = [torch.autograd.grad(_mlp_loss(twin, data[r]), params) for r in own]
        g = [sum(parts) for parts in zip(*grads)]
        norm = float(torch.sqrt(sum((x**2).sum() for x in g)))
        total = [t + x / (norm + gamma) for t, x in zip(total, g)]
    return total


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional", "auto"])
def test_automatic_clipping_sums_each_gradient_over_its_norm_plus_gamma(mode):
    data = _rows()
    data.tensors = (data.tensors[0] * 5, data.tensors[1])  # (large gradients: the rule's scale matters)
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, clipping="automatic", stability=GAMMA, grad_sample_mode=mode, sampling_seed=0,
                  exactness_rate=1.0, neighbour_rate=1.0)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 4).fit(MLP().double(), DataLoader(data, batch_size=16))
    for state, rows, sums in seen.records:
        expected = automatic_loop(state, rows, data)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-12
    assert dpsgd.max_grad_norm == 1.0 and 0 < dpsgd.neighbours.max_ratio <= 1.0  # sensitivity 1: the premise holds
    assert dpsgd.privacy_settings()[names.DP_CLIPPING] == "automatic"
    fixed = DPSGD(noise_multiplier=1.0, sample_rate=dpsgd.sample_rate)  # the same accounting as a fixed C = 1
    fixed.ledger.step(noise_multiplier=1.0, sample_rate=dpsgd.sample_rate, steps=dpsgd.steps)
    assert dpsgd.epsilon() == fixed.epsilon()


def test_automatic_clipping_scales_each_person_s_summed_gradient():
    data, ids = _rows(), _ids()
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, clipping="automatic", grad_sample_mode="hooks", sampling_seed=3,
                  privacy_unit="user", user_ids=ids, max_examples_per_user=4, sample_rate=0.3)  # fmt: skip
    seen = FirstSteps(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 3).fit(MLP().double(), DataLoader(data, batch_size=16))
    for state, rows, sums in seen.records:
        expected = automatic_loop(state, rows, data, ids)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clipping="adaptive"), r"clipping='adaptive'.*'fixed'.*'automatic'"),
        (dict(clipping="automatic", max_grad_norm=1.0), r"max_grad_norm=1.0.*has no clipping norm; drop max_grad_norm"),
        (dict(clipping="automatic", stability=0.0), r"stability=0.0.*> 0"),
    ],
)
def test_bad_clipping_arguments_are_refused_in_one_sentence(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        DPSGD(noise_multiplier=1.0, **kwargs)


def test_the_rule_is_saved_checked_on_resume_and_stated(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_privacy.statement import privacy_statement

    dpsgd = DPSGD(noise_multiplier=1.0, clipping="automatic", stability=0.05, sampling_seed=0)
    trainer = pl.Trainer(
        max_steps=3, callbacks=[dpsgd, ModelCheckpoint(dirpath=tmp_path, filename="final")], logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP().double(), DataLoader(_rows(), batch_size=16))
    state = dpsgd.state_dict()
    assert state["clipping"] == {"rule": "automatic", "stability": 0.05}
    for other in (DPSGD(noise_multiplier=1.0), DPSGD(noise_multiplier=1.0, clipping="automatic")):
        with pytest.raises(RuntimeError, match="clipping"):
            other.load_state_dict(state)
    text = privacy_statement(tmp_path / "final.ckpt").to_markdown()
    assert "| clipping | automatic | each gradient scaled by 1/(‖g‖ + 0.05)" in text


def test_fixed_clipping_is_the_default_and_its_norm_defaults_to_one():
    dpsgd = DPSGD(noise_multiplier=1.0)
    assert dpsgd.clipping.rule == "fixed" and dpsgd.max_grad_norm == 1.0


# ------------------------------------------------------------------------------------------ quantile clipping
def _quantile_data(n=512, seed=0):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, 2, (n,), generator=g))


class _Recorder(pl.Callback):
    """Each step's C, rows, starting weights and pre-noise sums; the logged C."""

    def __init__(self, dpsgd):
        self.dpsgd, self.steps, self.logged = dpsgd, [], []
        dpsgd.register_before_noise_hook(self._hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.rows = list(trainer.train_dataloader.batch_sampler.recent[self.dpsgd.ledger.steps])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logged.append(float(trainer.callback_metrics[names.DP_MAX_GRAD_NORM]))

    def _hook(self, optimizer):
        sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]
        self.steps.append((float(optimizer.max_grad_norm), self.rows, self.state, sums))


def _fixed_loop(state, rows, data, clip):
    twin = MLP().double()
    twin.load_state_dict(state)
    params = list(twin.parameters())
    total = [torch.zeros_like(p) for p in params]
    for r in rows:
        g = torch.autograd.grad(_mlp_loss(twin, data[r]), params)
        norm = float(torch.sqrt(sum((x**2).sum() for x in g)))
        total = [t + min(1.0, clip / (norm + 1e-6)) * x for t, x in zip(total, g)]
    return total


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional", "auto"])
def test_quantile_clipping_tracks_its_quantile_clips_at_each_step_s_c_and_is_accounted_with_its_count(mode):
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from lightning_privacy.dpsgd.clipping import combined_noise_multiplier

    data, held = _quantile_data(), _quantile_data(seed=1)
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=5.0, clipping="quantile", target_quantile=0.5,
                  grad_sample_mode=mode, sampling_seed=0, noise_seed=0)  # fmt: skip
    seen = _Recorder(dpsgd)
    model = MLP().double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, seen], 200).fit(model, DataLoader(data, batch_size=32))
    for clip, rows, state, sums in (seen.steps[0], seen.steps[100], seen.steps[199]):  # at the step's own C
        expected = _fixed_loop(state, rows, data, clip)
        assert max(float((s - e).abs().max()) for s, e in zip(sums, expected)) < 1e-12
    clips = [c for c, *_ in seen.steps]
    assert clips[0] == 5.0 and len(set(clips)) > 100 and seen.logged == pytest.approx(clips)
    # the released C after 200 steps covers the target share of held-out examples' norms (float64, one by one)
    params = list(model.parameters())
    norms = [
        float(torch.sqrt(sum((g**2).sum() for g in torch.autograd.grad(_mlp_loss(model, held[i]), params))))
        for i in range(len(held))
    ]
    share = sum(n <= dpsgd.quantile.clip for n in norms) / len(norms)
    assert abs(share - 0.5) <= 0.1, share
    # the ledger keeps the combined Gaussian of gradient and count; dp_accounting's PLD of it gives the same ε
    sigma_b = 32 / 20
    assert dpsgd.quantile.count_noise == sigma_b
    assert combined_noise_multiplier(dpsgd.quantile.gradient_noise, sigma_b) == pytest.approx(1.0, rel=1e-12)
    reference = pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0, sampling_prob=dpsgd.sample_rate, value_discretization_interval=1e-3
    ).self_compose(200)
    assert dpsgd.epsilon() == pytest.approx(reference.get_epsilon_for_delta(1e-5), rel=1e-3)
    assert dpsgd.state_dict()["clip"] == dpsgd.quantile.clip


def test_noise_planned_for_epsilon_4_covers_the_count_too():
    torch.manual_seed(0)
    dpsgd = DPSGD(target_epsilon=4.0, epochs=2, clipping="quantile", count_noise_multiplier=4.0, sampling_seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd], 32).fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))
    assert dpsgd.steps == 32 and dpsgd.epsilon() <= 4.0  # (the noise self-check passed at the gradient's z_Δ)
    assert dpsgd.quantile.gradient_noise > dpsgd.noise_multiplier == dpsgd.ledger.history[-1][0]


def test_a_resumed_quantile_run_continues_its_clipping_norm():
    torch.manual_seed(0)
    first = DPSGD(noise_multiplier=1.0, clipping="quantile", sampling_seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([first], 20).fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))
    state = first.state_dict()
    again = DPSGD(noise_multiplier=1.0, clipping="quantile", sampling_seed=0)
    again.load_state_dict(state)
    seen = _Recorder(again)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([again, seen], 1).fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))
    assert seen.steps[0][0] == pytest.approx(first.quantile.clip) != 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_quantile=1.0), r"target_quantile=1.0.*\(0, 1\)"),
        (dict(clipping_learning_rate=0), r"clipping_learning_rate=0.*> 0"),
        (dict(count_noise_multiplier=-1.0), r"count_noise_multiplier=-1.0.*> 0"),
    ],
)
def test_bad_quantile_arguments_are_refused_in_one_sentence(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        DPSGD(noise_multiplier=1.0, clipping="quantile", **kwargs)


def test_a_count_noise_that_leaves_no_budget_for_the_gradient_is_refused_at_fit_start():
    dpsgd = DPSGD(noise_multiplier=2.0, clipping="quantile", count_noise_multiplier=0.5)
    with pytest.raises(MisconfigurationException, match=r"count_noise_multiplier=.*σ_b = 0.5 leaves no budget"):
        _trainer([dpsgd], 1).fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))


def test_reference_models_are_trained_with_the_target_s_clipping_rule():
    from lightning_privacy.models import TabularMLP
    from lightning_privacy.references import recipe_like

    for kwargs in (dict(clipping="automatic", stability=0.05), dict(clipping="quantile", target_quantile=0.7)):
        trainer = pl.Trainer(max_epochs=2, callbacks=[DPSGD(noise_multiplier=1.3, **kwargs)], logger=False)
        _, recipe = recipe_like(trainer, TabularMLP(4, hidden=(8,)))
        assert recipe["callbacks"][0].clipping == trainer.callbacks[0].clipping


def test_gradient_canaries_join_at_each_step_s_clipping_norm_under_quantile_clipping():
    from lightning_privacy import CanaryAudit

    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1e-4, max_grad_norm=3.0, clipping="quantile", sampling_seed=0, noise_seed=0)
    audit = CanaryAudit(num_canaries=50, seed=1)
    seen = _Recorder(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, audit, seen], 30).fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))
    clips = [c for c, *_ in seen.steps]
    # released minus the batch's own sum: each sampled canary's C_t (σ tiny), summed over the steps it joined
    expected = sum(audit.sampled(t).astype(float) * clips[t] for t in range(30))
    assert audit.scores == pytest.approx(expected, abs=0.02) and len(set(clips)) > 10 and expected.max() > 1.0


def _quantile_ddp_worker():
    torch.set_num_threads(1)
    pl.seed_everything(0)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=5.0, clipping="quantile", sampling_seed=0)  # (secret count seed)
    seen = _Recorder(dpsgd)
    trainer = pl.Trainer(
        max_steps=12, callbacks=[dpsgd, seen], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", strategy="ddp", devices=2, use_distributed_sampler=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP().double(), DataLoader(_quantile_data(), batch_size=32))
    return {"clips": [c for c, *_ in seen.steps], "final": dpsgd.quantile.clip, "epsilon": dpsgd.epsilon()}


@pytest.mark.slow
def test_under_ddp_the_ranks_count_together_and_keep_one_clipping_norm(tmp_path):
    from tests._launch import run_ddp

    rank0, rank1 = run_ddp("tests.callbacks.test_dpsgd_clipping_rules:_quantile_ddp_worker", tmp_path / "ddp")
    assert rank0["clips"] == rank1["clips"] and rank0["final"] == rank1["final"]  # one count, one noise draw
    assert rank0["clips"][0] == 5.0 and len(set(rank0["clips"])) == 12 and rank0["final"] < 5.0
    assert rank0["epsilon"] == rank1["epsilon"]


class _Clips(pl.Callback):
    """The C each step ended with (the DP optimizer's, which quantile clipping moves)."""

    def __init__(self):
        self.clips = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.clips.append(float(trainer.strategy.optimizers[0].max_grad_norm))


def _fsdp2_worker(rule):
    """FSDP2, where ghost clipping is the only mode: the rule's factors in its second pass, C_t in its noise."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from tests.callbacks.test_dpsgd_sampling import _ShardedMLP, seeded_loader

    torch.set_num_threads(1)
    pl.seed_everything(0)
    extra = {"max_grad_norm": 5.0} if rule == "quantile" else {}
    dpsgd = DPSGD(noise_multiplier=1.0, clipping=rule, sampling_seed=0, grad_sample_mode="ghost", **extra)
    seen = _Clips()
    trainer = pl.Trainer(
        max_steps=10, callbacks=[dpsgd, seen], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=2, use_distributed_sampler=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_ShardedMLP(), seeded_loader(256, 32))
    return {"clips": seen.clips, "epsilon": dpsgd.epsilon(), "steps": dpsgd.steps, "rate": dpsgd.sample_rate}


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["quantile", "automatic"])
def test_fsdp2_runs_each_rule_in_ghost_clipping(tmp_path, rule):
    from tests._launch import run_ddp

    rank0, rank1 = run_ddp("tests.callbacks.test_dpsgd_clipping_rules:_fsdp2_worker", tmp_path / "fsdp2", rule=rule)
    assert rank0["clips"] == rank1["clips"] and rank0["epsilon"] == rank1["epsilon"] and rank0["steps"] == 10
    if rule == "quantile":  # one count over both ranks moves one C from 5
        assert len(set(rank0["clips"])) == 10 and rank0["clips"][-1] < 5.0
    else:  # sensitivity 1: accounted as a fixed C = 1
        assert set(rank0["clips"]) == {1.0}
        fixed = DPSGD(noise_multiplier=1.0)
        fixed.ledger.step(noise_multiplier=1.0, sample_rate=rank0["rate"], steps=10)
        assert rank0["epsilon"] == pytest.approx(fixed.epsilon(), rel=1e-9)

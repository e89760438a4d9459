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


@pytest.mark.parametrize("mode", ["hooks", "functional", "auto"])
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
        (dict(clipping="automatic", grad_sample_mode="ghost"), r"ghost.*'auto'"),
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

"""Two CPU processes (torchrun, gloo) give the same privacy numbers as one."""

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
from tests._launch import run_ddp
from tests.callbacks._tiny import BATCH, N, TinyDataModule, tiny_module, trainer

KEYS = (names.MIA_BAYES_SECURITY, names.DP_STEPS, names.DP_SAMPLE_RATE, names.DP_EPSILON, names.MIA_TPR_BOUND_FPR_0_1)


def _run(tmp_path, **kwargs):
    callbacks = [
        DPSGD(noise_multiplier=1.5),
        BayesSecurityMonitor(),
        PrivacyBudgetStopping(min_bayes_security=0.85),
    ]
    model = tiny_module()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    t = trainer(callbacks, tmp_path, max_epochs=10, **kwargs)
    t.fit(model, datamodule=TinyDataModule())
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {
        "rank": t.global_rank,
        "steps": t.global_step,
        "metrics": {k: float(t.callback_metrics[k]) for k in KEYS},
        "moved": float(torch.linalg.norm(after - before)),
        "weights": after.clone(),
    }


def _ddp_worker(root):
    torch.set_num_threads(1)
    pl.seed_everything(0)  # every rank: the same initial weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(root, strategy="ddp", devices=2, use_distributed_sampler=False)


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path):
    pl.seed_everything(0)
    single = _run(tmp_path / "one")
    ranks = run_ddp("tests.callbacks.test_ddp:_ddp_worker", tmp_path / "two", root=str(tmp_path / "two"))
    one = single["metrics"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for two in ranks:
        assert two["metrics"] == pytest.approx(one, rel=1e-9)  # same σ, p and steps, hence the same bounds
        assert two["steps"] == single["steps"]
        assert two["moved"] > 0  # trained
    assert one[names.DP_SAMPLE_RATE] == pytest.approx(BATCH / N)
    # the (rank-reduced) budget decision stopped both runs at the same step, before 10 epochs
    assert one[names.DP_STEPS] == single["steps"] < 10 * (N // BATCH)
    assert one[names.MIA_BAYES_SECURITY] >= 0.85
    assert single["moved"] > 0
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # one model: the ranks stayed in step

"""Two CPU processes (gloo, ddp_spawn) give the same privacy numbers as one."""

import pytest
import torch

from lightning_privacy import DPSGD, BayesSecurityMonitor, PrivacyBudgetStopping, names
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
    return t, {k: float(t.callback_metrics[k]) for k in KEYS}, float(torch.linalg.norm(after - before))


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path):
    single, one, moved_one = _run(tmp_path / "one")
    _, two, moved_two = _run(tmp_path / "two", strategy="ddp_spawn", devices=2, use_distributed_sampler=False)
    assert two == pytest.approx(one, rel=1e-9)  # same σ, p and steps, hence the same bounds
    assert one[names.DP_SAMPLE_RATE] == pytest.approx(BATCH / N)
    # the (rank-reduced) budget decision stopped both runs at the same step, before 10 epochs
    assert one[names.DP_STEPS] == single.global_step < 10 * (N // BATCH)
    assert one[names.MIA_BAYES_SECURITY] >= 0.85
    assert moved_one > 0 and moved_two > 0  # both trained (weights come back from the spawned ranks)

"""Epsilon* on sequences (issue 39, item 3): an over-fitted language model's mean token losses separate members from
non-members completely, and Epsilon* — a supremum over thresholds with both rates in [δ, 1 − δ] — then has no
threshold left and returned 0 silently beside a threshold attack's ε ≥ 3. The 0 now comes with a warning that says
so and names the attack's bound; a 0 that is a measurement (no difference) does not."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import epsilon_star_details
from lightning_privacy.audits import audit_epsilon_star, audit_epsilon_star_from_losses
from lightning_privacy.audits.epsilon_star import separated_warning
from lightning_privacy.functional.sequence_loss import CausalLMSignal, causal_lm_signal

V, T = 50, 16


class Sequences(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.mask = (torch.arange(T) < torch.randint(4, T + 1, (n, 1), generator=g)).long()
        self.ids = torch.randint(1, V, (n, T), generator=g) * self.mask

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


class BigramLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(V, 32), torch.nn.Linear(32, V)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.embed(input_ids))


def test_an_over_fitted_lms_zero_epsilon_star_is_flagged_and_points_to_the_attacks_bound():
    torch.manual_seed(0)
    members, nonmembers, model = Sequences(64, seed=1), Sequences(64, seed=2), BigramLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        optimizer.zero_grad()
        causal_lm_signal(model, next(iter(DataLoader(members, batch_size=64)))).mean().backward()
        optimizer.step()
    loaders = DataLoader(members, batch_size=32), DataLoader(nonmembers, batch_size=32)
    result = audit_epsilon_star(model, *loaders, signal_fn=causal_lm_signal, warn=False)
    values = result.metrics()
    # measured: mean token loss 1.3-3.0 on members, 5.0-16.1 on non-members; the attack's bound 3.43
    assert values[names.EPSILON_STAR] == 0.0 and values[names.EPSILON_STAR_EMPIRICAL] == 0.0
    assert values[names.MIA_EPSILON_LOWER] > 2.0
    (warning,) = [w for w in result.warnings if w.startswith("Epsilon* = 0")]
    assert "(parametric, empirical) is no measurement here" in warning
    assert f"`{names.MIA_EPSILON_LOWER}` = {values[names.MIA_EPSILON_LOWER]:.3g}" in warning
    # the summed loss (confounded by length) overlaps: ε* is measured and nothing is flagged
    summed = audit_epsilon_star(model, *loaders, signal_fn=CausalLMSignal("sum"), warn=False)
    assert summed.metrics()[names.EPSILON_STAR] > 0 and not any(w.startswith("Epsilon* = 0") for w in summed.warnings)


def test_a_zero_that_is_a_measurement_is_not_flagged():
    rng = np.random.default_rng(0)
    same = audit_epsilon_star_from_losses(rng.normal(size=500), rng.normal(size=500), warn=False)
    constant = audit_epsilon_star_from_losses(np.ones(50), np.ones(50), delta=1e-3, warn=False)  # empirical 0: equal
    reversed_ = audit_epsilon_star_from_losses(np.linspace(5, 6, 50), np.linspace(0, 1, 50), warn=False)
    for result in (same, constant, reversed_):
        assert not any(w.startswith("Epsilon* = 0") for w in result.warnings)
    members, nonmembers = np.linspace(0, 1, 50), np.linspace(5, 6, 50)
    for method in ("parametric", "empirical"):
        details = {method: epsilon_star_details(members, nonmembers, delta=1e-3, method=method)}
        assert details[method].epsilon_star == 0.0
        assert separated_warning(details, members, nonmembers, 1.0).startswith(f"Epsilon* = 0 ({method})")
    overlapping = rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000)
    details = {"empirical": epsilon_star_details(*overlapping, delta=1e-4, method="empirical")}
    assert separated_warning(details, *overlapping, 1.0) is None

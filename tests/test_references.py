"""train_references on a tiny synthetic task: the cache is keyed by the seed, the online IN/OUT labels are those of
the trained models, and every reference starts from its own initial weights."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy.models import TabularMLP
from lightning_privacy.references import train_references

pytestmark = pytest.mark.filterwarnings("ignore")
D = 8


def _data(seed: int, n: int):
    """Rows with random labels: a model can only fit them by memorising (members look unlike non-members)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g), torch.randint(0, 2, (n,), generator=g)


def _loader(x, y, batch=16):
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def _factory(width=8, lr=0.1, optimizer="sgd"):
    return lambda: TabularMLP(D, hidden=(width,), lr=lr, optimizer=optimizer)


def test_a_cache_of_another_seed_is_refused_naming_the_seed(tmp_path):
    """Pins the seed in the cache key: references of seed 0 reused for seed 1 would carry seed 0's halves while the
    caller reads seed 1's IN/OUT labels."""
    pop = _loader(*_data(0, 32))
    kwargs = dict(num_references=1, trainer_kwargs=dict(max_steps=1), cache_dir=tmp_path)
    first = train_references(_factory(), pop, seed=0, **kwargs)
    assert first.trained == 1 and train_references(_factory(), pop, seed=0, **kwargs).trained == 0
    with pytest.raises(ValueError, match=r"other seed\b"):
        train_references(_factory(), pop, seed=1, **kwargs)


def test_online_references_have_lower_losses_on_the_rows_they_are_labelled_in():
    """Pins the order of the audited examples mixed into the halves (members, then non-members, as
    ``inside_targets`` and the attacks read them): on references that memorise their half, every reference's loss
    on the audited rows labelled IN is far below its loss on the rows labelled OUT."""
    (xm, ym), (xn, yn), (xp, yp) = _data(1, 24), _data(2, 40), _data(3, 32)  # members and non-members: other sizes
    members, nonmembers = _loader(xm, ym), _loader(xn, yn)
    torch.manual_seed(0)
    refs = train_references(
        _factory(width=128, lr=0.02, optimizer="adam"),
        _loader(xp, yp),
        num_references=2,
        trainer_kwargs=dict(max_epochs=60),
        targets=(members, nonmembers),
    )
    x, y = torch.cat([xm, xn]), torch.cat([ym, yn])
    assert refs.inside_targets.shape == (2, 64)
    for model, inside in zip(refs.models, refs.inside_targets):
        with torch.no_grad():
            losses = F.cross_entropy(model(x), y, reduction="none").numpy()
        assert losses[inside].mean() < 0.25 * losses[~inside].mean(), (losses[inside].mean(), losses[~inside].mean())


def _initial_weights(seed):
    """The weights each reference started from (recorded by the model factory)."""
    starts = []

    def factory():
        model = _factory()()
        starts.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))
        return model

    train_references(factory, _loader(*_data(0, 32)), num_references=3, trainer_kwargs=dict(max_steps=1), seed=seed)
    return starts


def test_every_reference_starts_from_its_own_initial_weights():
    """Pins the per-reference seeding of the initial weights: references that all start alike are not independent
    draws of the training algorithm (the attacks' IN and OUT distributions come out too narrow)."""
    starts = _initial_weights(seed=4)
    assert len(starts) == 3
    assert not any(torch.equal(starts[i], starts[j]) for i, j in ((0, 1), (0, 2), (1, 2)))
    assert all(torch.equal(a, b) for a, b in zip(starts, _initial_weights(seed=4)))  # the same seed: the same starts


def test_dp_sgd_references_are_the_same_on_every_run_of_a_seed_and_differ_between_references():
    """Each DP-SGD reference's masks and noise are seeded from (seed, j): the audit re-runs to the digit, and two
    references of one run are still independent draws (not one copied DPSGD's seeds)."""
    pop = _loader(*_data(0, 64))

    def weights(seed):
        refs = train_references(
            _factory(),
            pop,
            num_references=2,
            trainer_kwargs=dict(max_epochs=2),
            dp_sgd=dict(noise_multiplier=1.0),
            seed=seed,
            progress=False,
        )
        return [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in refs.models]

    a, b = weights(4), weights(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(weights(5)[0], a[0])
    # reference 1 differs from reference 0 by more than its own initial weights: its own noise too
    assert float((a[0] - a[1]).abs().max()) > 0

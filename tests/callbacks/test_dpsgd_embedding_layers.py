"""Embedding layers Opacus samples wrong or that leak, trained exactly or refused before the first step (issue 48).

- ``nn.EmbeddingBag``: Opacus' sampler wrote a token repeated within a bag once (5 of 6 Poisson-sampled runs wrong in
  both modes; in ghost mode one example added 1.06·C to a step) and failed on a ``[B, L]`` input: the exact sampler
  (:func:`lightning_privacy.dpsgd.samplers.embedding_bag_grad_sample`) equals torch's per-example backward, and the
  clipped sum equals a float64 loop over examples run alone, in hooks and ghost mode.
- ``nn.Embedding(max_norm=...)`` renormalises the looked-up rows in place during the forward pass (a row's norm after
  one step said whether any example held its token): refused in every mode, before any step; so are
  ``scale_grad_by_freq`` (the batch's counts mix examples) and ``EmbeddingBag(mode="max")``.
- ``fix_modules`` on ``BatchNorm1d(8)`` of ``[B, 8]`` features: Opacus' ``GroupNorm(8, 8)`` outputs its bias for
  every input (opacus#567); the warning says so.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd.samplers import embedding_bag_grad_sample
from tests.callbacks.test_dpsgd_exactness import (
    MODES,
    V,
    _Base,
    _data,
    _reference_clipped_sum,
    _SumsBeforeNoise,
    _trainer,
)


class Bag(_Base):
    """Bag-of-tokens classifier: ``nn.EmbeddingBag`` on a ``[B, L]`` input (repeated tokens are common)."""

    def __init__(self, mode: str = "sum"):
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(V, 4, mode=mode), nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(torch.tanh(self.bag(ids)))


class BagWithOffsets(Bag):
    """The same layer called on the flattened tokens with offsets (torch's other form)."""

    def forward(self, ids):
        offsets = torch.arange(ids.shape[0], device=ids.device) * ids.shape[1]
        return self.head(torch.tanh(self.bag(ids.reshape(-1), offsets)))


def _repeats(n=64, seed=0):
    data = _data(n, seed=seed, pad=False)
    ids, y = data.tensors
    ids[::2, :3] = ids[::2, :1]  # every other example repeats its first token three times
    return data


@pytest.mark.parametrize("bag_mode", ["sum", "mean"])
@pytest.mark.parametrize("form", [Bag, BagWithOffsets])
def test_the_bag_sampler_is_torchs_per_example_backward(form, bag_mode):
    torch.manual_seed(0)
    layer = nn.EmbeddingBag(V, 3, mode=bag_mode, padding_idx=0).double()
    ids = torch.tensor([[1, 1, 1, 2], [0, 3, 3, 0], [0, 0, 0, 0]])
    grads = torch.randn(3, 3, dtype=torch.float64)
    expected = []
    for i in range(3):
        layer.zero_grad()
        (layer(ids[i : i + 1]) * grads[i]).sum().backward()
        expected.append(layer.weight.grad.clone())
    inputs = [ids] if form is Bag else [ids.reshape(-1), torch.arange(3) * 4]
    got = embedding_bag_grad_sample(layer, inputs, grads)[layer.weight]
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=1e-12)
    share = 3.0 if bag_mode == "sum" else 3 / 4  # token 1 occurs 3 times in a bag of 4: every occurrence counts
    torch.testing.assert_close(got[0, 1], share * grads[0], rtol=0, atol=1e-12)
    assert not got[1, 0].any() and not got[2].any()  # padding adds nothing (and an all-padding bag nothing at all)


def test_opacus_alone_drops_a_repeated_token():
    """What the sampler corrects (if Opacus fixes it, this test says so and the correction becomes a no-op)."""
    from opacus.grad_sample.embedding import compute_embeddingbag_gradsampler

    layer = nn.EmbeddingBag(4, 2, mode="sum")
    got = compute_embeddingbag_gradsampler(layer, [torch.tensor([1, 1, 2]), torch.tensor([0])], torch.ones(1, 2))
    assert got[layer.weight][0, 1, 0] == 1.0  # torch's gradient for row 1 is 2.0 (it occurs twice)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", [Bag, BagWithOffsets])
def test_embedding_bag_with_repeated_tokens_is_clipped_exactly(mode, form):
    torch.manual_seed(0)
    model = form()
    dpsgd = DPSGD(
        noise_multiplier=1.0, max_grad_norm=0.05, grad_sample_mode=mode, sampling_seed=1, loss_reduction="sum"
    )
    watch = _SumsBeforeNoise(dpsgd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([dpsgd, watch]).fit(model, DataLoader(_repeats(), batch_size=16))
    ids, y = watch.batch
    replay = form()
    replay.load_state_dict(watch.state)
    expected = _reference_clipped_sum(replay, ids, y, 0.05)
    got = dict(zip([n for n, p in model.named_parameters() if p.requires_grad], watch.sums))
    for name, value in expected.items():
        torch.testing.assert_close(got[name].double(), value, rtol=1e-4, atol=1e-6, msg=name)
    assert dpsgd.steps > 0


class _Embedded(_Base):
    def __init__(self, **embedding):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, 4, **embedding), nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("layer", "words"),
    [
        (lambda: _Embedded(max_norm=1.0), "max_norm=1.0 renormalises the looked-up rows"),
        (lambda: _Embedded(scale_grad_by_freq=True), "scale_grad_by_freq=True divides each row's gradient"),
        (lambda: Bag(mode="max"), "mode='max' has no exact per-example gradient"),
    ],
)
def test_leaking_or_unsampled_embeddings_are_refused_before_any_step(layer, words, mode):
    torch.manual_seed(0)
    model = layer()
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0)
    with pytest.raises(MisconfigurationException, match=words) as err:
        _trainer([dpsgd]).fit(model, DataLoader(_data(pad=False), batch_size=16))
    assert "embed" in str(err.value) or "bag" in str(err.value)  # the layer is named
    assert dpsgd.steps == 0
    assert all(torch.equal(v, before[n]) for n, v in model.state_dict().items())  # nothing renormalised


class _BagMaxNorm(Bag):
    def __init__(self, **bag):
        super().__init__()
        self.bag = nn.EmbeddingBag(V, 4, mode="sum", **bag)


class _EmbeddedBeside(_Embedded):
    """:class:`_Embedded` beside a ``nn.Bilinear`` Opacus cannot sample: ``auto`` picks functional mode for it."""

    def __init__(self, **embedding):
        super().__init__(**embedding)
        self.pair = nn.Bilinear(4, 4, 2)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(h.mean(1)) + self.pair(h[:, 0], h[:, -1])


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional", "auto"])
@pytest.mark.parametrize(
    ("layer", "words"),
    [
        (lambda: _Embedded(max_norm=1.0), "max_norm=1.0 renormalises the looked-up rows"),
        (lambda: _Embedded(scale_grad_by_freq=True), "scale_grad_by_freq=True divides each row's gradient"),
        (lambda: _EmbeddedBeside(max_norm=1.0), "max_norm=1.0 renormalises the looked-up rows"),
        (lambda: _EmbeddedBeside(scale_grad_by_freq=True), "scale_grad_by_freq=True divides each row's gradient"),
        (lambda: _BagMaxNorm(max_norm=1.0), "max_norm=1.0 renormalises the looked-up rows"),
        (lambda: _BagMaxNorm(scale_grad_by_freq=True), "scale_grad_by_freq=True divides each row's gradient"),
    ],
    ids=["max_norm", "scale_grad_by_freq", "beside-max_norm", "beside-scale_grad_by_freq", "bag-max_norm",
         "bag-scale_grad_by_freq"],
)  # fmt: skip
def test_leaking_or_mixing_embeddings_are_refused_in_every_mode(layer, words, mode):
    """``max_norm`` leaks through the forward pass and ``scale_grad_by_freq`` mixes the batch's examples whatever
    computes the per-example gradients: functional mode (chosen or picked by ``auto``) refuses them too, and
    ``nn.EmbeddingBag`` as ``nn.Embedding``."""
    torch.manual_seed(0)
    model = layer()
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0)
    with pytest.raises(MisconfigurationException, match=words) as err:
        _trainer([dpsgd]).fit(model, DataLoader(_data(pad=False), batch_size=16))
    assert "`embed`" in str(err.value) or ": embed" in str(err.value) or ": bag" in str(err.value), str(err.value)
    assert dpsgd.steps == 0
    assert all(torch.equal(v, before[n]) for n, v in model.state_dict().items())  # nothing renormalised
    if mode == "auto":  # (decided before the refusal: functional for the model beside a Bilinear)
        assert dpsgd.grad_sample_mode == ("functional" if isinstance(model, _EmbeddedBeside) else "hooks")


def test_max_norm_is_what_leaks():
    """Why it is refused: the forward pass alone changes the weight rows of the tokens it saw."""
    layer = nn.Embedding(V, 4, max_norm=1.0)
    with torch.no_grad():
        layer.weight.mul_(5.0)
    seen = torch.tensor([[1, 2]])
    F.embedding(seen, layer.weight, max_norm=1.0)  # (what nn.Embedding.forward does)
    norms = layer.weight.norm(dim=1)
    assert float(norms[1]) <= 1.0 + 1e-6 and float(norms[3]) > 2.0


def test_fix_modules_gives_batchnorm1d_one_group_so_features_are_kept_and_says_so():
    """Issue 57: Opacus' fix, GroupNorm(8, 8) on [batch, 8] features, erased its input (every output its bias); DPSGD
    now gives BatchNorm1d one group, GroupNorm(1, 8), records the groups and replays them from a checkpoint."""
    from opacus.validators import ModuleValidator

    from lightning_privacy.checkpoints import replay_fixes
    from lightning_privacy.dpsgd.modules import fix_modules_in_place, fixed_modules_record, replacements_warning

    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, eps=1e-3), nn.Linear(8, 2))
    replaced = fix_modules_in_place(model)
    norm = model[1]
    assert isinstance(norm, nn.GroupNorm) and norm.num_groups == 1 and norm.eps == 1e-3
    x = torch.randn(5, 4)
    h = model[0](x)
    expected = (h - h.mean(1, keepdim=True)) / torch.sqrt(h.var(1, unbiased=False, keepdim=True) + 1e-3)
    torch.testing.assert_close(norm(h), expected * norm.weight + norm.bias)  # each example's features together
    assert norm(h).std() > 0.5  # the input kept, not erased
    text = replacements_warning(replaced)
    assert "BatchNorm1d(8) became GroupNorm(1, 8)" in text and "opacus#567" in text and "erases its input" in text
    record = fixed_modules_record(replaced)
    assert record == [{"name": "1", "old": "BatchNorm1d", "new": "GroupNorm", "num_groups": 1}]
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    replay_fixes(fresh, record)
    assert isinstance(fresh[1], nn.GroupNorm) and fresh[1].num_groups == 1
    older = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))  # a record from before: Opacus' fix
    replay_fixes(older, [{"name": "1", "old": "BatchNorm1d", "new": "GroupNorm"}])
    assert older[1].num_groups == ModuleValidator.fix(nn.BatchNorm1d(8)).num_groups == 8
    images = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8))  # other BatchNorms: Opacus' fix, unchanged
    fix_modules_in_place(images)
    assert images[1].num_groups == 8

"""DP-SGD clips each example's whole gradient, or refuses the model before its first step (issue: a weight used
outside its layer let one example add 8·C to a ghost step; padding_idx embeddings were clipped by the wrong norms;
a layer called twice failed in Opacus' words; empty Poisson batches reached Hugging Face models).

The reference everywhere is an independent per-example computation: a loop over examples, each its own forward and
backward pass through the plain module (no Opacus hooks), in float64."""

from __future__ import annotations

import re

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, names
from lightning_privacy.dpsgd import exactness

V, T, D = 11, 6, 8
MODES = ["hooks", "ghost"]


class _Base(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        ids, y = batch
        assert ids.shape[0] > 0, "an empty batch reached the module"
        losses = F.cross_entropy(self(ids), y, reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)


class FunctionalReuse(_Base):
    """``lin.weight`` used by its layer and again through ``F.linear`` (invisible to Opacus' hooks)."""

    def __init__(self):
        super().__init__()
        self.embed, self.lin, self.head = nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, ids):
        h = torch.tanh(self.lin(self.embed(ids).mean(1)))
        return self.head(torch.tanh(F.linear(h, self.lin.weight)))


class TiedHead(_Base):
    """A hand-written language model's output head reusing the token embedding: ``h @ embed.weight.T``."""

    def __init__(self):
        super().__init__()
        self.embed, self.mix = nn.Embedding(V, D), nn.Linear(D, D)

    def forward(self, ids):
        logits = torch.tanh(self.mix(self.embed(ids))) @ self.embed.weight.T  # [B, T, V]
        return logits.mean(1)[:, :2]


class Padded(_Base):
    """``nn.Embedding(padding_idx=0)``, as Llama's ``embed_tokens``: the padding row gets no gradient."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(V, D, padding_idx=0), nn.Linear(D * T, 2)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)).flatten(1))


class CalledTwice(_Base):
    """One Linear layer applied twice in the forward pass."""

    def __init__(self):
        super().__init__()
        self.embed, self.block, self.head = nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, 2)

    def forward(self, ids):
        h = self.embed(ids).mean(1)
        return self.head(torch.tanh(self.block(torch.tanh(self.block(h)))))


def _data(n=64, seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (n, T), generator=g)
    if pad:  # right padding of random length, as a tokenizer pads a batch
        lengths = torch.randint(2, T + 1, (n,), generator=g)
        ids[torch.arange(T).expand(n, T) >= lengths[:, None]] = 0
    return TensorDataset(ids, torch.randint(0, 2, (n,), generator=g))


def _trainer(callbacks, max_epochs=1, **kw):
    return pl.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def _one_sentence(message: str) -> bool:
    return not re.search(r"[.!?] [A-Z]", message) and message.endswith(".")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("cls", "param"), [(FunctionalReuse, "lin.weight"), (TiedHead, "embed.weight")])
def test_a_parameter_used_outside_its_layer_is_refused_before_the_first_step(cls, param, mode):
    torch.manual_seed(0)
    model = cls()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0)
    with pytest.raises(MisconfigurationException, match="exactness check") as err:
        _trainer([dpsgd]).fit(model, DataLoader(_data(), batch_size=16))
    message = str(err.value)
    assert f"`{param}`" in message and "move that use into the layer" in message and "freeze" in message
    assert "grad_sample_mode='functional'" in message  # (the mode that clips such a use exactly)
    assert _one_sentence(message), message
    assert dpsgd.steps == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no step was taken


def _reference_clipped_sum(model, ids, y, max_grad_norm):
    """Σᵢ clip(∇ℓᵢ) by a per-example loop on a float64 copy of the plain module (no hooks)."""
    twin = type(model)().double()
    twin.load_state_dict(model.state_dict())
    params = [p for p in twin.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(ids.shape[0]):
        loss = F.cross_entropy(twin(ids[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, max_grad_norm / (float(norm) + 1e-6))
        total = [t + factor * g for t, g in zip(total, grads)]
    return dict(zip([n for n, p in twin.named_parameters() if p.requires_grad], total))


class _SumsBeforeNoise(Callback):
    """Records the first step's batch and its clipped sums (before the noise), with the weights they came from."""

    def __init__(self, dpsgd):
        self.batch, self.sums, self.state = None, None, None
        dpsgd.register_before_noise_hook(self._hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sums is None:
            self.batch = [t.clone() for t in batch]
            self.state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def _hook(self, optimizer):
        if self.sums is None:
            self.sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]


@pytest.mark.parametrize("mode", MODES)
def test_padding_idx_embedding_is_clipped_exactly_in_both_modes(mode):
    torch.manual_seed(0)
    model = Padded()
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=0.5, grad_sample_mode=mode, sampling_seed=1, loss_reduction="sum")
    watch = _SumsBeforeNoise(dpsgd)
    _trainer([dpsgd, watch]).fit(model, DataLoader(_data(), batch_size=16))
    ids, y = watch.batch
    assert (ids == 0).any()  # the batch held padding
    replay = Padded()
    replay.load_state_dict(watch.state)
    expected = _reference_clipped_sum(replay, ids, y, 0.5)
    got = dict(zip([n for n, p in model.named_parameters() if p.requires_grad], watch.sums))
    for name, value in expected.items():
        assert torch.allclose(got[name].double(), value, atol=1e-5), name
    assert torch.count_nonzero(got["embed.weight"][0]) == 0  # the padding row: no gradient in the clipped sum
    assert dpsgd.exactness.steps == 2 and dpsgd.exactness.max_relative_error < 1e-4


def test_opacus_alone_gets_padding_wrong():
    """What the samplers correct (if Opacus fixes it, the correction becomes a no-op and this test says so)."""
    from opacus.grad_sample import GradSampleHooks

    layer = nn.Embedding(V, 3, padding_idx=0)
    hooks = GradSampleHooks(layer, batch_first=True, loss_reduction="sum")
    layer(torch.tensor([[0, 1, 0]])).sum().backward()
    assert torch.count_nonzero(layer.weight.grad[0]) == 0  # torch: no gradient for the padding row
    assert torch.count_nonzero(layer.weight.grad_sample[0, 0]) > 0  # Opacus: a per-example gradient for it
    hooks.cleanup()


def test_a_layer_called_twice_is_exact_in_hooks_mode_and_refused_by_name_in_ghost_mode():
    torch.manual_seed(0)
    model = CalledTwice()
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode="hooks", sampling_seed=0)
    watch = _SumsBeforeNoise(dpsgd)
    _trainer([dpsgd, watch]).fit(model, DataLoader(_data(pad=False), batch_size=16))
    replay = CalledTwice()
    replay.load_state_dict(watch.state)
    expected = _reference_clipped_sum(replay, *watch.batch, 1.0)
    got = dict(zip([n for n, p in model.named_parameters()], watch.sums))
    assert all(torch.allclose(got[n].double(), v, atol=1e-5) for n, v in expected.items())
    with pytest.raises(MisconfigurationException) as err:
        _trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost")]).fit(
            CalledTwice(), DataLoader(_data(pad=False), batch_size=16)
        )
    message = str(err.value)
    assert "`block` (Linear) ran more than once" in message and "grad_sample_mode='hooks'" in message
    assert _one_sentence(message) and "Parameter tying is not supported" not in message


@pytest.mark.parametrize("mode", MODES)
def test_the_check_records_what_it_compared_and_logs_it(mode):
    torch.manual_seed(0)
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0)
    trainer = _trainer([dpsgd])
    trainer.fit(Padded(), DataLoader(_data(), batch_size=16))
    record = dpsgd.exactness
    assert record.steps == 2 and 16 <= record.examples <= 64
    assert record.reference.startswith(exactness.PER_EXAMPLE_REFERENCE) and "(vmap)" in record.reference
    assert trainer.callback_metrics[names.DP_EXACTNESS_ERROR].item() == pytest.approx(record.max_relative_error)


@pytest.mark.parametrize("mode", MODES)
def test_a_large_batch_is_checked_on_a_uniform_sample_that_still_catches_a_bypass_and_changes_no_weight(mode):
    # a bypass reaches every example that makes the use: 4 of 16 are enough to refuse the model
    with pytest.raises(MisconfigurationException, match=r"`lin\.weight`"):
        _trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0, exactness_examples=4)]).fit(
            FunctionalReuse(), DataLoader(_data(), batch_size=16)
        )
    weights = {}
    for examples in (4, None):
        torch.manual_seed(0)
        model = Padded()
        dpsgd = DPSGD(
            noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0, noise_seed=0, exactness_examples=examples
        )
        _trainer([dpsgd]).fit(model, DataLoader(_data(), batch_size=16))
        record = dpsgd.exactness
        assert record.steps == 2 and record.batch_examples > 8
        assert record.examples == (8 if examples == 4 else record.batch_examples)
        weights[examples] = [p.detach().clone() for p in model.parameters()]
    # the sample comes from the check's own generator: dropout, noise and the user's code see the same global stream
    assert all(torch.equal(a, b) for a, b in zip(weights[4], weights[None]))


def test_checked_rows_and_reference_gradients_of_a_sample():
    assert exactness.checked_rows(8, 8, None) is None and exactness.checked_rows(8, None, None) is None
    counts = torch.zeros(20)
    g = torch.Generator().manual_seed(1)
    for _ in range(2000):
        rows = exactness.checked_rows(20, 5, g)
        assert rows.tolist() == sorted(set(rows.tolist())) and rows.numel() == 5
        counts[rows] += 1
    assert (counts / 2000 - 0.25).abs().max() < 0.04  # each example drawn with probability 5/20
    lin, x = nn.Linear(3, 2).double(), torch.randn(6, 3, dtype=torch.float64)
    losses = lin(x).pow(2).sum(1)
    every = torch.cat([w for _, (w, _), _ in exactness.reference_gradients(losses, [lin.weight, lin.bias])])
    picked = torch.tensor([1, 4, 5])
    chunks = list(exactness.reference_gradients(losses, [lin.weight, lin.bias], rows=picked, chunk=2))
    assert [c[0].tolist() for c in chunks] == [[1, 4], [5]]
    assert torch.allclose(torch.cat([w for _, (w, _), _ in chunks]), every[picked])
    with pytest.raises(MisconfigurationException, match="exactness_examples"):
        DPSGD(noise_multiplier=1.0, exactness_examples=0)
    assert DPSGD(noise_multiplier=1.0).exactness_examples == exactness.MAX_EXAMPLES == 64


class ReducedLoss(FunctionalReuse):
    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.cross_entropy(self(ids), y)


def test_a_reduced_loss_in_hooks_mode_is_checked_by_the_sum_invariant():
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode="hooks", sampling_seed=0)
    with pytest.raises(MisconfigurationException, match=r"`lin\.weight` that DP-SGD clips sum to a gradient") as err:
        _trainer([dpsgd]).fit(ReducedLoss(), DataLoader(_data(), batch_size=16))
    assert _one_sentence(str(err.value))

    class Plain(Padded):
        training_step = ReducedLoss.training_step

    ok = DPSGD(noise_multiplier=1.0, grad_sample_mode="hooks", sampling_seed=0)
    _trainer([ok]).fit(Plain(), DataLoader(_data(), batch_size=16))
    assert ok.exactness.reference == exactness.SUM_INVARIANT and ok.exactness.max_relative_error < 1e-5


def test_a_book_keeping_disagreement_stops_the_fit_instead_of_training_on_the_second_pass(monkeypatch):
    """The self-check of book-keeping runs on the checked steps, and a disagreement is never trained through."""
    from lightning_privacy.dpsgd.bookkeeping import BookKeeping

    real = BookKeeping._linear_sums

    def off(self, layer, *args):
        sums = real(self, layer, *args)
        return {p: s * 1.01 if p.dim() == 2 and p.shape[0] == 2 else s for p, s in sums.items()}  # the head's weight

    monkeypatch.setattr(BookKeeping, "_linear_sums", off)
    torch.manual_seed(0)
    model = Padded()
    before = model.head.weight.detach().clone()
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost", sampling_seed=0)
    with pytest.raises(MisconfigurationException, match=r"book-keeping's clipped sum for `head\.weight`") as err:
        _trainer([dpsgd]).fit(model, DataLoader(_data(), batch_size=16))
    assert _one_sentence(str(err.value)) and "1.0% of its norm" in str(err.value)
    assert dpsgd.steps == 0 and torch.equal(model.head.weight, before)


class EvalInside(Padded):
    def on_train_epoch_start(self):
        self.embed.eval()


@pytest.mark.parametrize("mode", MODES)
def test_a_trainable_layer_put_in_eval_mode_inside_the_fit_is_named(mode):
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode)
    with pytest.raises(
        MisconfigurationException, match=r"trainable layer `embed` \(Embedding\) is in eval mode"
    ) as err:
        _trainer([dpsgd]).fit(EvalInside(), DataLoader(_data(), batch_size=16))
    assert _one_sentence(str(err.value)) and "on_train_epoch_start" in str(err.value)
    assert "No activations" not in str(err.value)


class TokenLosses(Padded):
    """Per-token losses ([B·T]) where DP-SGD needs one loss per sequence."""

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)).flatten(1))[:, None, :].expand(-1, T, -1)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        logits = self(ids)
        return {"loss": F.cross_entropy(logits.reshape(-1, 2), y.repeat_interleave(T), reduction="none")}


@pytest.mark.parametrize("mode", MODES)
def test_token_level_losses_are_refused_in_both_modes_pointing_at_causal_lm_losses(mode):
    dpsgd = DPSGD(noise_multiplier=1.0, grad_sample_mode=mode)
    with pytest.raises(MisconfigurationException, match=r"returned \d+ per-example losses for a batch of \d+") as err:
        _trainer([dpsgd]).fit(TokenLosses(), DataLoader(_data(), batch_size=16))
    assert "causal_lm_losses" in str(err.value) and "not one per token" in str(err.value)
    assert _one_sentence(str(err.value))


def test_the_sum_check_takes_float32_rounding_of_a_cancelling_gradient_for_what_it_is_and_still_finds_a_bypass():
    """Examples' gradients of norm ~1 that cancel in the batch (near an optimum) leave autograd's float32 sum with
    rounding of ~1e-7 where the examples' own sum is ~0: a false alarm in 4 of 150 fits of
    test_fix_modules_trains_batchnorm_attention_and_lstm before the check's floor also took the examples' size (0 of
    200 after). A gradient of 1e-3 that no example accounts for is still a bypass."""
    g = torch.Generator().manual_seed(0)
    per_example = torch.randn(32, 50, generator=g, dtype=torch.float64)
    per_example = per_example / per_example.norm(dim=1, keepdim=True)  # each example's gradient: norm 1
    per_example = per_example - per_example.mean(0)  # ... and they cancel in the batch
    other = torch.nn.Parameter(torch.zeros(50, dtype=torch.float64))
    other.grad = per_example.sum(0) / 32  # ~1e-17: the batch's gradient of this parameter
    dead = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    params, names_ = [other, dead], {id(other): "other", id(dead): "head.1.weight"}
    dead.grad = torch.full((4, 4), 1.327e-7 / 4, dtype=torch.float64)  # autograd's rounding; the examples sum to 0
    samples = [per_example, torch.zeros(32, 4, 4, dtype=torch.float64)]
    exactness.check_summed_gradients(params, samples, names_, loss_reduction="mean", rtol=1e-3)
    dead.grad = torch.full((4, 4), 1e-3 / 4, dtype=torch.float64)  # a gradient no example accounts for: bypassed
    with pytest.raises(MisconfigurationException, match="`head.1.weight` that DP-SGD clips sum to a gradient"):
        exactness.check_summed_gradients(params, samples, names_, loss_reduction="mean", rtol=1e-3)

"""Book-keeping's clipped sum (one backward pass) against the gradient of Σ cᵢ·ℓᵢ, and inside a DPSGD fit."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from opacus.layers import DPMultiheadAttention
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd import bookkeeping
from lightning_privacy.dpsgd.bookkeeping import BookKeeping


class _Text(nn.Module):
    def __init__(self, padding_idx=0, max_norm=None) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 16, padding_idx=padding_idx, max_norm=max_norm)
        self.positions = nn.Embedding(8, 16)
        self.norm = nn.LayerNorm(16)
        self.attention = DPMultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        positions = torch.arange(x.shape[1]).repeat(x.shape[0], 1)  # one row of position ids per example
        h = self.norm(self.tokens(x) + self.positions(positions))
        h = h + self.attention(h, h, h, need_weights=False)[0]
        return self.head(h.mean(1))


def _image():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, padding=1, dilation=1, groups=2), nn.ReLU(),  # torch's weight gradient
        nn.Conv2d(4, 2, 2, padding=(1, 2), padding_mode="reflect", bias=False),  # padded as the layer pads (H, W apart)
        nn.Flatten(), nn.LazyLinear(3),
    )  # fmt: skip


def _mlp():
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3, bias=False))


def _data(kind, n=9):
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 3, (n,), generator=g)
    if kind == "text":
        return torch.randint(0, 50, (n, 8), generator=g), y  # token 0 (padding) appears
    if kind == "image":
        return torch.randn(n, 1, 6, 6, generator=g), y
    return torch.randn(n, 5, generator=g), y


MODELS = {"text": _Text, "image": _image, "mlp": _mlp}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_equals_the_gradient_of_the_weighted_loss(kind, reduction):
    torch.manual_seed(0)
    net = MODELS[kind]()
    x, y = _data(kind)
    net(x)  # (materialises LazyLinear)
    keeper = BookKeeping(net, loss_reduction=reduction)
    assert keeper.supported
    keeper.start()
    losses = F.cross_entropy(net(x), y, reduction="none")
    assert keeper.forward_ready()
    keeper.capturing = True
    (losses.mean() if reduction == "mean" else losses.sum()).backward(retain_graph=True)
    keeper.capturing = False
    assert keeper.ready(len(x))
    c = torch.rand(len(x), generator=torch.Generator().manual_seed(2))
    sums = keeper.clipped_sums(c)
    net.zero_grad()
    (c * losses).sum().backward()
    params = [p for p in net.parameters() if p.requires_grad]
    assert set(sums) == set(params)
    for p in params:
        torch.testing.assert_close(sums[p], p.grad, rtol=1e-5, atol=1e-6)
    if kind == "text":
        assert torch.all(sums[net.tokens.weight][0] == 0)  # the padding row gets no gradient, as in torch
    assert keeper.disagreeing(sums, params) is None  # DPSGD's self-check of book-keeping passes
    last = params[-1]
    sums[last] = sums[last] + 0.01 * last.grad.abs().max() + 1e-4
    assert keeper.disagreeing(sums, params) is last  # and names the parameter whose sum differs
    keeper.remove()


def test_refuses_what_it_cannot_do_exactly():
    assert not BookKeeping(_Text(max_norm=1.0), loss_reduction="sum").supported  # renormalised rows
    assert not BookKeeping(nn.Sequential(nn.LSTM(3, 4)), loss_reduction="sum").supported  # no per-example form
    shared = nn.Linear(4, 4)
    net = nn.Sequential(shared, nn.ReLU(), shared)  # one layer twice in a forward pass: take the second pass
    keeper = BookKeeping(net, loss_reduction="sum")
    keeper.start()
    net(torch.randn(3, 4)).sum().backward()
    assert keeper.supported and not keeper.forward_ready()
    with pytest.raises(ValueError, match="loss_reduction"):
        BookKeeping(net, loss_reduction="none")


class _Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = _Text()

    def training_step(self, batch, batch_idx):
        losses = F.cross_entropy(self.net(batch[0]), batch[1], reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def count_book_kept_sums(monkeypatch) -> dict:
    """``{"sums": n}``, n counting the clipped sums book-keeping forms from here on (steps without a second pass)."""
    calls = {"sums": 0}
    original = BookKeeping.clipped_sums

    def counted(self, coefficients):
        calls["sums"] += 1
        return original(self, coefficients)

    monkeypatch.setattr(BookKeeping, "clipped_sums", counted)
    return calls


def _fit(one_pass: bool, monkeypatch) -> tuple:
    calls = count_book_kept_sums(monkeypatch)
    monkeypatch.setattr(BookKeeping, "_supports", staticmethod(lambda layer: one_pass))
    x, y = _data("text", n=64)
    module = _Module()
    dp = DPSGD(noise_multiplier=0.5, max_grad_norm=0.1, grad_sample_mode="ghost", sampling_seed=3, noise_seed=4)
    trainer = pl.Trainer(max_epochs=2, callbacks=[dp], accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    monkeypatch.undo()
    return [p.detach().clone() for p in module.parameters()], calls["sums"], trainer.global_step


def test_a_fit_with_one_backward_pass_trains_the_same_model(monkeypatch):
    two, used_two, steps = _fit(False, monkeypatch)
    one, used_one, _ = _fit(True, monkeypatch)
    assert used_two == 0 and used_one >= steps - 1  # (an empty Poisson batch forms no sum)
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(one, two))  # another summation order: not a no-op comparison


def test_the_module_docstring_names_the_method():
    assert "Bu, Wang, Zha, Karypis" in bookkeeping.__doc__


def test_the_first_pass_computes_no_weight_gradient():
    torch.manual_seed(0)
    net = _Text()
    keeper = BookKeeping(net, loss_reduction="sum")
    x, y = _data("text")
    computed = []
    for p in net.parameters():
        p.register_hook(lambda g, p=p: computed.append(p))  # fires whenever a weight's gradient is computed
    keeper.start()
    losses = F.cross_entropy(net(x), y, reduction="none")
    targets = keeper.first_pass_targets()
    assert targets is not None and len(targets) == len(keeper._layers)
    keeper.capturing = True
    torch.autograd.grad(losses.sum(), targets, retain_graph=True)
    keeper.capturing = False
    assert computed == [] and keeper.ready(len(x))  # every layer's output gradient, no weight's
    c = torch.rand(len(x))
    sums = keeper.clipped_sums(c)
    (c * losses).sum().backward()
    for p in net.parameters():
        torch.testing.assert_close(sums[p], p.grad, rtol=1e-5, atol=1e-6)
    keeper.start()
    shared = nn.Linear(3, 3)
    again = BookKeeping(nn.Sequential(shared, shared), loss_reduction="sum")
    again.start()
    nn.Sequential(shared, shared)(torch.randn(2, 3))
    assert again.first_pass_targets() is None  # a layer that ran twice: the ordinary first pass

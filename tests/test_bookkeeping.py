"""Book-keeping's clipped sum (one backward pass) against the gradient of Σ cᵢ·ℓᵢ, and inside a DPSGD fit."""

from __future__ import annotations

from pathlib import Path

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
from lightning_privacy.dpsgd.products import float32_product


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


class _Sequence(nn.Module):
    """A linear layer fed by a LayerNorm (float32 input under autocast) and a Hugging Face Conv1D fed by it (bf16)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.norm = nn.LayerNorm(12)
        self.up = nn.Linear(12, 40)
        self.down = Conv1D(5, 40)  # (nf, nx): 40 → 5

    def forward(self, x):
        return self.down(torch.tanh(self.up(self.norm(x)))).mean(1)


def _captured_under_bf16(n=10, positions=24, *, frozen_norm=False):
    """A keeper holding a bf16-autocast first pass of ``_Sequence`` on the CPU, the net, and the clip factors."""
    torch.manual_seed(0)
    net = _Sequence()
    net.norm.requires_grad_(not frozen_norm)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(n, positions, 12, generator=g), torch.randint(0, 5, (n,), generator=g)
    keeper = BookKeeping(net, loss_reduction="sum")
    keeper.start()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = F.cross_entropy(net(x).float(), y, reduction="none")
    keeper.capturing = True
    losses.sum().backward()
    keeper.capturing = False
    assert keeper.ready(n) and keeper._grads[net.up][0].dtype == torch.bfloat16
    return keeper, net, torch.rand(n, generator=g) + 0.1


def _exact(keeper, layer, c):
    """Σᵢ cᵢ·(weight gradient of example i) in float64 from the captures (the input as autocast's layer took it, in
    bfloat16), and the split's bound Σᵢ 2⁻¹⁶cᵢ‖xᵢ‖‖gᵢ‖."""
    x, grad = keeper._inputs[layer][0][0], keeper._grads[layer][0]
    x = x.to(torch.bfloat16).double()
    w = grad.double() * c.double().view(-1, 1, 1)
    total = torch.einsum("npi,npo->io", x, w)
    bound = 2.0**-16 * (c.double() * x.flatten(1).norm(dim=1) * grad.double().flatten(1).norm(dim=1)).sum()
    return (total.t() if type(layer) is nn.Linear else total), float(bound)


def test_split_bf16_products_stay_within_their_stated_bound(monkeypatch):
    """Under bf16 autocast, "split" adds xᵀhi + xᵀlo: within 2⁻¹⁶·Σᵢcᵢ‖xᵢ‖‖gᵢ‖ (plus float32's summation) of the
    exact sum of the products autocast's layers formed; one bf16 product (hi alone) is not."""
    keeper, net, c = _captured_under_bf16()
    float32 = keeper.clipped_sums(c)
    assert keeper.low_precision and keeper.products is None
    monkeypatch.setattr(bookkeeping, "SIXTEEN_BIT_PRODUCTS", "split")
    split = keeper.clipped_sums(c)
    assert keeper.products == "split (emulated in float32)"  # (CUDA's torch.mm(out_dtype=float32) on a GPU)
    for layer in (net.up, net.down):
        exact, bound = _exact(keeper, layer, c)
        accumulation = 1e-6 * float(exact.norm())
        error = float((split[layer.weight].double() - exact).norm())  # (Frobenius, as the bound)
        assert error <= bound + accumulation, (layer, error, bound)
        # one bf16 product (2⁻⁹-relative errors) is beyond the bound
        x, w = keeper._inputs[layer][0][0], keeper._grads[layer][0].float() * c.view(-1, 1, 1)
        x, w = x.reshape(-1, x.shape[-1]).to(torch.bfloat16), w.reshape(-1, w.shape[-1]).to(torch.bfloat16)
        alone = (float32_product(torch.mm, w.t(), x) if type(layer) is nn.Linear
                 else float32_product(torch.mm, x.t(), w)).double()  # fmt: skip
        assert float((alone - exact).norm()) > 3 * (bound + accumulation)  # (measured: 7× on `up`)
        # the float32 products: the same operands (`up`'s float32 input rounded to bfloat16 as autocast did), exact
        torch.testing.assert_close(float32[layer.weight].double(), exact, rtol=1e-5, atol=1e-6)
    for p in (net.norm.weight, net.up.bias, net.down.bias):  # biases and other layers: the float32 sums, either way
        torch.testing.assert_close(split[p], float32[p], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("chunk", [1, 3000, 2**30])  # one example at a time, a few, all at once
def test_slices_of_examples_give_the_same_sum(monkeypatch, chunk):
    keeper, net, c = _captured_under_bf16(n=7)
    whole = keeper.clipped_sums(c)
    monkeypatch.setattr(bookkeeping, "CHUNK_BYTES", chunk)
    sliced = keeper.clipped_sums(c)
    for p in net.parameters():
        torch.testing.assert_close(sliced[p], whole[p], rtol=1e-5, atol=1e-6)


def test_no_temporary_holds_more_than_a_slice_of_examples(monkeypatch):
    """The memory claim: a linear layer's weighted gradients (and cast inputs) are formed ``CHUNK_BYTES`` at a time,
    never as one float32 copy of the whole batch's (GPT-2's head: two such copies, 26 GB at 65,536 tokens before)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and not t._is_view():  # (new memory: not a view or a slice)
                    Largest.bytes = max(Largest.bytes, t.numel() * t.element_size())
            return out

    keeper, net, c = _captured_under_bf16(n=10, positions=24, frozen_norm=True)  # (the linear layers alone)
    one_example = 4 * 24 * (40 + 12)  # float32 bytes of one example's output gradient and input of `up` (the widest)
    monkeypatch.setattr(bookkeeping, "CHUNK_BYTES", 2 * one_example)
    with Largest():
        keeper.clipped_sums(c)
    assert Largest.bytes <= 2 * one_example  # (the whole batch's weighted gradient of `up` alone: 10 · 4 · 24 · 40)
    assert 2 * 65_536 * 50_257 * 4 / 1e9 == pytest.approx(26, abs=0.5)  # (the changelog's GPT-2 head, in GB)


class _TinyTransformer(nn.Module):
    """Embedding → LayerNorm → Conv1D (bf16 under autocast) → Linear head over positions: GPT-2's layer types."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.tokens = nn.Embedding(40, 24)
        self.norm = nn.LayerNorm(24)
        self.mlp = Conv1D(48, 24)
        self.head = nn.Linear(48, 40)

    def forward(self, ids):
        return self.head(torch.tanh(self.mlp(self.norm(self.tokens(ids)))))


def _removal_ratios(norm_sampler=None, n=24, positions=32, clip=1e-3, split=False, dtype=torch.bfloat16):
    """``‖S − S₋ᵢ‖ / C`` for every example i of a bf16-autocast step: DPSGD's ghost hooks (its samplers, or
    ``norm_sampler`` for the linear layers) give the norms and factors, book-keeping the sum ``S`` and, with ``cᵢ = 0``,
    the sum without example i (book-keeping's captures are each example's own). C is small: every example is clipped."""
    from opacus.grad_sample import GradSampleHooksFastGradientClipping
    from transformers.pytorch_utils import Conv1D

    from lightning_privacy.dpsgd.samplers import install_exact_samplers

    torch.manual_seed(0)
    net = _TinyTransformer()
    hooks = GradSampleHooksFastGradientClipping(
        net, batch_first=True, loss_reduction="sum", max_grad_norm=clip, use_ghost_clipping=True
    )
    hooks = install_exact_samplers(hooks)
    if norm_sampler is not None:
        hooks.NORM_SAMPLERS = {**hooks.NORM_SAMPLERS, nn.Linear: norm_sampler, Conv1D: norm_sampler}
    keeper = BookKeeping(net, loss_reduction="sum")
    keeper.start()
    ids = torch.randint(0, 40, (n, positions), generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=dtype):
        logits = net(ids)
    losses = F.cross_entropy(logits.float().flatten(0, 1), ids.roll(-1, 1).flatten(), reduction="none")
    keeper.capturing = True
    losses.view(n, positions).sum(1).sum().backward()
    keeper.capturing = False
    assert keeper.ready(n) and keeper._grads[net.head][0].dtype == dtype  # (16-bit captures)
    norms = hooks.get_norm_sample()
    if split:  # as ghost mode clips: each norm raised by the split products' bound
        norms = norms + keeper.split_overshoot()
    c = (clip / (norms + 1e-6)).clamp(max=1.0)
    assert bool((c < 1).all())
    whole = keeper.clipped_sums(c)
    ratios = []
    for i in range(n):
        without = keeper.clipped_sums(torch.where(torch.arange(n) == i, 0.0, c))
        moved = sum(float((whole[p].double() - without[p].double()).square().sum()) for p in whole) ** 0.5
        ratios.append(moved / clip)
    hooks.cleanup()
    return ratios


def test_the_split_products_bound_is_folded_into_the_clip_factors(monkeypatch):
    """With "split", εᵢ = 2⁻¹⁶·(Σ_layers (‖xᵢ‖‖gᵢ‖)²)^½ (float64 here) raises each norm: removing an example moves the
    sum by at most C again; the split layers are the linear ones with bfloat16 captures."""
    monkeypatch.setattr(bookkeeping, "SIXTEEN_BIT_PRODUCTS", "split")
    keeper, net, c = _captured_under_bf16()
    squares = 0
    for layer in (net.up, net.down):
        x, g = keeper._inputs[layer][0][0].to(torch.bfloat16).double(), keeper._grads[layer][0].double()
        squares = squares + (x.flatten(1).norm(dim=1) * g.flatten(1).norm(dim=1)) ** 2
    torch.testing.assert_close(keeper.split_overshoot().double(), 2.0**-16 * squares.sqrt(), rtol=1e-5, atol=0)
    ratios = _removal_ratios(split=True)
    assert max(ratios) <= 1 + 1e-5 and min(ratios) >= 1 - 1e-3  # (the bound costs under 0.1 % of C here)
    monkeypatch.setattr(bookkeeping, "SIXTEEN_BIT_PRODUCTS", "float32")
    assert keeper.split_overshoot() is None


def test_under_bf16_autocast_removing_one_example_moves_the_book_kept_sum_by_at_most_c():
    """The premise under bf16-mixed: the ghost norm and book-keeping's sum multiply the same 16-bit operands with
    float32 accumulation, so every example's contribution is C up to float32 rounding; Opacus' linear norm (Gram
    matrices rounded to bfloat16) let an example add up to 1.004·C here."""
    from opacus.grad_sample.linear import compute_linear_norm_sample

    for dtype in (torch.bfloat16, torch.float16):  # (fp16 autocast: its products are exact in float32 too)
        ratios = _removal_ratios(dtype=dtype)
        assert max(ratios) <= 1 + 1e-5 and min(ratios) >= 1 - 1e-5, dtype
    opacus = _removal_ratios(compute_linear_norm_sample)
    assert max(opacus) > 1 + 1e-3
    guide = " ".join((Path(__file__).parents[1] / "docs" / "guides" / "dpsgd.md").read_text(encoding="utf-8").split())
    assert "‖S − S₋ᵢ‖/C within 1 ± 10⁻⁵" in guide and f"let one add {max(opacus):.3f}·C" in guide
    changelog = " ".join((Path(__file__).parents[1] / "CHANGELOG.md").read_text(encoding="utf-8").split())
    assert f"an example of a bf16 step added up to {max(opacus):.3f}·C" in changelog


def test_a_bf16_ghost_fit_with_split_products_clips_with_the_raised_norms(monkeypatch):
    """Inside DPSGD (bf16-mixed, ghost): with "split" the clip factors see each norm plus its εᵢ > 0; with the float32
    products the norms as they are. The model's attention key bias sums to about zero (softmax ignores it): its
    second pass is 16-bit noise, which the self-check took for a disagreement and stopped the fit before."""
    from lightning_privacy.dpsgd import ghost_mode

    passed = []
    real = ghost_mode.clip_factors

    def seen(norms, max_grad_norm, rule=None):
        passed.append(norms.detach().clone())
        return real(norms, max_grad_norm, rule)

    monkeypatch.setattr(ghost_mode, "clip_factors", seen)
    raised = {}
    for products in ("float32", "split"):
        monkeypatch.setattr(bookkeeping, "SIXTEEN_BIT_PRODUCTS", products)
        passed.clear()
        x, y = _data("text", n=32)
        dp = DPSGD(noise_multiplier=0.5, max_grad_norm=0.1, grad_sample_mode="ghost", sampling_seed=3)
        norms = []

        class Watch(pl.Callback):
            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                norms.append(dp._backward.last_norms.clone())

        trainer = pl.Trainer(max_epochs=1, callbacks=[dp, Watch()], accelerator="cpu", logger=False,
                             precision="bf16-mixed", enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)  # fmt: skip
        trainer.fit(_Module(), DataLoader(TensorDataset(x, y), batch_size=16))
        assert len(passed) == len(norms) == trainer.global_step > 0
        raised[products] = [float((a - b).min()) for a, b in zip(passed, norms)]
    assert all(r > 0 for r in raised["split"]) and all(r == 0 for r in raised["float32"])


def test_the_16_bit_self_check_allows_rounding_of_the_step_not_a_wrong_parameter():
    """Under 16-bit the self-check allows 2⁻⁸ of the whole step's gradient norm (a sum that cancels to about zero is
    rounding noise in the second pass) and still names a parameter off by more."""
    keeper, net, c = _captured_under_bf16()
    sums = keeper.clipped_sums(c)
    params = list(net.parameters())
    for p in params:
        p.grad = sums[p].clone()
    assert keeper.low_precision and keeper.disagreeing(sums, params) is None
    whole = sum(float(p.grad.square().sum()) for p in params) ** 0.5
    sums[net.down.bias] = torch.zeros_like(net.down.bias)  # a sum that cancels to zero (an attention key's bias),
    net.down.bias.grad = torch.zeros_like(net.down.bias)
    net.down.bias.grad[0] = 0.5 * 2.0**-8 * whole  # and the second pass's 16-bit noise of it
    assert keeper.disagreeing(sums, params) is None
    keeper.low_precision = False  # (float32's tolerance, relative to the parameter's own sum: named)
    assert keeper.disagreeing(sums, params) is net.down.bias
    keeper.low_precision = True
    net.down.bias.grad[0] = 4 * 2.0**-8 * whole  # beyond the step's 16-bit rounding: named
    assert keeper.disagreeing(sums, params) is net.down.bias
    net.down.bias.grad.zero_()
    net.up.weight.grad = sums[net.up.weight] * 2  # a parameter with twice its sum: named
    assert keeper.disagreeing(sums, params) is net.up.weight

"""DPSGD(grad_sample_mode="ghost"): the same clipped and noised updates as hooks, the per-example-loss contract, checks."""

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.grad_sample import GradSampleHooksFastGradientClipping
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD, _compat, names
from tests.callbacks._architectures import (
    ImageCNN,
    PerExampleLoss,
    TokenLSTM,
    TokenTransformer,
    digit_datasets,
    token_datasets,
)
from tests.callbacks._tiny import tiny_loader, tiny_module, trainer

SIGMA, C = 1.0, 0.5


class MLP(PerExampleLoss):
    def __init__(self, lr=0.5):
        super().__init__(lr)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)


class Reduced(MLP):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])


class Recorder(Callback):
    """Records each step's clipped sum (before noise) and noised gradient (after the optimizer step)."""

    def __init__(self, dpsgd):
        self.clipped, self.noised = [], []
        dpsgd.register_before_noise_hook(lambda opt: self.clipped.append([p.summed_grad.clone() for p in opt.params]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.noised.append([p.grad.clone() for p in pl_module.parameters() if p.requires_grad])


def _run(make, data, mode, *, dtype=torch.float64, epochs=1, extra=(), **dpsgd):
    torch.manual_seed(0)
    model = make().to(dtype)
    dp = DPSGD(noise_multiplier=SIGMA, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=0, noise_seed=0, **dpsgd)
    recorder = Recorder(dp)
    pl.seed_everything(1, verbose=False)  # same noise draws in both modes (sampling_seed: same batches)
    t = trainer([dp, recorder, *extra], max_epochs=epochs)
    t.fit(model, train_dataloaders=DataLoader(data, batch_size=32))
    return t, dp, recorder, model


def tabular64():
    """The tiny tabular data in float64."""
    return TensorDataset(*(t.double() if t.is_floating_point() else t for t in tiny_loader().dataset.tensors))


ARCHITECTURES = {
    "mlp": (MLP, tabular64),
    "cnn_groupnorm": (ImageCNN, lambda: digit_datasets(dtype=torch.float64)[0]),
    "embedding_attention": (TokenTransformer, lambda: token_datasets()[0]),
    "dplstm": (TokenLSTM, lambda: token_datasets()[0]),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_ghost_and_hooks_give_identical_clipped_and_noised_updates(arch):
    make, data = ARCHITECTURES[arch]
    hooks = _run(make, data(), "hooks")
    ghost = _run(make, data(), "ghost")
    assert hooks[0].global_step == ghost[0].global_step == len(hooks[2].noised) > 0
    for name in ("clipped", "noised"):
        for step_h, step_g in zip(getattr(hooks[2], name), getattr(ghost[2], name)):
            for a, b in zip(step_h, step_g):
                assert a.dtype == b.dtype == torch.float64
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert hooks[1].ledger.history == ghost[1].ledger.history  # same accounting
    assert hooks[1].epsilon() == ghost[1].epsilon()
    for model in (hooks[3], ghost[3]):
        assert "backward" not in vars(model)  # the module's own backward is back after fit


def test_clipping_telemetry_is_the_same_in_both_modes(tmp_path):
    results = []
    for mode in ("hooks", "ghost"):
        t, *_ = _run(MLP, tabular64(), mode, log_clipping=True, clipping_every_n_steps=1)  # every step in both
        results.append(
            (t.callback_metrics[names.DP_CLIP_FRACTION].item(), t.callback_metrics[names.DP_GRAD_NORM_MEDIAN].item())
        )
    assert results[0] == pytest.approx(results[1], rel=1e-9)


def test_a_reduced_loss_is_refused_naming_what_was_returned():
    with pytest.raises(
        MisconfigurationException,
        match=r"must return one loss per example.*returned a reduced loss \(a tensor of shape \[\]\)",
    ):
        _run(Reduced, tabular64(), "ghost")


def test_losses_of_another_shape_are_refused():
    class Column(MLP):
        def training_step(self, batch, batch_idx):
            return {"loss": F.cross_entropy(self(batch[0]), batch[1], reduction="none")[:, None]}

    with pytest.raises(MisconfigurationException, match=r"returned a tensor of shape \[\d+, 1\]"):
        _run(Column, tabular64(), "ghost")

    class TooFew(MLP):
        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch[0]), batch[1], reduction="none")[:1]

    with pytest.raises(
        MisconfigurationException, match=r"returned 1 per-example losses for a batch of \d+ examples.*causal_lm_losses"
    ):
        _run(TooFew, tabular64(), "ghost")


def test_hooks_mode_takes_a_reduced_loss_or_per_example_losses_and_refuses_others():
    _run(Reduced, tabular64(), "hooks")  # the usual reduced loss, as before

    class Matrix(MLP):
        def training_step(self, batch, batch_idx):
            return self(batch[0])

    with pytest.raises(MisconfigurationException, match=r"reduced loss or one loss per example.*shape \[\d+, 2\]"):
        _run(Matrix, tabular64(), "hooks")


def test_an_overridden_backward_is_refused_in_ghost_mode():
    class OwnBackward(MLP):
        def backward(self, loss, *args, **kwargs):
            loss.sum().backward()

    with pytest.raises(MisconfigurationException, match="overrides `backward`"):
        _run(OwnBackward, tabular64(), "ghost")


def test_an_unused_trainable_parameter_is_named():
    class Unused(MLP):
        def __init__(self):
            super().__init__()
            self.spare = nn.Linear(8, 2)

    with pytest.raises(
        MisconfigurationException, match=r"`spare\.weight`, `spare\.bias` got no per-example gradient norm"
    ):
        _run(Unused, tabular64(), "ghost")


def test_wrong_ghost_norms_are_caught_by_the_self_check(monkeypatch):
    real = GradSampleHooksFastGradientClipping.NORM_SAMPLERS[nn.Linear]

    def halved(layer, activations, backprops):
        return {p: n / 2 for p, n in real(layer, activations, backprops).items()}

    monkeypatch.setitem(GradSampleHooksFastGradientClipping.NORM_SAMPLERS, nn.Linear, halved)
    with pytest.raises(
        MisconfigurationException, match=r"ghost clipping clipped example \d+ with a norm of `net\.0\.weight`"
    ):
        _run(MLP, tabular64(), "ghost")


class Bag(PerExampleLoss):
    """Embedding (whose opacus 1.6.0 ghost norm fails on zero rows) + Linear."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(12, 4), nn.Linear(4 * 6, 2)

    def forward(self, tokens):
        return self.head(self.embed(tokens).flatten(1))


def test_empty_poisson_batches_are_noised_and_accounted():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 12, (8, 6), generator=g), torch.randint(0, 2, (8,), generator=g))
    torch.manual_seed(0)
    dp = DPSGD(noise_multiplier=SIGMA, grad_sample_mode="ghost")
    sizes, updates = [], []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sizes.append(batch[0].shape[0])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            updates.append(float(pl_module.head.weight.grad.norm()))

    t = trainer([dp, Watch()], max_epochs=4)
    t.fit(Bag(), train_dataloaders=DataLoader(data, batch_size=1))
    assert 0 in sizes and max(sizes) > 0
    assert dp.steps == t.global_step == len(sizes)
    assert all(u > 0 for u in updates)  # empty batches too: the noise is still added


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true"])
def test_ghost_warns_under_16_bit_unless_its_sum_is_exact(tmp_path, precision):
    """16-bit autocast with layers whose norms and book-kept sums multiply the same operands in float32 (Linear,
    Conv1D, Embedding, LayerNorm: test_bookkeeping's removal test) is bounded up to float32 rounding; a convolution
    (Opacus' 16-bit per-example gradients) or 16-bit parameters only up to 16-bit rounding."""
    # (ghost under DDP is supported: test_dpsgd_sampling.py::test_ghost_equals_hooks_under_ddp)
    exact = precision in ("bf16-mixed", "16-mixed")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        if precision == "16-mixed":  # (fp16 autocast with a GradScaler, as on a GPU)
            scaler = torch.amp.GradScaler("cpu")
            t = trainer([], tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
        else:
            t = trainer([], tmp_path, precision=precision)
        assert str(t.precision) == precision
        DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost").setup(t, tiny_module(), "fit")
    assert any("only up to 16-bit rounding" in str(w.message) for w in record) != exact
    if exact:
        t = trainer([], tmp_path, precision=precision)
        convolution = tiny_module()
        convolution.conv = nn.Conv1d(1, 2, 3)  # (a trainable layer of another type is enough)
        with pytest.warns(UserWarning, match="only up to 16-bit rounding"):
            DPSGD(noise_multiplier=1.0, grad_sample_mode="ghost").setup(t, convolution, "fit")


def test_a_16_bit_step_without_book_keeping_is_said_once(monkeypatch):
    """Setup said float32 rounding (bf16 autocast, Linear layers); a step whose sum a second 16-bit pass forms says so."""
    from lightning_privacy.dpsgd.bookkeeping import BookKeeping

    monkeypatch.setattr(BookKeeping, "ready", lambda self, batch_size: False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        t = trainer([DPSGD(noise_multiplier=SIGMA, max_grad_norm=C, grad_sample_mode="ghost")], max_epochs=2,
                    precision="bf16-mixed")  # fmt: skip
        t.fit(MLP(), train_dataloaders=tiny_loader())
    said = [str(w.message) for w in record if "book-keeping could not form" in str(w.message)]
    assert t.global_step > 2 and len(said) == 1 and "at step 0" in said[0] and "16-bit rounding" in said[0]
    assert not [w for w in record if "under precision=" in str(w.message)]  # (setup: no 16-bit warning)


def test_bad_grad_sample_mode():
    with pytest.raises(MisconfigurationException, match="`grad_sample_mode` must be one of"):
        DPSGD(noise_multiplier=1.0, grad_sample_mode="functorch")


def test_norm_sample_attribute_fails_loudly_if_opacus_renames_it():
    """_compat reads Opacus' private ``param._norm_sample``: a ghost backward must leave it, of batch size."""
    layer = nn.Linear(3, 2)
    hooks = GradSampleHooksFastGradientClipping(layer, max_grad_norm=1.0, loss_reduction="sum")
    x = torch.randn(5, 3)
    F.cross_entropy(layer(x), torch.zeros(5, dtype=torch.long), reduction="sum").backward()
    for p in layer.parameters():
        assert _compat.norm_sample(p) is not None and _compat.norm_sample(p).shape == (5,)
    torch.testing.assert_close(
        hooks.get_norm_sample(), torch.stack([_compat.norm_sample(p) for p in layer.parameters()]).norm(dim=0)
    )
    for p in layer.parameters():
        _compat.clear_norm_sample(p)
        assert _compat.norm_sample(p) is None
    hooks.cleanup()


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_torchs_full_backward_hook_warning_is_silenced_only_in_dpsgds_backward(mode):
    """Opacus' hooks on the first layer (input: data) make torch warn at every fit; only that warning, only there."""
    model = MLP() if mode == "ghost" else tiny_module()

    def first_layer_hook(module, grad_input, grad_output):  # a user's own full backward hook, outside DPSGD
        return None

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")  # (pyproject's filterwarnings ignores this warning in every other test)
        trainer([DPSGD(noise_multiplier=SIGMA, max_grad_norm=C, grad_sample_mode=mode)], max_epochs=1).fit(
            model, train_dataloaders=tiny_loader()
        )
        during_fit = [str(w.message) for w in record]
        plain = nn.Linear(8, 2)
        plain.register_full_backward_hook(first_layer_hook)
        plain(torch.randn(4, 8)).sum().backward()  # the same warning after the fit: the filter did not outlive it
    assert not [m for m in during_fit if m.startswith("Full backward hook is firing")]
    assert [str(w.message) for w in record[len(during_fit) :] if "Full backward hook is firing" in str(w.message)]


class BothLosses(MLP):
    """Returns the reduced loss for a plain Trainer and the per-example losses for DPSGD, with no switch."""

    def training_step(self, batch, batch_idx):
        losses = F.cross_entropy(self(batch[0]), batch[1], reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_one_module_trains_unchanged_with_and_without_dpsgd(mode):
    """The issue: the per-example loss vector ghost mode wants made a plain Trainer fail, so users kept a switch."""
    torch.manual_seed(0)
    plain = BothLosses().double()
    trainer([], max_epochs=1).fit(plain, train_dataloaders=DataLoader(tabular64(), batch_size=32))  # takes "loss"
    runs = [_run(cls, tabular64(), mode) for cls in (BothLosses, MLP)]  # MLP returns the per-example losses itself
    for _, dp, _, model in runs:
        assert dp.steps > 0 and "training_step" not in vars(model)  # the module's own training_step is back
    weights = [torch.cat([p.detach().flatten() for p in model.parameters()]) for *_, model in runs]
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=1e-9)  # the same DP-SGD training

"""DPSGD(fix_modules=True): Opacus' fixers applied in setup, in place, with a warning listing them."""

import re

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.layers import DPLSTM, DPMultiheadAttention
from opacus.validators import ModuleValidator
from opacus.validators.errors import UnsupportedModuleError
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.dpsgd.modules import (
    attention_fix_changes_outputs,
    fix_modules_in_place,
    replacements_warning,
)
from tests.callbacks._architectures import VOCAB, token_datasets
from tests.callbacks._tiny import trainer


class Unfixed(pl.LightningModule):
    """BatchNorm, nn.MultiheadAttention and nn.LSTM: three layers DP-SGD cannot train as they are."""

    def __init__(self, width=8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.attention = nn.MultiheadAttention(width, 2, batch_first=True)
        self.lstm = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.attention(h, h, h, need_weights=False)[0]
        out, _ = self.lstm(h)
        return self.head(out[:, -1])

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def test_fix_modules_trains_batchnorm_attention_and_lstm():
    torch.manual_seed(0)
    model = Unfixed()
    embed, lstm_state = model.embed, {k: v.clone() for k, v in model.lstm.state_dict().items()}
    dp = DPSGD(noise_multiplier=1.0, fix_modules=True)
    t = trainer([dp], max_epochs=2)
    with pytest.warns(UserWarning, match="replaced 3 module") as record:
        t.fit(model, train_dataloaders=DataLoader(token_datasets()[0], batch_size=32))
    message = next(str(w.message) for w in record if "replaced 3 module" in str(w.message))
    assert "opacus#825" in message  # batch-first attention with 2 heads: opacus 1.6.0's replacement differs
    for listed in (
        "attention (MultiheadAttention → DPMultiheadAttention)",
        "lstm (LSTM → DPLSTM)",
        "head.1 (BatchNorm1d → GroupNorm)",
    ):
        assert listed in message
    assert isinstance(model.attention, DPMultiheadAttention) and isinstance(model.lstm, DPLSTM)
    assert isinstance(model.head[1], nn.GroupNorm)
    assert model.embed is embed  # untouched modules keep their identity
    assert t.global_step > 0 and dp.steps == t.global_step
    # the optimizer trained the replacements: the DPLSTM started from the LSTM's weights and moved
    assert not torch.equal(model.lstm.state_dict()["weight_ih_l0"], lstm_state["weight_ih_l0"])


def test_without_fix_modules_the_same_model_is_a_clear_error():
    with pytest.raises(MisconfigurationException, match=r"DPSGD\(fix_modules=True\)"):
        trainer([DPSGD(noise_multiplier=1.0)], max_epochs=1).fit(
            Unfixed(), train_dataloaders=DataLoader(token_datasets()[0], batch_size=32)
        )


def test_fixed_lstm_and_attention_keep_weights_dtype_and_outputs():
    torch.manual_seed(0)
    model = nn.ModuleDict(
        {"attention": nn.MultiheadAttention(8, 2, batch_first=False), "lstm": nn.LSTM(8, 8, batch_first=True)}
    ).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    before = (model["attention"](x, x, x)[0], model["lstm"](x)[0])
    replaced = fix_modules_in_place(model)
    assert [r.name for r in replaced] == ["attention", "lstm"] and not any(r.caveat for r in replaced)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    torch.testing.assert_close(model["attention"](x, x, x)[0], before[0])
    torch.testing.assert_close(model["lstm"](x)[0], before[1])


def test_batch_first_attention_caveat_follows_what_opacus_computes():
    """The caveat is probed, not pinned to a version: it is there exactly when the outputs differ."""
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(3, 5, 8)
    before = layer(x, x, x)[0]
    holder = nn.ModuleDict({"attention": layer})
    (replaced,) = fix_modules_in_place(holder)
    differs = not torch.allclose(holder["attention"](x, x, x)[0], before, atol=1e-5)
    assert bool(replaced.caveat) == differs == attention_fix_changes_outputs()
    state = torch.random.get_rng_state()
    attention_fix_changes_outputs.cache_clear()
    attention_fix_changes_outputs()
    assert torch.equal(torch.random.get_rng_state(), state)  # the probe leaves the user's seed alone


def test_frozen_layers_are_left_alone_and_the_flag_is_checked():
    frozen = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    frozen[1].requires_grad_(False)
    assert fix_modules_in_place(frozen) == [] and isinstance(frozen[1], nn.BatchNorm1d)
    with pytest.raises(MisconfigurationException, match="`fix_modules` must be True or False, got 1"):
        DPSGD(noise_multiplier=1.0, fix_modules=1)


def test_the_state_records_what_was_replaced_and_the_training_set_size_across_a_resume(tmp_path):
    """Saved as plain strings and an int (checkpoints load weights-only); a resumed fit records them again."""
    listed = [
        {"name": "attention", "old": "MultiheadAttention", "new": "DPMultiheadAttention"},
        {"name": "lstm", "old": "LSTM", "new": "DPLSTM"},
        {"name": "head.1", "old": "BatchNorm1d", "new": "GroupNorm", "num_groups": 1},
    ]
    assert DPSGD(noise_multiplier=1.0).state_dict()["fixed_modules"] == []  # nothing replaced before a fit
    data = token_datasets(n_train=96)[0]
    dp = DPSGD(noise_multiplier=1.0, fix_modules=True, sampling_seed=0)
    t = trainer([dp], tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match="replaced 3 module"):
        t.fit(Unfixed(), train_dataloaders=DataLoader(data, batch_size=32))
    path = tmp_path / "fixed.ckpt"
    t.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["callbacks"][dp.state_key]
    assert (state["fixed_modules"], state["dataset_size"]) == (listed, 96)
    resumed = DPSGD(noise_multiplier=1.0, fix_modules=True, sampling_seed=0)
    with pytest.warns(UserWarning, match="replaced 3 module"):
        trainer([resumed], tmp_path, max_epochs=2).fit(
            Unfixed(), train_dataloaders=DataLoader(data, batch_size=32), ckpt_path=str(path)
        )
    assert resumed.steps > dp.steps
    assert (resumed.state_dict()["fixed_modules"], resumed.state_dict()["dataset_size"]) == (listed, 96)


class ResNetStyle(pl.LightningModule):
    """Four BatchNorm2d in nested blocks and one attention layer: the error names each once."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"conv": nn.Conv2d(8, 8, 3, padding=1), "bn1": nn.BatchNorm2d(8), "bn2": nn.BatchNorm2d(8)})
            for _ in range(2)
        )
        self.pool = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 10)

    def training_step(self, batch, batch_idx):  # never reached: setup refuses the model
        raise AssertionError

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _setup_error(model, **dpsgd) -> str:
    data = DataLoader(token_datasets()[0], batch_size=32)
    with pytest.raises(MisconfigurationException) as info:
        trainer([DPSGD(noise_multiplier=1.0, **dpsgd)], max_epochs=1).fit(model, train_dataloaders=data)
    return str(info.value)


def test_the_validator_error_puts_the_fix_first_and_names_each_layer_once_with_its_replacement():
    message = _setup_error(ResNetStyle(), grad_sample_mode="hooks")
    assert message.startswith("Pass `DPSGD(fix_modules=True)`: it replaces the 6 layers of ResNetStyle")
    batch_norms = ["stem.1", "blocks.0.bn1", "blocks.0.bn2", "blocks.1.bn1", "blocks.1.bn2"]
    assert f"BatchNorm2d → GroupNorm: {', '.join(batch_norms)}." in message
    assert "MultiheadAttention → DPMultiheadAttention: pool." in message
    for name in [*batch_norms, "pool"]:  # each layer once, Opacus' paragraph not at all
        assert len(re.findall(rf"(?<![\w.]){re.escape(name)}(?!\w|\.\w)", message)) == 1, name
    assert "GN-ResNet" not in message and message.count("BatchNorm normalises") == 1
    assert len(message) < 800
    # the default (auto) trains attention in functional mode: only the batch statistics are refused
    message = _setup_error(ResNetStyle())
    assert message.startswith("Pass `DPSGD(fix_modules=True)`: it replaces the 5 layers of ResNetStyle")
    assert f"BatchNorm2d → GroupNorm: {', '.join(batch_norms)}." in message and "MultiheadAttention" not in message


def test_an_attention_model_is_not_told_about_batchnorm():
    holder = ResNetStyle()
    holder.stem, holder.blocks = nn.Conv2d(1, 8, 3), nn.ModuleList()
    message = _setup_error(holder, grad_sample_mode="hooks")
    assert "BatchNorm" not in message and "GroupNorm" not in message
    assert message.startswith("Pass `DPSGD(fix_modules=True)`: it replaces the 1 layer of ResNetStyle")
    assert "MultiheadAttention → DPMultiheadAttention: pool." in message


class Gated(nn.Linear):
    """A layer with a (test-registered) Opacus validator and no fixer."""


def test_a_layer_without_replacement_is_named_and_fix_modules_is_not_suggested_again(monkeypatch):
    monkeypatch.setitem(
        ModuleValidator.VALIDATORS, Gated, lambda module: [UnsupportedModuleError("Gated layers mix examples. Long.")]
    )
    model = ResNetStyle()
    model.head = Gated(8, 10)
    with pytest.warns(UserWarning, match="replaced 6 module"):
        message = _setup_error(model, fix_modules=True)
    assert message.startswith(
        "ResNetStyle has 1 layer DP-SGD cannot train after DPSGD(fix_modules=True) and Opacus has no replacement"
    )
    assert "- Gated (no replacement): head. Gated layers mix examples." in message
    assert "Pass `DPSGD(fix_modules=True)`" not in message


def test_a_model_left_in_eval_mode_is_told_to_call_train():
    model = ResNetStyle()
    model.eval()
    message = _setup_error(model, grad_sample_mode="hooks")
    assert message.endswith("Also: ResNetStyle is in eval mode: call `model.train()` before `fit`.")


def test_the_warning_speaks_of_fresh_weights_only_for_layers_that_lost_their_trained_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(4, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4))
    with torch.no_grad():
        model[2].weight.uniform_(0.5, 1.5)  # a trained BatchNorm: its scale cannot be carried over to GroupNorm
    replaced = fix_modules_in_place(model)
    assert [(r.name, r.fresh) for r in replaced] == [("0", False), ("1", False), ("2", True)]
    warning = replacements_warning(replaced)
    assert "2 starts from GroupNorm's initial weights: its trained values could not be carried over." in warning
    lstm_only = replacements_warning(fix_modules_in_place(nn.Sequential(nn.LSTM(4, 4))))
    assert lstm_only == "DPSGD(fix_modules=True) replaced 1 module(s) DP-SGD cannot train: 0 (LSTM → DPLSTM)."


def test_the_warning_of_a_fit_with_attention_and_lstm_says_nothing_of_batchnorm():
    model = Unfixed()
    model.head = nn.Sequential(nn.Linear(8, 2))
    with pytest.warns(UserWarning, match="replaced 2 module") as record:
        trainer([DPSGD(noise_multiplier=1.0, fix_modules=True)], max_epochs=1, max_steps=1).fit(
            model, train_dataloaders=DataLoader(token_datasets()[0], batch_size=32)
        )
    message = next(str(w.message) for w in record if "replaced 2 module" in str(w.message))
    assert "BatchNorm" not in message and "fresh" not in message and "initial weights" not in message


class _ReflectPadded(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"), nn.Flatten(), nn.Linear(50, 2))

    def training_step(self, batch, batch_idx):
        losses = F.cross_entropy(self.net(batch[0]), batch[1], reduction="none")
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_convolution_opacus_differentiates_wrongly_is_refused():
    model = _ReflectPadded()
    x = torch.randn(3, 1, 5, 5)
    # what Opacus' hooks compute for this layer is not its per-example gradient (the reason for the refusal)
    from opacus.grad_sample import GradSampleModule

    conv = model.net[0]
    truth = torch.stack([torch.autograd.grad(model.net(x[i : i + 1]).sum(), conv.weight)[0] for i in range(3)])
    hooked = GradSampleModule(model.net)
    hooked(x).sum().backward()
    assert not torch.allclose(conv.weight.grad_sample, truth, atol=1e-3)
    hooked._close()
    data = torch.utils.data.TensorDataset(torch.randn(64, 1, 5, 5), torch.randint(0, 2, (64,)))
    for mode in ("hooks", "ghost"):
        with pytest.raises(MisconfigurationException, match=r"net\.0\. Opacus computes a convolution's per-example"):
            trainer([DPSGD(noise_multiplier=1.0, grad_sample_mode=mode)], max_epochs=1).fit(
                _ReflectPadded(), train_dataloaders=DataLoader(data, batch_size=16)
            )

"""The CUDA paths (issue 40): ghost = hooks, book-keeping under bf16 autocast, the noise's law and seeding, Poisson
batches, the attribute monitor, the canary audit and a DP-LoRA fine-tune of a GPT-2-sized model, all on a GPU.

Marked ``cuda`` and skipped without CUDA; ``make gpu-check`` (``benchmarks/gpu_check.py``) runs them on a GPU with
``pytest -m cuda tests``. ``LIGHTNING_PRIVACY_TEST_DEVICE=cpu`` runs the same tests on the CPU (their logic only,
for development: it proves nothing about CUDA).
"""

from __future__ import annotations

import os
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD, AttributeInferenceMonitor, CanaryAudit
from lightning_privacy.dpsgd.bookkeeping import BookKeeping
from lightning_privacy.dpsgd.noise import NoiseSource
from lightning_privacy.functional.attribute_sensitivity import attribute_sensitivity, sensitivity_rounding_allowance
from lightning_privacy.functional.attributes import SensitiveAttribute
from lightning_privacy.models import TabularMLP
from tests.callbacks._architectures import PerExampleLoss
from tests.callbacks._tiny import D, tiny_dataset, tiny_loader
from tests.callbacks._tiny import trainer as cpu_trainer

DEVICE = os.environ.get("LIGHTNING_PRIVACY_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore:AttributeInferenceMonitor.*Section 5.3"),
    pytest.mark.filterwarnings("ignore:DPSGD\\(grad_sample_mode='ghost'\\) under precision"),
]
SIGMA, C = 1.0, 0.5


def trainer(callbacks, **kwargs) -> pl.Trainer:
    return cpu_trainer(callbacks, accelerator="gpu" if DEVICE == "cuda" else "cpu", **kwargs)


class MLP(PerExampleLoss):
    def __init__(self) -> None:
        super().__init__(lr=0.5)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)


class _TrainingDevices(Callback):
    """The device types of the module's parameters at the end of training (before the strategy's teardown)."""

    def __init__(self) -> None:
        self.seen: set = set()

    def on_train_end(self, trainer, pl_module):
        self.seen = {p.device.type for p in pl_module.parameters()}


class Recorder(Callback):
    """Each step's clipped sum (before the noise), the noise itself and the noised gradient, and the batches' device."""

    def __init__(self, dpsgd: DPSGD) -> None:
        self.clipped, self.noise, self.noised, self.devices, self.rows = [], [], [], set(), []
        dpsgd.register_before_noise_hook(self._before)
        self._optimizer = None

    def _before(self, optimizer) -> None:
        self._optimizer = optimizer
        self.clipped.append([optimizer.summed(p).detach().clone() for p in optimizer.params])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        first = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        self.devices.add(first.device.type)
        self.rows.append(int(first.shape[0]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        opt = self._optimizer
        grads = [p.grad.detach().clone() for p in opt.params]
        self.noised.append(grads)
        scale = opt.expected_batch_size if opt.loss_reduction == "mean" else 1
        self.noise.append(torch.cat([(g * scale - s).flatten() for g, s in zip(grads, self.clipped[-1])]))


def _language_model(kind: str, lora: bool):
    """A fresh one-layer GPT-2 or Llama (``tests/callbacks/_language_models.py``), LoRA or full."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.callbacks._language_models import TinyCausalLM

    return TinyCausalLM(kind, lora)


def _sequences():
    from tests.callbacks._language_models import PaddedSequences

    return PaddedSequences(32)


def _fit(make, data, batch_size, *, epochs=1, precision="32-true", **dpsgd):
    torch.manual_seed(0)
    model = make()
    dp = DPSGD(**{"noise_multiplier": SIGMA, "max_grad_norm": C, **dpsgd})
    recorder = Recorder(dp)
    t = trainer([dp, recorder], max_epochs=epochs, precision=precision)
    t.fit(model, DataLoader(data, batch_size=batch_size))
    return t, dp, recorder, model


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


# ---------------------------------------------------------------------------------------------- ghost = hooks
CASES = {
    "mlp": lambda: (MLP, tiny_dataset(), 32),
    "gpt2_lora": lambda: (lambda: _language_model("gpt2", True), _sequences(), 8),
    "llama_full": lambda: (lambda: _language_model("llama", False), _sequences(), 8),
}


@pytest.mark.parametrize("case", CASES)
def test_ghost_and_hooks_give_the_same_clipped_and_noised_updates_in_float32(case):
    make, data, batch = CASES[case]()
    runs = {
        mode: _fit(make, data, batch, grad_sample_mode=mode, sampling_seed=0, noise_seed=0)
        for mode in ("hooks", "ghost")
    }
    (th, dh, rh, mh), (tg, dg, rg, mg) = runs["hooks"], runs["ghost"]
    assert th.global_step == tg.global_step == dh.steps == dg.steps == len(rh.noised) > 0
    assert rh.devices == rg.devices == {DEVICE}
    for name in ("clipped", "noised"):
        for step_h, step_g in zip(getattr(rh, name), getattr(rg, name)):
            for a, b in zip(step_h, step_g):
                assert a.device.type == DEVICE and a.dtype == b.dtype == torch.float32
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(mh.parameters(), mg.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert dh.ledger.history == dg.ledger.history
    assert dh.exactness.steps == dg.exactness.steps == 2 and dg.exactness.max_relative_error < 1e-4


# ---------------------------------------------------------------------------------------------- book-keeping, bf16
class _Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 32)
        self.norm = nn.LayerNorm(32)
        self.hidden = nn.Linear(32, 64)
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(self.norm(self.tokens(x))))).mean(1)


def _first_pass_under_bf16_autocast():
    """``_Text`` on the device, a batch of 16, and a book-keeping that captured its first pass under bf16 autocast."""
    torch.manual_seed(0)
    net = _Text().to(DEVICE)
    x, y = torch.randint(0, 50, (16, 12), device=DEVICE), torch.randint(0, 3, (16,), device=DEVICE)
    keeper = BookKeeping(net, loss_reduction="sum")
    keeper.start()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        losses = F.cross_entropy(net(x).float(), y, reduction="none")
    keeper.capturing = True
    losses.sum().backward()
    keeper.capturing = False
    return net, x, y, keeper


def test_book_keepings_sum_equals_the_second_pass_under_bf16_autocast():
    net, x, y, keeper = _first_pass_under_bf16_autocast()
    assert keeper.ready(16)
    c = torch.rand(16, device=DEVICE)
    sums = keeper.clipped_sums(c)
    assert keeper.low_precision  # 16-bit output gradients: the allowance is 5e-2 of the sum's norm
    net.zero_grad()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        second = (c * F.cross_entropy(net(x).float(), y, reduction="none")).sum()
    second.backward()
    params = list(net.parameters())
    assert keeper.disagreeing(sums, params) is None
    for p in params:
        assert sums[p].device.type == DEVICE and sums[p].dtype == torch.float32
        error = float((sums[p].double() - p.grad.double()).norm())
        assert error <= 5e-2 * float(p.grad.double().norm()) + 1e-6
    keeper.remove()


def test_split_bf16_products_on_the_device_are_within_their_bound_of_the_exact_sum(monkeypatch):
    """``SIXTEEN_BIT_PRODUCTS = "split"`` (issue 60): CUDA's bfloat16 product with float32 output runs (not the
    float32 emulation), and each linear sum is within 2⁻¹⁶·Σᵢcᵢ‖xᵢ‖‖gᵢ‖ (plus float32 slack) of the exact sum."""
    from lightning_privacy.dpsgd import bookkeeping

    net, x, y, keeper = _first_pass_under_bf16_autocast()
    c = torch.rand(16, device=DEVICE)
    float32 = keeper.clipped_sums(c)
    monkeypatch.setattr(bookkeeping, "SIXTEEN_BIT_PRODUCTS", "split")
    split = keeper.clipped_sums(c)
    assert keeper.products == ("split" if DEVICE == "cuda" else "split (emulated in float32)")
    for layer in (net.hidden, net.head):  # (split takes the input as autocast's layer did, in bfloat16)
        inputs = keeper._inputs[layer][0][0].to(torch.bfloat16).double()
        grads = keeper._grads[layer][0].double()
        exact = torch.einsum("npi,npo->oi", inputs, grads * c.double().view(-1, 1, 1))
        bound = 2.0**-16 * float((c.double() * inputs.flatten(1).norm(dim=1) * grads.flatten(1).norm(dim=1)).sum())
        error = float((split[layer.weight].double() - exact).norm())
        assert error <= bound + 1e-6 * float(exact.norm()), (layer, error, bound)
        assert split[layer.weight].dtype == torch.float32 and split[layer.weight].device.type == DEVICE
        # float32's products take the input as captured (the LayerNorm's float32 output for `hidden`): 16-bit apart
        gap = float((split[layer.weight].double() - float32[layer.weight].double()).norm())
        assert gap <= 2.0**-6 * float(exact.norm()), (layer, gap)
    keeper.remove()


@pytest.mark.parametrize("lora", [True, False])
def test_a_ghost_fit_under_bf16_mixed_passes_its_self_checks(lora):
    """Book-keeping and the second pass compared inside DPSGD on the first steps, under autocast (raises if not)."""
    kind = "gpt2" if lora else "llama"  # (GPT-2's full fine-tune: a tied head, which ghost clipping refuses)
    make = lambda: _language_model(kind, lora)  # noqa: E731
    t, dp, recorder, _ = _fit(make, _sequences(), 8, precision="bf16-mixed", grad_sample_mode="ghost")
    assert dp.steps == t.global_step == 4 and dp.exactness.steps == 2
    assert all(torch.isfinite(g).all() for step in recorder.noised for g in step)


@pytest.mark.parametrize("mode", ["hooks", "ghost", "functional"])
def test_fp16_mixed_precision_trains_the_float32_clipped_sums(mode):
    """``precision="16-mixed"`` (CUDA's GradScaler, scale 65,536): each step's clipped sum before the noise is the
    float32 fit's (the scale divided out before clipping; tests/callbacks/test_dpsgd_fp16.py on the CPU)."""
    if DEVICE != "cuda":
        pytest.skip("fp16 autocast with a GradScaler is CUDA's (the CPU version: tests/callbacks/test_dpsgd_fp16.py)")
    sums = {}
    for precision in ("32-true", "16-mixed"):
        _, dp, recorder, _ = _fit(MLP, tiny_dataset(), 32, precision=precision, grad_sample_mode=mode, sampling_seed=0)
        sums[precision] = torch.cat([torch.cat([g.flatten() for g in step]) for step in recorder.clipped])
    got, expected = sums["16-mixed"].double(), sums["32-true"].double()
    assert float((got - expected).norm()) <= 1e-2 * float(expected.norm())


# ---------------------------------------------------------------------------------------------- noise
def test_the_noise_source_on_the_device():
    draw = lambda source, step: torch.randn(10_000, device=DEVICE, generator=source.generator(step, DEVICE))  # noqa: E731
    a, b = draw(NoiseSource(7), 3), draw(NoiseSource(7), 3)
    assert a.device.type == DEVICE and torch.equal(a, b)  # same (seed, rank, step): same noise
    assert abs(_corr(a, draw(NoiseSource(7), 4))) < 0.05  # another step
    assert abs(_corr(a, draw(NoiseSource(7, rank=1), 3))) < 0.05  # another rank
    assert abs(_corr(draw(NoiseSource(None), 3), draw(NoiseSource(None), 3))) < 0.05  # fresh secret seeds
    assert abs(_corr(draw(NoiseSource(None, secure=True), 0), draw(NoiseSource(None, secure=True), 0))) < 0.05
    assert float(a.mean()) == pytest.approx(0.0, abs=0.05) and float(a.std()) == pytest.approx(1.0, rel=0.05)


def _noise(seed_kwargs, epochs=3):
    pl.seed_everything(0, verbose=False)  # what most scripts do: the noise must not follow it
    seeds = {} if seed_kwargs.get("secure_mode") else {"sampling_seed": 3}  # (secure mode: OS entropy for both)
    t, dp, recorder, model = _fit(MLP, tiny_dataset(), 32, epochs=epochs, **seeds, **seed_kwargs)
    assert recorder.devices == {DEVICE} and dp.steps == t.global_step == 8 * epochs
    return torch.cat(recorder.noise), torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_same_noise_seed_gives_the_same_noise_and_the_default_fresh_noise():
    (a, wa), (b, wb) = _noise({"noise_seed": 11}), _noise({"noise_seed": 11})
    assert a.device.type == DEVICE
    # the same draws, up to the order of the GPU's sums in the clipped sum the noise is recovered from
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    torch.testing.assert_close(wa, wb, rtol=0, atol=1e-5)
    c, _ = _noise({"noise_seed": 12})
    (d, wd), (e, we) = _noise({}), _noise({})
    assert abs(_corr(a, c)) < 0.1 and abs(_corr(d, e)) < 0.1  # 24 steps × 98 coordinates: |r| has sd ≈ 0.02
    assert not torch.equal(wd, we)
    for noise in (a, d):  # the law: N(0, (σC)²) per coordinate
        assert float(noise.std()) == pytest.approx(SIGMA * C, rel=0.1) and abs(float(noise.mean())) < 0.05


def test_secure_mode_runs_and_draws_noise_of_the_stated_law():
    noise, weights = _noise({"secure_mode": True})
    assert torch.isfinite(weights).all()
    assert float(noise.std()) == pytest.approx(SIGMA * C, rel=0.1) and abs(float(noise.mean())) < 0.05


# ---------------------------------------------------------------------------------------------- Poisson batches
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_poisson_batches_reach_the_module_on_the_device_and_empty_ones_are_noise_only_steps(mode):
    model = _language_model("gpt2", True)
    t, dp, recorder, _ = _fit(lambda: model, _sequences(), 1, grad_sample_mode=mode, sampling_seed=3)  # q = 1/32
    assert dp.steps == t.global_step == 32 and recorder.devices == {DEVICE}
    assert len(model.rows_seen) < 32 and min(model.rows_seen) > 0  # empty batches never reach the model
    assert 0 in recorder.rows and max(recorder.rows) > 0  # the loader's batches vary: Poisson
    assert all(g.device.type == DEVICE and torch.isfinite(g).all() for step in recorder.noised for g in step)


# ---------------------------------------------------------------------------------------------- monitor, audit
class Snapshots(Callback):
    """The weights (on the CPU) and batch each step starts with."""

    def __init__(self) -> None:
        self.steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        self.steps.append((state, [t.detach().cpu().clone() for t in batch]))


def test_the_attribute_inference_monitor_measures_every_step():
    attribute = SensitiveAttribute.numeric(column=0, values=[-2.0, -1.0, 0.0, 1.0, 2.0], name="x0")
    dp = DPSGD(noise_multiplier=1.5)
    monitor = AttributeInferenceMonitor(attribute=attribute, method="exact")
    snapshots = Snapshots()
    torch.manual_seed(0)
    t = trainer([dp, monitor, snapshots], max_epochs=2)
    t.fit(TabularMLP(D, hidden=(16,), lr=0.5), tiny_loader())
    assert monitor.steps == dp.steps == t.global_step == len(snapshots.steps) == 16
    model = TabularMLP(D, hidden=(16,), lr=0.5)
    allowance = sensitivity_rounding_allowance(torch.float32, max_grad_norm=dp.max_grad_norm)
    again = []
    for state, (x, y) in snapshots.steps:  # every step again on the CPU
        model.load_state_dict(state)
        again.append(
            attribute_sensitivity(
                model,
                x,
                y,
                attribute=attribute,
                max_grad_norm=dp.max_grad_norm,
                method="exact",
                rounding_allowance=allowance,
            )  # fmt: skip
        )
    assert 0 < monitor.max_sensitivity <= 2 * dp.max_grad_norm + 1e-3
    assert monitor.max_sensitivity == pytest.approx(max(again), rel=1e-3)
    assert 0 < monitor.bayes_security() <= 1


def test_the_canary_audit_scores_every_canary_on_the_device():
    """σ → 0: each gradient canary's score is C × the steps it was sampled in, read from the released gradient."""
    dp = DPSGD(noise_multiplier=1e-4, max_grad_norm=2.0)
    audit = CanaryAudit(num_canaries=300, seed=1)
    torch.manual_seed(0)
    t = trainer([dp, audit], max_epochs=4)
    t.fit(TabularMLP(D, hidden=(128,), lr=0.5), DataLoader(tiny_dataset(), batch_size=26, shuffle=True))
    counts = sum(audit.sampled(step).astype(int) for step in range(dp.steps))
    assert audit.canaries.steps == dp.steps == 40
    assert audit.scores == pytest.approx(2.0 * counts, abs=0.05)
    assert audit.result is not None


# ---------------------------------------------------------------------------------------------- DP-LoRA, GPT-2 size
class GPT2Lora(pl.LightningModule):
    """GPT-2 of the default size (124 M parameters, random weights: no download), LoRA r = 8 on ``c_attn``."""

    def __init__(self) -> None:
        super().__init__()
        from peft import LoraConfig, get_peft_model
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.model = get_peft_model(
                GPT2LMHeadModel(GPT2Config()),
                LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True, lora_dropout=0.0),
            )

    def forward(self, input_ids, attention_mask=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(input_ids.shape[0], 1)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits

    def training_step(self, batch, batch_idx):
        from lightning_privacy.functional.sequence_loss import causal_lm_signal

        losses = causal_lm_signal(self, batch)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, length: int = 64) -> None:
        self.ids = torch.randint(0, 50257, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_a_dp_lora_fine_tune_of_a_gpt2_sized_model(mode):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    model = GPT2Lora()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in frozen.values()) > 120e6 and 0 < sum(p.numel() for p in trainable.values()) < 1e6
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, sampling_seed=0)
    devices = _TrainingDevices()
    t = trainer([dp, devices], max_epochs=1, precision="bf16-mixed" if DEVICE == "cuda" else "32-true")
    t.fit(model, DataLoader(_Tokens(), batch_size=8))  # q = 1/4: 4 steps of about 8 sequences of 64 tokens
    assert dp.steps == t.global_step == 4 and dp.exactness.steps == 2 and dp.epsilon() > 0
    params = dict(model.named_parameters())
    assert devices.seen == {DEVICE}  # trained on the device (Lightning's teardown moves the module back to the CPU)
    assert all(torch.equal(params[n].detach().cpu(), p.cpu()) for n, p in frozen.items())
    assert all(not torch.equal(params[n].detach().cpu(), p.cpu()) for n, p in trainable.items())
    assert all(torch.isfinite(p).all() for p in params.values())

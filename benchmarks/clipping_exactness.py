"""Does DP-SGD clip each example's whole gradient? Every model pattern × mode against an independent reference.

For each pattern (issue 48's Why: tied weights, uses outside a layer from the start or after warm-up, examples mixed
in the batch, sequence-first layers, raw parameters in ``training_step``, ``nn.Bilinear``, ``EmbeddingBag`` with
repeated ids, ``max_norm``, ``spectral_norm``, gradient checkpointing, ``.item()``, custom Functions, language models)
and ``grad_sample_mode`` (hooks, ghost, functional, auto) a DPSGD fit takes a few steps with half the later steps
sampled by the exactness check; the first step's batch, weights and clipped sum (before the noise,
:meth:`DPSGD.register_before_noise_hook`) are recorded. The reference clipped sum comes from a per-example loop on a
float64 copy of the module at those weights, no Opacus hook anywhere: each example's loss (``training_step`` on a
one-row batch), its gradient by ``.backward()``, clipped to C by hand, summed. The table gives the largest error of
the clipped sum relative to its norm, or the refusal (its first words, and the step it came at), with what DPSGD's
own check compared, and the timing of checked, unsampled and sampled steps.

    python benchmarks/clipping_exactness.py            # → benchmarks/results/clipping_exactness.md (~5 min)
    python benchmarks/clipping_exactness.py --only padding_idx --steps 6   # a subset, printed only

``tests/test_clipping_exactness.py`` reads the results file (every row exact or refused) and runs a subset.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_privacy import DPSGD  # noqa: E402
from lightning_privacy.dpsgd.functional import example_loss  # noqa: E402
from lightning_privacy.dpsgd.sampled_exactness import DEFAULT_RATE  # noqa: E402
from lightning_privacy.dpsgd.settings import fix_module  # noqa: E402
from tests.callbacks import test_dpsgd_exactness as small  # noqa: E402
from tests.callbacks import test_dpsgd_functional as fx  # noqa: E402
from tests.callbacks._language_models import PaddedSequences, TinyCausalLM  # noqa: E402
from tests.callbacks._stock_models import STOCK  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "clipping_exactness.md"
C = 1.0


class MHA(small._Base):
    """Opacus' DPMultiheadAttention over token embeddings (its own per-example gradients)."""

    def __init__(self):
        super().__init__()
        from opacus.layers import DPMultiheadAttention

        self.embed, self.attention = nn.Embedding(small.V, small.D), DPMultiheadAttention(small.D, 2, batch_first=True)
        self.head = nn.Linear(small.D, 2)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(self.attention(h, h, h, need_weights=False)[0].mean(1))


class Conv1dStrided(small._Base):
    """Conv1d with stride and dilation over the embedded sequence, LayerNorm on [B, T, D], GroupNorm."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(small.V, small.D), nn.LayerNorm(small.D)
        self.conv = nn.Conv1d(small.D, 6, kernel_size=2, stride=2, dilation=2)
        self.group, self.head = nn.GroupNorm(2, 6), nn.Linear(6, 2)

    def forward(self, ids):
        h = self.norm(self.embed(ids)).transpose(1, 2)  # [B, D, T]
        return self.head(torch.tanh(self.group(self.conv(h))).mean(2))


class Conv2dGroupedSame(small._Base):
    """A grouped Conv2d with padding="same" over the [T, D] embedding image."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(small.V, small.D)
        self.lift = nn.Conv2d(1, 4, 3, padding=1)
        self.conv = nn.Conv2d(4, 4, 3, padding="same", groups=2)
        self.head = nn.Linear(4, 2)

    def forward(self, ids):
        h = torch.tanh(self.lift(self.embed(ids)[:, None]))
        return self.head(torch.tanh(self.conv(h)).mean((2, 3)))


class LateReuse(small._Base):
    """From the fifth step on, ``lin.weight`` is also used through ``F.linear`` (an auxiliary path after warm-up)."""

    def __init__(self):
        super().__init__()
        self.embed, self.lin, self.head = (
            nn.Embedding(small.V, small.D),
            nn.Linear(small.D, small.D),
            nn.Linear(small.D, 2),
        )

    def forward(self, ids):
        h = torch.tanh(self.lin(self.embed(ids).mean(1)))
        if self.training and self._trainer is not None and self.trainer.global_step >= 4:
            h = h + torch.tanh(F.linear(h, self.lin.weight))
        return self.head(h)


class CentredReduced(fx.Mixing):
    """``h - h.mean(0)`` with a reduced loss: per-example gradients that sum to the batch's."""

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.cross_entropy(self(ids), y)


class BagRepeats(small._Base):
    """``nn.EmbeddingBag(mode="sum")`` over token ids that repeat within a bag."""

    def __init__(self):
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(small.V, small.D, mode="sum"), nn.Linear(small.D, 2)

    def forward(self, ids):
        return self.head(torch.tanh(self.bag(ids % 4)))  # (4 distinct ids in 6 positions: repeats in every bag)


class MaxNorm(small._Base):
    """``nn.Embedding(max_norm=1.0)``: renormalises the looked-up rows in place during the forward pass."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(small.V, small.D, max_norm=1.0), nn.Linear(small.D, 2)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids).mean(1)))


class SpectralNorm(small._Base):
    """``nn.utils.spectral_norm`` on the hidden Linear (a power-iteration buffer updated in the forward pass)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(small.V, small.D), nn.Linear(small.D, 2)
        self.hidden = nn.utils.spectral_norm(nn.Linear(small.D, small.D))

    def forward(self, ids):
        return self.head(torch.tanh(self.hidden(self.embed(ids).mean(1))))


class ReentrantCheckpoint(fx.MLP):
    """The hidden layer under reentrant ``torch.utils.checkpoint`` (a classic autograd.Function)."""

    def forward(self, ids):
        h = torch.utils.checkpoint.checkpoint(
            lambda e: torch.tanh(self.hidden(e)), self.embed(ids).mean(1), use_reentrant=True
        )
        return self.head(h)


def _lm(kind: str, lora: bool) -> Callable[[], pl.LightningModule]:
    def make() -> pl.LightningModule:
        return TinyCausalLM(kind, lora)

    return make


ARCHITECTURES: Dict[str, Callable[[], pl.LightningModule]] = {
    "functional_reuse": small.FunctionalReuse,
    "tied_head": small.TiedHead,
    "padding_idx": small.Padded,
    "called_twice": small.CalledTwice,
    "mha": MHA,
    "conv1d_stride_dilation": Conv1dStrided,
    "conv2d_grouped_same": Conv2dGroupedSame,
    "gpt2_lora": _lm("gpt2", True),
    "gpt2_full": _lm("gpt2", False),
    "llama_lora": _lm("llama", True),
    "llama_full": _lm("llama", False),
    "late_reuse": LateReuse,
    "centred_reduced": CentredReduced,
    "mixing": fx.Mixing,
    "sequence_first": fx.SequenceFirst,
    "step_parameter": fx.StepParameter,
    "bilinear": fx.Bilinear,
    "tied_lm": fx.TiedLM,
    "bag_repeats": BagRepeats,
    "max_norm": MaxNorm,
    "spectral_norm": SpectralNorm,
    "checkpoint": fx.Checkpointed,
    "checkpoint_reentrant": ReentrantCheckpoint,
    "item": fx.Item,
    "classic_function": fx.ClassicFunction,
    # stock models as a user writes them (issue 57 item 8; tests/callbacks/_stock_models.py): Hugging Face's own loss
    **{f"stock_{name}": make for name, (make, _, _, _) in STOCK.items()},
}
WHAT = {
    "functional_reuse": "`lin.weight` also used by `F.linear`",
    "tied_head": "output head `h @ embed.weight.T`",
    "padding_idx": "`nn.Embedding(padding_idx=0)`, padded rows",
    "called_twice": "one Linear applied twice",
    "mha": "Opacus' DPMultiheadAttention",
    "conv1d_stride_dilation": "Conv1d stride 2 dilation 2, LayerNorm, GroupNorm",
    "conv2d_grouped_same": "grouped Conv2d, padding='same'",
    "gpt2_lora": "GPT-2 (1 layer), LoRA on c_attn",
    "gpt2_full": "GPT-2 (1 layer), full (tied head module)",
    "llama_lora": "Llama (1 layer), LoRA on q/v",
    "llama_full": "Llama (1 layer), full (padding_idx)",
    "late_reuse": "`lin.weight` reused by `F.linear` from step 4 on",
    "centred_reduced": "`h - h.mean(0)`, reduced loss",
    "mixing": "`h - h.mean(0)`, per-example losses",
    "sequence_first": "torch's sequence-first MultiheadAttention + TransformerEncoderLayer",
    "step_parameter": "a raw `nn.Parameter` used in `training_step`",
    "bilinear": "`nn.Bilinear`",
    "tied_lm": "tied LM head (`lm_head.weight is wte.weight`)",
    "bag_repeats": "`nn.EmbeddingBag`, ids repeated within a bag",
    "max_norm": "`nn.Embedding(max_norm=1.0)`",
    "spectral_norm": "`nn.utils.spectral_norm(nn.Linear)`",
    "checkpoint": "non-reentrant `torch.utils.checkpoint`",
    "checkpoint_reentrant": "reentrant `torch.utils.checkpoint`",
    "item": "`.item()` in `training_step`",
    "classic_function": "a classic `autograd.Function` (ctx in forward)",
    "stock_bert": "stock HF `BertForSequenceClassification`, `.loss`",
    "stock_gpt2": "stock HF `GPT2LMHeadModel` (tied head), `.loss`",
    "stock_llama": "stock HF `LlamaForCausalLM`, `.loss`",
    "stock_t5": "stock HF `T5ForConditionalGeneration`, `.loss`",
    "stock_vit": "stock HF `ViTForImageClassification`, `.loss`",
    "stock_resnet": "ResNet with BatchNorm, `fix_modules=True`",
    "stock_lstm": "`nn.LSTM` classifier",
    "stock_textbag": "torchtext `EmbeddingBag(text, offsets)` classifier",
    "stock_metric": "torchmetrics accuracy and kept outputs in `training_step`",
}
MODES = ("hooks", "ghost", "functional", "auto")


def _loader(name: str, batch_size: int) -> DataLoader:
    if name.startswith("stock_"):
        stock = STOCK[name[len("stock_") :]][1](64)
        return DataLoader(stock.dataset, batch_size=batch_size, collate_fn=stock.collate_fn)
    data = PaddedSequences(64) if name.startswith(("gpt2", "llama")) else small._data(64)
    return DataLoader(data, batch_size=batch_size)


def _examples(name: str, batch: Any) -> List[Any]:
    """The batch's examples, each a batch of one (torchtext's split by its offsets and collated alone)."""
    if name.startswith("stock_"):
        return STOCK[name[len("stock_") :]][3](batch)
    if isinstance(batch, dict):
        return [{k: v[i : i + 1] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    return [[t[i : i + 1] for t in batch] for i in range(len(batch[0]))]


class Capture(Callback):
    """The first step's batch, weights and clipped sum; the wall time of every step."""

    def __init__(self, dpsgd: DPSGD) -> None:
        self.dpsgd = dpsgd
        self.batch = self.state = self.sums = None
        self.times: List[float] = []
        self.sampled: List[bool] = []  # whether each step was one of the sampled later steps
        self._drawn = 0
        self._start = 0.0
        dpsgd.register_before_noise_hook(self._hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sums is None:
            self.batch = copy.deepcopy(batch)
            self.state = copy.deepcopy(pl_module.state_dict())
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)
        record = self.dpsgd.exactness
        drawn = record.later_steps + record.later_not_comparable
        self.sampled.append(drawn > self._drawn)
        self._drawn = drawn

    def _hook(self, optimizer):
        if self.sums is None:
            self.sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]


def reference_clipped_sum(twin: pl.LightningModule, examples: List[Any]) -> List[torch.Tensor]:
    """Σᵢ clip_C(∇ℓᵢ) by a loop over the batch's examples, each its own forward and backward pass (float64)."""
    params = [p for p in twin.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    twin.log = twin.log_dict = lambda *args, **kwargs: None
    for example in examples:
        example = (
            [t.double() if t.is_floating_point() else t for t in example]
            if isinstance(example, (list, tuple))
            else example
        )
        loss = example_loss(twin.training_step(example, 0))
        for p in params:
            p.grad = None
        loss.backward()  # (not autograd.grad, which reentrant checkpointing refuses)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
        total = [t + min(1.0, C / (norm + 1e-6)) * g for t, g in zip(total, grads)]
    return total


def run(name: str, mode: str, steps: int, batch_size: int, rate: float) -> Dict[str, Any]:
    torch.manual_seed(0)
    model = ARCHITECTURES[name]()
    extra = STOCK[name[len("stock_") :]][2] if name.startswith("stock_") else {}
    dpsgd = DPSGD(
        noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=7, exactness_rate=rate, **extra
    )
    capture = Capture(dpsgd)
    trainer = pl.Trainer(
        max_steps=steps, max_epochs=-1, callbacks=[dpsgd, capture], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    row: Dict[str, Any] = {"architecture": name, "mode": mode}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, _loader(name, batch_size))
    except MisconfigurationException as err:
        row.update(outcome="refused", message=str(err), steps=dpsgd.steps, used=dpsgd.grad_sample_mode)
        return row
    except Exception as err:  # a raw framework error: what no user should see (the tests require none)
        row.update(
            outcome="CRASH", message=f"{type(err).__name__}: {err}", steps=dpsgd.steps, used=dpsgd.grad_sample_mode
        )
        return row
    twin = ARCHITECTURES[name]()  # (the module as trained: fix_modules' replacements included) at the first step
    if extra.get("fix_modules"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fix_module(twin, fix_modules=True)
    twin.load_state_dict(capture.state)
    twin = twin.double().train()
    expected = reference_clipped_sum(twin, _examples(name, capture.batch))
    got = [s.double() for s in capture.sums]
    error = float(torch.sqrt(sum((g - e).pow(2).sum() for g, e in zip(got, expected))))
    size = float(torch.sqrt(sum(e.pow(2).sum() for e in expected)))
    row.update(
        outcome="exact" if error <= 1e-4 * max(size, 1e-12) else "WRONG",
        relative_error=error / max(size, 1e-30),
        check=dpsgd.exactness.reference,
        check_error=dpsgd.exactness.max_relative_error,
        checked_steps=dpsgd.exactness.steps,
        later_steps=dpsgd.exactness.later_steps,
        step_times=capture.times,
        sampled=capture.sampled,
        used=dpsgd.grad_sample_mode,
        switched=None if dpsgd.grad_sample_mode_switch is None else dpsgd.grad_sample_mode_switch.step,
    )
    return row


def _cost(times: List[float], sampled: List[bool], checked: int) -> str:
    """Mean wall time of the self-checked steps / the later unsampled steps / the sampled ones, and the sampled
    check's cost at the default rate: rate × (sampled − unsampled) ÷ unsampled."""
    later = [
        (t, s) for t, s in zip(times[checked + 1 :], sampled[checked + 1 :])
    ]  # (the step after the checks: skipped)
    plain = [t for t, s in later if not s]
    drawn = [t for t, s in later if s]
    if len(times) <= checked + 1 or not plain:
        return "— | —"
    first, mean = sum(times[:checked]) / checked, sum(plain) / len(plain)
    if not drawn:
        return f"{1e3 * first:.1f} / {1e3 * mean:.1f} / — ms | —"
    check = sum(drawn) / len(drawn)
    cost = DEFAULT_RATE * (check - mean) / mean
    return f"{1e3 * first:.1f} / {1e3 * mean:.1f} / {1e3 * check:.1f} ms | {cost:+.1%}"


def table(rows: List[Dict[str, Any]]) -> str:
    lines = [
        "| architecture | mode | outcome | clipped sum vs reference (relative) | DPSGD's check | its largest mismatch "
        "| checked / later / sampled step | cost at the default rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mode = r["mode"] if r["mode"] != "auto" else f"auto → {r['used']}"
        if r.get("switched") is not None:
            mode += f" (switched at step {r['switched']})"
        if r["outcome"] in ("refused", "CRASH"):
            message = r["message"]
            words = "exactness check" if "exactness check" in message else message.split(":")[0].split(" (")[0]
            detail = message[:140].replace("|", "/").replace("\n", " ")
            when = "before any step" if r["steps"] == 0 else f"at step {r['steps']}"
            lines.append(
                f"| {WHAT[r['architecture']]} | {mode} | {r['outcome']} {when} ({words}) | {detail}… | — | — | — | — |"
            )
            continue
        check = r["check"].replace(
            "per-example gradients by autograd through the whole forward pass", "autograd per example"
        )
        if r["later_steps"]:
            check += f"; {r['later_steps']} sampled later steps"
        lines.append(
            f"| {WHAT[r['architecture']]} | {mode} | {r['outcome']} | {r['relative_error']:.1e} | {check} "
            f"| {r['check_error']:.1e} | {_cost(r['step_times'], r['sampled'], 2)} |"
        )
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> List[Dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(ARCHITECTURES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rate", type=float, default=0.5, help="DPSGD(exactness_rate=...) of every run")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.only or list(ARCHITECTURES)
    rows = []
    for n in names:
        for m in args.modes:
            rows.append(run(n, m, args.steps, args.batch_size, args.rate))
            print(f"{n} {m}: {rows[-1]['outcome']}", file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.only is None and len(args.modes) == len(MODES):
        header = (
            "# DP-SGD clips each example's whole gradient: patterns × modes\n\n"
            f"`python benchmarks/clipping_exactness.py` ({args.steps} steps, expected batch {args.batch_size} of 64 "
            f"rows, C = {C}, `exactness_rate={args.rate}`; torch {torch.__version__}, {platform.machine()}, one thread). "
            "The clipped sum of the first step (before the noise) against a per-example loop in float64 on a copy of "
            "the module (no Opacus hook, each example alone): `exact` means within 1e-4 of its norm (float32 "
            "training). `refused`: DPSGD raised a MisconfigurationException, before any step or at the step named "
            "(a sampled later step); `CRASH` would be any other exception, `WRONG` a clipped sum off the reference. "
            "`auto → m`: the mode auto trained in (the default; `switched at step k`: it started in hooks, the "
            "verification disagreed at step k, and that step was redone in functional mode before its noise). "
            "`stock …` rows: models as a user writes them (`tests/callbacks/_stock_models.py`). DPSGD's own check: what its first two steps compared, and how many "
            "later steps were sampled. Timing: mean wall time of the two self-checked steps / the later unsampled "
            f"steps / the sampled ones; the cost of the sampled check at the default rate ({DEFAULT_RATE}) is that "
            "rate × (sampled − unsampled) ÷ unsampled (this machine runs other jobs: the times are noisy).\n\n"
        )
        RESULTS.write_text(header + text + "\n")
    return rows


if __name__ == "__main__":
    main()

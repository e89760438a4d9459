"""Does DP-SGD clip each example's whole gradient? Every architecture × mode against an independent reference.

For each architecture and ``grad_sample_mode`` a DPSGD fit takes a few steps; the first step's batch, weights and
clipped sum (before the noise, :meth:`DPSGD.register_before_noise_hook`) are recorded. The reference clipped sum comes
from a per-example loop on a float64 copy of the module at those weights, no Opacus hook anywhere: each example's
loss (``training_step`` on a one-row batch), its gradient by autograd, clipped to C by hand, summed. The table gives
the largest error of the clipped sum relative to its norm over the trainable parameters, or the refusal (the first
words of DPSGD's message, raised before any optimizer step), with what DPSGD's own exactness check compared and
found. Then the check's cost: the mean time of the self-checked steps and of the steps after them.

    python benchmarks/clipping_exactness.py            # → benchmarks/results/clipping_exactness.md (~1 min)
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
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_privacy import DPSGD  # noqa: E402
from tests.callbacks import test_dpsgd_exactness as small  # noqa: E402
from tests.callbacks._language_models import PaddedSequences, TinyCausalLM  # noqa: E402

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
}


def _data(name: str):
    return PaddedSequences(64) if name.startswith(("gpt2", "llama")) else small._data(64)


def _rows(batch: Any, i: int) -> Any:
    if isinstance(batch, dict):
        return {k: v[i : i + 1] for k, v in batch.items()}
    return [t[i : i + 1] for t in batch]


class Capture(Callback):
    """The first step's batch, weights and clipped sum; the wall time of every step."""

    def __init__(self, dpsgd: DPSGD) -> None:
        self.batch = self.state = self.sums = None
        self.times: List[float] = []
        self._start = 0.0
        dpsgd.register_before_noise_hook(self._hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sums is None:
            self.batch = copy.deepcopy(batch)
            self.state = copy.deepcopy(pl_module.state_dict())
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)

    def _hook(self, optimizer):
        if self.sums is None:
            self.sums = [optimizer.summed(p).detach().clone() for p in optimizer.params]


def reference_clipped_sum(twin: pl.LightningModule, batch: Any) -> List[torch.Tensor]:
    """Σᵢ clip_C(∇ℓᵢ) by a loop over the batch's examples, each its own forward and backward pass (float64)."""
    params = [p for p in twin.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n = len(batch["input_ids"]) if isinstance(batch, dict) else len(batch[0])
    for i in range(n):
        loss = twin.training_step(_rows(batch, i), 0)["per_example_loss"][0]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
        total = [t + min(1.0, C / (norm + 1e-6)) * g for t, g in zip(total, grads)]
    return total


def run(name: str, mode: str, steps: int, batch_size: int) -> Dict[str, Any]:
    torch.manual_seed(0)
    model = ARCHITECTURES[name]()
    twin = copy.deepcopy(model)
    dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=mode, sampling_seed=7)
    capture = Capture(dpsgd)
    trainer = pl.Trainer(
        max_steps=steps, max_epochs=-1, callbacks=[dpsgd, capture], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    row: Dict[str, Any] = {"architecture": name, "mode": mode}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, DataLoader(_data(name), batch_size=batch_size))
    except MisconfigurationException as err:
        row.update(outcome="refused", message=str(err), steps=dpsgd.steps)
        return row
    twin.load_state_dict(capture.state)
    twin = twin.double().train()
    batch = capture.batch
    expected = reference_clipped_sum(twin, batch)
    got = [s.double() for s in capture.sums]
    error = float(torch.sqrt(sum((g - e).pow(2).sum() for g, e in zip(got, expected))))
    size = float(torch.sqrt(sum(e.pow(2).sum() for e in expected)))
    row.update(
        outcome="exact" if error <= 1e-4 * max(size, 1e-12) else "WRONG",
        relative_error=error / max(size, 1e-30),
        check=dpsgd.exactness.reference,
        check_error=dpsgd.exactness.max_relative_error,
        checked_steps=dpsgd.exactness.steps,
        step_times=capture.times,
    )
    return row


def _cost(times: List[float], checked: int) -> str:
    if len(times) <= checked + 1:
        return "—"
    first = sum(times[:checked]) / checked
    later = times[checked + 1 :]  # (the step right after the checks warms nothing up; skipped with the first)
    later_mean = sum(later) / len(later)
    return f"{1e3 * first:.1f} / {1e3 * later_mean:.1f} ms"


def table(rows: List[Dict[str, Any]]) -> str:
    lines = [
        "| architecture | mode | outcome | clipped sum vs reference (relative) | DPSGD's check | its largest mismatch "
        "| checked / later step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["outcome"] == "refused":
            words = (
                "exactness check" if "exactness check" in r["message"] else r["message"].split(":")[0].split(" (")[0]
            )
            detail = r["message"][:140].replace("|", "/").replace("\n", " ")
            lines.append(f"| {WHAT[r['architecture']]} | {r['mode']} | refused ({words}) | {detail}… | — | — | — |")
            continue
        check = r["check"].replace(
            "per-example gradients by autograd through the whole forward pass", "autograd per example"
        )
        lines.append(
            f"| {WHAT[r['architecture']]} | {r['mode']} | {r['outcome']} | {r['relative_error']:.1e} | {check} "
            f"| {r['check_error']:.1e} | {_cost(r['step_times'], 2)} |"
        )
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> List[Dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(ARCHITECTURES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.only or list(ARCHITECTURES)
    rows = [run(n, m, args.steps, args.batch_size) for n in names for m in ("hooks", "ghost")]
    text = table(rows)
    print(text)
    if args.only is None:
        header = (
            "# DP-SGD clips each example's whole gradient: architectures × modes\n\n"
            f"`python benchmarks/clipping_exactness.py` ({args.steps} steps, expected batch {args.batch_size} of 64 "
            f"rows, C = {C}; torch {torch.__version__}, {platform.machine()}, one thread). The clipped sum of the first "
            "step (before the noise) against a per-example loop in float64 on a copy of the module (no Opacus "
            "hook): `exact` means within 1e-4 of its norm (float32 training). `refused`: DPSGD raised before any "
            "optimizer step. DPSGD's own check is the exactness check of its two self-checked steps; the last "
            "column is the mean wall time of those steps and of the steps after the first unchecked one.\n\n"
        )
        RESULTS.write_text(header + text + "\n")
    return rows


if __name__ == "__main__":
    main()

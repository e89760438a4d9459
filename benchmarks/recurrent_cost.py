"""What recurrent layers cost in functional mode, and what its one remaining loop costs (issue 57, item 6).

Inside the per-example passes ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` run unrolled over time
(``lightning_privacy.dpsgd.recurrent``), which ``vmap`` batches; before, torch's fused kernels sent GRU, RNN and LSTM
in float64 one example at a time. A ``PackedSequence`` still goes one example at a time (packing reads each example's
length as data). For each model this prints the training step's time (median over the steps after the first
``WARMUP``, one thread): plain training, functional mode as it runs now, functional mode forced through the loop (what
those models cost before, and what a packed sequence costs now), and hooks mode with ``fix_modules=True`` (Opacus'
``DPLSTM``/``DPGRU``/``DPRNN``), the other way to train them. Each model: embedding 32 → recurrent layer 64 → linear
head, batch 64, sequences of 32 tokens (the packed one: lengths 8–32, ``pack_padded_sequence`` with the lengths).

    OMP_NUM_THREADS=1 python benchmarks/recurrent_cost.py > benchmarks/results/recurrent_cost.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from typing import Dict, List, Optional, Tuple

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import DPSGD

BATCH, LENGTH, VOCAB, WARMUP = 64, 32, 1000, 3
MODELS = {  # name: (recurrent class, dtype, packed)
    "LSTM": (nn.LSTM, torch.float32, False),
    "GRU": (nn.GRU, torch.float32, False),
    "RNN (tanh)": (nn.RNN, torch.float32, False),
    "LSTM, float64": (nn.LSTM, torch.float64, False),
    "LSTM, packed sequences": (nn.LSTM, torch.float32, True),
}


class Recurrent(pl.LightningModule):
    """Embedding → recurrent layer → linear head on the last state; ``packed``: the rows packed by their lengths."""

    def __init__(self, cls: type, packed: bool, plain: bool = False) -> None:
        super().__init__()
        self.packed, self.plain = packed, plain
        self.embed, self.rnn, self.head = nn.Embedding(VOCAB, 32), cls(32, 64, batch_first=True), nn.Linear(64, 2)

    def training_step(self, batch, batch_idx):
        ids, lengths, y = batch
        x = self.embed(ids)
        if self.packed:
            x = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.rnn(x)
        h = h[0] if isinstance(h, tuple) else h
        losses = F.cross_entropy(self.head(h[-1]), y, reduction="none")
        return losses.mean() if self.plain else losses

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class StepTimes(pl.Callback):
    """Each training step's wall time (``on_train_batch_start`` to ``_end``)."""

    def __init__(self, loop: bool = False) -> None:
        self.loop, self.times, self._start = loop, [], 0.0
        self.runs = "—"  # how functional mode's per-example passes ran: "vmap", or "loop" after a fallback

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for callback in trainer.callbacks:  # forced through the loop: what these models cost before (or packed now)
            engine = getattr(getattr(callback, "_backward", None), "engine", None)
            if self.loop and engine is not None:
                engine.loop = True
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)
        for callback in trainer.callbacks:
            engine = getattr(getattr(callback, "_backward", None), "engine", None)
            if engine is not None:
                self.runs = "loop" if engine.fallback is not None or engine.loop else "vmap"


def _loader(packed: bool) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = BATCH * 20
    ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
    lengths = torch.randint(8, LENGTH + 1, (n,), generator=g) if packed else torch.full((n,), LENGTH)
    ids = ids * (torch.arange(LENGTH) < lengths[:, None])
    return DataLoader(TensorDataset(ids, lengths, (ids[:, 0] % 2).long()), batch_size=BATCH)


def step_ms(name: str, how: str, steps: int) -> Tuple[Optional[float], str]:
    """Median ms per training step of ``name`` trained ``how`` (``plain``, ``functional``, ``loop``, ``hooks``), and
    how functional mode ran its per-example passes (``"vmap"``, ``"loop"``; ``"—"`` without it); ``None`` and the
    refusal's first words where DPSGD refused to train it."""
    cls, dtype, packed = MODELS[name]
    torch.manual_seed(0)
    module = Recurrent(cls, packed, plain=how == "plain").to(dtype)
    timer = StepTimes(loop=how == "loop")
    callbacks: List[pl.Callback] = [timer]
    if how != "plain":
        mode = "hooks" if how == "hooks" else "functional"
        fix = how == "hooks"
        callbacks.insert(0, DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, fix_modules=fix, sampling_seed=0,
                                  noise_seed=0, exactness_rate=0.0, neighbour_rate=0.0))  # fmt: skip
    trainer = pl.Trainer(
        max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", precision="64-true" if dtype == torch.float64 else "32-true",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(module, _loader(packed))
        except MisconfigurationException as refusal:  # (DPSGD's checks stop what would train wrong)
            return None, str(refusal).split(", so ")[0]
    return 1000 * statistics.median(timer.times[WARMUP:]), timer.runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: Dict[str, Dict[str, Tuple[float, str]]] = {}
    for name in MODELS:
        rows[name] = {how: step_ms(name, how, args.steps) for how in ("plain", "functional", "loop", "hooks")}
        print(name, rows[name], file=sys.stderr)
    print(
        f"Recurrent layers in functional mode (one thread, batch {BATCH}, {LENGTH} tokens, median ms per step over "
        f"{args.steps - WARMUP} steps after {WARMUP}): plain training, functional mode now (recurrent layers unrolled "
        "in the per-example passes, vmap), functional mode through the per-example loop (these models before the "
        "unrolling; a packed sequence now — its one remaining loop), and hooks mode with `fix_modules=True` "
        "(Opacus' DP layers).\n"
    )
    print("| model | plain ms | functional ms | loop ms | hooks (fix_modules) ms | functional ÷ plain | loop ÷ plain "
          "| functional runs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    refusals = []
    for name, row in rows.items():
        ms = {how: value[0] for how, value in row.items()}
        if ms["hooks"] is None:
            refusals.append(f"- {name}, hooks mode with `fix_modules=True`: refused at step 0 — {row['hooks'][1]}.")
        hooks = "refused" if ms["hooks"] is None else f"{ms['hooks']:.1f}"
        print(
            f"| {name} | {ms['plain']:.1f} | {ms['functional']:.1f} | {ms['loop']:.1f} | {hooks} | "
            f"{ms['functional'] / ms['plain']:.1f}× | {ms['loop'] / ms['plain']:.1f}× | {row['functional'][1]} |"
        )
    if refusals:  # (auto switches such a step to functional mode; tests/callbacks/test_dpsgd_recurrent.py)
        print("\nRefused (DPSGD's checks stop what would train wrong; `auto` switches that step to functional mode):\n")
        print("\n".join(refusals))
    print(f"\n<!-- written by benchmarks/recurrent_cost.py, {datetime.date.today()}, torch {torch.__version__} -->")


if __name__ == "__main__":
    main()

"""The prepared GPU check (issue 40): the CUDA-marked tests, then DP-SGD's step against a plain one, on one device.

On a CUDA machine, in about 5–8 minutes, it

1. runs the suite's CUDA-marked tests (``pytest -m cuda tests``, a subprocess) and records passed / failed / errors /
   skipped, naming each failure;
2. measures in this process, on the same device, one optimizer step of a randomly initialised GPT-2 of the default
   size (``GPT2Config()``: 12 layers, 768 wide, 50,257 tokens; no download), full fine-tuning and LoRA (peft, r = 8
   on ``c_attn``), under ``precision="bf16-mixed"``, sequences of 256 tokens, SGD: plain (a ``Trainer`` without
   DPSGD), ``DPSGD(grad_sample_mode="ghost")`` (ghost clipping with book-keeping) and ``DPSGD(grad_sample_mode=
   "hooks")``; since issue 60 also ``grad_sample_mode="functional"`` on the untied GPT-2 and on GPT-2 as users have
   it, head tied (``tied``: ghost clipping refuses it, so ``auto`` trains it in functional mode), and the same with
   Hugging Face's gradient checkpointing (``tied-checkpointed``); each functional row notes whether vmap ran the batch
   or the per-example loop did (and why). ``ghost-split`` is full fine-tuning's ghost row again with book-keeping's
   linear products as two bfloat16 products with float32 output (``bookkeeping.SIXTEEN_BIT_PRODUCTS = "split"``,
   ``torch.mm(..., out_dtype=torch.float32)``) instead of float32 products of the captures cast to float32: the row
   that says whether ``"split"`` is faster (its note says whether CUDA's 16-bit product ran or a float32 emulation);
   a ghost row whose steps' sums a second 16-bit backward pass formed instead of book-keeping (DPSGD's
   ``rounded_steps``, the privacy statement's count) says on how many. Every step goes through the product path — ``lightning.Trainer(callbacks=[DPSGD(...), timer])`` on a
   module whose ``training_step`` returns ``{"loss": mean, "per_example_loss": causal_lm_signal(...)}`` — and a small
   callback times it from ``on_train_batch_start`` (after a ``cuda.synchronize``) to ``on_train_batch_end`` with CUDA
   events, split at ``on_before_backward`` / ``on_after_backward`` / ``on_before_optimizer_step`` into forward,
   backward (ghost: both passes or book-keeping, and the norms) and optimizer (clipping, noise, the update); the
   median over the measured steps after a warm-up that covers DPSGD's self-check steps. Peak memory is
   ``torch.cuda.max_memory_allocated`` over the measured steps (reset before the first). The batch is the largest
   power of two up to ``--max-batch`` whose plain step fits (a short search with one model per setting); a DP run
   that runs out of memory at it is retried at half (and its ratios are per row, marked). The data loader holds
   exactly one batch, so DPSGD's Poisson sampling has rate q = 1 and every step has the same rows as the plain one.
   One extra step of each DP run is profiled (``torch.profiler``: the operations that cost most device time, and the
   whole time of book-keeping's clipped sums, ``bookkeeping.PROFILER_RANGE``: under bf16-mixed they cast each
   layer's input and output gradient to float32 and multiply in float32, which the profile weighs). The
   noise generation rate is the Gaussian numbers per second drawn with the generator of
   :class:`lightning_privacy.dpsgd.noise.NoiseSource` (the generator's creation timed apart), and Opacus' secure-mode draw;
3. writes ``benchmarks/results/gpu.md``: the device, torch, CUDA and package versions, the tests' counts, the table,
   the ratios ghost ÷ plain, hooks ÷ plain, functional ÷ plain and the peak-memory ratios beside the issues' goals
   (ghost ÷ plain ≤ 1.25× full, ≤ 1.1× LoRA; hooks ÷ plain ≤ 1.3× LoRA; functional ÷ plain ≤ 1.5× tied; ghost's extra
   peak memory ≤ 10 % of plain's), the noise rates and the profiles.

GPT-2's output layer is its token embedding, a tied parameter that ghost clipping cannot clip (DPSGD refuses it):
full fine-tuning therefore unties it (``tie_word_embeddings=False``, 163 M parameters) in all three modes; LoRA keeps
GPT-2 as it is (124 M, frozen). Without CUDA, or with ``--smoke``, the same code runs on a tiny GPT-2 (1 layer, 16
wide, 64 tokens, sequences of 16, batches up to 4) on the CPU in well under 2 minutes (``tests/test_gpu_check.py``
runs it, so the script cannot rot), writes to ``--out`` (default: a temporary file) and refuses to write the committed
``benchmarks/results/gpu.md``: a CPU run measures nothing about a GPU.

    make gpu-check                                                  # = python benchmarks/gpu_check.py --out benchmarks/results/gpu.md
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu_smoke.md  # the CPU smoke
    python benchmarks/gpu_check.py --skip-tests --out ...           # the measurement alone (a rerun)

Prepared device run (the ``device`` tool; its README in the tool library). The device machine has torch, lightning,
transformers, peft, pytest, numpy, scipy, scikit-learn, matplotlib, tensorboard and torchmetrics, but not Opacus,
which travels as a wheel; the package itself travels with the working tree (``PYTHONPATH``). Here, once, in the
repository's root::

    echo /.whl/ >> .git/info/exclude
    .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .whl opacus==1.6.0   # pure Python: any platform

then one ``run`` with ``carry=[".whl"]`` and ``timeout_s=540``, command::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    && export PYTHONPATH=/tmp/site:$PWD || exit; nvidia-smi -L; set -o pipefail;
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT/gpu.md --json $OUT/gpu.json 2>&1 | tee $OUT/log

and copy ``gpu.md`` from the returned files to ``benchmarks/results/gpu.md``. ``tests/test_published_numbers.py``
wants every results file published: the first commit of ``gpu.md`` adds ``<!-- results: benchmarks/results/gpu.md
-->`` … ``<!-- /results -->`` to the "GPU check" section of ``docs/benchmarks.md`` and runs
``python benchmarks/sync_results.py``. A rerun after a fix can take ``--skip-tests`` or ``--tests-only``, or a
smaller ``--max-batch`` (see ``--help``), to fit in what is left of the 15 minutes. The tool's ``timeout_s`` of 540
leaves the report of the parts already measured: it is rewritten after each one.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu.md"

#: the issues' goals (40, 60): (setting, mode) → time ratio against plain; memory: ghost's extra peak memory
TIME_GOALS = {
    ("full", "ghost"): 1.25, ("full", "ghost-split"): 1.25, ("lora", "ghost"): 1.1, ("lora", "hooks"): 1.3,
    ("tied", "functional"): 1.5, ("tied-checkpointed", "functional"): 1.5,
}  # fmt: skip
MEMORY_GOAL = 0.10
#: each setting's modes, plain first and hooks last (per-example gradients of every weight: the likeliest to run out
#: of memory). "tied" is GPT-2 as users have it (head tied to the token embedding: ghost clipping refuses it, so
#: `auto` picks functional mode); "tied-checkpointed" the same with HF gradient checkpointing. "ghost-split": ghost
#: with book-keeping's "split" bfloat16 products (bookkeeping.SIXTEEN_BIT_PRODUCTS), to weigh against "ghost".
MODES_OF = {
    "lora": ("plain", "ghost", "hooks"), "full": ("plain", "ghost", "ghost-split", "functional", "hooks"),
    "tied": ("plain", "functional"), "tied-checkpointed": ("plain", "functional"),
}  # fmt: skip
SETTINGS = tuple(MODES_OF)
PHASES = ("forward", "backward", "optimizer")


@dataclass
class Scale:
    """What one run of the check measures: the GPU's GPT-2 or the smoke's tiny one."""

    model: Dict[str, Any]
    seq: int
    first_batch: int
    max_batch: int
    warmup: int
    steps: int
    noise_numbers: int
    tests: List[List[str]]
    test_timeout: float
    budget: float
    lora_rank: int = 8


#: the CUDA tests: every test marked ``cuda``, and the end-to-end architecture matrix's CUDA column (unmarked)
ARCHITECTURES_ON_CUDA = ["tests/callbacks/test_architectures_end_to_end.py", "-k", "cuda"]
GPU = Scale(model={}, seq=256, first_batch=16, max_batch=256, warmup=3, steps=5, noise_numbers=2**27,
            tests=[["-m", "cuda", "tests"], ARCHITECTURES_ON_CUDA], test_timeout=240.0, budget=400.0)  # fmt: skip
SMOKE = Scale(model=dict(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=63,
                         eos_token_id=63), seq=16, first_batch=2, max_batch=4, warmup=3, steps=3, noise_numbers=2**18,
              tests=[["-m", "cuda", "tests/test_cuda.py"]], test_timeout=60.0, budget=240.0, lora_rank=4)  # fmt: skip


@dataclass
class Run:
    """One (setting, mode) measured: its batch, per-step times (ms) and peak memory (bytes)."""

    setting: str
    mode: str
    batch: int
    steps_ms: List[float] = field(default_factory=list)
    phases_ms: Dict[str, List[float]] = field(default_factory=dict)
    peak_memory: Optional[int] = None
    trainable: int = 0
    note: str = ""
    profile: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps_ms)

    @property
    def step_ms(self) -> float:
        return statistics.median(self.steps_ms)

    @property
    def row_ms(self) -> float:
        return self.step_ms / self.batch

    def phase_ms(self, phase: str) -> float:
        values = self.phases_ms.get(phase) or []
        return statistics.median(values) if values else float("nan")


# ------------------------------------------------------------------------------------------------------- the model
def _quiet() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning",
                 "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):  # fmt: skip
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # ghost under bf16, few workers, peft's notes: none of them is measured here


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def build_lm(scale: Scale, setting: str, device: str):
    """A LightningModule around a randomly initialised GPT-2 (full: untied head; LoRA: adapters on ``c_attn``; tied:
    GPT-2 as it is, head tied, trained in full; tied-checkpointed: the same with HF gradient checkpointing)."""
    import lightning.pytorch as pl
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from lightning_privacy.functional.sequence_loss import causal_lm_signal

    class GPT2Step(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            config = GPT2Config(**scale.model, tie_word_embeddings=setting != "full")
            with torch.random.fork_rng(devices=[]), torch.device(device):
                torch.manual_seed(0)
                model = GPT2LMHeadModel(config)
            if setting == "tied-checkpointed":
                model.gradient_checkpointing_enable()
            if setting == "lora":
                from peft import LoraConfig, get_peft_model

                lora = LoraConfig(
                    r=scale.lora_rank, lora_alpha=2 * scale.lora_rank, target_modules=["c_attn"],
                    fan_in_fan_out=True, lora_dropout=0.0,
                )  # fmt: skip
                model = get_peft_model(model, lora)
            self.model = model

        def forward(self, input_ids, attention_mask=None):
            # one row of position ids per example: Opacus' per-example hooks need the batch dimension on every input
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(input_ids.shape[0], 1)
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits

        def training_step(self, batch, batch_idx):
            losses = causal_lm_signal(self, batch)
            return {"loss": losses.mean(), "per_example_loss": losses}

        def configure_optimizers(self):
            return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=1e-4)

    return GPT2Step()


def token_rows(scale: Scale, rows: int):
    """``rows`` random sequences of ``scale.seq`` tokens, no padding, as a tokenizer's dict examples."""
    import torch
    from torch.utils.data import Dataset

    vocab = scale.model.get("vocab_size", 50257)

    class Rows(Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(rows)
            self.ids = torch.randint(0, vocab, (rows, scale.seq), generator=g)

        def __len__(self) -> int:
            return rows

        def __getitem__(self, i: int):
            return {"input_ids": self.ids[i], "attention_mask": torch.ones(scale.seq, dtype=torch.long)}

    return Rows()


def _is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def largest_plain_batch(scale: Scale, setting: str, device: str) -> int:
    """The largest power of two from ``first_batch`` up to ``max_batch`` whose plain bf16 step fits (two steps each)."""
    import torch

    from lightning_privacy.functional.sequence_loss import causal_lm_signal

    module = build_lm(scale, setting, device).to(device)
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=1e-4)
    fits, batch = 0, scale.first_batch
    while batch <= scale.max_batch:
        data = token_rows(scale, batch)
        rows = {
            k: v.to(device) for k, v in {"input_ids": data.ids, "attention_mask": torch.ones_like(data.ids)}.items()
        }
        oom = False
        try:
            for _ in range(2):
                with torch.autocast(device_type=device, dtype=torch.bfloat16):
                    loss = causal_lm_signal(module, rows).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            _sync(device)
        except RuntimeError as error:
            if not _is_oom(error):
                raise
            oom = True
        loss = rows = None
        optimizer.zero_grad(set_to_none=True)
        _free(device)
        if oom:
            break
        fits, batch = batch, batch * 2
    del module, optimizer
    _free(device)
    if not fits:
        raise RuntimeError(f"not even a batch of {scale.first_batch} fits a plain {setting} step on {device}")
    return fits


# ------------------------------------------------------------------------------------------------------- timing
class _Clock:
    """Marks on the device's timeline: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, device: str) -> None:
        self.device = device

    def mark(self) -> Any:
        import torch

        if self.device == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.device == "cuda" else (b - a) * 1e3


def step_timer(device: str, warmup: int, steps: int, profile: bool):
    """A callback timing each step and its phases, resetting peak memory after ``warmup`` steps; profiles one more."""
    import torch
    from lightning.pytorch.callbacks import Callback

    clock = _Clock(device)

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.index, self.marks, self.peak, self.profile_rows = 0, [], None, []
            self._marks: Dict[str, Any] = {}
            self._profiler = None

        def _measured(self) -> bool:
            return warmup <= self.index < warmup + steps

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            _sync(device)
            if self.index == warmup and device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if profile and self.index == warmup + steps:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if device == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                try:  # a profiler that cannot start (no CUPTI, say) costs the profile, not the run
                    self._profiler = torch.profiler.profile(activities=activities)
                    self._profiler.__enter__()
                except Exception as error:  # noqa: BLE001
                    self._profiler, self.profile_rows = None, [_profiler_failed(error)]
            self._marks = {"start": clock.mark()}

        def on_before_backward(self, trainer, pl_module, loss):
            self._marks.setdefault("forward", clock.mark())

        def on_after_backward(self, trainer, pl_module):
            self._marks["backward"] = clock.mark()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self._marks["pre_step"] = clock.mark()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._marks["end"] = clock.mark()
            if self._measured():
                self.marks.append(self._marks)
                if device == "cuda" and self.index == warmup + steps - 1:
                    _sync(device)
                    self.peak = torch.cuda.max_memory_allocated()
            if self._profiler is not None:
                _sync(device)
                try:
                    self._profiler.__exit__(None, None, None)
                    self.profile_rows = _top_operations(self._profiler, device)
                except Exception as error:  # noqa: BLE001
                    self.profile_rows = [_profiler_failed(error)]
                self._profiler = None
            self.index += 1

        def results(self):
            _sync(device)
            total, phases = [], {p: [] for p in PHASES}
            for m in self.marks:
                total.append(clock.ms(m["start"], m["end"]))
                if all(k in m for k in ("forward", "backward", "pre_step")):
                    phases["forward"].append(clock.ms(m["start"], m["forward"]))
                    phases["backward"].append(clock.ms(m["forward"], m["backward"]))
                    phases["optimizer"].append(clock.ms(m["pre_step"], m["end"]))
            return total, phases

    return StepTimer()


def _profiler_failed(error: BaseException) -> Dict[str, Any]:
    return {
        "op": f"(the profiler failed: {type(error).__name__}: {str(error)[:200]})",
        "ms": 0.0,
        "share": 0.0,
        "calls": 0,
    }


def _top_operations(profiler: Any, device: str, limit: int = 8) -> List[Dict[str, Any]]:
    """The package's own ranges (``lightning_privacy::…``, e.g. book-keeping's clipped sums: their whole time, the
    operations inside included), then the operations of the profiled step that cost most self time on the device (on
    the CPU: CPU time), in ms."""

    def device_us(event: Any, kind: str = "self_") -> float:
        for name in (f"{kind}device_time_total", f"{kind}cuda_time_total"):
            value = getattr(event, name, None)
            if value is not None:
                return float(value)
        return 0.0

    events = list(profiler.key_averages())
    if device == "cuda":
        key, whole = device_us, lambda e: device_us(e, "")
    else:

        def key(event: Any) -> float:
            return float(event.self_cpu_time_total)

        def whole(event: Any) -> float:
            return float(event.cpu_time_total)

    total = sum(key(e) for e in events) or 1.0
    ranges = [
        {"op": e.key, "ms": whole(e) / 1e3, "share": whole(e) / total, "calls": int(e.count), "range": True}
        for e in events
        if e.key.startswith("lightning_privacy::")
    ]
    events = sorted((e for e in events if not e.key.startswith("lightning_privacy::")), key=key, reverse=True)
    return ranges + [
        {"op": e.key, "ms": key(e) / 1e3, "share": key(e) / total, "calls": int(e.count)}
        for e in events[:limit]
        if key(e) > 0
    ]


def _functional_how(dpsgd: Any):
    import lightning.pytorch as pl

    class FunctionalHow(pl.Callback):
        """Whether functional mode's engine ran the batch through vmap or fell back to the per-example loop, and which
        products book-keeping formed (read during the fit: the engine and the book-keeping are gone after it)."""

        seen, fallback, products = False, None, None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            engine = getattr(dpsgd._backward, "engine", None)
            if engine is not None:
                self.seen, self.fallback = True, engine.fallback
            keeper = getattr(getattr(dpsgd._backward, "impl", None), "bookkeeping", None)
            if keeper is not None and keeper.products is not None:
                self.products = keeper.products

    return FunctionalHow()


def measure(scale: Scale, setting: str, mode: str, batch: int, device: str, *, profile: bool) -> Run:
    """One ``Trainer.fit`` of ``warmup + steps (+1 profiled)`` one-step epochs; the measured steps' times and memory."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_privacy import DPSGD
    from lightning_privacy.dpsgd import bookkeeping, products

    run = Run(setting, mode, batch)
    module = build_lm(scale, setting, device)
    run.trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    profiled = profile and mode != "plain"
    timer = step_timer(device, scale.warmup, scale.steps, profiled)
    callbacks: List[Any] = [timer]
    how = None
    if mode != "plain":
        dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode.split("-")[0])
        how = _functional_how(dpsgd)
        callbacks = [dpsgd, timer, how]
    trainer = pl.Trainer(
        accelerator="cuda" if device == "cuda" else "cpu", devices=1, precision="bf16-mixed",
        max_epochs=scale.warmup + scale.steps + int(profiled), callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    default = bookkeeping.SIXTEEN_BIT_PRODUCTS
    bookkeeping.SIXTEEN_BIT_PRODUCTS = "split" if mode == "ghost-split" else default
    try:
        trainer.fit(module, DataLoader(token_rows(scale, batch), batch_size=batch))  # one batch: q = 1 under DPSGD
    finally:
        bookkeeping.SIXTEEN_BIT_PRODUCTS = default
    # how functional mode ran: vmap over chunks of examples, or one example at a time (a fallback)
    if how is not None and how.seen:
        run.note = "vmap" if how.fallback is None else f"loop: {how.fallback}"
    if mode == "ghost-split":  # which 16-bit products book-keeping formed
        run.note = f"products: {how.products or 'not split (no bfloat16 capture)'}"
    if mode.startswith("ghost") and device == "cuda" and not products.native():  # (a torch without out_dtype)
        run.note = "; ".join(filter(None, [run.note, "linear norms' products in float32: no bmm out_dtype"]))
    if mode.startswith("ghost") and dpsgd.rounded_steps:  # (a second 16-bit backward pass formed those steps' sums)
        second = f"second 16-bit pass on {dpsgd.rounded_steps} of {trainer.global_step} steps"
        run.note = "; ".join(filter(None, [run.note, second]))
    run.steps_ms, run.phases_ms = timer.results()
    run.peak_memory, run.profile = timer.peak, timer.profile_rows
    return run


def measure_with_retries(scale: Scale, setting: str, mode: str, batch: int, device: str, *, profile: bool) -> Run:
    """:func:`measure`, halving the batch (at most three times) where the device runs out of memory."""
    notes = []
    for _ in range(4):
        failed = None
        try:
            run = measure(scale, setting, mode, batch, device, profile=profile)
        except RuntimeError as error:
            if not _is_oom(error) or batch == 1:
                raise
            failed = f"out of memory at batch {batch}"
        _free(device)
        if failed is None:
            run.note = "; ".join(notes + ([run.note] if run.note else []))
            return run
        notes.append(failed)
        batch //= 2
    return Run(setting, mode, batch, note="; ".join(notes))


def noise_rates(device: str, numbers: int, repeats: int = 5) -> List[Dict[str, Any]]:
    """Gaussian numbers per second from NoiseSource's generator, its creation time, and Opacus' secure draw."""
    import torch

    from lightning_privacy.dpsgd.noise import NoiseSource

    out = torch.empty(numbers, device=device)
    rows = []

    def timed(fn) -> List[float]:
        times = []
        for step in range(repeats + 1):
            _sync(device)
            start = time.perf_counter()
            fn(step)
            _sync(device)
            if step:  # the first is a warm-up
                times.append((time.perf_counter() - start) * 1e3)
        return times

    fixed, secret, secure = NoiseSource(0), NoiseSource(None), NoiseSource(None, secure=True)
    generators = {step: fixed.generator(step, device) for step in range(repeats + 1)}
    draw = timed(lambda step: out.normal_(0.0, 1.0, generator=generators[step]))
    rows.append({"what": "draw: `normal_` with `NoiseSource(seed).generator(t, device)`", "numbers": numbers,
                 "ms": statistics.median(draw)})  # fmt: skip
    create = timed(lambda step: secret.generator(step, device))
    rows.append({"what": "creating `NoiseSource(None).generator(t, device)` (per step)", "numbers": 0,
                 "ms": statistics.median(create)})  # fmt: skip
    create_secure = timed(lambda step: secure.generator(step, device))
    rows.append({"what": "creating `NoiseSource(secure=True).generator(t, device)` (per step)", "numbers": 0,
                 "ms": statistics.median(create_secure)})  # fmt: skip
    try:
        from opacus.optimizers.optimizer import _generate_noise

        generator = secure.generator(0, device)
        secure_draw = timed(lambda step: _generate_noise(1.0, out, generator=generator, secure_mode=True))
        rows.append({"what": "secure mode: Opacus' draw (4 Gaussians per coordinate + 1)", "numbers": numbers,
                     "ms": statistics.median(secure_draw)})  # fmt: skip
    except ImportError as error:  # Opacus renamed its private helper: the rest still stands
        rows.append({"what": f"secure mode: not measured ({error})", "numbers": 0, "ms": float("nan")})
    return rows  # (the buffer goes with this frame; the caller frees the cache)


# ------------------------------------------------------------------------------------------------------- the tests
def run_cuda_tests(scale: Scale, timeout: float) -> Dict[str, Any]:
    """Each selection of ``scale.tests`` through pytest in a subprocess: counts from its JUnit XML, the failures'
    names, collection errors apart (a module that cannot be imported there holds no CUDA test), the wall time."""
    result: Dict[str, Any] = {"commands": [], "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": [],
                              "collection_errors": [], "notes": [], "tail": ""}  # fmt: skip
    env = dict(os.environ)
    if scale is SMOKE:  # the smoke is a CPU run wherever it runs: its CUDA tests skip
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.perf_counter()
    for selection in scale.tests:
        left = timeout - (time.perf_counter() - start)
        result["commands"].append(" ".join(["pytest", *selection]))
        if left < 10:
            result["notes"].append(f"`pytest {' '.join(selection)}` not run: no time left")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            xml = Path(tmp) / "junit.xml"
            command = [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                       "--continue-on-collection-errors", f"--junitxml={xml}"]  # fmt: skip
            try:
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=left, env=env)
                output, returncode = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as expired:
                output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
                returncode = None
            counted = _count_junit(xml, result) if xml.exists() else 0
        if returncode is None:
            result["notes"].append(f"`pytest {' '.join(selection)}` timed out ({left:.0f} s left of {timeout:.0f} s)")
        elif returncode not in (0, 1, 5) or (returncode == 1 and not counted):  # 5: nothing selected
            result["notes"].append(f"`pytest {' '.join(selection)}` exited {returncode} (usage or internal error)")
        if returncode not in (0, 5):
            result["tail"] += output[-2500:]
    result["seconds"] = time.perf_counter() - start
    return result


def _count_junit(xml: Path, result: Dict[str, Any]) -> int:
    """Adds a JUnit XML file's test cases to ``result``; the number of failed or erroring cases it held."""
    bad = 0
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        error = case.find("error")
        if case.find("failure") is not None:
            result["failed"] += 1
            result["failures"].append(name)
            bad += 1
        elif error is not None and "collection failure" in (error.get("message") or ""):
            result["collection_errors"].append(name)
        elif error is not None:
            result["errors"] += 1
            result["failures"].append(name)
            bad += 1
        elif case.find("skipped") is not None:
            result["skipped"] += 1
        else:
            result["passed"] += 1
    return bad


# ------------------------------------------------------------------------------------------------------- the report
def _versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import lightning_privacy

    found = {"python": platform.python_version(), "torch": torch.__version__, "CUDA": str(torch.version.cuda)}
    for name in ("lightning", "opacus", "transformers", "peft"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "absent"
    found["lightning_privacy"] = lightning_privacy.__version__
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        found["commit"] = commit.stdout.strip() or "unknown"
    except OSError:
        found["commit"] = "unknown"
    return found


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)"
    return (
        f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    )


def ratios(runs: List[Run]) -> List[Dict[str, Any]]:
    """Each DP run against the plain run of its setting: time (per step, or per row at another batch) and memory."""
    plain = {r.setting: r for r in runs if r.mode == "plain" and r.ok}
    out = []
    for run in runs:
        base = plain.get(run.setting)
        if run.mode == "plain" or base is None or not run.ok:
            continue
        same = run.batch == base.batch
        time_ratio = run.step_ms / base.step_ms if same else run.row_ms / base.row_ms
        memory = None
        if same and run.peak_memory and base.peak_memory:
            memory = run.peak_memory / base.peak_memory
        goal = TIME_GOALS.get((run.setting, run.mode))
        out.append({
            "setting": run.setting, "mode": run.mode, "time": time_ratio, "per_row": not same,
            "time_goal": goal, "time_met": None if goal is None else time_ratio <= goal,
            "memory": memory, "memory_goal": 1 + MEMORY_GOAL if run.mode.startswith("ghost") else None,
            "memory_met": None if memory is None or not run.mode.startswith("ghost") else memory <= 1 + MEMORY_GOAL,
        })  # fmt: skip
    return out


def _fmt(x: Optional[float], spec: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _mib(x: Optional[int]) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.0f}"


def _met(flag: Optional[bool]) -> str:
    return "—" if flag is None else ("yes" if flag else "**no**")


def report(info: Dict[str, Any]) -> str:
    smoke, runs = info["smoke"], [Run(**r) for r in info["runs"]]
    v = info["versions"]
    lines = ["# GPU check: DP-SGD on CUDA, against a plain step (issue 40)", ""]
    if smoke:
        lines += ["**CPU smoke of `benchmarks/gpu_check.py` on a tiny GPT-2: it checks that the script runs, it "
                  "measures nothing about a GPU.**", ""]  # fmt: skip
    lines += [
        f"Written by `python benchmarks/gpu_check.py` on {info['date']} in {info['seconds']:.0f} s.",
        "",
        f"- device: {info['device_name']}",
        f"- torch {v['torch']}, CUDA {v['CUDA']}, Python {v['python']}; lightning {v['lightning']}, opacus "
        f"{v['opacus']}, transformers {v['transformers']}, peft {v['peft']}; lightning_privacy {v['lightning_privacy']}"
        f" (commit {v['commit']})",
        "",
        "## CUDA-marked tests",
        "",
    ]
    tests = info.get("tests")
    if tests is None:
        lines += ["Not run (`--skip-tests`).", ""]
    else:
        commands = " and ".join(f"`{c}`" for c in tests["commands"])
        lines += [
            f"{commands}: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
            f"{tests['skipped']} skipped ({tests['seconds']:.0f} s).",
            "",
        ]
        lines += [f"- failed: `{name}`" for name in tests["failures"]]
        lines += [f"- {note}" for note in tests["notes"]]
        if tests["collection_errors"]:
            lines.append("- modules that could not be collected here (they hold no CUDA test): "
                         + ", ".join(f"`{n}`" for n in tests["collection_errors"]))  # fmt: skip
        if tests["tail"].strip():
            lines += ["", "```", tests["tail"].strip()[-3000:], "```"]
        if tests["failures"] or tests["notes"] or tests["collection_errors"]:
            lines.append("")
    scale = info["scale"]
    model = scale["model"] or "defaults (12 layers, 768 wide, 12 heads, 50,257 tokens)"
    lines += [
        "## One optimizer step: plain vs DPSGD ghost (book-keeping) vs hooks",
        "",
        f"GPT-2 `GPT2Config({model})`, randomly initialised; full fine-tuning with the head untied (ghost clipping "
        f"cannot clip a tied parameter), LoRA r = {scale['lora_rank']} on `c_attn` (GPT-2 frozen as it is); "
        f'`precision="bf16-mixed"`, {scale["seq"]} tokens per sequence, SGD, σ = 1, C = 1. Each row is a `Trainer.fit` '
        f"through the product path; times are medians of {scale['steps']} steps after {scale['warmup']} warm-up steps "
        "(DPSGD's self-checks run on the first two), from `on_train_batch_start` to `on_train_batch_end` "
        + ("(CUDA events)" if info["device"] == "cuda" else "(`perf_counter`)")
        + "; forward / backward / optimizer split at `on_before_backward`, `on_after_backward` and "
        "`on_before_optimizer_step` (optimizer: clipping, noise and the update). The batch is the largest power of two "
        f"≤ {scale['max_batch']} whose plain step fits"
        + (f" ({', '.join(f'{k}: {b}' for k, b in info['batches'].items())})" if info.get("batches") else "")
        + "; DPSGD's loader then holds exactly that batch (q = 1), so every step has the same rows. Peak memory: "
        "`torch.cuda.max_memory_allocated` over the measured steps.",
        "",
        "| setting | mode | trainable | batch | step ms | ms / row | forward ms | backward ms | optimizer ms "
        "| peak MiB | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        if not r.ok:
            lines.append(f"| {r.setting} | {r.mode} | {r.trainable:,} | {r.batch} | — | — | — | — | — | — | {r.note} |")
            continue
        lines.append(
            f"| {r.setting} | {r.mode} | {r.trainable:,} | {r.batch} | {r.step_ms:.3f} | {r.row_ms:.4f} "
            f"| {r.phase_ms('forward'):.3f} | {r.phase_ms('backward'):.3f} | {r.phase_ms('optimizer'):.3f} "
            f"| {_mib(r.peak_memory)} | {r.note} |"
        )
    lines += ["", "## Ratios against the issue's goals", "",
              "| ratio | measured | goal | met |", "|---|---:|---:|---|"]  # fmt: skip
    for q in info["ratios"]:
        per = " (per row: another batch)" if q["per_row"] else ""
        goal = "(none)" if q["time_goal"] is None else f"≤ {q['time_goal']:g}×"
        lines.append(
            f"| {q['mode']} ÷ plain, {q['setting']}{per} | {q['time']:.2f}× | {goal} | {_met(q['time_met'])} |"
        )
    for q in info["ratios"]:
        memory = "n/a" if q["memory"] is None else f"{q['memory']:.2f}× ({(q['memory'] - 1) * 100:+.0f} %)"
        goal = f"≤ {q['memory_goal']:.2f}× (+{MEMORY_GOAL:.0%})" if q["memory_goal"] else "(none)"
        lines.append(
            f"| peak memory {q['mode']} ÷ plain, {q['setting']} | {memory} | {goal} | {_met(q['memory_met'])} |"
        )
    if not info["ratios"]:
        lines.append("| (no DP run finished) | — | — | — |")
    missed = [q for q in info["ratios"] if q["time_met"] is False or q["memory_met"] is False]
    if missed:
        lines += ["", "Missed: " + ", ".join(f"{q['mode']} {q['setting']}" for q in missed)
                  + ". The phases in the table and the profiles below say which part of the step costs it."]  # fmt: skip
    lines += ["", "## Noise generation", "", "| what | numbers | ms (median of 5) | Gaussian numbers / s |",
              "|---|---:|---:|---:|"]  # fmt: skip
    rate = None
    for n in info["noise"]:
        this = n["numbers"] / (n["ms"] / 1e3) if n["numbers"] and n["ms"] == n["ms"] and n["ms"] > 0 else None
        rate = this if rate is None else rate  # the first row: the default draw
        numbers = f"{n['numbers']:,}" if n["numbers"] else "—"
        lines.append(f"| {n['what']} | {numbers} | {_fmt(n['ms'], '.3f')} | {_fmt(this, '.3e')} |")
    full = next((r for r in runs if r.setting == "full" and r.mode == "plain" and r.ok), None)
    if rate and full is not None:
        noise_ms = full.trainable / rate * 1e3
        lines += ["", f"At that rate one step's noise for full fine-tuning ({full.trainable:,} coordinates) takes "
                  f"{noise_ms:.3f} ms, {noise_ms / full.step_ms:.1%} of the plain step."]  # fmt: skip
    profiled = [r for r in runs if r.profile]
    if profiled:
        unit = "device" if info["device"] == "cuda" else "CPU"
        lines += ["", "## Profiles", "",
                  f"One extra step of each DP run under `torch.profiler`: the operations with the most self {unit} "
                  "time (the profiler's overhead included); first, in italics, the package's own ranges with all of "
                  "their time (book-keeping's clipped sums: the layers' weight products and their dtype casts)."]  # fmt: skip
        for r in profiled:
            lines += ["", f"**{r.setting}, {r.mode}** (batch {r.batch})", "",
                      f"| operation | self {unit} ms | share | calls |", "|---|---:|---:|---:|"]  # fmt: skip
            for p in r.profile:
                name = f"*`{p['op']}`*" if p.get("range") else f"`{p['op']}`"  # (the package's ranges in italics)
                lines.append(f"| {name} | {p['ms']:.3f} | {p['share']:.0%} | {p['calls']} |")
    if info.get("skipped"):
        lines += ["", "Not measured (over the time budget): " + ", ".join(info["skipped"]) + "."]
    if info.get("failures"):
        lines += ["", "## Failures", ""] + [f"- {f}" for f in info["failures"]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------- main
def _write(out: Path, json_path: Optional[Path], info: Dict[str, Any], started: float) -> None:
    """The report as it stands (rewritten after every part: a run stopped half-way leaves what it measured)."""
    info["seconds"] = time.perf_counter() - started
    info["ratios"] = ratios([Run(**r) for r in info["runs"]])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(info))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(info, indent=1, default=str))


def _failure(error: BaseException) -> str:
    return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny CPU run (automatic without CUDA)")
    parser.add_argument("--out", type=Path, help="the Markdown results (GPU default: benchmarks/results/gpu.md)")
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--skip-tests", action="store_true", help="measure only (a rerun after the tests passed)")
    parser.add_argument("--tests-only", action="store_true", help="run the CUDA tests only")
    parser.add_argument("--max-batch", type=int, help="the batch search's upper end (GPU: 256)")
    parser.add_argument("--no-profile", action="store_true", help="no profiled extra step")
    args = parser.parse_args(argv)

    import torch

    started = time.perf_counter()
    device = _device()
    smoke = args.smoke or device != "cuda"
    if smoke:
        device = "cpu"
        torch.set_num_threads(1)
    scale = SMOKE if smoke else GPU
    if args.max_batch:
        scale.max_batch = args.max_batch
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="gpu_check_")) / "gpu.md" if smoke else RESULTS
    if smoke and out.resolve() == RESULTS.resolve():
        parser.error(f"a CPU run never writes {RESULTS.relative_to(ROOT)} (it measures nothing about a GPU)")

    info: Dict[str, Any] = {"smoke": smoke, "device": device, "scale": asdict(scale), "runs": [], "ratios": [],
                            "noise": [], "batches": {}, "skipped": [], "failures": [],
                            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "versions": _versions(),
                            "device_name": _device_name(device)}  # fmt: skip
    print(f"gpu_check: {'smoke (CPU)' if smoke else info['device_name']}, writing {out}", flush=True)
    if not args.skip_tests:
        info["tests"] = t = run_cuda_tests(scale, scale.test_timeout)
        print(f"tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped "
              f"({t['seconds']:.0f} s) {'; '.join(t['notes'])}", flush=True)  # fmt: skip
        _write(out, args.json, info, started)
    if not args.tests_only:
        _quiet()
        try:
            info["noise"] = noise_rates(device, scale.noise_numbers)
            _free(device)
        except Exception as error:  # noqa: BLE001 (a one-shot GPU run: record it, measure the rest)
            info["failures"].append(f"noise rates {_failure(error)}")
        for setting in SETTINGS:
            try:
                batch = info["batches"][setting] = largest_plain_batch(scale, setting, device)
            except Exception as error:  # noqa: BLE001
                info["failures"].append(f"{setting} batch search {_failure(error)}")
                continue
            print(f"{setting}: batch {batch}", flush=True)
            for mode in MODES_OF[setting]:
                if time.perf_counter() - started > scale.budget:
                    info["skipped"].append(f"{setting} {mode}")
                    continue
                try:
                    run = measure_with_retries(scale, setting, mode, batch, device, profile=not args.no_profile)
                except Exception as error:  # noqa: BLE001
                    run = Run(setting, mode, batch, note=_failure(error))
                    _free(device)
                info["runs"].append(asdict(run))
                step = f"{run.step_ms:.2f} ms" if run.ok else "—"
                print(
                    f"  {mode}: batch {run.batch}, step {step}, peak {_mib(run.peak_memory)} MiB {run.note}", flush=True
                )
                _write(out, args.json, info, started)
    _write(out, args.json, info, started)
    print(f"gpu_check: wrote {out} in {info['seconds']:.0f} s", flush=True)
    tests = info.get("tests") or {}
    failed = tests.get("failed") or tests.get("errors") or tests.get("notes") or info["failures"]
    return 1 if failed or any(not r["steps_ms"] for r in info["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())

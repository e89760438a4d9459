"""Peak memory and step time of DPSGD's per-sample gradient modes: hooks, ghost, functional (vs no DP-SGD).

Two models of 10–20 M parameters train on CPU with ``DPSGD(grad_sample_mode=...)`` (σ = 1, C = 1, Poisson batches
of expected size ``--batch-size``): a wide MLP on flat inputs and a small transformer (token + position Embedding,
two blocks of DPMultiheadAttention + LayerNorm + feed-forward Linear layers) on sequences. ``hooks`` stores every
example's gradient (batch × parameters floats); ``ghost`` computes each example's gradient norm layer by layer
(Linear and Embedding by the ghost-norm identity) and backpropagates the clipped sum in a second pass. ``none`` is
the same module and optimizer without DPSGD, for reference; ``functional`` computes each example's whole gradient by
``torch.func`` in chunks of 256 MiB of per-example gradients. Two GPT-2s of the same blocks, one with GPT-2's head
tied to its token embedding (ghost clipping refuses it; functional mode trains it) and one with its own head, show a
tied-head model's memory in functional mode beside ghost clipping's on the untied one.

Each (model, mode) runs in a fresh subprocess, so one run's allocations cannot hide another's. Memory is the peak
resident set size (``VmHWM`` in ``/proc/self/status``), reset with ``/proc/self/clear_refs`` once the model and data
are built: "peak" is the process's high-water mark during training and "train" the part above the resident size at
that reset (what the training steps themselves added). tracemalloc does not see PyTorch's allocator, so it is not
used. Step time is the median over the measured steps (after warm-up steps) of ``on_train_batch_start`` →
``on_train_batch_end``; every (model, mode) runs ``--repeats`` times, interleaved, and the table shows the fastest
of those medians (the machine is shared: the slower repeats measure other processes) and the largest peak. hooks
and ghost draw the same Poisson batches (same seed); ``none`` uses the plain loader. Linux only (``/proc``).

    python benchmarks/dpsgd_memory.py [--batch-size 32] [--steps 6] [--warmup 2] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("none", "hooks", "ghost", "functional")
MODELS = ("mlp", "transformer", "gpt2", "gpt2_untied")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident set size (Linux ≥ 4.0)


def run_one(model_name: str, mode: str, batch_size: int, steps: int, warmup: int, threads: int) -> dict:
    """One measurement, in this process (called in a fresh subprocess by :func:`main`)."""
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch
    from _models import QUIET, Transformer, wide_mlp
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_privacy import DPSGD
    from lightning_privacy.functional.sequence_loss import causal_lm_losses

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class Module(pl.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            out = self.net(batch[0])
            if out.ndim == 3:  # a language model: one loss per sequence
                losses = causal_lm_losses(out, batch[1])
            else:
                losses = F.cross_entropy(out, batch[1], reduction="none")
            return losses if mode != "none" else losses.mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    n = batch_size * 16  # sample rate 1/16
    if model_name == "mlp":
        net = wide_mlp()
        data = TensorDataset(torch.randn(n, 1024), torch.randint(0, 10, (n,)))
        shape = "1024 → 2048 → 2048 → 2048 → 10"
    elif model_name == "transformer":
        net = Transformer()
        data = TensorDataset(torch.randint(0, 8000, (n, 32)), torch.randint(0, 2, (n,)))
        shape = "Embedding 8000×512 + 2 × (DPMultiheadAttention 8 heads + FFN 2048), T = 32"
    else:  # GPT-2 of 4 blocks, width 512, vocabulary 8,000, its head tied to wte (GPT-2's) or its own (untied)
        from transformers import GPT2Config, GPT2LMHeadModel

        tied = model_name == "gpt2"
        config = GPT2Config(vocab_size=8000, n_positions=64, n_embd=512, n_layer=4, n_head=8, bos_token_id=0,
                            eos_token_id=0, tie_word_embeddings=tied)  # fmt: skip
        config._attn_implementation = "eager"

        class LM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = GPT2LMHeadModel(config)

            def forward(self, tokens):  # (position ids per row: Opacus' hooks see a batch in wpe's input too)
                positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
                return self.model(input_ids=tokens, position_ids=positions).logits

        net = LM()
        tokens = torch.randint(0, 8000, (n, 32))
        data = TensorDataset(tokens, tokens)
        shape = f"GPT-2, 4 blocks of width 512, vocabulary 8,000, T = 32, lm_head {'tied to wte' if tied else 'untied'}"
    params = sum(p.numel() for p in net.parameters())

    times: list = []

    class Timer(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times.append((time.perf_counter() - self.start, int(batch[0].shape[0])))

    callbacks = [Timer()]
    if mode != "none":
        callbacks.insert(0, DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode))
    trainer = pl.Trainer(max_steps=warmup + steps, callbacks=callbacks, **QUIET)
    module = Module(net)
    base_kb = _status_kb("VmRSS")
    _reset_peak()
    pl.seed_everything(1, verbose=False)
    try:
        trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=batch_size))
    except MisconfigurationException as err:  # ghost clipping refuses the tied head: the row says so
        return {"model": model_name, "shape": shape, "mode": mode, "params": params, "refused": str(err).split(" (")[0]}
    peak_kb = _status_kb("VmHWM")
    measured = times[warmup:]
    return {
        "model": model_name,
        "shape": shape,
        "mode": mode,
        "params": params,
        "batch_sizes": [b for _, b in measured],
        "step_s": statistics.median(t for t, _ in measured),
        "base_mb": base_kb / 1024,
        "peak_mb": peak_kb / 1024,
        "train_mb": (peak_kb - base_kb) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="expected Poisson batch size")
    parser.add_argument("--steps", type=int, default=6, help="measured optimizer steps")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per (model, mode)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured first steps")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS))
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.batch_size, args.steps, args.warmup, args.threads)))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    runs: dict = {}
    for repeat in range(args.repeats):
        for model in args.models:
            for mode in MODES:
                command = [sys.executable, __file__, "--one", model, mode, "--batch-size", str(args.batch_size)]
                command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
                out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                runs.setdefault((model, mode), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"  repeat {repeat + 1}: measured {model} / {mode}", file=sys.stderr, flush=True)
    rows = []
    for measured in runs.values():
        if "refused" in measured[0]:
            rows.append(measured[0])
            continue
        row = dict(measured[0], step_s=min(r["step_s"] for r in measured))
        row.update(peak_mb=max(r["peak_mb"] for r in measured), train_mb=max(r["train_mb"] for r in measured))
        row["all_step_s"] = [round(r["step_s"], 3) for r in measured]
        rows.append(row)
    print(
        f"CPU, {args.threads} threads, expected batch {args.batch_size} (Poisson), fastest of {args.repeats} medians of "
        f"{args.steps} steps after {args.warmup} warm-up steps; RSS in MB (fresh process per run)\n"
    )
    print("| model | parameters | mode | step time (s) | × hooks | peak RSS | RSS added by training | × hooks |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "refused" in row:
            print(
                f"| {row['model']} | {row['params'] / 1e6:.1f} M | {row['mode']} | refused: {row['refused']} | | | | |"
            )
            continue
        hooks = next(r for r in rows if r["model"] == row["model"] and r["mode"] == "hooks")
        print(
            f"| {row['model']} | {row['params'] / 1e6:.1f} M | {row['mode']} | {row['step_s']:.2f} | "
            f"{row['step_s'] / hooks['step_s']:.2f} | {row['peak_mb']:.0f} | {row['train_mb']:.0f} | "
            f"{row['train_mb'] / hooks['train_mb']:.2f} |"
        )
    print()
    for model in args.models:
        print(f"{model}: {next(r['shape'] for r in rows if r['model'] == model)}")
    for row in (r for r in rows if "refused" not in r):
        print(
            f"  {row['model']} / {row['mode']}: batch sizes {row['batch_sizes']}, medians per repeat {row['all_step_s']} s"
        )


if __name__ == "__main__":
    main()

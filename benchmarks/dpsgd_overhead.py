"""Where a DP-SGD step's time goes: one step broken into its parts, per mode (hooks, ghost, functional, and auto, the
default, against the mode it trains in), against the same step without DPSGD.

Three models on CPU (one torch thread): a wide MLP (1024 → 2048 → 2048 → 2048 → 10, 10.5 M parameters), a small CNN
(two 3×3 convolutions with GroupNorm on 1×16×16 images, 10 classes) and a small transformer (token and position
embeddings, two blocks of DPMultiheadAttention + feed-forward, T = 32). Each trains with Poisson batches of expected
size 32 for ``--warmup`` + ``--steps`` steps; the table shows medians over the measured steps, in milliseconds, of:

- step: ``on_train_batch_start`` → ``on_train_batch_end`` (what the user waits for per batch);
- forward: the module's ``training_step``; backward: the backward pass(es) (ghost: both passes and the norms);
- clip: Opacus' ``clip_and_accumulate`` (hooks: per-sample norms, clipping and the sum); noise: drawing and adding the
  Gaussian noise (the generator included); scale: dividing by the expected batch size; optimizer: the wrapped SGD's
  ``step``; checks: DPSGD's self-checks (first steps only, so 0 after warm-up); ledger: the accountant's step;
- rest: step − the parts (Lightning's loop, hooks, data loading and collation, the sampler).

The parts are timed by wrapping the methods that do them, each exclusive of the timed parts nested in it (SGD's
``step`` runs Lightning's closure — forward and backward — inside), so they add up to the time spent inside them;
each run is a fresh process. The clock is the process's CPU time (``time.process_time``: user + system, so the page
faults of fresh tensors count) unless ``--clock wall``: with one torch thread it is the wall time of an idle machine,
and it does not move when other processes share the cores. Ratios against ``none`` (the same module and optimizer
without DPSGD) are what to compare.

``--callbacks`` adds each callback's cost on the CNN: the process CPU time of a 3-epoch fit (set-up and fit-end work
included, divided by the epochs) with DPSGD alone, with each of BayesSecurityMonitor, PrivacyBudgetStopping
(``max_epsilon``), AttributeInferenceMonitor (a 3-valued attribute written into a pixel, ``method="approximate"``)
and CanaryAudit (1,000 gradient canaries), all at their defaults, and with all four; 2,048 synthetic 16×16 images,
expected batch 64, ghost mode.

``--before REF`` measures the same rows a second time with the package as it was at git revision ``REF`` (checked
out into a temporary worktree, imported through ``PYTHONPATH``; the script itself is this one) and prints the
ratios side by side: the speed-ups of this release measured in one run.

``--models hf_bert hf_gpt2 hf_llama hf_t5 vit resnet_bn lstm textbag metric`` (``STOCK_MODELS``) measures the
models as a user writes them (Hugging Face BERT, GPT-2, Llama and T5 from small configs, a ViT, a ResNet with
BatchNorm under ``fix_modules=True``, an LSTM, a torchtext-style EmbeddingBag, a module with a torchmetrics metric;
``tests/callbacks/_stock_models.py``) with their own loaders (batch 8): auto's pick, its switch step and its cost (``benchmarks/results/dpsgd_overhead_stock.txt``); ``--models hf_gpt2_padded
hf_llama_padded --before REF`` the stock GPT-2 and Llama given a padding mask, functional mode through vmap now and the
per-example loop before issue 60's fix (``benchmarks/results/dpsgd_overhead_padded.txt``).

``--auto-cost N`` measures ``auto`` (the default) against ``hooks`` where it trains in hooks mode, N alternating fresh
processes per model (one run per mode is too noisy for a few per cent: ±30 % between runs of the same mode here).

    python benchmarks/dpsgd_overhead.py [--steps 8] [--warmup 3] [--before REF] --output benchmarks/results/dpsgd_overhead.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

MODELS = ("mlp", "cnn", "transformer", "gpt2", "gpt2_lora")
#: the tiny GPT-2 with a head of its own (ghost clipping and hooks take it: issue 60's GPT-2 rows, ``--models gpt2
#: gpt2_untied gpt2_lora --before REF`` → ``benchmarks/results/dpsgd_overhead_lm.txt``)
EXTRA_MODELS = ("gpt2_untied",)
#: models as a user writes them (issue 57 item 8; ``tests/callbacks/_stock_models.py``), batch 8 of their own loader:
#: the name here -> the name there
STOCK_MODELS = {
    "hf_bert": "bert", "hf_gpt2": "gpt2", "hf_llama": "llama", "hf_t5": "t5", "vit": "vit", "resnet_bn": "resnet",
    "lstm": "lstm", "textbag": "textbag", "metric": "metric",
}  # fmt: skip
#: stock GPT-2 and Llama given a padding mask (SDPA attention): functional mode's vmap against its loop (issue 60)
PADDED_MODELS = {"hf_gpt2_padded": "gpt2_padded", "hf_llama_padded": "llama_padded"}
MODES = ("none", "hooks", "ghost", "functional", "auto")
NAME_WIDTH = 12  # the tables' model column (wider where a model's name is longer: main sets it)
PARTS = ("forward", "backward", "clip", "noise", "scale", "optimizer", "checks", "ledger")


def run_one(model_name: str, mode: str, steps: int, warmup: int, clock: str = "cpu") -> dict:
    """One (model, mode) in this process: the per-step times of the step and of each part."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch
    from _models import QUIET, Classifier, TinyGPT2, Transformer, small_cnn, wide_mlp
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from opacus.optimizers import DPOptimizer
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_privacy import DPSGD
    from lightning_privacy.dpsgd import optimizers as _optimizers
    from lightning_privacy.dpsgd.backward import PerExampleBackward
    from lightning_privacy.dpsgd.self_checks import SelfChecks
    from lightning_privacy.ledger import PrivacyLedger

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    current: dict = defaultdict(float)
    inner: list = []  # time spent in timed parts nested inside the running one (exclusive timing)

    def timed(owner, name, part):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = now()
            inner.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = now() - start
                nested = inner.pop()
                current[part] += elapsed - nested  # e.g. SGD.step runs Lightning's closure (forward, backward) inside
                if inner:
                    inner[-1] += elapsed

        setattr(owner, name, wrapper)

    n = 32 * 16  # sample rate 1/16
    module, loader, extra = None, None, {}
    if model_name in STOCK_MODELS or model_name in PADDED_MODELS:  # the module, its own loader (batch 8) and DPSGD's
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # arguments, as the tests use
        from tests.callbacks._stock_models import PADDED, STOCK

        make, loader_of, extra, _ = {**STOCK, **PADDED}[{**STOCK_MODELS, **PADDED_MODELS}[model_name]]
        module, loader = make(), loader_of(n)
        net = module
    elif model_name == "mlp":
        net = wide_mlp()
        data = TensorDataset(torch.randn(n, 1024), torch.randint(0, 10, (n,)))
    elif model_name == "cnn":
        net = small_cnn()
        data = TensorDataset(torch.randn(n, 1, 16, 16), torch.randint(0, 10, (n,)))
    elif model_name == "transformer":
        net = Transformer(vocab=4000, width=256, heads=4)
        data = TensorDataset(torch.randint(0, 4000, (n, 32)), torch.randint(0, 2, (n,)))
    else:  # a tiny GPT-2, full (head tied to the token embedding, or untied) or LoRA; the sequences their own labels
        net = TinyGPT2(lora=model_name == "gpt2_lora", tied=model_name != "gpt2_untied")
        tokens = torch.randint(0, 4000, (n, 32))
        data = TensorDataset(tokens, tokens)
    params = sum(p.numel() for p in net.parameters())

    timed(Classifier if module is None else type(module), "training_step", "forward")
    timed(pl.LightningModule, "backward", "backward")  # (DPSGD's backward calls it: exclusive timing counts it once)
    timed(PerExampleBackward, "__call__", "backward")
    timed(DPOptimizer, "clip_and_accumulate", "clip")
    timed(_optimizers._SecretNoise, "add_noise", "noise")
    timed(DPOptimizer, "scale_grad", "scale")
    timed(torch.optim.SGD, "step", "optimizer")
    for name in ("per_sample_gradients", "before_noise", "after_step"):
        timed(SelfChecks, name, "checks")
    timed(PrivacyLedger, "step", "ledger")
    if mode == "auto":  # auto's own work: its step and finish, less the hooks' forward and backward nested in them
        from lightning_privacy.dpsgd.auto import AutoMode
        from lightning_privacy.dpsgd.hooks_mode import HooksMode
        from lightning_privacy.dpsgd.modes import PerLayerMode

        timed(AutoMode, "step", "auto_own")
        timed(AutoMode, "finish", "auto_own")
        timed(PerLayerMode, "forward", "forward")
        timed(HooksMode, "per_layer_backward", "backward")
    records: list = []

    class Timer(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            current.clear()
            self.start = now()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            records.append(dict(current, step=now() - self.start))

    callbacks = [Timer()]
    dpsgd = None
    if mode != "none":
        dpsgd = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode, **extra)
        callbacks.insert(0, dpsgd)
    trainer = pl.Trainer(max_steps=warmup + steps, callbacks=callbacks, **QUIET)
    out = {"model": model_name, "mode": mode, "params": params}
    try:
        if module is None:
            module, loader = Classifier(net, lr=0.01), DataLoader(data, batch_size=32, shuffle=True)
        trainer.fit(module, train_dataloaders=loader)
    except MisconfigurationException as err:  # (ghost clipping refuses the tied head: the row says so)
        return dict(out, refused=str(err).split(" (")[0])
    if dpsgd is not None:  # (auto: the mode it trained in, and the step it switched at)
        out["used"] = dpsgd.grad_sample_mode
        out["switched"] = None if dpsgd.grad_sample_mode_switch is None else dpsgd.grad_sample_mode_switch.step
    measured = records[warmup:]
    for key in ("step", *PARTS, "auto_own"):
        out[key] = 1e3 * statistics.median(r.get(key, 0.0) for r in measured)
    return out


CALLBACK_SETS = ("DPSGD alone", "+ BayesSecurityMonitor", "+ PrivacyBudgetStopping", "+ AttributeInferenceMonitor",
                 "+ CanaryAudit", "+ all four")  # fmt: skip


def run_callbacks(which: str, epochs: int = 3) -> dict:
    """One fit of the CNN with DPSGD and the callbacks of ``which``: process CPU seconds per epoch."""
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch
    from _models import QUIET, Classifier, small_cnn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_privacy import (
        DPSGD,
        AttributeInferenceMonitor,
        BayesSecurityMonitor,
        CanaryAudit,
        PrivacyBudgetStopping,
    )
    from lightning_privacy.attributes import SensitiveAttribute

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    def pixel(x, value):  # the attribute: the top-left pixel of every image
        x = x.clone()
        x[..., 0, 0] = value
        return x

    n = 2048
    data = TensorDataset(torch.randn(n, 1, 16, 16), torch.randint(0, 10, (n,)))
    extra = {
        "+ BayesSecurityMonitor": lambda: [BayesSecurityMonitor()],
        "+ PrivacyBudgetStopping": lambda: [PrivacyBudgetStopping(max_epsilon=50.0)],
        "+ AttributeInferenceMonitor": lambda: [
            AttributeInferenceMonitor(attribute=SensitiveAttribute.custom(substitute=pixel, values=[-1.0, 0.0, 1.0]))
        ],
        "+ CanaryAudit": lambda: [CanaryAudit()],
    }
    callbacks = [DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost")]
    if which == "+ all four":
        callbacks += [c for make in extra.values() for c in make()]
    elif which != "DPSGD alone":
        callbacks += extra[which]()
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET)
    start = time.process_time()
    trainer.fit(Classifier(small_cnn(), lr=0.05), train_dataloaders=DataLoader(data, batch_size=64, shuffle=True))
    return {"set": which, "per_epoch": (time.process_time() - start) / epochs, "steps": trainer.global_step}


def measure_callbacks() -> list:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = []
    for which in CALLBACK_SETS:
        command = [sys.executable, __file__, "--one-callbacks", which]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  measured {which}", file=sys.stderr, flush=True)
    alone = rows[0]["per_epoch"]
    lines = [
        "",
        "Callbacks on the CNN (ghost mode, 3 epochs of 32 steps): process CPU seconds per epoch, ÷ DPSGD alone:",
    ]
    lines += [f"{row['set']:<30}{row['per_epoch']:>8.3f}{row['per_epoch'] / alone:>8.2f}" for row in rows]
    return lines


def measure(models, steps: int, warmup: int, clock: str, roots=(None,)) -> list:
    """Every (model, mode) row for each package root (``None``: the default import), each in a fresh process.

    The roots alternate row by row, so that a slower or busier stretch of the run touches them alike.
    """
    tables: list = [[] for _ in roots]
    for model in models:
        for mode in MODES:
            for table, root in zip(tables, roots):
                env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
                if root is not None:
                    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                command = [sys.executable, __file__, "--one", model, mode, "--steps", str(steps)]
                command += ["--warmup", str(warmup), "--clock", clock]
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                table.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"  measured {model} / {mode}" + (f" ({root})" if root else ""), file=sys.stderr, flush=True)
    return tables


def _count(params: int) -> str:
    return f"{params / 1e6:.2f} M" if params >= 1e5 else f"{params / 1e3:.1f} k"


def _ratio(rows: list, row: dict) -> float:
    plain = next(r for r in rows if r["model"] == row["model"] and r["mode"] == "none")
    return row["step"] / plain["step"] if "refused" not in row else float("nan")


def breakdown(rows: list) -> list:
    head = (
        f"{'model':<{NAME_WIDTH}}{'mode':<11}{'step':>8}{'× none':>8}"
        + "".join(f"{p:>10}" for p in PARTS)
        + f"{'rest':>8}"
    )
    lines = [head]
    for row in rows:
        if "refused" in row:
            lines.append(f"{row['model']:<{NAME_WIDTH}}{row['mode']:<11}refused: {row['refused']}")
            continue
        rest = row["step"] - sum(row[p] for p in PARTS)
        lines.append(
            f"{row['model']:<{NAME_WIDTH}}{row['mode']:<11}{row['step']:>8.1f}{_ratio(rows, row):>8.2f}"
            + "".join(f"{row[p]:>10.1f}" for p in PARTS)
            + f"{rest:>8.1f}"
        )
    return lines


def functional_summary(rows: list) -> list:
    """Functional mode's step against hooks' and the plain step's, per model (the goal on the transformer: ≤ 2× hooks,
    ≤ 3× plain)."""
    lines = ["", "functional mode's step ÷ hooks' step and ÷ the plain step:"]
    for model in dict.fromkeys(r["model"] for r in rows):
        by_mode = {r["mode"]: r for r in rows if r["model"] == model}
        functional, hooks, plain = by_mode.get("functional"), by_mode.get("hooks"), by_mode.get("none")
        if functional is None or hooks is None or plain is None or "refused" in functional or "refused" in hooks:
            continue
        lines.append(
            f"{model:<{NAME_WIDTH}}{functional['step'] / hooks['step']:>8.2f} × hooks{functional['step'] / plain['step']:>8.2f} × none"
        )
    return lines


def auto_summary(rows: list) -> list:
    """``auto`` (the default) against the explicit mode it trained in, per model: what verifying costs where nothing
    switches (the goal: ≤ 1.03 × hooks)."""
    lines = ["", "auto (the default): the mode it trained in, and its step ÷ that mode's step given explicitly:"]
    for model in dict.fromkeys(r["model"] for r in rows):
        by_mode = {r["mode"]: r for r in rows if r["model"] == model}
        auto = by_mode.get("auto")
        if auto is None or "refused" in auto:
            continue
        used = by_mode.get(auto["used"])
        if used is None or "refused" in used:
            continue
        switched = "" if auto.get("switched") is None else f" (switched at step {auto['switched']})"
        lines.append(
            f"{model:<{NAME_WIDTH}}{auto['used']:<11}{auto['step'] / used['step']:>8.3f} × {auto['used']}{switched}"
        )
    return lines


def measure_auto_cost(models, steps: int, warmup: int, clock: str, repeats: int) -> list:
    """``auto`` against ``hooks`` on the models where auto trains in hooks mode, each measured ``repeats`` times in
    alternation (hooks, auto, hooks, auto, …; a fresh process each), so that a slower stretch of the machine touches
    both alike: the median of each mode's step medians, and their ratio — and, in the same auto runs, the time in
    auto's own code (its ``step`` and ``finish`` less the hooks' forward and backward they call: the verification and
    the decision), which is what auto adds to hooks mode whatever the machine's noise (the goal: ≤ 3 %)."""
    lines = [
        "",
        f"auto (the default) against hooks where it trains in hooks mode: median of {repeats} alternating runs each:",
    ]
    for model in models:
        times: dict = {"hooks": [], "auto": []}
        own: list = []
        used = None
        for _ in range(repeats):
            for mode in ("hooks", "auto"):
                env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
                command = [sys.executable, __file__, "--one", model, mode, "--steps", str(steps)]
                command += ["--warmup", str(warmup), "--clock", clock]
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                times[mode].append(row["step"])
                if mode == "auto":
                    used = row.get("used", used)
                    own.append(row["auto_own"])
                print(f"  measured {model} / {mode} (auto's cost)", file=sys.stderr, flush=True)
        if used != "hooks":
            continue
        hooks, auto, mine = statistics.median(times["hooks"]), statistics.median(times["auto"]), statistics.median(own)
        lines.append(
            f"{model:<{NAME_WIDTH}}hooks {hooks:>8.2f} ms   auto {auto:>8.2f} ms   {auto / hooks:>6.3f} × hooks   "
            f"auto's own work {mine:>6.3f} ms = {mine / auto:>6.2%} of its step"
        )
    return lines


def side_by_side(before: list, after: list, ref: str) -> list:
    lines = [
        f"{'model':<{NAME_WIDTH}}{'mode':<11}{'× none ' + ref:>16}{'× none now':>12}{'step ' + ref:>14}{'step now':>10}"
    ]
    for old, new in zip(before, after):
        if new["mode"] == "none" or "refused" in old or "refused" in new:
            continue
        lines.append(
            f"{new['model']:<{NAME_WIDTH}}{new['mode']:<11}{_ratio(before, old):>16.2f}{_ratio(after, new):>12.2f}"
            f"{old['step']:>14.1f}{new['step']:>10.1f}"
        )
    return lines


def _worktree(ref: str, where: Path) -> Path:
    repo = Path(__file__).resolve().parents[1]
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(where), ref], check=True, capture_output=True
    )
    return where


def main() -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="measured steps (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first steps (default: %(default)s)")
    parser.add_argument(
        "--models",
        nargs="*",
        choices=MODELS + EXTRA_MODELS + tuple(STOCK_MODELS) + tuple(PADDED_MODELS),
        default=list(MODELS),
    )
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="process CPU time or wall time")
    parser.add_argument("--before", metavar="REF", help="also measure the package at this git revision")
    parser.add_argument("--output", type=Path, default=None, help="write the table here too")
    parser.add_argument("--callbacks", action="store_true", help="also each callback's cost per epoch on the CNN")
    parser.add_argument(
        "--auto-cost", type=int, default=0, metavar="N",
        help="also auto against hooks, N alternating runs per model (the models where auto trains in hooks mode)",
    )  # fmt: skip
    parser.add_argument(
        "--auto-cost-only", type=int, default=0, metavar="N",
        help="measure only auto's cost again (N alternating runs) and replace that block of --output",
    )  # fmt: skip
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--one-callbacks", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_callbacks:
        print(json.dumps(run_callbacks(args.one_callbacks)))
        return ""
    if args.auto_cost_only:  # (the auto block of an existing output file, measured again)
        kept = args.output.read_text(encoding="utf-8").split("\nauto (the default) against hooks")[0].rstrip("\n")
        cheap = [m for m in args.models if m != "mlp"]
        table = (
            kept + "\n" + "\n".join(measure_auto_cost(cheap, args.steps, args.warmup, args.clock, args.auto_cost_only))
        )
        args.output.write_text(table + "\n", encoding="utf-8")
        print(table)
        return table
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.steps, args.warmup, args.clock)))
        return ""
    clock = "process CPU time" if args.clock == "cpu" else "wall time"
    global NAME_WIDTH
    NAME_WIDTH = max(12, max(map(len, args.models), default=0) + 1)
    lines = [
        f"DP-SGD step broken into its parts: medians over {args.steps} steps after {args.warmup} warm-up steps, ms of "
        f"{clock}; CPU, 1 torch thread, expected batch "
        + (
            "8 (the stock models' own loaders)"
            if all(m in STOCK_MODELS or m in PADDED_MODELS for m in args.models)
            else "32"
        )
        + " (Poisson), σ = 1, C = 1"
    ]
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            root = _worktree(args.before, Path(tmp) / "before")
            try:
                before, after = measure(args.models, args.steps, args.warmup, args.clock, roots=(root, None))
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(root)], cwd=Path(__file__).parent, check=False
                )
        lines += breakdown(after) + ["", f"The step ÷ the plain step, the package at {args.before} and now (same run):"]
        lines += side_by_side(before, after, args.before)
    else:
        (after,) = measure(args.models, args.steps, args.warmup, args.clock)
        lines += breakdown(after)
    lines += functional_summary(after)
    lines += auto_summary(after)
    lines.append(
        "parameters: " + ", ".join(f"{r['model']} {_count(r['params'])}" for r in after if r["mode"] == "none")
    )
    if args.auto_cost:
        cheap = [m for m in args.models if m != "mlp"]  # (the MLP's 1.5 s hooks step: the others say it faster)
        lines += measure_auto_cost(cheap, args.steps, args.warmup, args.clock, args.auto_cost)
    if args.callbacks:
        lines += measure_callbacks()
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.output is not None:
        args.output.write_text(table, encoding="utf-8")
    return table


if __name__ == "__main__":
    main()

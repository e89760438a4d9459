"""Cost of tracking the attribute sensitivity R_t (Cherubin et al. 2024, Algorithm 4, Section 5.4).

Three models, one batch each, C = 1, one thread. For each: the time of one plain DP-SGD step (Opacus
``make_private``: per-sample gradients by hooks, clipping, noise, SGD step) and of R_t, exact (diameter)
and approximate (centre bound), with the default backend (``auto``, here the Gram backend: one batched
forward/backward over the B·|A| substituted rows, per-layer Gram matrices) and with the ``torch.func``
backend (vmap per-sample gradients). The cost reported is

    R_t time ÷ (|A| × one DP-SGD step)     (goal ≤ 1.0; ≤ 0.4 on the Adult MLP)

i.e. R_t relative to |A| ordinary DP-SGD steps, which is what computing |A|·B per-sample gradients
costs Opacus. Each repetition times the DP-SGD step (median of 5) and then every R_t variant once, so
the ratios are taken within a repetition; the table gives medians over repetitions (robust to the
load of a shared machine).

- Adult MLP: TabularMLP 104-64-32-2 (8,866 parameters), attribute ``age`` with |A| = 73 (17..89),
  256 real training rows.
- CNN: 3×32×32 inputs, three 3×3 convs (16 channels) with GroupNorm, ReLU and pooling, Linear head
  (5,354 parameters), batch 64, |A| = 16 (the 4×4 top-left patch set to one of 16 intensities).
- Transformer: Embedding(1000, 32) + Opacus DPMultiheadAttention(32, 4 heads) + LayerNorm + Linear
  (36,418 parameters), sequences of 16 tokens, batch 64, |A| = 16 (the first token replaced by one of
  16 token ids).

Usage::

    python benchmarks/attribute_inference.py                 # ~3-5 min on one core
    python benchmarks/attribute_inference.py --naive 32      # also the naive per-example loop on the MLP (32 rows, scaled)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import warnings

import torch
from opacus import GradSampleModule, PrivacyEngine
from opacus.layers import DPMultiheadAttention
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy.data.datamodule import AdultDataModule
from lightning_privacy.functional.attribute_sensitivity import attribute_sensitivity, gram_backend_reason
from lightning_privacy.functional.attributes import SensitiveAttribute
from lightning_privacy.models import TabularMLP

warnings.filterwarnings("ignore", message=".*Secure RNG.*")
warnings.filterwarnings("ignore", message=".*Full backward hook.*")
warnings.filterwarnings("ignore", message=".*Optimal order is the (largest|smallest) alpha.*")


# ---------------------------------------------------------------------------------------- models
def cnn() -> nn.Module:
    def block(c_in):
        return [nn.Conv2d(c_in, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU()]

    return nn.Sequential(
        *block(3),
        nn.MaxPool2d(2),
        *block(16),
        nn.MaxPool2d(2),
        *block(16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


class Transformer(nn.Module):
    """Embedding + DPMultiheadAttention + LayerNorm + Linear (mean-pooled classifier)."""

    def __init__(self, vocab: int = 1000, dim: int = 32, heads: int = 4, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = DPMultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(self.norm(h + a).mean(1))


def patch(x: torch.Tensor, value: float) -> torch.Tensor:
    x = x.clone()
    x[:, :, :4, :4] = value
    return x


def first_token(idx: torch.Tensor, value: int) -> torch.Tensor:
    idx = idx.clone()
    idx[:, 0] = value
    return idx


def adult_case(batch_size: int):
    dm = AdultDataModule(batch_size=batch_size)
    dm.setup("fit")
    age = dm.sensitive_attribute("age", values=range(17, 90))  # |A| = 73 as in the paper
    x, y = (t[:batch_size] for t in dm.train_dataset.tensors)
    return "Adult MLP", lambda: TabularMLP(dm.num_features), x, y, age


def cnn_case(batch_size: int):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    values = [round(v, 3) for v in torch.linspace(-2.0, 2.0, 16).tolist()]
    return "CNN + GroupNorm", cnn, x, y, SensitiveAttribute.custom(substitute=patch, values=values, name="patch")


def transformer_case(batch_size: int):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 1000, (batch_size, 16), generator=g), torch.randint(0, 2, (batch_size,), generator=g)
    values = list(range(0, 1000, 1000 // 16))[:16]
    return (
        "Transformer",
        Transformer,
        x,
        y,
        SensitiveAttribute.custom(substitute=first_token, values=values, name="tok"),
    )


# ---------------------------------------------------------------------------------------- timing
def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name, build, x, y, attribute, repeats: int, c: float = 1.0) -> dict:
    torch.manual_seed(0)
    model = build()
    k = attribute.size
    dp_model = build()
    dp_model.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(dp_model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=len(y))
    gsm, dp_opt, _ = PrivacyEngine().make_private(
        module=dp_model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=c
    )

    def dp_step():
        dp_opt.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(x), y).backward()
        dp_opt.step()

    variants = {
        (method, backend): (
            lambda method=method, backend=backend: attribute_sensitivity(
                model, x, y, attribute=attribute, max_grad_norm=c, method=method, backend=backend
            )
        )
        for backend in ("auto", "func")
        for method in ("exact", "approximate")
    }
    values = {key: fn() for key, fn in variants.items()}  # warm-up, and the values to compare
    for _ in range(3):
        dp_step()
    times = {key: [] for key in variants}
    ratios = {key: [] for key in variants}
    steps = []
    for _ in range(repeats):
        t_dp = statistics.median(_time(dp_step) for _ in range(5))
        steps.append(t_dp)
        for key, fn in variants.items():
            t = _time(fn)
            times[key].append(t)
            ratios[key].append(t / (k * t_dp))
    for method in ("exact", "approximate"):
        a, b = values[(method, "auto")], values[(method, "func")]
        assert abs(a - b) <= 1e-4 * max(abs(b), 1e-12), (name, method, a, b)
    return {
        "name": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": len(y),
        "k": k,
        "step": statistics.median(steps),
        "backend": "gram" if gram_backend_reason(model) is None else "func",
        "time": {key: statistics.median(v) for key, v in times.items()},
        "ratio": {key: statistics.median(v) for key, v in ratios.items()},
        "speedup": {
            m: statistics.median(f / a for f, a in zip(times[(m, "func")], times[(m, "auto")]))
            for m in ("exact", "approximate")
        },
        "value": values,
        "model": model,
        "x": x,
        "y": y,
        "attribute": attribute,
    }


def naive_exact(model, x, y, attribute, max_grad_norm, examples: int) -> float:
    """Reference: one Opacus backward pass per example over its |A| copies; pairs by a Python double loop."""
    gsm = GradSampleModule(model)
    best = 0.0
    for i in range(examples):
        copies = attribute.expand(x[i : i + 1])[0]  # (|A|, features)
        gsm.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(copies), y[i].repeat(len(copies))).backward()
        flat = torch.cat([p.grad_sample.reshape(len(copies), -1) for p in gsm.parameters()], dim=1) * len(copies)
        for p in gsm.parameters():
            p.grad_sample = None
        norms = flat.norm(dim=1, keepdim=True)
        clipped = flat * (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        for a, b in itertools.combinations(list(clipped), 2):
            best = max(best, float(torch.linalg.vector_norm(a - b)))
    gsm._close()
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--naive", type=int, default=0, help="time the naive loop on this many Adult rows and scale")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    results = [
        measure(*adult_case(256), repeats=args.repeats),
        measure(*cnn_case(64), repeats=args.repeats),
        measure(*transformer_case(64), repeats=args.repeats),
    ]
    print(
        f"R_t cost ÷ (|A| × one Opacus DP-SGD step); {torch.get_num_threads()} thread(s), median of {args.repeats} "
        "repetitions; C = 1\n"
    )
    print(
        "| model | parameters | B | \\|A\\| | DP-SGD step | backend | exact | exact ÷ (\\|A\\|×step) | approximate | approximate ÷ (\\|A\\|×step) |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        for backend in ("auto", "func"):
            label = f"default ({r['backend']})" if backend == "auto" else "torch.func"
            head = (
                f"| {r['name']} | {r['parameters']:,} | {r['batch']} | {r['k']} | {r['step'] * 1e3:.1f} ms "
                if backend == "auto"
                else "| | | | | "
            )
            te, ta = r["time"][("exact", backend)], r["time"][("approximate", backend)]
            re, ra = r["ratio"][("exact", backend)], r["ratio"][("approximate", backend)]
            print(f"{head}| {label} | {te * 1e3:.0f} ms | **{re:.2f}** | {ta * 1e3:.0f} ms | **{ra:.2f}** |")
    print()
    print(
        "| model | speed-up of the default backend over torch.func: exact | approximate | R_t exact | R_t approximate |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['name']} | {r['speedup']['exact']:.1f}× | {r['speedup']['approximate']:.1f}× "
            f"| {r['value'][('exact', 'auto')]:.4f} | {r['value'][('approximate', 'auto')]:.4f} |"
        )
    print()
    goals = {"Adult MLP": 0.4}
    for r in results:
        goal = goals.get(r["name"], 1.0)
        worst = max(r["ratio"][("exact", "auto")], r["ratio"][("approximate", "auto")])
        print(f"{r['name']}: default backend ≤ {goal}: {'yes' if worst <= goal else 'NO'} (worst {worst:.2f})")

    if args.naive:
        r = results[0]
        start = time.perf_counter()
        value = naive_exact(r["model"], r["x"], r["y"], r["attribute"], 1.0, args.naive)
        t_naive = (time.perf_counter() - start) * r["batch"] / args.naive
        exact = r["time"][("exact", "auto")]
        print(
            f"\nnaive loop on the Adult MLP ({args.naive} rows, scaled to {r['batch']}): {t_naive * 1e3:.0f} ms, "
            f"{t_naive / exact:.0f}× the default backend's exact R_t (R_t over those rows: {value:.4f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

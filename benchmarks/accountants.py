"""One accountant behind every ε: σ planned with Opacus' RDP vs the package's PLD, and what it buys on Adult.

Part 1 — planning. For the demo's run (Adult, expected batch 256: q = 1/107, 5 epochs = 535 steps, δ = 1e-5) and
ε = 1, 3, 8: the σ ``PrivacyLedger.calibrate`` plans with ``accountant="rdp"`` and with the default ``"pld"``, the
certified ε of each σ (the package's pessimistic PLD, add/remove; dp_accounting's pessimistic PLD beside it, grid
1e-4), and the test accuracy of the demo's MLP trained with each σ (5 seeds: mean ± sd). The PLD-planned σ meets
the target by the certified ε; the RDP-planned σ adds noise the guarantee does not need.

Part 2 — cost. A ``dp/epsilon`` read every epoch: the time of one read (the steps since the last read composed onto
the stored PLD as one chunk, then ε) at 10⁴ and 10⁵ steps (100 and 1,000 steps per epoch, σ = 1), beside RDP's cached
read, one epoch's β* read (the replace PLD the monitor has always composed) and the per-step cost of an epoch.

    python benchmarks/accountants.py              # → benchmarks/results/accountants.md (~10 min on 2 cores)
    python benchmarks/accountants.py --seeds 1    # quicker, printed only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from lightning_privacy import DPSGD  # noqa: E402
from lightning_privacy.data import AdultDataModule  # noqa: E402
from lightning_privacy.ledger import PrivacyLedger  # noqa: E402
from lightning_privacy.models import TabularMLP  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "accountants.md"
EPSILONS = (1.0, 3.0, 8.0)
EPOCHS, BATCH, DELTA = 5, 256, 1e-5


def dp_accounting_epsilon(sigma: float, rate: float, steps: int, delta: float) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_gaussian_mechanism(standard_deviation=sigma, sampling_prob=rate, value_discretization_interval=1e-4)
    return one.self_compose(steps).get_epsilon_for_delta(delta)


def certified(sigma: float, rate: float, steps: int, per_epoch: int) -> float:
    ledger = PrivacyLedger(delta=DELTA)
    for done in range(0, steps, per_epoch):  # one read per epoch, as a run reads dp/epsilon
        ledger.step(noise_multiplier=sigma, sample_rate=rate, steps=min(per_epoch, steps - done))
        ledger.epsilon()
    return ledger.epsilon()


def accuracy(sigma: float, seed: int) -> float:
    pl.seed_everything(seed, verbose=False)
    data = AdultDataModule(batch_size=BATCH, seed=seed)
    data.setup("fit")
    model = TabularMLP(data.num_features, hidden=(64, 32), lr=0.5)
    dpsgd = DPSGD(noise_multiplier=sigma, delta=DELTA, sampling_seed=seed, noise_seed=seed)
    trainer = pl.Trainer(
        max_epochs=EPOCHS, callbacks=[dpsgd], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu", limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    return float(trainer.test(model, datamodule=data, verbose=False)[0]["test_acc"])


def planning(seeds: int) -> list:
    data = AdultDataModule(batch_size=BATCH)
    data.setup("fit")
    per_epoch = len(data.train_dataloader())
    rate, steps = 1.0 / per_epoch, EPOCHS * per_epoch
    rows = []
    for target in EPSILONS:
        for accountant in ("rdp", "pld"):
            sigma = PrivacyLedger.calibrate(
                sample_rate=rate, steps=steps, target_epsilon=target, delta=DELTA, accountant=accountant,
                steps_per_read=per_epoch,
            )  # fmt: skip
            accs = [accuracy(sigma, seed) for seed in range(seeds)]
            rows.append(
                dict(
                    target=target,
                    accountant=accountant,
                    sigma=sigma,
                    rate=rate,
                    steps=steps,
                    certified=certified(sigma, rate, steps, per_epoch),
                    reference=dp_accounting_epsilon(sigma, rate, steps, DELTA),
                    acc=statistics.mean(accs),
                    sd=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    n=len(accs),
                )  # fmt: skip
            )
            print(rows[-1], flush=True)
    return rows


def cost() -> list:
    rows = []
    for total, per_epoch in ((10_000, 100), (100_000, 1_000)):
        rate = 1.0 / per_epoch
        timings = {}
        for kind in ("pld", "rdp", "beta"):
            ledger = PrivacyLedger(accountant="rdp" if kind == "rdp" else "pld")
            seconds = []
            for _ in range(total // per_epoch):
                ledger.step(noise_multiplier=1.0, sample_rate=rate, steps=per_epoch)
                start = time.perf_counter()
                ledger.bayes_security() if kind == "beta" else ledger.epsilon()
                seconds.append(time.perf_counter() - start)
            timings[kind] = (statistics.mean(seconds), seconds[-1], ledger.epsilon())
        rows.append(dict(total=total, per_epoch=per_epoch, **timings))
        print(rows[-1], flush=True)
    return rows


def step_time() -> float:
    """Seconds per DP-SGD step of the demo's MLP on Adult (one epoch, hooks mode), for scale."""
    pl.seed_everything(0, verbose=False)
    data = AdultDataModule(batch_size=BATCH, seed=0)
    data.setup("fit")
    model = TabularMLP(data.num_features, hidden=(64, 32), lr=0.5)
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[DPSGD(noise_multiplier=1.0)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
        limit_val_batches=0,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(model, datamodule=data)
    return (time.perf_counter() - start) / trainer.global_step


def render(plans: list, costs: list, per_step: float, seeds: int) -> str:
    lines = [
        f"Adult, the demo's MLP (104-64-32-2), expected batch {BATCH} (q = {plans[0]['rate']:.5f}), {EPOCHS} epochs "
        f"= {plans[0]['steps']} steps, C = 1, δ = {DELTA:g}; test accuracy over {seeds} seed(s) (mean ± sd). "
        "'certified ε' is the ledger's (the package's pessimistic PLD, add/remove, read once per epoch); "
        "'dp_accounting' its pessimistic PLD at grid 1e-4.",
        "",
        "| target ε | planned with | σ | σ vs RDP | certified ε | dp_accounting ε | test accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    by_target = {(r["target"], r["accountant"]): r for r in plans}
    for r in plans:
        rdp = by_target[(r["target"], "rdp")]["sigma"]
        lines.append(
            f"| {r['target']:g} | {r['accountant'].upper()} | {r['sigma']:.4f} | {r['sigma'] / rdp - 1:+.1%} | "
            f"{r['certified']:.3f} | {r['reference']:.3f} | {r['acc']:.4f} ± {r['sd']:.4f} |"
        )
    lines += [
        "",
        f"Cost of a read every epoch (σ = 1, mean over the run's epochs / the last epoch's), beside one DP-SGD step of "
        f"the MLP above ({1e3 * per_step:.1f} ms on this machine):",
        "",
        "| steps | steps per epoch | ε read, PLD (ms) | ε read, RDP cached (ms) | β* read, replace PLD (ms) | "
        "PLD read ÷ epoch's steps | ε (PLD / RDP) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in costs:
        epoch = c["per_epoch"] * per_step
        lines.append(
            f"| {c['total']:,} | {c['per_epoch']:,} | {1e3 * c['pld'][0]:.2f} / {1e3 * c['pld'][1]:.2f} | "
            f"{1e3 * c['rdp'][0]:.3f} | {1e3 * c['beta'][0]:.2f} / {1e3 * c['beta'][1]:.2f} | "
            f"{c['pld'][1] / epoch:.2%} | {c['pld'][2]:.3f} / {c['rdp'][2]:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        costs = cost()
        per_step = step_time()
        plans = planning(args.seeds)
    text = render(plans, costs, per_step, args.seeds)
    print(text)
    if args.seeds == 5:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

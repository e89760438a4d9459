"""One accountant behind every ε: how close it is to dp_accounting, the σ it plans against RDP's, and what it buys.

Part 1 — accuracy (``--accuracy``: only this part, ~12 min on one core → ``benchmarks/results/accountant_accuracy.md``).
Over q = 0.004, 0.01, 0.05, 500 and 5,000 steps and ε = 0.5, 1, 2, 4, 8 at δ = 1e-5 (30 runs):
  a. the σ ``PrivacyLedger.calibrate`` plans with the default PLD and with Opacus' RDP (% below RDP);
  b. at the PLD's σ, the ledger's ε at δ = 1e-5 and 1e-8 against dp_accounting's PLD (add/remove, connect-the-dots,
     pessimistic) at its default grid 1e-4 and at the ledger's own grid (the same discretisation: the ledger must never
     be below it);
  c. ε and β* after T steps read at other cadences (every step, every 7, every epoch, once) and across a resume from
     the ledger's saved state, against reading once at the end — and what composing one chunk per read gives instead.
The file opens with a summary table; the guide, the docstrings and the changelog quote it
(``tests/test_accountant_accuracy.py`` checks that they do and recomputes rows).

Part 2 — planning on Adult. For the demo's run (Adult, expected batch 256: q = 1/107, 5 epochs = 535 steps,
δ = 1e-5) and ε = 1, 3, 8: the σ planned with ``accountant="rdp"`` and with the default ``"pld"``, the certified ε of
each σ (the package's pessimistic PLD, add/remove; dp_accounting's pessimistic PLD beside it, grid 1e-4), and the test
accuracy of the demo's MLP trained with each σ (5 seeds: mean ± sd).

Part 3 — cost. A ``dp/epsilon`` read every epoch: the time of one read at 10⁴ and 10⁵ steps (100 and 1,000 steps
per epoch, σ = 1), beside RDP's cached read, one epoch's β* read and the per-step cost of an epoch.

    python benchmarks/accountants.py --accuracy   # → benchmarks/results/accountant_accuracy.md (~12 min, one core)
    python benchmarks/accountants.py              # both files (~50 min on one core: the Adult fits)
    python benchmarks/accountants.py --seeds 1    # Adult quicker, printed only
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
ACCURACY_OUT = ROOT / "benchmarks" / "results" / "accountant_accuracy.md"
RATES, STEPS, TARGETS, DELTAS = (0.004, 0.01, 0.05), (500, 5000), (0.5, 1.0, 2.0, 4.0, 8.0), (1e-5, 1e-8)
EPSILONS = (1.0, 3.0, 8.0)
EPOCHS, BATCH, DELTA = 5, 256, 1e-5


def dp_accounting_pld(sigma: float, rate: float, steps: int, grid: float = 1e-4):
    """dp_accounting's pessimistic (connect-the-dots) add/remove PLD of ``steps`` Poisson-subsampled Gaussian steps."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=rate, value_discretization_interval=grid,
        pessimistic_estimate=True, use_connect_dots=True,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
    )  # fmt: skip
    return one.self_compose(steps)


def dp_accounting_epsilon(sigma: float, rate: float, steps: int, delta: float) -> float:
    return dp_accounting_pld(sigma, rate, steps).get_epsilon_for_delta(delta)


# ------------------------------------------------------------------------------------------------ part 1: accuracy
def sci(value: float) -> str:
    """``+1.1e-6``: a signed difference with two significant digits, as the docs quote it."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:+.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def planned(rate: float, steps: int, target: float) -> dict:
    """σ for ``target`` at δ = 1e-5 by the PLD and by RDP, and the PLD σ's ε against dp_accounting at both δ."""
    pld_sigma = PrivacyLedger.calibrate(sample_rate=rate, steps=steps, target_epsilon=target, delta=DELTA)
    rdp_sigma = PrivacyLedger.calibrate(
        sample_rate=rate, steps=steps, target_epsilon=target, delta=DELTA, accountant="rdp"
    )
    ledger = PrivacyLedger(delta=DELTA)
    ledger.step(noise_multiplier=pld_sigma, sample_rate=rate, steps=steps)
    grid = ledger.privacy_loss_distribution("add_remove").value_discretization_interval
    default = dp_accounting_pld(pld_sigma, rate, steps)
    matched = dp_accounting_pld(pld_sigma, rate, steps, grid=grid)
    row = dict(rate=rate, steps=steps, target=target, sigma=pld_sigma, rdp_sigma=rdp_sigma, grid=grid)
    for delta in DELTAS:
        row[delta] = dict(
            ours=ledger.epsilon(delta),
            default=default.get_epsilon_for_delta(delta),
            matched=matched.get_epsilon_for_delta(delta),
        )
    return row


def _read(segments, reads, ledger=None, done=0):
    """Record ``segments`` [(σ, p, steps)] from step ``done`` on, reading ε and β* every ``reads`` steps (0: never)."""
    ledger = ledger or PrivacyLedger(delta=DELTA)
    position = 0
    for sigma, rate, steps in segments:
        for _ in range(steps):
            position += 1
            if position <= done:
                continue
            ledger.step(noise_multiplier=sigma, sample_rate=rate)
            if reads and position % reads == 0:
                ledger.epsilon(), ledger.bayes_security()
    return ledger


def _per_read(segments, reads) -> float:
    """ε at δ of the PLD composed one chunk per read, reads after the steps in ``reads`` (and at the end)."""
    from lightning_privacy.analysis.composition import ComposedPLD

    pld, position, pending = ComposedPLD(relation="add_remove"), 0, []
    for sigma, rate, steps in segments:
        for _ in range(steps):
            position += 1
            if pending and tuple(pending[-1][:2]) == (sigma, rate):
                pending[-1][2] += 1
            else:
                pending.append([sigma, rate, 1])
            if position in reads:
                for s, p, t in pending:
                    pld.compose(sample_rate=p, noise_multiplier=s, steps=t)
                pending = []
    for s, p, t in pending:
        pld.compose(sample_rate=p, noise_multiplier=s, steps=t)
    return pld.epsilon_uncapped(DELTA)


CADENCE_RUNS = {
    "σ 1.1, q 0.05, 300 steps": [(1.1, 0.05, 300)],
    "σ 1.1 → 2, q 0.05, 120 + 180 steps": [(1.1, 0.05, 120), (2.0, 0.05, 180)],
    "σ 1, q 0.01, 3,000 steps": [(1.0, 0.01, 3000)],
}


def cadence() -> list:
    """ε and β* after the whole run, read at several cadences or resumed half-way, minus reading once at the end."""
    rows = []
    for name, segments in CADENCE_RUNS.items():
        total = sum(t for *_, t in segments)
        epoch = round(1 / segments[0][1])
        once = _read(segments, 0)
        base = (once.epsilon(), once.bayes_security())
        chunked_once = _per_read(segments, set())
        for label, reads in (("every step", 1), ("every 7 steps", 7), (f"every epoch ({epoch} steps)", epoch)):
            if reads == 1 and total > 300:
                continue  # a read per step of 3,000 steps adds minutes and nothing the 300-step runs do not show
            ledger = _read(segments, reads)
            chunked = _per_read(segments, set(range(reads, total + 1, reads)))
            rows.append(dict(run=name, reads=label, epsilon=ledger.epsilon(), beta=ledger.bayes_security(),
                             base=base, chunked=chunked - chunked_once))  # fmt: skip
            print(rows[-1], flush=True)
        half = total // 2
        first = _read(_prefix(segments, half), epoch)
        resumed = PrivacyLedger(delta=DELTA)
        resumed.load_state_dict(first.state_dict())  # a checkpoint's ledger state, saved at step `half`
        _read(segments, 25, ledger=resumed, done=half)
        reads = set(range(epoch, half + 1, epoch)) | {half} | set(range(25, total + 1, 25)) - set(range(half + 1))
        rows.append(dict(run=name, reads=f"resumed at step {half} (read every epoch, then every 25 steps)",
                         epsilon=resumed.epsilon(), beta=resumed.bayes_security(), base=base,
                         chunked=_per_read(segments, reads) - chunked_once))  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def _prefix(segments, steps):
    out, left = [], steps
    for sigma, rate, count in segments:
        if left > 0:
            out.append((sigma, rate, min(count, left)))
        left -= count
    return out


def accuracy_part() -> tuple:
    rows = []
    for rate in RATES:
        for steps in STEPS:
            for target in TARGETS:
                rows.append(planned(rate, steps, target))
                r = rows[-1]
                print(f"q {rate} T {steps} ε {target}: σ {r['sigma']} (RDP {r['rdp_sigma']}), "
                      f"{[(d, r[d]) for d in DELTAS]}", flush=True)  # fmt: skip
    return rows, cadence()


def summary(rows: list, cadences: list) -> dict:
    """The numbers the docs quote, formatted as they quote them."""
    import numpy as np

    out = {}
    for delta in DELTAS:
        for ref in ("matched", "default"):
            diffs = np.array([r[delta]["ours"] - r[delta][ref] for r in rows])
            out[(ref, delta)] = (sci(diffs.max()), sci(float(np.median(diffs))), int((diffs < 0).sum()))
    saved = [100 * (1 - r["sigma"] / r["rdp_sigma"]) for r in rows]
    moved = [abs(c["epsilon"] - c["base"][0]) for c in cadences] + [abs(c["beta"] - c["base"][1]) for c in cadences]
    chunked = [abs(c["chunked"]) for c in cadences]
    out["saved"] = f"{min(saved):.1f}–{max(saved):.1f} %"
    out["cadence"] = sci(max(moved)) if max(moved) else "0"
    out["chunked"] = sci(max(chunked))
    out["cases"] = len(cadences)
    return out


def render_accuracy(rows: list, cadences: list) -> str:
    s = summary(rows, cadences)
    n = len(rows)
    lines = [
        f"The ledger's ε (the package's pessimistic PLD, add/remove) at the σ it plans for ε = 0.5–8 at δ = 1e-5, "
        f"q = {', '.join(f'{q:g}' for q in RATES)} and {' and '.join(f'{t:,}' for t in STEPS)} steps ({n} runs), "
        "against dp_accounting 0.6's PLD: pessimistic (connect-the-dots) at the ledger's own grid — the same "
        "discretisation, so the difference is the ledger's safety allowances (round-off and truncation bounds added "
        "to δ) — and at dp_accounting's default grid 1e-4, finer than the ledger's p/σ/10 within [1e-5, 1e-3]. "
        "Differences are the ledger's ε minus dp_accounting's: max (median).",
        "",
        "| quantity | δ = 1e-5 | δ = 1e-8 |",
        "|---|---|---|",
    ]
    for ref, name in (("matched", "at the ledger's grid"), ("default", "at grid 1e-4")):
        cells = [f"{s[(ref, d)][0]} ({s[(ref, d)][1]})" for d in DELTAS]
        lines.append(f"| ε − dp_accounting's pessimistic PLD {name} | {' | '.join(cells)} |")
    cells = [f"{s[('matched', d)][2]} of {n}" for d in DELTAS]
    lines.append(
        f"| runs where ε is below dp_accounting's pessimistic PLD at the ledger's grid | {' | '.join(cells)} |"
    )
    lines += [
        "",
        "| quantity | value |",
        "|---|---|",
        f"| σ planned with the PLD below σ planned with Opacus' RDP, same target | {s['saved']} |",
        f"| largest change of ε or β* read at another cadence or across a resume ({s['cases']} cases) | "
        f"{s['cadence']} |",
        f"| the same, composing one chunk per read (how the ledger composed before) | {s['chunked']} |",
        "",
        "Per run (σ: planned with the PLD at δ = 1e-5, rounded up to 1e-4; RDP's beside it; grid: the ledger's; ε at "
        "δ = 1e-5 / 1e-8 and its differences from dp_accounting's pessimistic PLD at the ledger's grid and at 1e-4):",
        "",
        "| q | steps | target ε | σ (PLD) | σ (RDP) | PLD below RDP | grid | ε | − same grid | − grid 1e-4 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eps = " / ".join(f"{r[d]['ours']:.4f}" for d in DELTAS)
        same = " / ".join(sci(r[d]["ours"] - r[d]["matched"]) for d in DELTAS)
        fine = " / ".join(sci(r[d]["ours"] - r[d]["default"]) for d in DELTAS)
        lines.append(
            f"| {r['rate']:g} | {r['steps']:,} | {r['target']:g} | {r['sigma']:.4f} | {r['rdp_sigma']:.4f} | "
            f"{100 * (1 - r['sigma'] / r['rdp_sigma']):.1f} % | {r['grid']:g} | {eps} | {same} | {fine} |"
        )
    lines += [
        "",
        "ε and β* (δ = 1e-5) after the whole run read at other cadences or resumed from the ledger's saved state, minus "
        "reading once at the end; the last column is the same difference for ε when the PLD is composed one chunk "
        "per read (the ledger's composition before ε stopped depending on the reads):",
        "",
        "| run | reads | ε | ε − read once | β* − read once | one chunk per read: ε − read once |",
        "|---|---|---|---|---|---|",
    ]
    for c in cadences:
        lines.append(
            f"| {c['run']} | {c['reads']} | {c['epsilon']:.6f} | {sci(c['epsilon'] - c['base'][0])} | "
            f"{sci(c['beta'] - c['base'][1])} | {sci(c['chunked'])} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- part 2: Adult
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
                sample_rate=rate, steps=steps, target_epsilon=target, delta=DELTA, accountant=accountant
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
        "'certified ε' is the ledger's (the package's pessimistic PLD, add/remove); "
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
    parser.add_argument("--accuracy", action="store_true", help="part 1 only (accountant_accuracy.md)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, cadences = accuracy_part()
        text = render_accuracy(rows, cadences)
        print(text)
        ACCURACY_OUT.write_text(text, encoding="utf-8")
        print(f"wrote {ACCURACY_OUT}")
        if args.accuracy:
            return
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

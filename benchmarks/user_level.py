"""User-level DP on data where people own unequal numbers of rows (issue 58): user-level sampling (ULS) against
example-level sampling (ELS) at the same person-level ε and the same compute.

Adult, grouped into synthetic households: the 45,222 rows of ``adult.data`` and ``adult.test`` (one encoder, fitted on
``adult.data``) shuffled once and dealt into households of Geometric(0.2) rows (at least 1, capped at 40; mean ≈ 5, a
heavy tail), the household being the person; half the households train (members), the other half are held out (the test
rows of the utility and the non-members of user inference). Every run: the Adult MLP (104-64-32-2, SGD), DP-SGD at
C = 1, δ = 1e-5, σ planned for the person's ε after ``--epochs`` epochs, the contribution bound k = 8
(``max_examples_per_user``), sample rate q = 0.01 for both samplings — each person joins a step with probability q
under ULS, each kept row under ELS, so a step sees q × (kept rows) rows in expectation either way and both run the
same steps: the same compute. The divisor of the noised sum is the expected number of people (ULS) or rows (ELS) per
step.

Measured per run:

- test accuracy on the held-out households' rows;
- user inference: the LOSS attack on people (each household's mean membership loss over all its rows; members: the
  training households, non-members: the held-out ones; ``audit_membership(..., user_ids=...)``), its AUC and TPR at
  1 % FPR;
- in a second fit of the same recipe, 1,000 canary people of k gradient-canary rows each (``CanaryAudit(
  rows_per_canary=k)``), their binomial ε lower bound ÷ the person's ε, and whether they contradict the person-level
  claim (they must not) and the record-level one (the same run's ε for one row: ``DPSGD.record_epsilon``);
- the person's ε and a row's ε of the same run.

    OMP_NUM_THREADS=1 python benchmarks/user_level.py --output benchmarks/results/user_level.md   # ~35 min

A second part does the same on a language model (``--parts lm``): people each with their own perturbation of a
Markov chain and 1–50 sequences, the tiny GPT-2 with LoRA, the held-out people's loss as utility, and user inference
(Kandpal et al. 2023) on fresh sequences of every person: their loss under the base minus under the fine-tune.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_privacy import DPSGD, CanaryAudit, audit_membership  # noqa: E402
from lightning_privacy.audits import canary_run  # noqa: E402
from lightning_privacy.claims import Claim  # noqa: E402
from lightning_privacy.data.adult import AdultEncoder, load_adult  # noqa: E402
from lightning_privacy.models import TabularMLP  # noqa: E402

K, RATE, DELTA, GEOMETRIC, LARGEST = 8, 0.01, 1e-5, 0.2, 40
EPSILONS = (2.0, 8.0)


def households(seed: int = 0):
    """Features, labels and each row's household; the households' split into members and held-out people."""
    train, test = load_adult("train"), load_adult("test")
    encoder = AdultEncoder().fit(train)
    x = np.concatenate([encoder.transform(train), encoder.transform(test)]).astype(np.float32)
    y = np.concatenate([train.labels, test.labels])
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    sizes = np.minimum(LARGEST, rng.geometric(GEOMETRIC, size=len(y)))  # ≥ 1 row each (mean 1/0.2 = 5)
    count = int(np.searchsorted(np.cumsum(sizes), len(y))) + 1  # households until every row has one
    person = np.repeat(np.arange(count), sizes[:count])[: len(y)]
    x, y = x[order], y[order]
    members = (rng.random(len(sizes)) < 0.5)[:count]  # (one draw per household: the first `count` are used)
    return x, y, person, members


class QUIET:
    kwargs = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  accelerator="cpu")  # fmt: skip


def fit(data, *, epsilon: float, uls: bool, epochs: int, seed: int, canaries: bool):
    """One DP-SGD fit on the members' rows; returns (model, DPSGD, CanaryAudit or None, seconds)."""
    x, y, person, members = data
    rows = np.flatnonzero(members[person])
    ids = person[rows].tolist()
    torch.manual_seed(seed)
    model = TabularMLP(x.shape[1], hidden=(64, 32), lr=0.5)
    people = len(set(ids))
    kept = sum(min(K, c) for c in np.bincount(person[rows]) if c)
    dpsgd = DPSGD(
        target_epsilon=epsilon, epochs=epochs, delta=DELTA, privacy_unit="user", user_ids=ids,
        max_examples_per_user=K, user_sampling=uls, sample_rate=RATE,
        expected_batch_size=RATE * (people if uls else kept), exactness_rate=0.0, neighbour_rate=0.0,
    )  # fmt: skip
    callbacks: List[pl.Callback] = [dpsgd]
    audit = None
    if canaries:
        audit = CanaryAudit(num_canaries=1000, seed=seed, rows_per_canary=K)
        callbacks.append(audit)
    loader = DataLoader(
        TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows])), batch_size=int(np.ceil(len(rows) * RATE))
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET.kwargs).fit(model, loader)
    return model, dpsgd, audit, time.perf_counter() - start


def measure(data, *, epsilon: float, uls: bool, epochs: int, seed: int) -> Dict[str, float]:
    x, y, person, members = data
    model, dpsgd, _, seconds = fit(data, epsilon=epsilon, uls=uls, epochs=epochs, seed=seed, canaries=False)
    held = np.flatnonzero(~members[person])
    train = np.flatnonzero(members[person])
    model.eval()
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(x[held])).argmax(1).numpy() == y[held]).mean())

    def loader(index):
        return DataLoader(TensorDataset(torch.from_numpy(x[index]), torch.from_numpy(y[index])), batch_size=4096)

    ui = audit_membership(
        model, loader(train), loader(held), attack="loss", user_ids=(person[train].tolist(), person[held].tolist()),
        warn=False, delta=DELTA,
    )  # fmt: skip
    _, canary_dpsgd, audit, canary_seconds = fit(
        data, epsilon=epsilon, uls=uls, epochs=epochs, seed=seed, canaries=True
    )
    record = Claim.dp_sgd(noise_multiplier=canary_dpsgd.noise_multiplier, sample_rate=RATE, steps=canary_dpsgd.steps,
                          delta=DELTA)  # fmt: skip
    if uls:  # a row of a ULS run: a Gaussian of sensitivity 2C (DPSGD.record_epsilon)
        record = Claim.dp_sgd(noise_multiplier=canary_dpsgd.noise_multiplier / 2, sample_rate=RATE,
                              steps=canary_dpsgd.steps, delta=DELTA)  # fmt: skip
    against_record = canary_run.audit_run(
        audit.canaries, kind="gradient", alpha=0.05, delta=DELTA, correction="bonferroni", claim=record,
        dpsgd=canary_dpsgd, score="released_minus_batch",
    )  # fmt: skip
    return {
        "sigma": float(dpsgd.noise_multiplier),
        "accuracy": accuracy,
        "auc": float(ui.auc),
        "tpr": float(ui.tpr[1].tpr),
        "canary": float(audit.result.epsilon_lower),
        "person_contradicted": float(audit.result.verdict == "contradicted"),
        "record_contradicted": float(against_record.verdict == "contradicted"),
        "epsilon": float(dpsgd.epsilon()),
        "record_epsilon": float(dpsgd.record_epsilon()),
        "steps": float(dpsgd.steps),
        "seconds": seconds + canary_seconds,
        "left_out": float(dpsgd.people.rows_left_out),
        "people": float(dpsgd.people.num_people),
    }


# ------------------------------------------------------------------------------------------------ language model
LM_PEOPLE, LM_LARGEST, LM_RATE, LM_FAVOURITES, LM_MIX, LM_FRESH, LM_PRETRAIN = 400, 50, 0.05, 100, 0.8, 4, 3000
LM_LR = 2e-3  # Adam (the language-model benchmark's DP learning rate)


class PeopleSequences(torch.utils.data.Dataset):
    """Each person's sequences from their own perturbation of one Markov chain: every person has ``LM_FAVOURITES``
    tokens of their own, after which the next token is, with probability ``mix``, the person's own successor of that
    token, else the chain's (one of 8, uniform); so a person's sequences share transitions no other person's have.
    ``mix=0``: the chain alone (the base's pretraining data). Mappings with ``input_ids`` and ``attention_mask``
    (lengths 16–32), as the language-model benchmark's."""

    def __init__(self, counts: np.ndarray, *, seed: int, mix: float = LM_MIX, vocab: int = 1000, length: int = 32):
        g = torch.Generator().manual_seed(0)  # the chain and the people: shared by every split
        shared = torch.randint(1, vocab, (vocab, 8), generator=g)
        own = torch.randint(1, vocab, (LM_PEOPLE, vocab), generator=g)  # each person's own successor of each token
        favourite = torch.zeros(LM_PEOPLE, vocab, dtype=torch.bool)
        for person in range(LM_PEOPLE):
            favourite[person, torch.randperm(vocab - 1, generator=g)[:LM_FAVOURITES] + 1] = True
        rows = torch.as_tensor(np.repeat(np.arange(len(counts)), counts))
        g = torch.Generator().manual_seed(seed)  # the sequences
        ids = torch.empty(len(rows), length, dtype=torch.long)
        ids[:, 0] = torch.randint(1, vocab, (len(rows),), generator=g)
        for t in range(1, length):
            last = ids[:, t - 1]
            common = shared[last, torch.randint(0, 8, (len(rows),), generator=g)]
            mine = favourite[rows, last] & (torch.rand(len(rows), generator=g) < mix)
            ids[:, t] = torch.where(mine, own[rows, last], common)
        lengths = torch.randint(16, length + 1, (len(rows),), generator=g)
        self.attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        self.input_ids = ids * self.attention_mask
        self.person = rows.numpy()

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i]}


def lm_people(seed: int = 0):
    """The people's sequence counts (1–50, log-uniform), which people train, their training sequences, fresh sequences
    of every person (for user inference, Kandpal et al.'s setting, and the utility), and the base: the tiny GPT-2
    pretrained without DP on the chain alone (``save_pretrained`` to a temporary folder)."""
    import tempfile

    sys.path.insert(0, str(ROOT / "examples"))
    import dp_lora_language_model as lm

    rng = np.random.default_rng(seed)
    counts = np.minimum(LM_LARGEST, np.floor(np.exp(rng.uniform(0, np.log(LM_LARGEST + 1), LM_PEOPLE)))).astype(int)
    members = rng.random(LM_PEOPLE) < 0.5
    sequences = PeopleSequences(counts, seed=1)
    fresh = PeopleSequences(np.full(LM_PEOPLE, LM_FRESH), seed=2)
    folder = tempfile.mkdtemp(prefix="user_level_base_")
    torch.manual_seed(0)
    base = lm.CausalLM(lora_rank=0, lr=2e-3)
    chain = PeopleSequences(np.full(LM_PEOPLE, LM_PRETRAIN // LM_PEOPLE), seed=3, mix=0.0)
    loader = DataLoader(chain, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=3, **QUIET.kwargs).fit(base, loader)
    base.model.save_pretrained(folder)
    return counts, members, sequences, fresh, folder


def lm_measure(data, *, epsilon: float, uls: bool, epochs: int, seed: int) -> Dict[str, float]:
    """One LoRA fine-tune of the pretrained tiny GPT-2 per recipe (and one with canary people): the trained people's
    loss on fresh sequences of theirs, user inference on those sequences, the canary people's bound."""
    sys.path.insert(0, str(ROOT / "examples"))
    import dp_lora_language_model as lm

    from lightning_privacy.functional.base_reference import BaseLossDifferenceSignal

    counts, members, sequences, fresh, folder = data
    train = np.flatnonzero(members[sequences.person])
    ids = sequences.person[train].tolist()
    kept = int(np.minimum(counts[members], K).sum())
    out: Dict[str, float] = {}
    for canaries in (False, True):
        torch.manual_seed(seed)
        model = lm.CausalLM(model_name=folder, lora_rank=8, lr=LM_LR)
        dpsgd = DPSGD(
            target_epsilon=epsilon, epochs=epochs, delta=DELTA, privacy_unit="user", user_ids=ids,
            max_examples_per_user=K, user_sampling=uls, sample_rate=LM_RATE,
            expected_batch_size=LM_RATE * (int(members.sum()) if uls else kept), exactness_rate=0.0,
            neighbour_rate=0.0,
        )  # fmt: skip
        audit = CanaryAudit(num_canaries=1000, seed=seed, rows_per_canary=K) if canaries else None
        loader = DataLoader(torch.utils.data.Subset(sequences, train), batch_size=int(np.ceil(len(train) * LM_RATE)))
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            callbacks = [dpsgd] + ([audit] if audit else [])
            pl.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET.kwargs).fit(model, loader)
        out["seconds"] = out.get("seconds", 0.0) + time.perf_counter() - start
        if canaries:
            out["canary"] = float(audit.result.epsilon_lower)
            out["person_contradicted"] = float(audit.result.verdict == "contradicted")
            continue
        fresh_members = np.flatnonzero(members[fresh.person])
        fresh_others = np.flatnonzero(~members[fresh.person])
        member_loader = DataLoader(torch.utils.data.Subset(fresh, fresh_members), batch_size=256)
        out["loss"] = lm.mean_loss(model, member_loader)
        ui = audit_membership(
            model, member_loader, DataLoader(torch.utils.data.Subset(fresh, fresh_others), batch_size=256),
            attack="loss", signal_fn=BaseLossDifferenceSignal(),
            user_ids=(fresh.person[fresh_members].tolist(), fresh.person[fresh_others].tolist()), warn=False,
            delta=DELTA,
        )  # fmt: skip
        out.update(
            sigma=float(dpsgd.noise_multiplier), auc=float(ui.auc), tpr=float(ui.tpr[1].tpr),
            epsilon=float(dpsgd.epsilon()), record_epsilon=float(dpsgd.record_epsilon()), steps=float(dpsgd.steps),
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lm-epochs", type=int, default=5)
    parser.add_argument("--lm-seeds", type=int, default=1)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--parts", nargs="*", choices=("adult", "lm"), default=["adult", "lm"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    lines = [
        "# User-level DP: user-level against example-level sampling at the same person-level ε",
        "",
        f"`python benchmarks/user_level.py --seeds {args.seeds} --epochs {args.epochs} --lm-epochs {args.lm_epochs} "
        f"--lm-seeds {args.lm_seeds}` "
        f"(torch {torch.__version__}, one thread). k = {K} rows per person, C = 1, δ = {DELTA:g}; σ planned for the "
        "person's ε; ULS samples people, ELS kept rows, at the same rate (the same expected rows per step, the same "
        f'steps: the same compute). Means over the seeds (Adult {args.seeds}, language model {args.lm_seeds}). "canary people": 1,000 canaries of k '
        "gradient-canary rows each, in a second fit of the same recipe; the claims they test are the person's (the "
        "run's ledger) and a row's (the same run's ε for one row: `DPSGD.record_epsilon`, a Gaussian of sensitivity 2C "
        "under ULS).",
    ]
    if "adult" in args.parts:
        lines += adult_table(args)
    if "lm" in args.parts:
        lines += lm_table(args)
    lines += [
        "",
        f"<!-- written by benchmarks/user_level.py, {datetime.date.today()}, {time.perf_counter() - start:.0f} s -->",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")


HEADER = (
    "| person ε | sampling | σ | {utility} | user-inference AUC | TPR at 1 % FPR | canary people: bound ÷ ε | canaries "
    "contradict the person's claim | … a row's claim | a row's ε (same run) |"
)


def _row(epsilon: float, uls: bool, runs: List[Dict[str, float]], utility: str) -> str:
    mean = {key: statistics.mean(r[key] for r in runs) for key in runs[0]}
    print(f"ε = {epsilon:g} {'ULS' if uls else 'ELS'}: {mean}", file=sys.stderr, flush=True)
    row_claim = (
        f"{int(sum(r['record_contradicted'] for r in runs))} of {len(runs)}" if "record_contradicted" in mean else "—"
    )
    return (
        f"| {epsilon:g} | {'ULS (people)' if uls else 'ELS (rows)'} | {mean['sigma']:.3f} | {mean[utility]:.4f} | "
        f"{mean['auc']:.4f} | {mean['tpr']:.4f} | {mean['canary'] / mean['epsilon']:.3f} | "
        f"{int(sum(r['person_contradicted'] for r in runs))} of {len(runs)} | {row_claim} | "
        f"{mean['record_epsilon']:.2f} |"
    )


def adult_table(args: Any) -> List[str]:
    data = households()
    x, y, person, members = data
    sizes = np.bincount(person)
    lines = [
        "",
        "## Adult households",
        "",
        f"{len(y):,} Adult rows dealt into {len(sizes):,} synthetic households of Geometric({GEOMETRIC}) rows (mean "
        f"{sizes.mean():.2f}, largest {sizes.max()}, {int((sizes > K).sum())} above k); {int(members.sum()):,} "
        f"households train, {int((~members).sum()):,} are held out. The Adult MLP, q = {RATE}, {args.epochs} epochs. "
        "User inference: LOSS on each household's mean membership loss.",
        "",
        HEADER.format(utility="test accuracy"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for epsilon in EPSILONS:
        for uls in (True, False):
            runs = [measure(data, epsilon=epsilon, uls=uls, epochs=args.epochs, seed=s) for s in range(args.seeds)]
            lines.append(_row(epsilon, uls, runs, "accuracy"))
    return lines


def lm_table(args: Any) -> List[str]:
    data = lm_people()
    counts, members = data[0], data[1]
    lines = [
        "",
        "## Language model: people with their own perturbation of a Markov chain",
        "",
        f"{LM_PEOPLE} people, each with 1–{LM_LARGEST} sequences (log-uniform; {int(counts.sum()):,} in all, "
        f"{int((counts > K).sum())} people above k) from a chain whose next token follows the person's own successor "
        f"with probability {LM_MIX} after each of the person's {LM_FAVOURITES} own tokens; {int(members.sum())} people "
        f"train. The tiny GPT-2 of the language-model benchmark pretrained without DP on {LM_PRETRAIN:,} sequences of "
        f"the chain alone (the base), then LoRA r = 8 with DP-SGD, q = {LM_RATE}, {args.lm_epochs} epochs. Utility: the "
        f"trained people's mean token loss on {LM_FRESH} fresh sequences each (lower is better; what the fine-tune "
        "learned of them). User inference (Kandpal et al. 2023): on those fresh sequences of every person, their loss "
        "under the base (adapters disabled) minus under the fine-tune, averaged per person "
        "(`BaseLossDifferenceSignal`, `user_ids`).",
        "",
        HEADER.format(utility="trained people's loss"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for epsilon in EPSILONS:
        for uls in (True, False):
            runs = [
                lm_measure(data, epsilon=epsilon, uls=uls, epochs=args.lm_epochs, seed=s) for s in range(args.seeds)
            ]
            lines.append(_row(epsilon, uls, runs, "loss"))
    return lines


if __name__ == "__main__":
    main()

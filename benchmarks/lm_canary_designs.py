"""Language-model canary designs on the language-model benchmark's DP fine-tune, and ten times longer (issue 50).

The model, data and base are ``benchmarks/language_model.py``'s: a tiny GPT-2 (2 layers, 128 wide) pretrained without
DP on 4,000 sequences of a random Markov chain (1,000 tokens), then fine-tuned with DP-SGD (hooks, C = 1, δ = 1e-5,
expected batch 64, Adam) on 1,000 member sequences plus the inserted canaries: m = 1,000 canaries of 32 tokens, each
inserted once with probability ½ (Steinke et al. 2023's one-run game, black-box as in Panda et al. 2025), scored by
the base's minus the fine-tune's mean loss over the canary's scored tokens (``audit_language_model_canaries``).

Designs (Panda et al.'s recipe, one piece at a time):

- ``random tokens``: 32 random tokens of the chain's vocabulary, trained and scored on all of them;
- ``new token, loss on all``: a random prefix, then a secret of one new token of its own (an id no sequence and no
  other canary contains, added with ``resize_token_embeddings``), trained on every token, scored on the secret — the
  language-model benchmark's new-token row;
- ``new token, loss on secret``: the same canaries trained with the loss on the secret only
  (``with_canaries(..., loss_on="secret")``), so that the canary's clipped gradient is all its secret's;
- ``4 new tokens, loss on secret``: a secret of four new tokens of its own (4,000 new ids), loss on the secret;
- ``…, low-prior rows``: the same on a base whose new rows start with almost no probability
  (:func:`with_low_prior_tokens`; every other design's base has ``resize_token_embeddings``' own rows).

Part 1 — the benchmark's length (5 epochs: p = 1/24, 120 steps), full fine-tuning at ε = 8: every design, one
inclusion vector (seed ``CANARY_SEED``). Part 2 — ten times longer (50 epochs, 1,200 steps), where
``benchmarks/results/lm_canary_ceiling.md`` shows an ideal final-model canary reaching 0.35 / 0.28 of ε: the design
fixed before any run (four new tokens, loss on the secret; canaries and inclusion drawn from another seed, so nothing
of part 1's outcome decides what part 2 tests), ε ∈ {4, 8}, full fine-tuning and LoRA (r = 8 on ``c_attn``/``c_proj``;
the new tokens' rows stay frozen, only the adapters can raise a secret). Every bound is ÷ the accountant's ε of the
same run. Canaries that share a model are not independent, so the audit's headline is the f-DP test of the (ε, δ)
curve at all of α (issue 56): valid for every (ε, δ)-DP mechanism. Beside it, Mahloujifar et al.'s Gaussian f-DP
reading, a lower bound only if the mechanism is μ-GDP (the headline before issue 56 was the larger of that reading and
the binomial bound at α/2 each; ``results/lm_canary_ceiling.md`` sets both beside the ideal canary's). Every row keeps
its canaries' scores and inclusion (``--rows``), so another test can be read from the same runs. Every run's ledger is
tested as a claim (on its own PLD curve).

Part 3 — repetitions (Panda et al. insert each canary several times): part 1's four-new-token design (the same
canaries and inclusion) with every included canary inserted k ∈ ``REPETITIONS`` times, at the benchmark's length and
ε = 8 (σ planned for the larger training set). A canary inserted k times is a group of k records, so the one-run game
bounds the group's ε, not the record's: each run's bound is set beside the accountant's record ε and the ε of the
same run for groups of k (``Claim.from_ledger(ledger, group_size=k)``), and the scores are tested against both
claims — the group claim must stand, the record claim is the one the repeated canaries can (rightly) contradict.

    OMP_NUM_THREADS=1 python benchmarks/lm_canary_designs.py --part both > benchmarks/results/lm_canary_designs.md
    OMP_NUM_THREADS=1 python benchmarks/lm_canary_designs.py --part 3 > benchmarks/results/lm_canary_repetitions.md
    OMP_NUM_THREADS=1 python benchmarks/lm_canary_designs.py --quick          # smaller, for a smoke run

A learning-rate sweep of part 2's full fine-tune (``--lr``, ``--epsilons``), one process per learning rate: ``--part 2
--fine-tuning full --epsilons 4 8 --lr 0.0005 --rows A``, ``--epsilons 8 --lr 0.001 --rows B`` and ``--epsilons 8 --lr
0.00025 --rows C``, then ``--report A B C --scores benchmarks/results/lm_canary_lr_sweep_scores.jsonl.gz >
benchmarks/results/lm_canary_lr_sweep.md``.

The runs are independent: on a machine with more than one core, ``--part 1``, ``--part 2 --fine-tuning full``, ``--part
2 --fine-tuning lora`` and ``--part 3`` in processes, each with ``--rows FILE`` (one JSON row per run), then ``--report
FILE...`` prints the same Markdown from their rows; ``--scores FILE`` also writes the reported runs' canary scores and
inclusion (gzipped JSON lines), committed beside each results file as ``results/<name>_scores.jsonl.gz``, from which
the tests recompute every bound. The published files came from two processes this way (2026-11-29, about 3 CPU hours
in all). Progress goes to stderr, the Markdown to stdout. About 2 min per run at the benchmark's length and 7–16 min
per run ten times longer, on one core.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import language_model as bench  # noqa: E402  (the LM benchmark's model, data, base and recipes)

from lightning_privacy import names  # noqa: E402
from lightning_privacy.audits.lm_canaries import audit_language_model_canaries, language_model_canaries  # noqa: E402

lm = bench.lm
DELTA, ALPHA = bench.DELTA, 0.05
LORA_DP_LR = 1e-2  # the LM benchmark's LoRA learning rate
SECOND_SEED = bench.CANARY_SEED + 1  # part 2's canaries: drawn apart from part 1's
# (label, secret length, loss on, the new rows): secret length 0 = random-token canaries; rows "mean" =
# resize_token_embeddings' own (around the old rows' mean), "low prior" = with_low_prior_tokens
DESIGNS = (
    ("random tokens", 0, "all", "mean"),
    ("new token, loss on all", 1, "all", "mean"),
    ("new token, loss on secret", 1, "secret", "mean"),
    ("4 new tokens, loss on secret", 4, "secret", "mean"),
    ("4 new tokens, loss on secret, low-prior rows", 4, "secret", "low prior"),
)
LONG_DESIGN = DESIGNS[3]
REPETITIONS = (2, 4)  # part 3: each included canary inserted k times


def with_low_prior_tokens(plain: str, folder: str, vocab: int, public, *, mass: float = 1e-4) -> tuple:
    """The base with token ids added up to ``vocab``, their rows set so that the base gives them almost no probability
    (written to ``folder``); returns (λ, their total probability on ``public``).

    ``resize_token_embeddings`` draws the new rows around the old ones' mean (Hewitt's "vocab expansion"), which gives
    each new token about the average token's probability: with 4,000 new tokens beside the chain's 1,000, half of the
    base's probability mass. Fine-tuning then spends its steps pushing every new token down at every position, the
    same for a canary's secret whether or not it was inserted. Here every new row is −λ·d + N(0, 0.02²) per
    coordinate, d the direction along which the base's last hidden states h (on ``public``: the pretraining
    sequences, not the members) have the least spread for a unit mean (d = Σ⁻¹h̄ / (h̄ᵀΣ⁻¹h̄), so d·h ≈ 1 at every
    position), λ doubled from 1 until the new tokens' total probability on ``public`` is at most ``mass``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(plain, local_files_only=True).eval()
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(vocab, mean_resizing=False)
    loader = torch.utils.data.DataLoader(public, batch_size=250)
    with torch.no_grad():
        hidden = torch.cat(
            [
                model(**batch, output_hidden_states=True).hidden_states[-1][batch["attention_mask"].bool()]
                for batch in loader
            ]
        )
        mean = hidden.mean(0)
        spread = torch.cov(hidden.T) + 1e-3 * torch.eye(hidden.shape[1])
        d = torch.linalg.solve(spread, mean)
        d = d / (mean @ d)
        rows = model.get_input_embeddings().weight  # tied: also the output rows
        jitter = 0.02 * torch.randn(vocab - old, rows.shape[1])
        lam, found = 1.0, 1.0
        while found > mass:
            lam *= 2.0
            rows[old:] = -lam * d + jitter
            found = _new_mass(model, loader, old)
    model.save_pretrained(folder)
    return lam, found


def _new_mass(model, loader, old: int) -> float:
    """The new tokens' total probability, averaged over the tokens of ``loader``."""
    total, count = 0.0, 0
    for batch in loader:
        probs = model(**batch).logits.softmax(-1)[..., old:].sum(-1)
        mask = batch["attention_mask"].bool()
        total, count = total + float(probs[mask].sum()), count + int(mask.sum())
    return total / count


def draw(m: int, secret_length: int, seed: int, vocab: int):
    """The canaries of a design: random tokens of the chain, or a prefix of them and a secret of new ids."""
    new = range(lm.VOCAB, vocab)
    if secret_length == 0:
        return language_model_canaries(
            m, vocab_size=vocab, length=lm.LENGTH, seed=seed, exclude_token_ids=(lm.PAD, *new)
        )
    canaries = language_model_canaries(
        m,
        vocab_size=vocab,
        length=lm.LENGTH,
        seed=seed,
        exclude_token_ids=(lm.PAD,),
        secret_token_ids=new,
        secret_length=secret_length,
    )
    assert not canaries.secret_tokens_shared  # every canary's secret is its own
    return canaries


def run(
    label,
    design,
    *,
    members,
    canaries,
    bases: dict,
    kind: str,
    epochs: int,
    epsilon: float,
    repetitions: int = 1,
    lr: Optional[float] = None,
) -> dict:
    """One DP fine-tune of the design's base (``bases``: {rows: (folder, model)}) on the members plus the inserted
    canaries (each ``repetitions`` times), and its canary audit (against the group claim when ``repetitions`` > 1)."""
    from lightning_privacy.audits.canary import audit_canaries
    from lightning_privacy.audits.lm_canaries import canary_scores
    from lightning_privacy.claims import Claim

    _, secret_length, loss_on, rows = design
    base, base_model = bases[rows]
    training = canaries.with_canaries(members, loss_on=loss_on, repetitions=repetitions)
    lr = lr or (LORA_DP_LR if kind == "lora" else bench.DP_LR)
    start = time.process_time()
    model, dpsgd, _ = bench.train_target(training, base, kind, epochs=epochs, lr=lr, epsilon=epsilon)
    seconds = time.process_time() - start
    eps = dpsgd.epsilon()
    group = Claim.from_ledger(dpsgd.ledger, delta=DELTA, group_size=repetitions)
    scores = canary_scores(model, canaries, base_model=None if kind == "lora" else base_model)
    if repetitions == 1:
        result = audit_language_model_canaries(
            model,
            canaries,
            delta=DELTA,
            alpha=ALPHA,
            base_model=None if kind == "lora" else base_model,
            claim=dpsgd.ledger,
            accountant_epsilon=eps,
        )
    else:
        result = audit_canaries(
            scores, canaries.included, delta=DELTA, alpha=ALPHA, claim=group, accountant_epsilon=eps
        )
        record = audit_canaries(scores, canaries.included, delta=DELTA, alpha=ALPHA, claim=dpsgd.ledger)
    v = result.values
    row = {
        "run": label,
        "design": design[0],
        "fine-tuning": "LoRA r = 8" if kind == "lora" else "full",
        "lr": lr,
        "steps": dpsgd.steps,
        "q": dpsgd.sample_rate,
        "sigma": dpsgd.noise_multiplier,
        "epsilon": eps,
        "binomial": v[names.CANARY_EPSILON_LOWER],
        "fdp": v[names.CANARY_EPSILON_LOWER_FDP],
        "headline": v[names.CANARY_EPSILON_LOWER_TIGHTEST],  # the audit's sound headline
        "gdp": v[names.CANARY_EPSILON_GDP_GAUSSIAN_READING],  # a lower bound only if the mechanism is μ-GDP
        "scores": [float(x) for x in scores],
        "included": [bool(x) for x in canaries.included],
        "verdict": result.verdict,
        "seconds": seconds,
        "member loss": lm.mean_loss(model, torch.utils.data.DataLoader(members, batch_size=250)),
        "repetitions": repetitions,
        "group epsilon": group.epsilon,
        "record verdict": result.verdict if repetitions == 1 else record.verdict,
    }
    print(
        f"{label} / {design[0]} / {kind} / ε = {epsilon:g}: headline {row['headline']:.3f} "
        f"({row['headline'] / eps:.3f} of ε), {seconds:.0f} CPU s",
        file=sys.stderr,
        flush=True,
    )
    return row


def table(rows) -> list:
    lines = [
        "| run | canaries | fine-tuning | steps | σ | accountant ε | binomial | headline | headline ÷ ε "
        "| Gaussian reading | reading ÷ ε | ledger verdict | CPU s | member loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['design']} | {r['fine-tuning']} | {r['steps']} | {r['sigma']:.3f} | {r['epsilon']:.3f} "
            f"| {r['binomial']:.3f} | {r['headline']:.3f} | {r['headline'] / r['epsilon']:.3f} | {r['gdp']:.3f} | "
            f"{r['gdp'] / r['epsilon']:.3f} | {r['verdict']} | {r['seconds']:.0f} | {r['member loss']:.2f} |"
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--part", choices=("1", "2", "3", "both", "all"), default="all", help="'both': 1 and 2")
    parser.add_argument("--fine-tuning", choices=("full", "lora", "both"), default="both", help="part 2's")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 8.0], help="part 2's")
    parser.add_argument("--lr", type=float, help="part 2's learning rate (default: the LM benchmark's)")
    parser.add_argument("--designs", type=int, nargs="+", help="part 1's designs to run (indices of DESIGNS)")
    parser.add_argument("--rows", help="also append every run's row to this JSON-lines file")
    parser.add_argument("--report", nargs="+", help="print the Markdown from these JSON-lines files; run nothing")
    parser.add_argument(
        "--scores", help="with --report: also write the reported runs' canary scores (gzipped JSON lines)"
    )
    args = parser.parse_args(argv)
    members_n, pretraining_n, pretrain_epochs, m = 1000, 4000, 4, 1000
    short, long = 5, 50
    if args.quick:
        members_n, pretraining_n, pretrain_epochs, m, short, long = 96, 128, 1, 64, 1, 2
    if args.report:
        found = [json.loads(line) for path in args.report for line in Path(path).read_text().splitlines() if line]
        meta = next((r for r in found if "base loss" in r), found[0])  # (rows of every process share the base)
        rows = {part: [r for r in found if r["part"] == part] for part in ("1", "2", "3")}
        minutes = (sum(r["wall"] for r in found) + sum({r["base wall"] for r in found})) / 60
        report(rows, meta, minutes, "benchmarks/lm_canary_designs.py --report (runs in several processes)")
        if args.scores:
            write_scores(found, args.scores)
        return
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    started = time.perf_counter()
    members = lm.MarkovSequences(members_n, seed=1, successors=bench.SUCCESSORS)
    pretraining = lm.MarkovSequences(pretraining_n, seed=4, successors=bench.SUCCESSORS)
    vocab = lm.VOCAB + m * max(d[1] for d in DESIGNS)
    rows = {"1": [], "2": [], "3": []}
    meta = {
        "members": members_n,
        "pretraining": pretraining_n,
        "pretrain epochs": pretrain_epochs,
        "m": m,
        "short": short,
        "long": long,
    }

    def keep(part: str, row: dict, since: float) -> None:
        row.update(part=part, wall=time.perf_counter() - since, **meta)
        rows[part].append(row)
        if args.rows:
            with open(args.rows, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    with (
        tempfile.TemporaryDirectory() as plain,
        tempfile.TemporaryDirectory() as extended,
        tempfile.TemporaryDirectory() as low_prior,
    ):
        seconds = bench.pretrain_base(pretraining, epochs=pretrain_epochs, folder=plain)
        meta["base wall"] = time.perf_counter() - started
        bench.with_new_tokens(plain, extended, vocab)  # the base of every design but one: the same weights, new rows
        public = torch.utils.data.Subset(pretraining, range(min(1000, pretraining_n)))
        meta["low prior"] = with_low_prior_tokens(plain, low_prior, vocab, public)
        bases = {
            rows: (folder, bench.fine_tuned(folder, "full", 1e-3).eval())
            for rows, folder in (("mean", extended), ("low prior", low_prior))
        }
        loader = torch.utils.data.DataLoader(members, batch_size=250)
        meta["base loss"] = {rows: lm.mean_loss(model, loader) for rows, (_, model) in bases.items()}
        meta["base loss"]["no new tokens"] = lm.mean_loss(bench.fine_tuned(plain, "full", 1e-3).eval(), loader)
        print(f"base: {seconds:.0f} CPU s; {meta}", file=sys.stderr, flush=True)
        common = dict(members=members, bases=bases)
        if args.part in ("1", "both", "all"):
            for design in DESIGNS if not args.designs else [DESIGNS[i] for i in args.designs]:
                canaries = draw(m, design[1], bench.CANARY_SEED, vocab)
                label, since = f"benchmark length ({short} epochs)", time.perf_counter()
                row = run(label, design, canaries=canaries, kind="full", epochs=short, epsilon=8.0, **common)
                keep("1", row, since)
        if args.part in ("2", "both", "all"):
            canaries = draw(m, LONG_DESIGN[1], SECOND_SEED, vocab)
            for kind in ("full", "lora") if args.fine_tuning == "both" else (args.fine_tuning,):
                for epsilon in args.epsilons:
                    label, since = f"ten times longer ({long} epochs)", time.perf_counter()
                    if args.lr:
                        label += f", lr {args.lr:g}"
                    row = run(
                        label, LONG_DESIGN, canaries=canaries, kind=kind, epochs=long, epsilon=epsilon, lr=args.lr,
                        **common,
                    )  # fmt: skip
                    keep("2", row, since)
        if args.part in ("3", "all"):
            canaries = draw(m, LONG_DESIGN[1], bench.CANARY_SEED, vocab)  # part 1's canaries of this design
            for k in REPETITIONS:
                label, since = f"benchmark length ({short} epochs), each canary {k} times", time.perf_counter()
                row = run(
                    label, LONG_DESIGN, canaries=canaries, kind="full", epochs=short, epsilon=8.0, repetitions=k,
                    **common,
                )  # fmt: skip
                keep("3", row, since)
    minutes = (time.perf_counter() - started) / 60
    part = "" if args.part == "all" else f" --part {args.part}"
    report(rows, meta, minutes, "benchmarks/lm_canary_designs.py" + part + (" --quick" if args.quick else ""))


def report(rows: dict, meta: dict, minutes: float, command: str) -> None:
    """The Markdown of parts 1 and 2 (either may be empty) on stdout."""
    members_n, pretraining_n, m = meta["members"], meta["pretraining"], meta["m"]
    rows = {part: sorted(found, key=_order) for part, found in rows.items()}
    out = [
        f"Language-model canary designs under DP-SGD: tiny GPT-2 pretrained on {pretraining_n:,} sequences, fine-tuned "
        f"on {members_n:,} members plus the inserted canaries (m = {m:,}, each inserted with probability ½), hooks, "
        f"C = 1, δ = {DELTA:g}, expected batch {bench.BATCH}, Adam (lr {bench.DP_LR:g} full, {LORA_DP_LR:g} LoRA); "
        f"σ planned for ε over the run. Scores: the base's minus the fine-tune's mean loss over the scored tokens "
        f"(the secret; all tokens for random-token canaries). ε lower bounds at α = {ALPHA}, δ = {DELTA:g}, each at all "
        "of α: 'binomial' is Steinke et al.'s test; 'headline' the audit's for canaries that share a model, the f-DP "
        "test of the (ε, δ) curve, valid for every (ε, δ)-DP mechanism; 'Gaussian reading' Mahloujifar et al.'s "
        "Gaussian f-DP test read through the Gaussian curve, a lower bound only if the mechanism is μ-GDP (before "
        "issue 56 the headline was the larger of it and the binomial at α/2 each). 'ledger verdict': the run's ledger "
        "tested as a claim on its own PLD curve at confidence 0.95.",
        "",
    ]
    if rows["1"]:
        out += [
            f"**Part 1: every design at the benchmark's length** (full fine-tuning, ε = 8, seed {bench.CANARY_SEED})",
            "",
        ]
        out += table(rows["1"]) + [""]
    if rows["2"]:
        out += [
            f"**Part 2: ten times longer**, the design fixed before any run ({LONG_DESIGN[0]}; canaries and inclusion "
            f"from seed {SECOND_SEED})",
            "",
        ]
        out += table(rows["2"]) + [""]
        goal = [r for r in rows["2"] if r["fine-tuning"] == "full"]
        out += ["**Goal (issue 50): ≥ 0.25 of ε at ε = 4 and 8, full fine-tuning**", ""]
        for r in goal:
            ratio = r["headline"] / r["epsilon"]
            out.append(
                f"- {r['run']}, ε = {r['epsilon']:.0f}: headline ÷ ε = {ratio:.3f}: {'met' if ratio >= 0.25 else 'not met'}"
            )
        out.append("")
    if rows.get("3"):
        out += [
            f"**Part 3: repetitions**: {LONG_DESIGN[0]} (part 1's canaries and inclusion, seed {bench.CANARY_SEED}), each "
            "included canary inserted k times, full fine-tuning, ε = 8 for one record; 'group ε' is the same run's ε "
            "for a group of k records, what the bounds bound; verdicts: the scores tested against each claim",
            "",
        ]
        out += repetitions_table(rows["3"]) + [""]
    if "base loss" in meta:
        loss, (lam, mass) = meta["base loss"], meta["low prior"]
        out += [
            f"- the base (pretrained {meta.get('pretrain epochs', 4)} epochs without DP): mean token loss on the members "
            f"{loss['no new tokens']:.2f}; with the new rows of `resize_token_embeddings` (around the old rows' mean) "
            f"{loss['mean']:.2f}, the new tokens taking a large share of its probability; with low-prior rows "
            f"(`with_low_prior_tokens`: λ = {lam:g}, the new tokens' total probability {mass:.1e} on 1,000 pretraining "
            f"sequences) {loss['low prior']:.2f}",
            "",
        ]
    out.append(
        f"<!-- written by {command} in {minutes:.1f} min, {datetime.date.today()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread -->"
    )
    print("\n".join(out))


SCORE_KEYS = ("part", "run", "design", "fine-tuning", "lr", "epsilon", "repetitions", "scores", "included")


def write_scores(rows: list, path: str) -> None:
    """The runs' canary scores and inclusion (one JSON line per run, gzipped), so that any test can be read from the
    published runs without training them again (``tests/test_lm_canary_designs_results.py`` reads the tables' bounds
    from them)."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in sorted(rows, key=_order):
            f.write(json.dumps({key: row[key] for key in SCORE_KEYS}) + "\n")


def repetitions_table(rows) -> list:
    lines = [
        "| k | steps | q | σ | record ε | group ε | binomial | headline | headline ÷ group ε | headline ÷ record ε "
        "| Gaussian reading | reading ÷ group ε | group claim | record claim | CPU s | member loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['repetitions']} | {r['steps']} | {r['q']:.4f} | {r['sigma']:.3f} | {r['epsilon']:.3f} | "
            f"{r['group epsilon']:.3f} | {r['binomial']:.3f} | {r['headline']:.3f} | "
            f"{r['headline'] / r['group epsilon']:.3f} | {r['headline'] / r['epsilon']:.3f} | {r['gdp']:.3f} | "
            f"{r['gdp'] / r['group epsilon']:.3f} | {r['verdict']} | "
            f"{r['record verdict']} | {r['seconds']:.0f} | {r['member loss']:.2f} |"
        )
    return lines


def _order(row: dict) -> tuple:
    designs = [d[0] for d in DESIGNS]
    fine_tuning = row["fine-tuning"] != "full"
    return (designs.index(row["design"]), fine_tuning, row.get("repetitions", 1), row["epsilon"], -row.get("lr", 0))


if __name__ == "__main__":
    main()

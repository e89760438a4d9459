"""A tiny GPT-2 under DP-SGD: seconds per epoch (no DP, hooks, ghost; LoRA and full fine-tuning), the sequence-level
membership audits (LOSS, Min-K%, RMIA, EZ-MIA) of fine-tunes of a pretrained base with and without DP-SGD, and the
one-run canary audit of the same fine-tunes.

The model and data are ``examples/dp_lora_language_model.py``'s: a GPT-2 (2 layers, 128 wide, 1,000 tokens) and
sequences of a seeded random Markov chain (64 successors per token), right-padded to 32 tokens (lengths 16–32). For
the new-token canaries the pretrained base gets ``--canaries`` more token ids (``resize_token_embeddings``, as after
``tokenizer.add_tokens``): their secrets, which no sequence contains.
Members, non-members, population and the base's pretraining set are disjoint draws of the chain.

- Timing: CPU seconds of one epoch over the members (expected batch 64, Adam) after a warm-up epoch, measured by a
  callback (Trainer set-up excluded; CPU time, not wall time, so that other jobs on a shared CPU do not count), LoRA
  r = 8 on ``c_attn``/``c_proj`` and full fine-tuning, from the random initialisation. Ghost clipping cannot clip
  GPT-2's tied ``wte``/``lm_head`` weight (DPSGD refuses it), so full fine-tuning in ghost mode is also measured with
  the tied embedding frozen, as DPSGD's message suggests.
- The base: the random GPT-2 pretrained without DP on ``--pretraining`` sequences (``save_pretrained`` to a temporary
  folder; every fine-tune and reference model loads it), so that it is a real reference for EZ-MIA.
- Fine-tunes of the base on the members plus the inserted canaries: LoRA (``--lora-epochs``) and full fine-tuning
  (``--full-epochs``) without DP; full fine-tuning with DP-SGD (hooks, C = 1, δ = 1e-5, σ planned for each ε over
  ``--dp-epochs`` epochs, ``DPSGD(sampling_seed=0, noise_seed=0)``).
- Membership audits of each: the mean token loss (LOSS), Min-K% Prob with k = 20% (Shi et al. 2024), RMIA (offline,
  γ = 2, ``--references`` reference models fine-tuned from the base with the target's recipe, DP-SGD at the same σ
  included, on halves of the population; on the fine-tunes without DP also with references trained from scratch, the
  base's recipe from the random initialisation on the same halves, as an auditor without the base would) and EZ-MIA (Ilić et al., arXiv 2601.12104: the Error Zone score against the
  base; LoRA: the model with its adapters disabled). Every DP row's points are checked against the accountant's
  add/remove trade-off curve and its ledger tested as a claim.
- The one-run canary audit (``lightning_privacy.audits.lm_canaries``): ``--canaries`` sequences, each inserted with
  probability ½, scored by the base's minus the fine-tune's mean token loss, of two kinds in fits of their own (one
  inclusion vector): random tokens of the chain's vocabulary, and Panda et al.'s new-token canaries (a random prefix,
  then one new token of its own, an id no sequence contains; the secret alone is scored). The fine-tunes without DP are tested against a false claim of ε = 1, the DP-SGD ones against
  their ledger.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/language_model.py            # ~30 min on one CPU thread
    OMP_NUM_THREADS=1 python benchmarks/language_model.py --quick               # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import dp_lora_language_model as lm  # noqa: E402

from lightning_privacy import DPSGD  # noqa: E402
from lightning_privacy.audits import audit_membership  # noqa: E402
from lightning_privacy.audits.lm_canaries import audit_language_model_canaries, language_model_canaries  # noqa: E402
from lightning_privacy.functional.base_reference import BaseLossDifferenceSignal  # noqa: E402
from lightning_privacy.functional.sequence_loss import causal_lm_signal, min_k_percent_signal  # noqa: E402
from lightning_privacy.references import train_references  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
EPSILONS = (8.0, 1.0)
DELTA = 1e-5
BATCH = 64
SUCCESSORS = 64
SECRET_LENGTH = 1  # new-token canaries: one new token each, its own (ids lm.VOCAB … lm.VOCAB + m − 1)
PRETRAIN_LR, LORA_LR, FULL_LR, DP_LR = 2e-3, 1e-2, 1e-3, 2e-3
SCRATCH_EPOCHS = 4  # the base's own recipe, applied to a population half
FINE_TUNED, SCRATCH = "fine-tuned from the base", "trained from scratch"
CANARY_SEED = 20251127  # the canaries and their inclusion: drawn apart from every training seed


class EpochTimer(pl.Callback):
    """CPU time of this process in every training epoch (from its first to its last hook): on one torch thread it is
    the epoch's compute, whatever else shares the machine (wall time on a shared CPU is not)."""

    def __init__(self) -> None:
        self.seconds: list = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.process_time()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seconds.append(time.process_time() - self._start)


def make_model(kind: str, lr: float) -> lm.CausalLM:
    model = lm.CausalLM(lora_rank=8 if kind == "lora" else 0, lr=lr)
    if kind == "full-frozen":
        model.model.transformer.wte.weight.requires_grad_(False)  # also lm_head.weight: the same tensor
    return model


def seconds_per_epoch(kind: str, mode: str, members, lr: float) -> str:
    """The second epoch's seconds (the first warms up), or why it does not run."""
    torch.manual_seed(0)
    model = make_model(kind, lr)
    timer = EpochTimer()
    callbacks = (
        [timer] if mode == "none" else [DPSGD(noise_multiplier=1.0, grad_sample_mode=mode, sampling_seed=0), timer]
    )
    loader = DataLoader(members, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    try:
        pl.Trainer(max_epochs=2, callbacks=callbacks, **QUIET).fit(model, loader)
    except Exception as err:  # the refusal of tied parameters in ghost mode, reported in the table
        if "tied parameters" in str(err):
            return "refused: tied `wte`/`lm_head`"
        raise
    return f"{timer.seconds[-1]:.1f}"


def pretrain_base(pretraining, *, epochs: int, folder: str, seed: int = 0) -> float:
    """The base every fine-tune starts from: the tiny GPT-2 trained without DP on ``pretraining`` sequences (disjoint
    from members, non-members and population; batches shuffled by ``seed``), written with ``save_pretrained`` to
    ``folder``; its CPU seconds."""
    torch.manual_seed(seed)
    model = lm.CausalLM(lora_rank=0, lr=PRETRAIN_LR)
    loader = DataLoader(pretraining, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed))
    start = time.process_time()
    pl.Trainer(max_epochs=epochs, **QUIET).fit(model, loader)
    model.model.save_pretrained(folder)
    return time.process_time() - start


def with_new_tokens(base: str, folder: str, vocab: int) -> None:
    """The base with token ids added up to ``vocab`` (``resize_token_embeddings``, as after ``tokenizer.add_tokens``:
    rows drawn around the old embeddings' mean), written to ``folder``: what the new-token canaries fine-tune."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    model.resize_token_embeddings(vocab)
    model.save_pretrained(folder)


def fine_tuned(base: str, kind: str, lr: float) -> lm.CausalLM:
    return lm.CausalLM(model_name=base, lora_rank=8 if kind == "lora" else 0, lr=lr)


def train_target(data, base: str, kind: str, *, epochs: int, lr: float, epsilon=None):
    torch.manual_seed(0)
    model = fine_tuned(base, kind, lr)
    callbacks, dpsgd = [], None
    if epsilon is not None:
        dpsgd = DPSGD(
            target_epsilon=epsilon,
            epochs=epochs,
            delta=DELTA,
            max_grad_norm=1.0,
            grad_sample_mode="hooks",
            sampling_seed=0,
            noise_seed=0,
        )
        callbacks.append(dpsgd)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    start = time.process_time()
    pl.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET).fit(model, loader)
    return model.eval(), dpsgd, time.process_time() - start


def scratch_references(population_loader, *, references: int):
    """The references of an auditor without the base: the architecture trained from its random initialisation with
    the base's own recipe (``PRETRAIN_LR``, ``SCRATCH_EPOCHS``) on halves of the population; their CPU seconds."""
    start = time.process_time()
    refs = train_references(
        lambda: lm.CausalLM(lora_rank=0, lr=PRETRAIN_LR),
        population_loader,
        num_references=references,
        trainer_kwargs={"max_epochs": SCRATCH_EPOCHS},
        seed=0,
    )
    return refs, time.process_time() - start


def audit_rows(
    label,
    model,
    dpsgd,
    loaders,
    *,
    base: str,
    kind: str,
    base_model,
    epochs: int,
    lr: float,
    references: int,
    scratch=None,
):
    """LOSS, Min-K%, Ref, RMIA (references fine-tuned from the base folder with the target's recipe; and, given
    ``scratch``, references trained from scratch) and EZ-MIA on the members and non-members; ``base_model``: Ref's
    and EZ-MIA's reference (``None`` for LoRA: adapters disabled)."""
    member_loader, nonmember_loader, population_loader = loaders
    dp = None
    if dpsgd is not None:
        dp = dict(noise_multiplier=dpsgd.noise_multiplier, max_grad_norm=1.0, delta=DELTA, grad_sample_mode="hooks")
    start = time.process_time()
    refs = train_references(
        lambda: fine_tuned(base, kind, lr),
        population_loader,
        num_references=references,
        trainer_kwargs={"max_epochs": epochs},
        dp_sgd=dp,
        seed=0,
    )
    ref_seconds = time.process_time() - start
    ledger = None if dpsgd is None else dpsgd.ledger
    epsilon = "—" if dpsgd is None else f"{dpsgd.epsilon():.2f}"
    rows = []
    attacks = [
        ("loss", causal_lm_signal, "LOSS (mean token loss)", None),
        ("loss", min_k_percent_signal, "Min-K% (k = 20%)", None),
        ("loss", BaseLossDifferenceSignal(base_model), "Ref (base): LOSS minus the base's", None),
        ("rmia", causal_lm_signal, f"RMIA offline, {references} ref {FINE_TUNED}", refs),
        ("ezmia", None, "EZ-MIA (base model)", None),
    ]
    if scratch is not None:
        attacks.insert(4, ("rmia", causal_lm_signal, f"RMIA offline, {references} ref {SCRATCH}", scratch))
    for attack, signal_fn, name, used in attacks:
        result = audit_membership(
            model,
            member_loader,
            nonmember_loader,
            attack=attack,
            references=used,
            population_loader=population_loader,
            ledger=ledger,
            claim=ledger,
            signal_fn=signal_fn,
            base_model=base_model if attack == "ezmia" else None,
            warn=False,
        )
        tprs = [f"{p.tpr:.3f}" for p in result.tpr]
        if ledger is None:
            region, bounds, verdict = "—", "—", "—"
        else:
            region = "OUTSIDE" if result.outside else "inside"
            bounds = " / ".join(f"{b:.3f}" for b in result.ledger_tpr_bounds)
            verdict = result.verdict
        rows.append((label, epsilon, name, f"{result.auc:.3f}", *tprs, region, bounds, verdict))
    return rows, ref_seconds


def canary_row(label, model, dpsgd, canaries, *, base_model, claim):
    """The one-run canary audit of this fine-tune against ``base_model`` (``None`` for LoRA): its ε lower bound, its
    ceiling and the claim's verdict."""
    accountant = None if dpsgd is None else dpsgd.epsilon()
    result = audit_language_model_canaries(
        model, canaries, delta=DELTA, base_model=base_model, claim=claim, accountant_epsilon=accountant
    )
    claimed = result.claim.epsilon
    lower = result.epsilon_lower
    return (
        label,
        "—" if accountant is None else f"{accountant:.2f}",
        f"ε = {claimed:.2f}" + (" (the ledger)" if dpsgd is not None else " (false: no noise)"),
        f"{lower:.3f}",
        f"{result.ceiling:.2f}",
        f"{lower / claimed:.3f}",
        result.verdict,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and epochs, for a smoke run")
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--pretraining", type=int, default=4000, help="sequences the base is pretrained on")
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--full-epochs", type=int, default=2, help="full fine-tuning without DP")
    parser.add_argument("--lora-epochs", type=int, default=10, help="LoRA fine-tuning without DP")
    parser.add_argument("--dp-epochs", type=int, default=5)
    parser.add_argument("--references", type=int, default=2)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--output", default=str(RESULTS / "language_model.md"))
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.pretraining, args.pretrain_epochs = 128, 256, 1
        args.full_epochs, args.lora_epochs, args.dp_epochs, args.references, args.canaries = 1, 1, 1, 1, 64
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    started = time.perf_counter()
    n = args.members
    members = lm.MarkovSequences(n, seed=1, successors=SUCCESSORS)
    nonmembers = lm.MarkovSequences(n, seed=2, successors=SUCCESSORS)
    population = lm.MarkovSequences(n, seed=3, successors=SUCCESSORS)
    pretraining = lm.MarkovSequences(args.pretraining, seed=4, successors=SUCCESSORS)
    loaders = tuple(DataLoader(d, batch_size=250) for d in (members, nonmembers, population))
    vocab = lm.VOCAB + args.canaries * SECRET_LENGTH  # the chain's tokens, then the new tokens (in no sequence)
    new_tokens = range(lm.VOCAB, vocab)
    draw = dict(vocab_size=vocab, length=lm.LENGTH, seed=CANARY_SEED, exclude_token_ids=(lm.PAD, *new_tokens))
    canaries = language_model_canaries(args.canaries, **draw)  # random tokens of the chain's vocabulary
    draw["exclude_token_ids"] = (lm.PAD,)
    secret = language_model_canaries(args.canaries, **draw, secret_token_ids=new_tokens, secret_length=SECRET_LENGTH)
    assert not secret.secret_tokens_shared
    assert (canaries.included == secret.included).all()  # one seed, one inclusion: the same rows inserted
    canary_sets = (("random tokens", canaries), (f"new-token secret ({SECRET_LENGTH} of {lm.LENGTH})", secret))

    timing = []
    for kind, label, lr in (
        ("lora", "LoRA r = 8 (`c_attn`, `c_proj`)", 1e-2),
        ("full", "full fine-tuning", 2e-3),
        ("full-frozen", "full, tied `wte`/`lm_head` frozen", 2e-3),
    ):
        model = make_model(kind, lr)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        cells = [seconds_per_epoch(kind, mode, members, lr) for mode in ("none", "hooks", "ghost")]
        timing.append((label, f"{trainable:,}", *cells))
        print(timing[-1], flush=True)

    audits, canary_rows, notes = [], [], []
    with tempfile.TemporaryDirectory() as base, tempfile.TemporaryDirectory() as extended:
        seconds = pretrain_base(pretraining, epochs=args.pretrain_epochs, folder=base)
        reference = fine_tuned(base, "full", 1e-3).eval()
        with_new_tokens(base, extended, vocab)  # the new-token canaries' base: the same weights, more rows
        extended_reference = fine_tuned(extended, "full", 1e-3).eval()
        scratch, scratch_seconds = scratch_references(loaders[2], references=args.references)
        notes.append(
            f"references trained from scratch (RMIA without the base, no-DP rows): {args.references} GPT-2s from the "
            f"random initialisation, the base's recipe ({SCRATCH_EPOCHS} epochs, lr {PRETRAIN_LR:g}) on halves of the "
            f"population; {scratch_seconds:.0f} CPU s; mean token loss of the first "
            f"{lm.mean_loss(scratch.models[0].eval(), loaders[1]):.2f} on non-members"
        )
        notes.append(
            f"base: pretrained without DP on {args.pretraining:,} other sequences of the chain for "
            f"{args.pretrain_epochs} epochs in {seconds:.0f} CPU s; mean token loss {lm.mean_loss(reference, loaders[0]):.2f} "
            f"on members, {lm.mean_loss(reference, loaders[1]):.2f} on non-members"
        )
        targets = (
            ("lora", "LoRA, no DP", args.lora_epochs, LORA_LR, None),
            ("full", "full, no DP", args.full_epochs, FULL_LR, None),
            *(("full", f"full, DP-SGD ε = {e:g}", args.dp_epochs, DP_LR, e) for e in EPSILONS),
        )
        for kind, label, epochs, lr, epsilon in targets:  # the membership audits: fine-tunes on the members
            target, dpsgd, seconds = train_target(members, base, kind, epochs=epochs, lr=lr, epsilon=epsilon)
            member_loss, nonmember_loss = lm.mean_loss(target, loaders[0]), lm.mean_loss(target, loaders[1])
            how = f"{epochs} epochs, lr {lr:g}"
            if dpsgd is not None:
                how += (
                    f", σ = {dpsgd.noise_multiplier:.3f}, q = {dpsgd.sample_rate:.4f}, {dpsgd.steps} steps, accountant "
                    f"ε {dpsgd.epsilon():.3f} ({dpsgd.ledger.epsilon_label})"
                )
            rows, ref_seconds = audit_rows(
                label,
                target,
                dpsgd,
                loaders,
                base=base,
                kind=kind,
                base_model=None if kind == "lora" else reference,
                epochs=epochs,
                lr=lr,
                references=args.references,
                scratch=scratch if epsilon is None else None,
            )
            notes.append(
                f"{label}: {how}; {seconds:.0f} CPU s (its {args.references} reference model(s): {ref_seconds:.0f} CPU "
                f"s); mean token loss {member_loss:.2f} on members, {nonmember_loss:.2f} on non-members"
            )
            audits += rows
            print(*rows, sep="\n", flush=True)
        for what, drawn in canary_sets:  # the canary audits: the same recipes on members + canaries
            start, start_model = (base, reference) if drawn is canaries else (extended, extended_reference)
            training = drawn.with_canaries(members, loss_on="all")  # (the published rows: every token trained on)
            for kind, label, epochs, lr, epsilon in targets:
                target, dpsgd, seconds = train_target(training, start, kind, epochs=epochs, lr=lr, epsilon=epsilon)
                claim = (1.0, DELTA) if dpsgd is None else dpsgd.ledger
                row = canary_row(
                    label, target, dpsgd, drawn, base_model=None if kind == "lora" else start_model, claim=claim
                )
                canary_rows.append((what, *row))
                if dpsgd is not None and drawn is canaries:
                    notes.append(
                        f"{label} with the canaries (either kind): σ = {dpsgd.noise_multiplier:.3f}, q = "
                        f"{dpsgd.sample_rate:.4f}, {dpsgd.steps} steps, accountant ε {dpsgd.epsilon():.3f}"
                    )
                print(canary_rows[-1], flush=True)

    def cell(label: str, attack: str, column: int) -> float:
        return next(float(r[column]) for r in audits if r[0] == label and r[2].startswith(attack))

    no_dp = [label for _, label, _, _, eps in targets if eps is None]
    rmia = f"RMIA offline, {args.references} ref"
    scratch_rmia, tuned = f"{rmia} {SCRATCH}", f"{rmia} {FINE_TUNED}"

    def beats(attack: str, others) -> bool:  # AUC and TPR@1% at least every other's, on both fine-tunes without DP
        return all(cell(t, attack, c) >= max(cell(t, o, c) for o in others) for t in no_dp for c in (3, 5))

    baselines = ("LOSS", "Min-K%", scratch_rmia)
    base_attacks = all(beats(attack, baselines) for attack in ("EZ-MIA", "Ref"))
    ez_over_ref = beats("EZ-MIA", ("Ref",))
    tuned_over_ez = [
        f"{t}: AUC {cell(t, tuned, 3) - cell(t, 'EZ-MIA', 3):+.3f}, TPR@1% {cell(t, tuned, 5) - cell(t, 'EZ-MIA', 5):+.3f}"
        for t in no_dp
    ]
    twice = cell("full, no DP", "EZ-MIA", 5) >= 2 * cell("full, no DP", "LOSS", 5)
    dp_rows = [row for row in audits if "DP-SGD" in row[0]]
    inside = all(row[-3] == "inside" and row[-1] == "consistent" for row in dp_rows)
    false_claims = [row for row in canary_rows if "false" in row[3]]
    caught = all(row[-1] == "contradicted" for row in false_claims if row[1].startswith("full"))
    true_kept = all(row[-1] == "consistent" for row in canary_rows if "ledger" in row[3])
    minutes = (time.perf_counter() - started) / 60
    command = "benchmarks/language_model.py" + (" --quick" if args.quick else "")
    lines = [
        f"<!-- written by {command} in {minutes:.1f} min, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, 1 thread -->",
        "",
        f"Tiny GPT-2 (2 layers, 128 wide, 1,000 tokens), {n:,} member / {n:,} non-member / {n:,} population "
        f"sequences of a random Markov chain ({SUCCESSORS} successors per token), 16–32 tokens padded to 32; expected "
        f"batch {BATCH}, Adam.",
        "",
        "**CPU seconds per epoch** over the members (random init; the second of two epochs, one torch thread; DP-SGD "
        "with σ = 1, C = 1):",
        "",
        "| fine-tuning | trainable parameters | no DP | DP-SGD hooks | DP-SGD ghost |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in timing),
        "",
        f"**Membership audits per sequence** ({n:,} members → {n:,} scores) of fine-tunes of a base pretrained on "
        f"{args.pretraining:,} other sequences of the chain, on the members. LoRA r = 8 and full fine-tuning without DP; full "
        f"fine-tuning with DP-SGD (hooks, C = 1, δ = {DELTA:g}). RMIA offline, γ = 2, with references fine-tuned from "
        "the base with the target's recipe on halves of the population and, on the fine-tunes without DP, with "
        "references trained from scratch (an auditor without the base: the base's recipe from the random "
        "initialisation on the same halves); Ref (base) and EZ-MIA take the base itself as "
        "their reference (LoRA: the model with its adapters disabled; full: the base checkpoint), no training. "
        "'ledger region': every reported "
        "point's Clopper–Pearson TPR lower limit is at most the accountant's add/remove bound at its FPR upper limit; "
        "'verdict': the ledger tested as a claim (`claim=dpsgd.ledger`).",
        "",
        "| target | accountant ε | attack | AUC | TPR@0.1% | TPR@1% | TPR@10% | ledger region (add/remove) | "
        "ledger TPR bound @ FPR⁺ (0.1% / 1% / 10%) | verdict (true claim) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in audits),
        "",
        f"**One-run canary audit** of the same four recipes fine-tuned on the members plus the "
        f"{len(canaries.inserted())} inserted canaries (separate fits: the canaries would otherwise be a third of the "
        f"data the membership audits measure): m = {args.canaries} canaries of {lm.LENGTH} "
        "tokens, each inserted with probability ½ (Steinke et al. 2023's game, black-box as in Panda et al. 2025), "
        "scored by the base's minus the fine-tune's mean token loss. Two kinds, in fits of their own with the same "
        "inclusion: random tokens of the chain's vocabulary (scored over all tokens) and Panda et al.'s new-token "
        f"canaries, a random prefix of {lm.LENGTH - SECRET_LENGTH} tokens and a secret of {SECRET_LENGTH} new token(s) of "
        f"its own ({len(new_tokens):,} ids after the chain's {lm.VOCAB:,}, which no sequence contains, added to the "
        "pretrained base with `resize_token_embeddings` before fine-tuning) scored over the secret. Steinke et al.'s binomial ε lower bound at "
        "δ = 1e-5, α = 0.05 (Bonferroni over the guess counts) and its ceiling for m (all guesses right); the verdict "
        "tests the claim at confidence 0.95. The fine-tunes without DP are tested against a claim of ε = 1 they cannot keep; the DP-SGD ones "
        "against their own ledger.",
        "",
        "| canaries | target | accountant ε | claim tested | ε lower bound | ceiling for m | lower bound ÷ claimed ε "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in canary_rows),
        "",
        *(f"- {note}" for note in notes),
        "- acceptance: the base-model attacks' (EZ-MIA's and Ref's) AUC and TPR@1% at least LOSS's, Min-K%'s and those "
        f"of RMIA with references trained from scratch on the fine-tunes without DP: {'yes' if base_attacks else 'NO'}; "
        f"EZ-MIA's TPR@1% at least twice LOSS's on full fine-tuning: "
        f"{'yes' if twice else 'NO'}; every DP-SGD row inside the accountant's region and its ledger consistent: "
        f"{'yes' if inside else 'NO'}; the canaries contradict the false claim on full fine-tuning: "
        f"{'yes' if caught else 'NO'}; the DP-SGD ledgers consistent with their canaries: {'yes' if true_kept else 'NO'}",
        f"- measured, not accepted: EZ-MIA at least Ref (the base's plain loss difference): "
        f"{'yes' if ez_over_ref else 'no'}; RMIA with references fine-tuned from the base (two fine-tunes and the "
        f"population's data) minus EZ-MIA: {'; '.join(tuned_over_ez)}",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

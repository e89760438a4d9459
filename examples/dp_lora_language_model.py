"""DP fine-tuning of a causal language model with LoRA adapters, audited per sequence.

A GPT-2 (by default a tiny, randomly initialised one: 2 layers, 128 wide, 1,000 tokens, so that the example runs
offline in under a minute on one CPU thread; ``--model gpt2`` loads a pretrained one where the Hugging Face hub is
reachable, ``--model DIR`` one from a folder ``save_pretrained`` wrote, offline: the same ``from_pretrained`` call with
``local_files_only=True``, so the two differ only in where the files come from) gets LoRA adapters (``peft``, r = 8 on ``c_attn`` / ``c_proj``; ``--full`` trains every weight instead) and
is fine-tuned on token sequences with

- ``DPSGD(target_epsilon=--epsilon, epochs=--epochs, grad_sample_mode=--grad-sample-mode)``: one clipped gradient per
  *sequence* (``training_step`` returns ``{"loss": ..., "per_example_loss": ...}``, so the same module trains with or
  without DP-SGD); ``--epsilon 0`` trains without it;
- ``BayesSecurityMonitor``: β*_MIA and the accountant's ε every epoch;
- ``MembershipAudit(attack="rmia", signal_fn=causal_lm_signal)``: RMIA per sequence against ``--references`` reference
  models trained like the target (same base weights, same DP-SGD recipe) on halves of a population of sequences; its
  ROC is drawn inside the region DP-SGD's accountant allows (add/remove);
- after training, the reference-free LOSS (each sequence's mean token loss) and Min-K% Prob (Shi et al. 2024) attacks
  through ``audit_membership(..., ledger=dpsgd.ledger)``, and the privacy report (``privacy_report.md``).

The sequences are synthetic and generated here: a seeded random Markov chain over the vocabulary (each token has a few
likely successors), right-padded to 32 tokens (lengths 16–32). Members are the training sequences, non-members fresh
sequences from the same chain, the population a third set.

Run:  OMP_NUM_THREADS=1 python examples/dp_lora_language_model.py [--grad-sample-mode hooks|ghost] [--epsilon 8]
          [--epochs 3] [--full] [--model gpt2] [--logdir lightning_logs]
Needs the ``lm`` extra: ``pip install -e ".[lm]"`` (transformers, peft).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Optional

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_privacy import DPSGD, BayesSecurityMonitor, names
from lightning_privacy.audits import audit_membership
from lightning_privacy.callbacks.membership_audit import MembershipAudit
from lightning_privacy.functional.sequence_loss import causal_lm_signal, min_k_percent_signal
from lightning_privacy.report import audit_report, log_privacy_report

VOCAB, LENGTH, PAD = 1000, 32, 0
BASE_SEED = 1234  # the tiny GPT-2's "pretrained" weights: the same for the target and every reference model


# ----------------------------------------------------------------------------------------------------------- data
class MarkovSequences(Dataset):
    """``n`` token sequences from a seeded random Markov chain, right-padded: mappings with ``input_ids`` and
    ``attention_mask``, as a tokenizer and its collator give them.

    Every token (1 … vocab − 1; 0 is padding) has ``successors`` possible next tokens with
    Dirichlet(``concentration``) probabilities; the chain (``chain_seed``) is shared by members, non-members and
    population, the sequences (``seed``) are not. Lengths are uniform in [``min_length``, ``length``].
    """

    def __init__(
        self,
        n: int,
        *,
        seed: int,
        chain_seed: int = 0,
        vocab: int = VOCAB,
        length: int = LENGTH,
        min_length: int = 16,
        successors: int = 8,
        concentration: float = 0.5,
    ) -> None:
        chain = torch.Generator().manual_seed(chain_seed)
        nxt = torch.randint(1, vocab, (vocab, successors), generator=chain)
        # (torch's Dirichlet draws from the global generator: NumPy's, seeded, keeps the chain a function of chain_seed)
        dirichlet = np.random.default_rng(chain_seed).dirichlet(np.full(successors, concentration), size=vocab)
        probs = torch.from_numpy(dirichlet).float()
        g = torch.Generator().manual_seed(seed)
        ids = torch.empty(n, length, dtype=torch.long)
        ids[:, 0] = torch.randint(1, vocab, (n,), generator=g)
        for t in range(1, length):
            pick = torch.multinomial(probs[ids[:, t - 1]], 1, generator=g)[:, 0]
            ids[:, t] = nxt[ids[:, t - 1], pick]
        lengths = torch.randint(min_length, length + 1, (n,), generator=g)
        self.attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        self.input_ids = ids * self.attention_mask + PAD * (1 - self.attention_mask)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i]}


# ---------------------------------------------------------------------------------------------------------- model
def base_model(name: Optional[str] = None, *, vocab: int = VOCAB, length: int = LENGTH) -> torch.nn.Module:
    """A pretrained causal LM (``name``: a hub name, or a ``save_pretrained`` folder read offline), or the tiny GPT-2
    with weights fixed by :data:`BASE_SEED`."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    if name:
        return AutoModelForCausalLM.from_pretrained(name, local_files_only=Path(name).is_dir())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BASE_SEED)
        config = GPT2Config(
            vocab_size=vocab, n_positions=length, n_embd=128, n_layer=2, n_head=4, bos_token_id=PAD, eos_token_id=PAD
        )
        return GPT2LMHeadModel(config)


class CausalLM(pl.LightningModule):
    """A causal LM fine-tuned with LoRA adapters (``lora_rank`` > 0) or in full, on per-sequence losses.

    ``training_step`` returns the batch's mean loss (what a plain Trainer minimises) and every sequence's loss (what
    DPSGD clips in ghost mode): the module trains unchanged with and without DP-SGD.
    """

    def __init__(
        self, model_name: Optional[str] = None, lora_rank: int = 8, lr: float = 1e-2, vocab: int = VOCAB
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        model = base_model(model_name, vocab=vocab)
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            # GPT-2's c_attn / c_proj are Conv1D layers (weights stored transposed): fan_in_fan_out=True
            config = LoraConfig(
                r=lora_rank, lora_alpha=2 * lora_rank, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # peft's notes on Conv1D's fan_in_fan_out
                model = get_peft_model(model, config)
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # position ids per example ([B, T], contiguous): a [1, T] row shared by the batch gives the position embedding
        # no per-example gradient, which DPSGD refuses (hooks) when that embedding is trained
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(input_ids.shape[0], 1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)
        return out.logits

    def training_step(self, batch, batch_idx):
        losses = causal_lm_signal(self, batch)  # [B]: each sequence's mean next-token loss over its tokens
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)


@torch.no_grad()
def mean_loss(model: torch.nn.Module, loader: DataLoader) -> float:
    """The mean of the sequences' mean token losses (eval mode; mode restored)."""
    was = model.training
    model.eval()
    try:
        return float(torch.cat([causal_lm_signal(model, batch) for batch in loader]).mean())
    finally:
        model.train(was)


# ----------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=None,
        help="a Hugging Face causal LM to load: a hub name, or a save_pretrained folder (offline; default: the tiny GPT-2)",
    )
    parser.add_argument("--grad-sample-mode", choices=("hooks", "ghost"), default="ghost")
    parser.add_argument("--epsilon", type=float, default=8.0, help="ε of DP-SGD at δ = 1e-5; 0: no DP-SGD")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA adapters")
    parser.add_argument("--members", type=int, default=512, help="training sequences (and as many non-members)")
    parser.add_argument("--references", type=int, default=2, help="RMIA's reference models")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: 1e-2 with LoRA, 5e-4 in full")
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.members < 8 or args.references < 1 or args.epsilon < 0:
        parser.error("--epochs, --references must be >= 1, --members >= 8 and --epsilon >= 0")
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        parser.error('this example needs the `lm` extra: pip install -e ".[lm]" (transformers, peft)')
    warnings.filterwarnings(
        "ignore", ".*LeafSpec.*|.*does not have many workers.*|.*Secure RNG.*|.*Full backward hook.*|.*fan_in_fan_out.*"
    )
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    from lightning.pytorch.loggers import TensorBoardLogger

    vocab = VOCAB
    if args.model:
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(args.model, local_files_only=Path(args.model).is_dir()).vocab_size
    data = dict(vocab=vocab)
    members = MarkovSequences(args.members, seed=args.seed + 1, **data)
    nonmembers = MarkovSequences(args.members, seed=args.seed + 2, **data)
    population = MarkovSequences(2 * args.members, seed=args.seed + 3, **data)
    loader = lambda ds, **kw: DataLoader(ds, batch_size=args.batch_size, **kw)
    member_loader, nonmember_loader, population_loader = loader(members), loader(nonmembers), loader(population)
    lora_rank = 0 if args.full else 8
    lr = args.lr if args.lr is not None else (5e-4 if args.full else 1e-2)
    factory = lambda: CausalLM(args.model, lora_rank=lora_rank, lr=lr, vocab=vocab)
    model = factory()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())

    callbacks: list = []
    dpsgd = None
    if args.epsilon > 0:
        dpsgd = DPSGD(
            target_epsilon=args.epsilon, epochs=args.epochs, max_grad_norm=1.0, grad_sample_mode=args.grad_sample_mode
        )
        callbacks += [dpsgd, BayesSecurityMonitor()]
    rmia = MembershipAudit(
        attack="rmia",
        num_references=args.references,
        population=population_loader,
        member_dataloader=member_loader,
        nonmember_dataloader=nonmember_loader,
        model_factory=factory,
        signal_fn=causal_lm_signal,
        seed=args.seed,
    )
    callbacks.append(rmia)
    logger = TensorBoardLogger(args.logdir, name="dp_lora_language_model")
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=logger,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    before = mean_loss(model, member_loader)
    start = time.perf_counter()
    trainer.fit(model, loader(members, shuffle=True, generator=torch.Generator().manual_seed(args.seed)))
    seconds = time.perf_counter() - start
    after, unseen = mean_loss(model, member_loader), mean_loss(model, nonmember_loader)

    ledger = dpsgd.ledger if dpsgd is not None else None
    extra = {
        "loss": audit_membership(
            model, member_loader, nonmember_loader, attack="loss", signal_fn=causal_lm_signal, ledger=ledger, warn=False
        ),
        "min-k%": audit_membership(
            model,
            member_loader,
            nonmember_loader,
            attack="loss",
            signal_fn=min_k_percent_signal,
            ledger=ledger,
            warn=False,
        ),
    }
    report = f"{logger.log_dir}/privacy_report.md"
    if dpsgd is not None:
        log_privacy_report(trainer, report)
    with open(report, "a" if dpsgd is not None else "w", encoding="utf-8") as f:
        for label, result in extra.items():
            f.write(f"\n\n## Sequence-level {label.upper()} attack (reference-free)\n\n{audit_report(result)}\n")

    what = "full fine-tuning" if args.full else f"LoRA r = {lora_rank} on c_attn/c_proj"
    print(f"\n{args.model or 'tiny GPT-2 (random init)'}, {what}: {trainable:,} of {total:,} parameters trained")
    if dpsgd is not None:
        print(
            f"DP-SGD ({args.grad_sample_mode}): σ = {dpsgd.noise_multiplier:.4f}, C = 1, sample rate "
            f"{dpsgd.sample_rate:.4f}, {dpsgd.steps} steps"
        )
        print(f"accountant ε at δ = {dpsgd.delta:g}: {dpsgd.epsilon():.3f} (budget {args.epsilon:g})")
        print(f"β*_MIA (safe): {float(trainer.callback_metrics[names.MIA_BAYES_SECURITY]):.4f}")
    else:
        print("no DP-SGD (--epsilon 0)")
    print(f"fit: {seconds:.1f} s for {args.epochs} epoch(s) and RMIA's {args.references} reference model(s)")
    print(f"member loss: {before:.4f} before -> {after:.4f} after; non-member loss after: {unseen:.4f}")
    results = {"rmia": rmia.result, **extra}
    print(f"{'attack':>7}  {'AUC':>6}  {'TPR@0.1%':>8}  {'TPR@1%':>7}  {'TPR@10%':>7}  inside region")
    for label, result in results.items():
        tprs = "  ".join(f"{p.tpr:>7.4f}" for p in result.tpr)
        inside = "—" if result.ledger_tpr_bounds is None else ("no" if result.outside else "yes")
        print(f"{label:>7}  {result.auc:>6.4f}  {tprs}   {inside}")
    print(f"privacy report: {report}\nTensorBoard: tensorboard --logdir {args.logdir}")
    return {
        "loss_before": before,
        "loss_after": after,
        "nonmember_loss": unseen,
        "epsilon": None if dpsgd is None else dpsgd.epsilon(),
        "results": results,
        "report": report,
    }


if __name__ == "__main__":
    main()

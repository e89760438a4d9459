"""How far the language-model benchmark's attack ranking moves with the base: the membership audits without DP of
``benchmarks/language_model.py`` (LoRA and full fine-tuning of the tiny GPT-2 on the same 1,000 members; LOSS, Ref,
RMIA with references fine-tuned from the base and trained from scratch, EZ-MIA) repeated on bases pretrained on other
draws of the chain in another order (``--bases`` of them; base 0 is the benchmark's own).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/language_model_bases.py     # ~4 min per base on one CPU thread
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

import language_model as bench  # noqa: E402

lm = bench.lm
COLUMNS = ("LOSS", "Ref", "RMIA offline, 2 ref fine-tuned", "RMIA offline, 2 ref trained from scratch", "EZ-MIA")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", type=int, default=4, help="bases: 0 (the benchmark's) and 1 … bases − 1")
    parser.add_argument("--output", default=str(bench.RESULTS / "language_model_bases.md"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    started = time.perf_counter()
    n, succ = 1000, bench.SUCCESSORS
    members, nonmembers, population = (lm.MarkovSequences(n, seed=s, successors=succ) for s in (1, 2, 3))
    loaders = tuple(DataLoader(d, batch_size=250) for d in (members, nonmembers, population))
    rows = []
    for b in range(args.bases):
        pretraining = lm.MarkovSequences(4000, seed=4 if b == 0 else 100 + b, successors=succ)
        with tempfile.TemporaryDirectory() as base:
            bench.pretrain_base(pretraining, epochs=4, folder=base, seed=b)
            reference = bench.fine_tuned(base, "full", 1e-3).eval()
            scratch, _ = bench.scratch_references(loaders[2], references=2)
            for kind, label, epochs, lr in (
                ("lora", "LoRA, no DP", 10, bench.LORA_LR),
                ("full", "full, no DP", 2, bench.FULL_LR),
            ):
                target, _, _ = bench.train_target(members, base, kind, epochs=epochs, lr=lr)
                audited, _ = bench.audit_rows(
                    label, target, None, loaders, base=base, kind=kind,
                    base_model=None if kind == "lora" else reference, epochs=epochs, lr=lr, references=2,
                    scratch=scratch,
                )  # fmt: skip
                cells = []
                for column in COLUMNS:
                    row = next(r for r in audited if r[2].startswith(column))
                    cells.append(f"{row[3]} / {row[5]}")
                loss_tpr = float(next(r for r in audited if r[2].startswith("LOSS"))[5])
                ez_tpr = float(next(r for r in audited if r[2].startswith("EZ-MIA"))[5])
                ratio = f"{ez_tpr / loss_tpr:.1f}" if loss_tpr > 0 else "—"
                rows.append((str(b), label, f"{lm.mean_loss(reference, loaders[1]):.2f}", *cells, ratio))
                print(rows[-1], flush=True)
    minutes = (time.perf_counter() - started) / 60
    lines = [
        f"<!-- written by benchmarks/language_model_bases.py in {minutes:.1f} min, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread -->",
        "",
        f"**The attacks over {args.bases} bases** (base 0 is `benchmarks/language_model.py`'s; base b > 0 pretrained on "
        "4,000 other sequences of the chain, drawn with seed 100 + b, in another order), each fine-tuned on the same "
        "1,000 members and attacked on them and 1,000 non-members: AUC / TPR at 1 % FPR, and EZ-MIA's TPR at 1 % FPR "
        "over LOSS's.",
        "",
        "| base | target | base loss (non-members) | LOSS | Ref (base) | RMIA, 2 ref fine-tuned from the base | "
        "RMIA, 2 ref from scratch | EZ-MIA | EZ-MIA ÷ LOSS @1% |",
        "|---|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    Path(args.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

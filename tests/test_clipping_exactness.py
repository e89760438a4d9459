"""The published architectures × modes table of ``benchmarks/clipping_exactness.py``: every model trains exactly or
is refused before its first step, and a short re-run of the script agrees with the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "clipping_exactness.md"
REFUSED = {  # (what, mode) that DPSGD must refuse: the rest must be exact
    ("`lin.weight` also used by `F.linear`", "hooks"),
    ("`lin.weight` also used by `F.linear`", "ghost"),
    ("output head `h @ embed.weight.T`", "hooks"),
    ("output head `h @ embed.weight.T`", "ghost"),
    ("one Linear applied twice", "ghost"),
    ("GPT-2 (1 layer), full (tied head module)", "ghost"),
}


def _rows(text: str):
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip(" |") for cell in row] for row in rows[1:]]


def test_every_published_row_is_exact_or_refused_as_it_must_be():
    rows = _rows(RESULTS.read_text())
    assert len(rows) == 22 and {r[1] for r in rows} == {"hooks", "ghost"}
    for what, mode, outcome, error, check, mismatch, _ in rows:
        if (what, mode) in REFUSED:
            assert outcome.startswith("refused"), (what, mode)
            continue
        assert outcome == "exact" and float(error) < 1e-5, (what, mode, error)
        assert check.startswith("autograd per example (vmap)") and float(mismatch) < 1e-4


@pytest.mark.slow
def test_a_short_rerun_agrees_with_the_published_table():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import clipping_exactness as bench

    rows = bench.main(["--only", "functional_reuse", "padding_idx", "llama_full", "--steps", "4"])
    published = {(r[0], r[1]): r[2] for r in _rows(RESULTS.read_text())}
    for row in rows:
        what = bench.WHAT[row["architecture"]]
        assert published[(what, row["mode"])].split(" ")[0] == row["outcome"]
        if row["outcome"] == "refused":
            assert re.search(r"raise|exactness check", row["message"]) and row["steps"] == 0

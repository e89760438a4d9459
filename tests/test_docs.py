"""Every ```python block of README.md runs as written, in a fresh namespace, from a temporary folder.

Blocks are collected in order and named by their section heading (``## ...``); a block that trains
for more than ~15 s on one thread is marked slow (deselect with ``-m 'not slow'``). Measured on a
shared 2-core CPU with one torch thread (busier runs up to ~1.7x): DP-SGD 12 s, attribute inference
20 s, estimation <0.1 s, Epsilon* 4 s, PANORAMIA 19 s, privacy profile 2 s and 6 s; 64 s in all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
SLOW_SECTIONS = ("Attribute inference", "PANORAMIA")  # > 15 s each


def _blocks() -> list[tuple[str, str, str]]:
    blocks, heading, counts = [], "top", {}
    lines = README.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.strip() == "```python":
            end = lines.index("```", i + 1)
            slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")[:40]
            counts[slug] = counts.get(slug, 0) + 1
            blocks.append((f"{slug}-{counts[slug]}", heading, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def _params():
    for block_id, heading, code in _blocks():
        marks = [pytest.mark.slow] if heading.startswith(SLOW_SECTIONS) else []
        yield pytest.param(code, id=block_id, marks=marks)


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 7


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("code", list(_params()))
def test_readme_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lightning_logs and checkpoints land here
    torch.set_num_threads(1)
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})

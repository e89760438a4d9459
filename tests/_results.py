"""Helpers of the tests that read a benchmark's results file or load a benchmark script as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (not run: its ``main`` is behind ``__name__ == "__main__"``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_table(path: Path, header_start: str, occurrence: int = 0) -> List[Dict[str, str]]:
    """The rows of the Markdown table of ``path`` whose header line starts with ``header_start`` (the first such
    table, or the ``occurrence``-th counting from 0), each a dict of its header's cells (stripped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(header_start)][occurrence]
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.strip("|").split("|")))))
    return rows

"""The code in README.md and docs/**/*.md runs as written, and prints what the page says it prints.

- Every ```python block runs in order, in a fresh namespace, from a temporary folder. Blocks of the pages in
  ``SLOW_PAGES`` train for more than ~15 s on one thread and are marked slow (deselect with ``-m 'not slow'``).
- Printed output is compared where the page shows it (docs/contributing.md, "Code blocks run"): a ``# prints: ...``
  comment is what its ``print`` call prints; a ```text block right after the code block is everything the block's
  ``print`` calls print, or, after a ```bash block holding one ``lightning-privacy`` command, what the command prints
  on stdout from a temporary folder (output before the text block's first line — progress bars — is not compared).
  Whitespace runs compare equal and ``...`` stands for any text (doctest's NORMALIZE_WHITESPACE and ELLIPSIS).
- A block importing an optional dependency (``OPTIONAL_MODULES``: the ``lm`` extra's transformers and peft) is skipped
  where it is not installed.
- README.md stays short and its links resolve (the site's links are checked by ``mkdocs build --strict``).
"""

from __future__ import annotations

import builtins
import doctest
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)]
SLOW_PAGES = ("docs/guides/attribute_inference.md", "docs/guides/panoramia.md")  # > 15 s a block
OPTIONAL_MODULES = ("transformers", "peft")  # the `lm` extra: a block importing one is skipped where it is missing
CLI = str(Path(sys.executable).parent / "lightning-privacy")
PRINTS = re.compile(r"#\s*prints:\s?(.*)$")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def fenced_blocks(page: Path) -> list:
    """``(language, code, first line, blank_before)`` of every fenced block; ``blank_before``: only blank lines
    separate it from the previous block."""
    blocks, lines, i, last_end = [], page.read_text(encoding="utf-8").splitlines(), 0, None
    while i < len(lines):
        match = re.match(r"^```(\w*)\s*$", lines[i])
        if match:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            adjacent = last_end is not None and all(not line.strip() for line in lines[last_end + 1 : i])
            blocks.append((match[1], "\n".join(lines[i + 1 : end]) + "\n", i + 1, adjacent))
            last_end, i = end, end
        i += 1
    return blocks


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _examples():
    """``(page, kind, code, expected text or None, line)``: kind is "python" or "command"."""
    for page in PAGES:
        blocks = fenced_blocks(page)
        for n, (lang, code, line, _) in enumerate(blocks):
            following = blocks[n + 1] if n + 1 < len(blocks) else None
            expected = following[1] if following and following[0] == "text" and following[3] else None
            if lang == "python":
                yield page, "python", code, expected, line
            elif lang == "bash" and expected is not None:
                commands = [c for c in code.splitlines() if c.strip() and not c.lstrip().startswith("#")]
                if len(commands) == 1 and commands[0].startswith("lightning-privacy "):
                    yield page, "command", commands[0].split("  #")[0].strip(), expected, line


def _params(kind: str):
    for page, k, code, expected, line in _examples():
        if k == kind:
            marks = [pytest.mark.slow] if _rel(page) in SLOW_PAGES else []
            yield pytest.param(code, expected, id=f"{_rel(page)}:{line}", marks=marks)


def same_output(want: str, got: str) -> bool:
    return doctest.OutputChecker().check_output(want.rstrip("\n") + "\n", got.rstrip("\n") + "\n", FLAGS)


def test_pages_have_examples():
    kinds = [k for _, k, *_ in _examples()]
    assert kinds.count("python") >= 10 and kinds.count("command") >= 3


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("code", "expected"), list(_params("python")))
def test_python_block_runs_and_prints_what_the_page_says(code, expected, tmp_path, monkeypatch):
    for module in OPTIONAL_MODULES:
        if re.search(rf"^\s*(?:from|import)\s+{module}\b", code, flags=re.M):
            pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)  # lightning_logs and checkpoints land here
    torch.set_num_threads(1)
    printed = []

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        if file is None or file is sys.stdout:
            printed.append(sep.join(str(a) for a in args) + end)
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)

    exec(compile(code, "<docs block>", "exec"), {"__name__": "__docs__", "print": recording_print})
    comments = [m[1] for line in code.splitlines() if (m := PRINTS.search(line))]
    if comments:
        assert len(printed) == len(comments), f"{len(printed)} print calls for {len(comments)} `# prints:` comments"
        for want, got in zip(comments, printed):
            assert same_output(want, got), f"printed {got!r}, the page says {want!r}"
    if expected is not None:
        got = "".join(printed)
        assert same_output(expected, got), f"printed:\n{got}\nthe page says:\n{expected}"


@pytest.mark.parametrize(("command", "expected"), list(_params("command")))
def test_command_prints_what_the_page_says(command, expected, tmp_path):
    argv = shlex.split(command)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([CLI, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got, first = proc.stdout, expected.splitlines()[0]
    got = got[got.find(first) :] if first in got else got  # progress bars before the shown output
    assert same_output(expected, got), f"{command} printed:\n{got}\nthe page says:\n{expected}"


def test_the_output_checker_compares():
    assert same_output("a  0.8...\nwall ...\n", "a 0.8467\nwall 3.6 s")
    assert not same_output("[0.5218, 1.2666]", "[0.5218, 1.2667]")


def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to a missing file: {target}"
        if anchor and path.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to a missing heading: {target}"

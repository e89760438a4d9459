"""Copy every published results file into the pages that publish it: README.md and docs/**/*.md.

A page embeds a file written by a benchmark or reproduction script between two markers::

    <!-- results: benchmarks/results/NAME -->
    ...the file's content, written by this script...
    <!-- /results -->

``NAME`` may name a fragment: ``NAME#table-2`` is the file's second Markdown table (a run of lines starting with
``|``), ``NAME#block-3`` its third block of non-blank lines. Markdown files (``.md``) and ``#table-N`` fragments are
embedded as Markdown; anything else (the scripts' ``.txt`` output) inside a ```text fence, verbatim.

    python benchmarks/sync_results.py            # rewrite every block from its file
    python benchmarks/sync_results.py --check    # change nothing; exit 1 if a block differs or a file is missing

A block whose file does not exist is left as it is and reported (exit status 1); the other blocks are still
rewritten. ``tests/test_published_numbers.py`` fails while any block differs from its file.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^<!-- results: (?P<spec>\S+) -->\n(?P<content>.*?)^<!-- /results -->$", flags=re.M | re.S)
FRAGMENT = re.compile(r"^(table|block)-([1-9][0-9]*)$")


class Block(NamedTuple):
    page: Path
    spec: str  # "benchmarks/results/NAME" or "benchmarks/results/NAME#fragment"
    content: str  # between the markers, as the page has it
    line: int  # 1-based line of the opening marker

    @property
    def file(self) -> Path:
        return ROOT / self.spec.split("#", 1)[0]


def pages() -> list:
    """README.md and every Markdown page under docs/ (the generated pages have no blocks)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list:
    text = page.read_text(encoding="utf-8")
    return [Block(page, m["spec"], m["content"], text.count("\n", 0, m.start()) + 1) for m in BLOCK.finditer(text)]


def _fragment(text: str, kind: str, number: int, spec: str) -> str:
    runs, current = [], []
    for line in text.splitlines():
        keep = line.startswith("|") if kind == "table" else bool(line.strip())
        if keep:
            current.append(line)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    if number > len(runs):
        raise ValueError(f"{spec}: the file has {len(runs)} {kind}(s), not {number}")
    return "\n".join(runs[number - 1]) + "\n"


def expected(spec: str) -> str:
    """The block's content for ``spec``, from its file (``FileNotFoundError`` if the file is missing)."""
    name, _, fragment = spec.partition("#")
    path = ROOT / name
    if not path.resolve().is_relative_to(ROOT / "benchmarks" / "results"):
        raise ValueError(f"{spec}: results files live in benchmarks/results/")
    text = path.read_text(encoding="utf-8")
    markdown = path.suffix == ".md"
    if fragment:
        match = FRAGMENT.match(fragment)
        if match is None:
            raise ValueError(f"{spec}: a fragment is #table-N or #block-N, got #{fragment}")
        text = _fragment(text, match[1], int(match[2]), spec)
        markdown = markdown or match[1] == "table"
    text = text.strip("\n") + "\n"
    return text if markdown else f"```text\n{text}```\n"


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)


def sync(paths: list, *, check: bool = False) -> list:
    """Rewrite (or with ``check``, compare) every block of ``paths``; return the problems as lines."""
    problems = []
    for page in paths:
        text = page.read_text(encoding="utf-8")

        def replace(match: re.Match, page=page, text=text) -> str:
            where = f"{_name(page)}:{text.count(chr(10), 0, match.start()) + 1}"
            try:
                content = expected(match["spec"])
            except FileNotFoundError:
                problems.append(f"{where}: {match['spec']}: file does not exist (block left as it is)")
                return match[0]
            except ValueError as err:
                problems.append(f"{where}: {err}")
                return match[0]
            if check and content != match["content"]:
                problems.append(f"{where}: {match['spec']}: the page differs from the file")
            return f"<!-- results: {match['spec']} -->\n{content}<!-- /results -->"

        new = BLOCK.sub(replace, text)
        if not check and new != text:
            page.write_text(new, encoding="utf-8")
            print(f"updated {_name(page)}")
    return problems


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    problems = sync(pages(), check=args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

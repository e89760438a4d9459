"""Every published number agrees with the results file that the script measuring it wrote.

Pages (README.md, docs/**/*.md) embed results files between ``<!-- results: benchmarks/results/NAME -->`` and
``<!-- /results -->``; ``python benchmarks/sync_results.py`` writes the blocks. One test per block: it fails when the
block differs from its file (run the sync script after a benchmark) or names a file that does not exist.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sync_results", ROOT / "benchmarks" / "sync_results.py")
sync_results = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("sync_results", sync_results)
_spec.loader.exec_module(sync_results)

# Tables outside any results block that hold numbers but are not measurements: (page, the table's header row) ->
# why it may stay. An entry that no longer matches a table fails `test_allowed_tables_exist`.
NOT_MEASUREMENTS: dict = {
    # the guide's model card rendered: the output of the page's own code block (tests/test_docs.py runs it and compares
    # the printed text block), and the rendered copy is compared with that text by tests/test_statement.py
    ("docs/guides/reporting.md", "| quantity | value | meaning |"): "the page's code block's output, compared by tests",
    ("docs/guides/reporting.md", "| key | what it holds |"): "the statement's keys; the FPRs named are fixed settings",
}

_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")
_NUMBER_CELL = re.compile(r"^[~≈<>≤≥]?\s*\d[\d,.]*(?:\s*[–-]\s*\d[\d,.]*)?\s*[%×]?$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _measured_looking(row: str) -> bool:
    """A table row with at least 2 decimal numbers, or at least 2 cells that are only a number (or a range)."""
    cells = [c.strip().strip("*") for c in row.strip().strip("|").split("|")]
    return len(_DECIMAL.findall(row)) >= 2 or sum(bool(_NUMBER_CELL.match(c)) for c in cells) >= 2


def _measured_table(body: list) -> bool:
    """A measured-looking row, or at least 2 cells across the rows that are only a decimal number."""
    cells = [c.strip().strip("*") for row in body for c in row.strip().strip("|").split("|")]
    return any(map(_measured_looking, body)) or sum(bool(_DECIMAL.fullmatch(c)) for c in cells) >= 2


def unpublished_tables(page: Path) -> list:
    """(line, header row) of every Markdown table outside results blocks and code fences that looks measured."""
    text = sync_results.BLOCK.sub(lambda m: "\n" * m[0].count("\n"), page.read_text(encoding="utf-8"))
    found, table, fenced = [], [], False
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if _FENCE.match(line):
            fenced = not fenced
        if line.startswith("|") and not fenced:
            table.append((number, line))
            continue
        if table and _measured_table([row for _, row in table[2:]]):
            found.append((table[0][0], table[0][1].strip()))
        table = []
    return found


def _params():
    for page in sync_results.pages():
        for block in sync_results.blocks(page):
            yield pytest.param(block, id=f"{page.relative_to(ROOT).as_posix()}:{block.line}:{block.spec}")


def test_pages_publish_results_files():
    specs = {b.spec.split("#")[0] for p in sync_results.pages() for b in sync_results.blocks(p)}
    written = {
        f"benchmarks/results/{p.name}"
        for pattern in ("*.txt", "*.md")
        for p in (ROOT / "benchmarks" / "results").glob(pattern)
    }
    assert written <= specs, f"results files no page publishes: {sorted(written - specs)}"


def test_every_measured_table_is_a_results_block():
    """A table of measured-looking numbers outside results blocks fails, unless NOT_MEASUREMENTS says why it may stay."""
    stray = [
        f"{page.relative_to(ROOT).as_posix()}:{line}: {header}"
        for page in sync_results.pages()
        for line, header in unpublished_tables(page)
        if (page.relative_to(ROOT).as_posix(), header) not in NOT_MEASUREMENTS
    ]
    assert not stray, (
        "tables of numbers outside any results block (have the script that measured them write a results file and "
        "embed it, or add the table to NOT_MEASUREMENTS with the reason):\n" + "\n".join(stray)
    )


def test_allowed_tables_exist():
    for (name, header), reason in NOT_MEASUREMENTS.items():
        assert reason.strip(), f"{name}: {header}: an allowed table needs its reason"
        headers = [h for _, h in unpublished_tables(ROOT / name)]
        assert header in headers, f"NOT_MEASUREMENTS names a table {name} no longer has outside a block: {header}"


def test_the_guard_sees_a_table_outside_blocks_and_not_inside(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "| a | b | c |\n|---|---|---|\n| x | 0.12 | 3.4 |\n\n"
        "| setting | value |\n|---|---|\n| steps | many |\n\n"
        "<!-- results: benchmarks/results/x.md -->\n| a | b |\n|---|---|\n| 1.5 | 2.5 |\n<!-- /results -->\n\n"
        "```text\n| 1.5 | 2.5 |\n```\n\n"
        "| method | trials | width |\n|---|---|---|\n| ours | 660 | 18–40% |\n\n"
        "| selection | share |\n|---|---|\n| holdout | 0.03 |\n| none | 0.31 |\n",
        encoding="utf-8",
    )
    assert unpublished_tables(page) == [
        (1, "| a | b | c |"),
        (19, "| method | trials | width |"),
        (23, "| selection | share |"),
    ]


@pytest.mark.parametrize("block", list(_params()))
def test_published_block_is_its_results_file(block):
    assert block.file.is_file(), f"{block.spec}: the file does not exist"
    assert block.content == sync_results.expected(block.spec), (
        f"{block.page.relative_to(ROOT)}:{block.line}: the block differs from {block.spec}; "
        "run `python benchmarks/sync_results.py`"
    )


def test_sync_rewrites_a_stale_block_and_reports_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    stale = "<!-- results: benchmarks/results/monitor_overhead.txt -->\nold numbers\n<!-- /results -->\n"
    missing = "<!-- results: benchmarks/results/no_such_file.md -->\nkept\n<!-- /results -->\n"
    page.write_text(f"# Page\n\n{stale}\n{missing}", encoding="utf-8")
    problems = sync_results.sync([page])
    text = page.read_text(encoding="utf-8")
    assert "old numbers" not in text and sync_results.expected("benchmarks/results/monitor_overhead.txt") in text
    assert "\nkept\n" in text
    assert len(problems) == 1 and "no_such_file.md" in problems[0] and "does not exist" in problems[0]
    (again,) = sync_results.sync([page], check=True)  # the rewritten block is current; the missing file is not
    assert "no_such_file.md" in again


def test_fragments():
    table = sync_results.expected("benchmarks/results/attribute_inference.txt#table-2")
    assert table.startswith("| model | speed-up") and "```" not in table
    block = sync_results.expected("benchmarks/results/bayes_security_vs_pld.txt#block-2")
    assert block.startswith("```text\n2. per-epoch cost") and block.endswith("```\n")
    with pytest.raises(ValueError, match="not 9"):
        sync_results.expected("benchmarks/results/attribute_inference.txt#table-9")

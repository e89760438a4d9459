"""The documentation site: the generated reference pages cover the code as it is, and the site builds strictly.

The API, CLI and logged-keys pages are generated at build time by ``docs/hooks/reference.py``; these tests call the
same functions, so a new public module, sub-command or key is covered without editing a page. The slow test builds
the site with ``mkdocs build --strict`` (what ``make docs`` and CI run) and reads the DPSGD page a user sees.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def _commands(parser, words=()):
    yield " ".join(words)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name))


def test_cli_reference_has_every_command_and_option():
    from lightning_privacy.cli import build_parser

    page = reference.cli_markdown()
    for words in _commands(build_parser()):
        assert f"## `{' '.join(['lightning-privacy', *words.split()])}`" in page
    for flag in ("--dataset-size", "--target-epsilon", "--member-losses", "--lower-is-member", "--datamodule-args"):
        assert f"`{flag}`" in page


def test_logged_keys_page_has_every_key():
    from lightning_privacy import names

    page = reference.keys_markdown()
    assert all(f"| `{key}` |" in page for key in names.ALL_KEYS)
    rows = {constant: comment for _, constant, _, comment in reference.logged_keys()}
    assert "certified lower bound" in rows["MIA_BAYES_SECURITY"]


def test_api_reference_has_every_public_module():
    expected = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "lightning_privacy").rglob("*.py")
        if p.name != "__init__.py" and "commands" not in p.parts and not any(s.startswith("_") for s in p.parts)
    }
    assert set(reference.api_modules()) == expected
    nav_pages = str(reference.api_nav())
    assert all(reference.api_page_uri(m) in nav_pages for m in expected)
    assert "lightning_privacy.callbacks.dpsgd" in expected


@pytest.mark.slow
def test_site_builds_strictly_and_the_dpsgd_page_lists_every_parameter_with_its_default(tmp_path):
    from lightning_privacy import DPSGD

    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")]
    proc = subprocess.run(mkdocs, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "site" / "reference" / "api" / "lightning_privacy.callbacks.dpsgd" / "index.html").read_text()
    table = next(t for t in re.findall(r"<table>.*?</table>", page, flags=re.S) if "Default" in t)
    defaults = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        if cells:
            defaults[cells[0]] = cells[-1]
    parameters = inspect.signature(DPSGD.__init__).parameters
    shown = {name: repr(p.default) for name, p in parameters.items() if name != "self"}
    assert defaults == shown
    guide = (tmp_path / "site" / "guides" / "tensorboard" / "index.html").read_text()
    assert 'src="../../assets/benchmarks/results/tensorboard_scalars.png"' in guide
    assert (tmp_path / "site" / "assets" / "benchmarks" / "results" / "tensorboard_scalars.png").is_file()
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()  # CHANGELOG.md, served by the hook
    assert "Keep a Changelog" in changelog and re.search(r"<h2[^>]*>0\.2\.0", changelog)


def test_the_changelog_heads_with_the_package_version():
    import tomllib

    import lightning_privacy

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", text, flags=re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert versions[0] == lightning_privacy.__version__ == project and versions[-1] == "0.1.0"
    assert "## Unreleased" not in text or text.index("## Unreleased") < text.index(f"## {versions[0]}")


def test_every_logged_key_has_a_meaning_a_unit_and_a_trust_kind_and_headings_are_escaped():
    """The logged-keys page once rendered the heading `audit/<attack>_<quantity>` as "audit/_", and about 35 keys had
    an empty meaning."""
    from lightning_privacy import names

    assert set(names.KEY_DOCS) == set(names.ALL_KEYS)
    for key, (meaning, unit, trust) in names.KEY_DOCS.items():
        assert meaning.strip() and unit.strip() and trust.strip(), key
    page = reference.keys_markdown()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings and not any("<" in h or ">" in h for h in headings)
    assert any("audit/&lt;attack&gt;_&lt;quantity&gt;" in h for h in headings)
    row = next(line for line in page.splitlines() if line.startswith(f"| `{names.DP_NOISE_MULTIPLIER}` |"))
    assert "σ, the noise standard deviation" in row and "| setting (as configured) |" in row

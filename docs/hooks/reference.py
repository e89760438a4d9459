"""MkDocs hook: the generated pages — API reference, CLI reference, logged keys — and the benchmark figures.

Nothing here is committed output: every build reads the package as it is, so a new public module, a new
``lightning-privacy`` sub-command or a new key in ``names.py`` appears in the site without editing a page.

- API reference: one page per public module of ``lightning_privacy`` (no path component starting with ``_``;
  ``commands/`` is the CLI and has its own page), rendered by mkdocstrings from the docstrings, grouped by
  sub-package in the nav under the entry that points at ``reference/api/index.md``.
- CLI reference: ``lightning_privacy.cli.build_parser()`` walked sub-command by sub-command (usage, description,
  every option with its default and help).
- Logged keys: ``lightning_privacy/names.py`` read as source (each constant, its key and its comment, under the
  comment line that heads its group).
- Figures: ``benchmarks/*.png`` and ``benchmarks/results/*.png`` are served under ``assets/``, so a page shows the
  PNG the benchmark script wrote.
"""

from __future__ import annotations

import argparse
import ast
import html
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lightning_privacy"
API_INDEX = "reference/api/index.md"
SKIPPED_PACKAGES = ("commands",)
GROUPS = {
    "callbacks": "Callbacks",
    "dpsgd": "DP-SGD engine",
    "audits": "Audits",
    "analysis": "Analysis (numpy/scipy)",
    "functional": "Functional (torch)",
    "metrics": "Metrics",
    "data": "Data",
    "generators": "Generators",
}


# --------------------------------------------------------------------------------------------- API reference
def api_modules() -> list[str]:
    """Dotted names of the public modules (packages excluded: their members live in their modules)."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if path.name == "__init__.py" or any(p.startswith("_") for p in parts) or parts[1] in SKIPPED_PACKAGES:
            continue
        modules.append(".".join(parts))
    return modules


def _group(module: str) -> str:
    parts = module.split(".")
    return GROUPS.get(parts[1], "Core") if len(parts) > 2 else "Core"


def _summary(module: str) -> str:
    path = ROOT / (module.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return first.replace("|", "\\|")


def api_page_uri(module: str) -> str:
    return f"reference/api/{module}.md"


def api_page(module: str) -> str:
    return f"# `{module}`\n\n::: {module}\n"


def api_index() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings (Google style) at every build: one page per public module. The callbacks and "
        "the audit functions are re-exported from the top level (`from lightning_privacy import DPSGD, "
        "BayesSecurityMonitor, audit_membership, ...`); the pure math in `analysis` imports neither torch nor Lightning.",
        "",
    ]
    current = None
    for module in sorted(api_modules(), key=lambda m: (list(GROUPS.values()) + ["Core"]).index(_group(m))):
        if _group(module) != current:
            current = _group(module)
            lines += ["", f"## {current}", "", "| module | what it holds |", "|---|---|"]
        lines.append(f"| [`{module}`]({module}.md) | {_summary(module)} |")
    return "\n".join(lines) + "\n"


def api_nav() -> list:
    groups: dict = {}
    for module in api_modules():
        groups.setdefault(_group(module), []).append({module.split(".", 1)[1]: api_page_uri(module)})
    order = list(GROUPS.values()) + ["Core"]
    return [API_INDEX] + [{name: groups[name]} for name in order if name in groups]


def _expand_nav(items: list) -> list:
    out = []
    for item in items:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == API_INDEX:
                value = api_nav()
            elif isinstance(value, list):
                value = _expand_nav(value)
            out.append({title: value})
        else:
            out.append(item)
    return out


# --------------------------------------------------------------------------------------------- CLI reference
def _commands(parser: argparse.ArgumentParser, words: list) -> list:
    found = [(words, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, [*words, name])
    return found


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser) -> list:
    formatter = argparse.HelpFormatter(prog=parser.prog)
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
        if action.metavar or (action.option_strings and action.nargs != 0):
            name += f" `{action.metavar or action.dest.upper()}`" if action.option_strings else ""
        if action.required and action.option_strings:
            name += " (required)"
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS) else f"`{default}`"
        help_text = formatter._expand_help(action) if action.help and action.help != argparse.SUPPRESS else ""
        if action.choices:
            help_text += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
        rows.append(f"| {_cell(name)} | {_cell(shown)} | {_cell(help_text)} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def cli_markdown() -> str:
    """The CLI reference page, from the parsers ``lightning-privacy`` runs."""
    from lightning_privacy.cli import build_parser

    root = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from the argparse parsers of `lightning-privacy` at every build "
        "(`lightning_privacy.cli.build_parser()`); `lightning-privacy COMMAND --help` prints the same.",
        "Every command's errors are one line naming the flag, with exit status 2.",
        "",
    ]
    for words, parser in _commands(root, []):
        title = " ".join(["lightning-privacy", *words])
        lines += [f"## `{title}`", ""]
        if parser.description:
            lines += [parser.description, ""]
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            lines += ["| command | what it does |", "|---|---|"]
            for choice in action._choices_actions:
                lines.append(f"| `{title} {choice.dest}` | {_cell(choice.help or '')} |")
            lines.append("")
        lines += ["```text", _usage(parser), "```", ""]
        rows = _option_rows(parser)
        if rows:
            lines += ["| option | default | meaning |", "|---|---|---|", *rows, ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- logged keys
def logged_keys() -> list:
    """``(group, constant, key, comment)`` for every string constant of ``names.py``, in source order."""
    source = (PACKAGE / "names.py").read_text(encoding="utf-8")
    comments: dict = {}
    headings: dict = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if token.line.strip().startswith("#"):
                headings[token.start[0]] = text
            else:
                comments[token.start[0]] = text
    rows, group = [], ""
    last_line = 0
    for node in ast.parse(source).body:
        for line in range(last_line + 1, node.lineno):
            group = headings.get(line, group)
        last_line = getattr(node, "end_lineno", node.lineno)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            rows.append((group, node.targets[0].id, node.value.value, comments.get(node.lineno, "")))
    from lightning_privacy import names

    return [row for row in rows if row[2] in names.ALL_KEYS]  # not the trust-kind constants below the keys


def keys_markdown() -> str:
    lines = [
        "# Logged keys",
        "",
        "Generated from `lightning_privacy/names.py` at every build: every key the callbacks and audits log, as the "
        "constant to import (`from lightning_privacy import names; names.MIA_BAYES_SECURITY`). The `/` groups keys "
        "into TensorBoard sections: `dp/` for the DP-SGD mechanism, `privacy/` for per-epoch bounds, `audit/` for "
        "post-training audits. How far to trust each kind of number: [Bayes security](../guides/bayes_security.md#"
        "how-far-to-trust-each-number).",
    ]
    from lightning_privacy import names

    lines += [
        "",
        "Every key has its meaning, its unit and how far to trust it (`names.KEY_DOCS`): a *certified* bound is on the "
        "safe side by construction, a *valid lower bound* is statistical evidence at confidence 1 − α, an *estimate* "
        "carries no guarantee, and *data-dependent* values are not covered by the DP guarantee.",
    ]
    group = None
    for row_group, constant, key, comment in logged_keys():
        if row_group != group:
            group = row_group
            lines += [
                "",
                f"## {html.escape(group or 'Other')}",
                "",
                "| key | constant | meaning | unit | how far to trust it |",
                "|---|---|---|---|---|",
            ]
        meaning, unit, trust = names.KEY_DOCS[key]
        note = f" ({_cell(comment)})" if comment and comment not in meaning else ""
        lines.append(f"| `{key}` | `names.{constant}` | {_cell(meaning)}{note} | {_cell(unit)} | {_cell(trust)} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the hooks
def figures() -> list:
    """``(served path, file)`` for every benchmark PNG."""
    pngs = sorted((ROOT / "benchmarks").glob("*.png")) + sorted((ROOT / "benchmarks" / "results").glob("*.png"))
    return [(f"assets/{p.relative_to(ROOT).as_posix()}", p) for p in pngs]


def on_config(config, **kwargs):
    config["nav"] = _expand_nav(config["nav"] or [])
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    pages = {API_INDEX: api_index(), "reference/cli.md": cli_markdown(), "reference/logged_keys.md": keys_markdown()}
    pages["changelog.md"] = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")  # the repository's, served as is
    pages.update({api_page_uri(m): api_page(m) for m in api_modules()})
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    for uri, path in figures():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files

"""The ``lightning-privacy`` command.

Each sub-command is one module in :mod:`lightning_privacy.commands` that defines

- ``NAME``: the words that invoke it, e.g. ``"estimate"`` or ``"audit epsilon-star"``;
- ``HELP``: one line for ``--help``;
- ``add_arguments(parser)`` and ``run(args) -> int``.

Modules are discovered, so adding a command means adding a file. Heavy imports (torch, lightning)
belong inside ``run`` so that ``lightning-privacy --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

import lightning_privacy.commands as _commands
from lightning_privacy import __version__


def _discover() -> list:
    modules = []
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        modules.append(importlib.import_module(f"{_commands.__name__}.{info.name}"))
    return modules


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every discovered sub-command."""
    parser = argparse.ArgumentParser(
        prog="lightning-privacy",
        description="Privacy risk, measured: DP-SGD bounds, audits and estimates for Lightning models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict = {}
    for module in _discover():
        words = module.NAME.split()
        if len(words) == 1:
            sub = top.add_parser(words[0], help=module.HELP, description=module.HELP)
        else:
            group, leaf = words
            if group not in groups:
                gp = top.add_parser(group, help=f"{group} sub-commands")
                groups[group] = gp.add_subparsers(dest=f"{group}_command", metavar="KIND", required=True)
            sub = groups[group].add_parser(leaf, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-privacy`` console script."""
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

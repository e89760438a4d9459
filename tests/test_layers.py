"""The package's layering, read from the source: who may import whom, and where private APIs live."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_privacy"

# Lower layers first; a module may import its own layer and any layer before it (see docs/architecture.md).
LAYERS = ["analysis", "functional", "metrics", "audits", "callbacks", "commands"]

# Private attributes of Lightning, Opacus, torch, TensorBoard and SDV; only _compat.py may touch them.
PRIVATE = re.compile(
    r"_accelerator_connector|\._data_source|_DataLoaderSource|getclosurevars|_get_file_writer|"
    r"\._forward_hooks|\._forward_pre_hooks|\._backward_hooks|\._backward_pre_hooks|_full_backward_hooks|"
    r"_set_random_state|\._norm_sample"
)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _layer(path: Path):
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def test_private_apis_only_in_compat():
    offenders = []
    for path, _ in _modules():
        if path.name == "_compat.py":
            continue
        # docstrings and comments may name them (e.g. a doctest that checks hooks are gone): strip those
        code = ast.unparse(ast.parse(path.read_text(encoding="utf-8")))
        code = re.sub(r"(?s)('''|\"\"\").*?\1", "", code)
        for line in code.splitlines():
            if PRIVATE.search(line) and not line.lstrip().startswith(("'", '"', ">>>")):
                offenders.append(f"{path.relative_to(PACKAGE)}: {line.strip()}")
    assert not offenders, "private APIs outside _compat.py:\n" + "\n".join(offenders)


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_downwards(layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    wrong = []
    for path, tree in _modules():
        if _layer(path) != layer:
            continue
        for name in _imports(tree):
            parts = name.split(".")
            if parts[0] == "lightning_privacy" and len(parts) > 1 and parts[1] in LAYERS and parts[1] not in allowed:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_commands_import_no_callbacks():
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == "commands"
        for name in _imports(tree)
        if name.startswith("lightning_privacy.callbacks")
    ]
    assert not wrong, "\n".join(wrong)


def test_analysis_stands_alone():
    """analysis/ is numpy/scipy only: it imports nothing else from the package, and loading it loads no torch."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == "analysis"
        for name in _imports(tree)
        if name.split(".")[0] in ("torch", "lightning", "opacus")
        or (name.startswith("lightning_privacy") and not name.startswith("lightning_privacy.analysis"))
    ]
    assert not wrong, "\n".join(wrong)
    modules = sorted(p.stem for p in (PACKAGE / "analysis").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('lightning_privacy.analysis.' + m)\n"
        "print(sorted(k for k in ('torch', 'lightning', 'opacus') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

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

# The modules at the package's top level, each in the lowest layer its imports allow: "analysis" imports neither
# torch nor Lightning nor Opacus, "functional" may (torch, Opacus, a LightningModule), and a module that imports a
# layer sits in it. A new top-level module needs an entry here.
TOP_LEVEL = {
    "_validation": "analysis",  # argument checks, plain Python
    "names": "analysis",  # the logged keys
    "reporting": "analysis",  # ReportSection: the report's protocol, plain Python
    "attribute_ledger": "analysis",  # β*_AI's composition (analysis.composition)
    "_compat": "functional",  # private Lightning / Opacus / torch APIs
    "attributes": "functional",  # SensitiveAttribute (torch)
    "bookkeeping": "functional",  # ghost clipping's one-pass clipped sum (torch, Opacus)
    "sampling": "functional",  # Poisson masks (torch)
    "noise": "functional",  # NoiseSource (torch)
    "ledger": "functional",  # PrivacyLedger (Opacus accountants)
    "claims": "functional",  # Claim (the ledger)
    "checkpoints": "functional",  # load_checkpoint (Opacus fixers, the ledger)
    "models": "functional",  # TabularMLP (a LightningModule)
    "references": "callbacks",  # re-exports callbacks.references (Lightning and DP-SGD)
    "report": "callbacks",  # the privacy report (reads callbacks._audit_utils)
    "cli": "commands",  # the console script
}

# Private attributes of Lightning, Opacus, torch, TensorBoard and SDV; only _compat.py may touch them.
PRIVATE = re.compile(
    r"_accelerator_connector|\._data_source|_DataLoaderSource|getclosurevars|_get_file_writer|"
    r"\._forward_hooks|\._forward_pre_hooks|\._backward_hooks|\._backward_pre_hooks|_full_backward_hooks|"
    r"_set_random_state|\._norm_sample"
)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _imports(tree):
    """The modules a module imports (``from lightning_privacy import names`` counts as ``lightning_privacy.names``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _layer(path: Path):
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def _imported_layer(name: str):
    """The layer of an imported ``lightning_privacy`` module (a layer's package or a top-level module), else None."""
    parts = name.split(".")
    if parts[0] != "lightning_privacy" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else TOP_LEVEL.get(parts[1])


def _above(name: str, layer: str) -> bool:
    imported = _imported_layer(name)
    return imported is not None and LAYERS.index(imported) > LAYERS.index(layer)


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
    """A layer's modules import no higher layer, neither its package nor a top-level module placed above it."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == layer
        for name in _imports(tree)
        if _above(name, layer)
    ]
    assert not wrong, "\n".join(wrong)


def test_top_level_modules_import_only_downwards():
    """Every top-level module has a layer (``TOP_LEVEL``) and imports nothing above it; those in ``analysis`` load no
    torch, Lightning or Opacus."""
    tops = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(TOP_LEVEL) == tops, "give each top-level module a layer in TOP_LEVEL"
    wrong = []
    for stem, layer in TOP_LEVEL.items():
        for name in _imports(ast.parse((PACKAGE / f"{stem}.py").read_text(encoding="utf-8"))):
            heavy = layer == "analysis" and name.split(".")[0] in ("torch", "lightning", "opacus")
            if heavy or _above(name, layer):
                wrong.append(f"{stem}.py ({layer}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_commands_import_only_the_references_of_callbacks():
    """Commands call the package's functions, not its callbacks, with one exception: ``audit membership`` trains DP
    reference models for the CLI, which needs DP-SGD, so commands may import ``lightning_privacy.callbacks.references``
    (and nothing else from callbacks)."""
    allowed = {"lightning_privacy.callbacks.references"}
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == "commands"
        for name in _imports(tree)
        if name.startswith("lightning_privacy.callbacks") and name not in allowed
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

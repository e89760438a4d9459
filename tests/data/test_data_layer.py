"""``data/`` and the generic layers do not import each other (issue "Audit any model", item 6).

``AdultDataModule.sensitive_attribute`` builds a ``SensitiveAttribute``, which lives at the package root
(``lightning_privacy/attributes.py``, shared vocabulary like ``names.py``), so data/ needs nothing from functional/;
the generic pipelines (``functional/``, ``analysis/``, ``metrics/``) must not reach back into the bundled dataset
(the PANORAMIA pipeline used to import Adult's column lists).
Read from the source, like ``tests/test_layers.py``, so a lazy import inside a function counts too.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_privacy"
LAYERS = {"analysis", "functional", "metrics", "audits", "callbacks", "commands", "data"}
DATA_MAY_IMPORT = {"analysis", "data"}


def _package_imports(path: Path):
    """``(line, layer)`` of every ``lightning_privacy.<layer>`` import in ``path`` (module level or lazy)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "lightning_privacy":  # from lightning_privacy import data, callbacks ...
                names = [f"lightning_privacy.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lightning_privacy" and len(parts) > 1 and parts[1] in LAYERS:
                yield node.lineno, parts[1]


def test_data_imports_only_analysis():
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line} imports lightning_privacy.{layer}"
        for path in sorted((PACKAGE / "data").rglob("*.py"))
        for line, layer in _package_imports(path)
        if layer not in DATA_MAY_IMPORT
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("layer", ["analysis", "functional", "metrics"])
def test_lower_layers_do_not_import_data(layer):
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line} imports lightning_privacy.data"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for line, imported in _package_imports(path)
        if imported == "data"
    ]
    assert not wrong, "\n".join(wrong)

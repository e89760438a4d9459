"""Who imports whom around the audits layer, and figures that leave the user's matplotlib alone."""

import ast
import subprocess
import sys
from pathlib import Path

import lightning_privacy

PACKAGE = Path(lightning_privacy.__file__).parent


def _imports(path: Path) -> set:
    """Every module a file imports (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{alias.name}" for alias in node.names}
    return out


def test_commands_import_no_callback_module():
    """The reference models come from lightning_privacy.references (DP ones need DP-SGD), no callback module."""
    for path in sorted((PACKAGE / "commands").glob("audit_*.py")):
        bad = {m for m in _imports(path) if m.startswith("lightning_privacy.callbacks")}
        assert not bad, f"{path.name} imports {bad}"


def test_audits_import_neither_lightning_nor_callbacks_nor_pyplot():
    for path in sorted((PACKAGE / "audits").glob("*.py")):
        bad = {
            m
            for m in _imports(path)
            if m.split(".")[0] in ("lightning", "pytorch_lightning")
            or m.startswith(("lightning_privacy.callbacks", "lightning_privacy.commands", "matplotlib.pyplot"))
        }
        assert not bad, f"{path.name} imports {bad}"


def test_the_panoramia_pipeline_knows_no_data_set():
    """functional/ is generic: Adult's column names come from the audits layer, not from data/."""
    assert not {m for m in _imports(PACKAGE / "functional" / "panoramia.py") if m.startswith("lightning_privacy.data")}


def test_audit_figures_leave_the_backend_and_pyplot_alone():
    code = """
import sys
import matplotlib
matplotlib.use("svg")
import numpy as np
import lightning_privacy
from lightning_privacy.audits import audit_epsilon_star_from_losses
from lightning_privacy.audits.panoramia import panoramia_figure
from lightning_privacy.analysis.panoramia import panoramia_bounds
from lightning_privacy.functional.panoramia import PanoramiaResult

rng = np.random.default_rng(0)
audit_epsilon_star_from_losses(rng.gamma(2, 5, 500), rng.gamma(3, 5, 500), delta=1e-3).figure()
s = rng.integers(0, 2, 200)
panoramia_figure(PanoramiaResult(panoramia_bounds(s, rng.random(200), s + rng.random(200)), s, rng.random(200),
                 s + rng.random(200), (np.zeros((200, 2)), s), np.arange(3)))
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
from lightning_privacy import EpsilonStarAudit, PanoramiaAudit, PrivacyProfileAudit  # torchmetrics imports pyplot
print(matplotlib.get_backend())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["svg", "False", "svg"]

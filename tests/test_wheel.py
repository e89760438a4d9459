"""``pip install`` of the built wheel runs the demo, with no access to this checkout.

What the test proves: the wheel built from ``pyproject.toml`` (``python -m build --wheel``, from a copy of the
sources so the working tree is untouched) holds the package, the console script and the package data — the bundled
UCI Adult files the demo trains on — and ``lightning-privacy demo`` runs from that installation alone.

What it does not: download the dependencies. A fresh venv cannot fetch torch quickly (or at all, offline), so the
fresh venv (``python -m venv --without-pip``) sees the third-party packages of this project's venv through a
``.pth`` line naming its site-packages. Python does not process ``.pth`` files found in a directory added that way,
so this project's editable install (``__editable__*.pth`` and its finder) is invisible: ``lightning_privacy`` can
only come from the wheel, which the test checks (``lightning_privacy.__file__`` lies in the fresh venv). The demo
runs from an empty temporary folder with ``PYTHONPATH`` unset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(argv, cwd):
    """Run from ``cwd`` (never this checkout: ``python -c`` puts the current folder on ``sys.path``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.slow
def test_the_built_wheel_installs_and_runs_the_demo(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "lightning_privacy", source / "lightning_privacy", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check", "--outdir", str(dist)],
        cwd=source,
    )
    (wheel,) = dist.glob("lightning_privacy-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("adult.data.gz", "adult.test.gz", "adult.names.gz", "PROVENANCE.md"):
        assert f"lightning_privacy/data/adult/{data}" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)

    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    fresh_site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).stdout.strip()
    )
    (fresh_site / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    missing = _run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('lightning_privacy') is None)"], tmp_path
    )
    assert missing.stdout.strip() == "True", "the fresh venv sees this checkout's lightning_privacy before the install"

    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)], tmp_path)
    where = _run(
        [str(python), "-c", "import lightning_privacy; print(lightning_privacy.__file__)"], tmp_path
    ).stdout.strip()
    assert Path(where).is_relative_to(fresh_site)

    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = _run([str(venv / "bin" / "lightning-privacy"), "demo", "--epochs", "1", "--no-progress"], cwd=work)
    assert "β*_MIA (exact, safe: pessimistic PLD)" in proc.stdout and "test accuracy" in proc.stdout
    assert (work / "runs" / "demo" / "version_0" / "privacy_report.html").is_file()

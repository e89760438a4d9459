"""``lightning-privacy estimate``: the worked example's table, JSON output, and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_privacy.cli import main

WORKED = ["estimate", "--fn", "35", "--tp", "65", "--fp", "25", "--tn", "75", "--delta", "0.05", "--alpha", "0.05"]


def test_table_of_the_worked_example(capsys):
    assert main(WORKED) == 0
    out = capsys.readouterr().out
    rows = {line[:28].strip(): line[28:].split() for line in out.splitlines()[2:]}
    assert [float(v) for v in rows["Bayesian (joint posterior)"][:2]] == pytest.approx([0.522, 1.268], abs=0.003)
    assert [float(v) for v in rows["Jeffreys rectangle"][:2]] == pytest.approx([0.321, 1.456], abs=0.003)
    assert [float(v) for v in rows["Clopper-Pearson rectangle"][:2]] == pytest.approx([0.295, 1.489], abs=0.003)
    assert "95% two-sided" in out


def test_json_one_sided_perfect_attack(capsys):
    argv = [
        "estimate",
        "--fn",
        "0",
        "--tp",
        "1000",
        "--fp",
        "0",
        "--tn",
        "1000",
        "--delta",
        "1e-5",
        "--alpha",
        "0.1",
        "--sided",
        "one",
        "--json",
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["intervals"]["clopper_pearson"]["low"] == pytest.approx(5.81, abs=0.005)
    assert result["intervals"]["jeffreys"]["low"] == pytest.approx(6.25, abs=0.005)
    assert result["intervals"]["bayes"]["high"] == float("inf")


def test_bad_input_is_a_clear_error(capsys):
    assert main(["estimate", "--fn", "1", "--tp", "1", "--fp", "1", "--tn", "1", "--delta", "1.5"]) == 2
    assert "`delta`" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "lightning_privacy.cli", *WORKED], check=True, capture_output=True, text=True
    ).stdout
    assert "Bayesian (joint posterior)       0.522" in out


def test_version_flag_prints_the_package_version():
    from lightning_privacy import __version__

    out = subprocess.run(
        [sys.executable, "-m", "lightning_privacy.cli", "--version"], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == f"lightning-privacy {__version__}"

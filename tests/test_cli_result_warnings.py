"""The CLI says when a result carries no information: stderr ``warning:`` lines, ``"warnings"`` in ``--json``.

Every test runs the installed console script as a subprocess, as a user would (see test_cli_audit_any_model.py).
"""

import json

import numpy as np
import pytest

from tests._cli import cli_warnings as _warnings
from tests._cli import run_cli as _cli


# --- estimate: scores (or guesses) that look reversed ---------------------------------------------
@pytest.fixture(scope="module")
def game(tmp_path_factory):
    """A strong attack (members score 1.5 higher), its scores negated, and the labels."""
    folder = tmp_path_factory.mktemp("game")
    rng = np.random.default_rng(1)
    is_member = rng.random(800) < 0.5
    scores = rng.normal(loc=1.5 * is_member)
    np.save(folder / "scores.npy", scores)
    np.save(folder / "reversed.npy", -scores)
    np.savetxt(folder / "labels.txt", is_member.astype(int), fmt="%d")
    return folder


def test_estimate_reversed_scores_warn_and_name_the_flag(game):
    out = _cli("estimate", "--scores", "reversed.npy", "--labels", "labels.txt", "--delta", "1e-5", "--json", cwd=game)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (warning,) = data["warnings"]
    assert data["epsilon_lower"] == 0.0 and "look reversed" in warning and "pass `--lower-is-member`" in warning
    assert _warnings(out.stderr, "estimate") == [warning]
    # the same files read the right way round: a real bound, no warning
    fixed = _cli(
        "estimate",
        "--scores",
        "reversed.npy",
        "--labels",
        "labels.txt",
        "--delta",
        "1e-5",
        "--lower-is-member",
        "--json",
        cwd=game,
    )
    assert fixed.returncode == 0 and fixed.stderr == ""
    assert json.loads(fixed.stdout)["warnings"] == [] and json.loads(fixed.stdout)["epsilon_lower"] > 0.5
    # scores passed with --lower-is-member by mistake: the hint is to drop it
    wrong = _cli(
        "estimate", "--scores", "scores.npy", "--labels", "labels.txt", "--delta", "1e-5", "--lower-is-member", cwd=game
    )
    (warning,) = _warnings(wrong.stderr, "estimate")
    assert wrong.returncode == 0 and "drop `--lower-is-member`" in warning and "refutes no epsilon" in wrong.stdout


def test_estimate_reversed_counts_warn(tmp_path):
    out = _cli(
        "estimate", "--fn", "70", "--tp", "30", "--fp", "60", "--tn", "40", "--delta", "1e-5", "--json", cwd=tmp_path
    )
    (warning,) = json.loads(out.stdout)["warnings"]
    assert out.returncode == 0 and "guesses look reversed" in warning and _warnings(out.stderr, "estimate") == [warning]
    fine = _cli(
        "estimate", "--fn", "35", "--tp", "65", "--fp", "25", "--tn", "75", "--delta", "0.05", "--json", cwd=tmp_path
    )
    assert fine.returncode == 0 and fine.stderr == "" and json.loads(fine.stdout)["warnings"] == []


# --- audit epsilon-star: Normal fits rejected by their KS test ----------------------------------
def test_epsilon_star_fits_rejected_warn_flag_and_json(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "m.npy", rng.gamma(2, 5, 2000))
    np.save(tmp_path / "n.npy", rng.gamma(3, 5, 2000))
    args = ["audit", "epsilon-star", "--member-losses", "m.npy", "--nonmember-losses", "n.npy", "--delta", "1e-4"]
    out = _cli(*args, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (warning,) = data["warnings"]
    assert data["fits_rejected"] is True and "Normal fits of Epsilon* are rejected" in warning
    assert "method='empirical'" in warning and _warnings(out.stderr, "audit epsilon-star") == [warning]
    table = _cli(*args, cwd=tmp_path)
    assert "(fits rejected: epsilon_star not reliable, use the empirical one)" in table.stdout
    assert _warnings(table.stderr, "audit epsilon-star") == [warning]


def test_epsilon_star_fitting_normals_no_warning(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "m.npy", rng.normal(1, 1, 2000))
    np.save(tmp_path / "n.npy", rng.normal(2, 1, 2000))
    out = _cli(
        "audit", "epsilon-star", "--member-losses", "m.npy", "--nonmember-losses", "n.npy", "--json", cwd=tmp_path
    )
    data = json.loads(out.stdout)
    assert out.returncode == 0 and out.stderr == "" and data["warnings"] == [] and data["fits_rejected"] is False

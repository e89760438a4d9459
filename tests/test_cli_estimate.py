"""``lightning-privacy estimate``: the worked example's table, JSON output, scores and labels files, and errors.

The scores mode runs the installed console script as a subprocess, as a user would, and compares with
:func:`~lightning_privacy.analysis.estimation.epsilon_lower_bound` on the same arrays.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from lightning_privacy.analysis.estimation import epsilon_from_rates, epsilon_lower_bound, max_informative_delta
from lightning_privacy.cli import main
from tests._cli import run_cli

WORKED = ["estimate", "--fn", "35", "--tp", "65", "--fp", "25", "--tn", "75", "--delta", "0.05", "--alpha", "0.05"]


def _one_strict_json_object(text: str) -> dict:
    """``text`` as exactly one JSON object, refusing NaN/Infinity (not JSON, though Python writes them)."""

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    value = json.loads(text, parse_constant=refuse)
    assert isinstance(value, dict)
    return value


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
    result = _one_strict_json_object(capsys.readouterr().out)
    assert result["intervals"]["clopper_pearson"]["low"] == pytest.approx(5.81, abs=0.005)
    assert result["intervals"]["jeffreys"]["low"] == pytest.approx(6.25, abs=0.005)
    assert result["intervals"]["bayes"]["high"] is None  # strict JSON: the one-sided upper end (inf) is null


def test_bad_input_is_a_clear_error(capsys):
    assert main(["estimate", "--fn", "1", "--tp", "1", "--fp", "1", "--tn", "1", "--delta", "1.5"]) == 2
    assert "`--delta` must be in [0, 1), got 1.5" in capsys.readouterr().err


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


# --- scores and labels ---------------------------------------------------------------------------
def _cli(*args, cwd):
    return run_cli(*args, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    """A simulated attack (members score 1 higher), saved as .npy, .csv and .txt files."""
    folder = tmp_path_factory.mktemp("scores")
    rng = np.random.default_rng(1)
    is_member = rng.random(800) < 0.5
    scores = rng.normal(loc=1.5 * is_member)
    np.save(folder / "scores.npy", scores)
    np.savetxt(folder / "scores.csv", scores, fmt="%.17g", header="attack scores, one a line")
    np.savetxt(folder / "losses.txt", -scores, fmt="%.17g")
    np.save(folder / "labels.npy", is_member)  # booleans
    np.savetxt(folder / "labels.txt", is_member.astype(int), fmt="%d")
    return folder, scores, is_member


@pytest.mark.parametrize(
    "files, options, settings",
    [
        (("scores.npy", "labels.npy"), [], dict()),
        (
            ("scores.csv", "labels.txt"),
            ["--method", "clopper_pearson", "--selection", "bonferroni"],
            dict(method="clopper_pearson", selection="bonferroni"),
        ),
        (
            ("scores.npy", "labels.txt"),
            ["--sided", "one", "--seed", "3", "--alpha", "0.1"],
            dict(sided="one", seed=3, alpha=0.1),
        ),
        (
            ("scores.csv", "labels.npy"),
            ["--selection", "none", "--method", "jeffreys"],
            dict(selection="none", method="jeffreys"),
        ),
    ],
)
def test_scores_mode_equals_epsilon_lower_bound(game, files, options, settings):
    folder, scores, is_member = game
    proc = _cli(
        "estimate", "--scores", files[0], "--labels", files[1], "--delta", "1e-5", *options, "--json", cwd=folder
    )
    assert proc.returncode == 0, proc.stderr
    out = _one_strict_json_object(proc.stdout)
    expected = epsilon_lower_bound(scores, is_member, delta=1e-5, **settings)
    assert out["epsilon_lower"] == pytest.approx(expected.epsilon_lower, rel=1e-9, abs=1e-12)
    assert out["epsilon_lower"] > 0.5  # the attack is strong: a real bound
    assert out["interval_low"] == pytest.approx(expected.interval_low, rel=1e-9, abs=1e-12)
    high = expected.interval_high
    assert out["interval_high"] == (pytest.approx(high, rel=1e-9) if np.isfinite(high) else None)
    assert out["threshold"] == pytest.approx(expected.threshold, rel=1e-12)
    for key in ("tp", "fp", "tn", "fn", "n_thresholds", "selection", "method", "optimistic", "alpha_per_test"):
        assert out[key] == getattr(expected, key), key
    assert out["optimistic"] is (settings.get("selection") == "none")
    assert (out["num_members"], out["num_nonmembers"]) == (int(is_member.sum()), int((~is_member).sum()))
    point = epsilon_from_rates(
        fnr=expected.fn / (expected.fn + expected.tp), fpr=expected.fp / (expected.fp + expected.tn), delta=1e-5
    )
    assert out["point_estimate"] == (pytest.approx(point) if np.isfinite(point) else None)


def test_losses_with_lower_is_member_give_the_same_bound(game):
    folder, scores, is_member = game
    proc = _cli(
        "estimate",
        "--scores",
        "losses.txt",
        "--labels",
        "labels.txt",
        "--delta",
        "1e-5",
        "--lower-is-member",
        "--json",
        cwd=folder,
    )
    assert proc.returncode == 0, proc.stderr
    out = _one_strict_json_object(proc.stdout)
    expected = epsilon_lower_bound(scores, is_member, delta=1e-5)
    assert out["epsilon_lower"] == pytest.approx(expected.epsilon_lower, rel=1e-9)
    assert out["threshold"] == pytest.approx(-expected.threshold)  # in loss units: member iff loss <= t
    assert out["rule"] == "member iff score <= threshold" and out["lower_is_member"] is True


def test_scores_table(game):
    folder, scores, is_member = game
    proc = _cli("estimate", "--scores", "scores.npy", "--labels", "labels.txt", "--delta", "1e-5", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    expected = epsilon_lower_bound(scores, is_member, delta=1e-5)
    rows = dict((line[:34].strip(), line[34:].strip()) for line in proc.stdout.splitlines())
    assert rows["epsilon lower bound"].startswith(f"{expected.epsilon_lower:.4f}   (95% two-sided, Bayesian")
    assert rows["threshold"] == f"member iff score >= {expected.threshold:.6g}"
    assert rows["confusion matrix (held-out half)"].startswith(
        f"TP={expected.tp} FP={expected.fp} TN={expected.tn} FN={expected.fn}"
    )
    assert proc.stderr == ""


def test_no_power_attack_claims_nothing(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savetxt(tmp_path / "s.txt", rng.normal(size=400))
    np.savetxt(tmp_path / "l.txt", np.repeat([1, 0], 200), fmt="%d")
    argv = ["estimate", "--scores", str(tmp_path / "s.txt"), "--labels", str(tmp_path / "l.txt"), "--delta", "1e-5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "epsilon lower bound               0.0000" in out and "refutes no epsilon > 0" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--scores", "scores.npy"], "`--scores` needs `--labels`"),
        (["--labels", "labels.txt"], "`--labels` needs `--scores`"),
        (["--scores", "scores.npy", "--labels", "labels.txt", "--fn", "3"], "not both"),
        (["--scores", "missing.npy", "--labels", "labels.txt"], "`--scores` 'missing.npy' is not a file"),
        (["--scores", "scores.npy", "--labels", "short.txt"], "holds 800 values but `--labels` 'short.txt' holds 3"),
        (["--scores", "scores.npy", "--labels", "scores.npy"], "`--labels` 'scores.npy' must hold 1 (member) or 0"),
        (["--scores", "nan.txt", "--labels", "short.txt"], "`--scores` 'nan.txt' must hold finite numbers; value 2"),
        (["--scores", "words.txt", "--labels", "short.txt"], "`--scores` 'words.txt' is not one number a line"),
        (["--scores", "short.txt", "--labels", "ones.txt"], "has 3 members (1) and 0 non-members (0)"),
        (["--fn", "1", "--tp", "2"], "missing --fp --tn"),
        (
            ["--fn", "1", "--tp", "2", "--fp", "1", "--tn", "1", "--selection", "none"],
            "--selection: only with --scores",
        ),
        (["--fn", "-1", "--tp", "2", "--fp", "1", "--tn", "1"], "`--fn` must be a count >= 0, got -1"),
        ([], "give the counts --fn --tp --fp --tn, or --scores F --labels F"),
        (["--scores", "scores.npy", "--labels", "labels.txt", "--alpha", "1"], "`--alpha` must be in"),
    ],
)
def test_clear_errors_name_the_flag(game, argv, message):
    folder, *_ = game
    (folder / "short.txt").write_text("0\n1\n0\n")
    (folder / "ones.txt").write_text("1\n1\n1\n")
    (folder / "nan.txt").write_text("0.5\nnan\n1\n")
    (folder / "words.txt").write_text("member\nnon-member\n")
    proc = _cli("estimate", *argv, "--delta", "1e-5", "--json", cwd=folder)
    assert proc.returncode == 2
    assert proc.stdout == ""  # nothing half-printed on stdout
    err = proc.stderr.strip()
    assert err.startswith("lightning-privacy estimate: error: ") and "\n" not in err and "Traceback" not in err
    assert message in err


# --- delta: refused where the game cannot show anything, flagged where it swallows the attack --------
def test_a_delta_at_which_no_outcome_can_show_epsilon_is_refused_naming_the_range(capsys):
    """100 + 100 trials: from delta = 0.9636 not even a perfect attack shows epsilon > 0 (Bayes, the widest)."""
    largest = max(
        max_informative_delta(members=100, nonmembers=100, method=m) for m in ("bayes", "jeffreys", "clopper_pearson")
    )
    assert largest == 0.9636
    counts = ["--fn", "35", "--tp", "65", "--fp", "25", "--tn", "75"]
    assert main(["estimate", *counts, "--delta", "0.97", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "lightning-privacy estimate: error: `--delta` must be in [0, 0.9636) for a game of 100 members and 100 "
        "non-members at alpha=0.05 (two-sided), got 0.97: at epsilon = 0, (epsilon, delta)-DP already allows every "
        "attack with TPR - FPR <= delta, and from there on not even a perfect attack (no errors) can show epsilon > 0"
    )
    # a perfect attack just below the limit still shows epsilon > 0: the range is the one the math supports
    perfect = ["--fn", "0", "--tp", "100", "--fp", "0", "--tn", "100", "--json"]
    assert main(["estimate", *perfect, "--delta", "0.963"]) == 0
    assert _one_strict_json_object(capsys.readouterr().out)["intervals"]["bayes"]["low"] > 0
    # a small game reaches its limit sooner: 10 + 10 trials at delta = 0.7
    assert main(["estimate", "--fn", "3", "--tp", "7", "--fp", "2", "--tn", "8", "--delta", "0.7"]) == 2
    assert "`--delta` must be in [0, 0.6844) for a game of 10 members and 10 non-members" in capsys.readouterr().err


def test_intervals_all_zero_because_delta_exceeds_the_attacks_advantage_are_flagged(capsys):
    """The issue's `--delta 0.7` on the worked example: every interval [0, 0]; a perfect attack would still show
    epsilon >= 3.35 there, so the delta is not refused, but the result says why it is empty."""
    argv = ["estimate", "--fn", "35", "--tp", "65", "--fp", "25", "--tn", "75", "--delta", "0.7", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = _one_strict_json_object(captured.out)
    assert all(r["low"] == r["high"] == 0 for r in result["intervals"].values())
    (warning,) = result["warnings"]
    assert warning.startswith(
        "every interval is [0, 0] at delta=0.7: at epsilon = 0, (epsilon, delta)-DP already allows every attack with "
        "TPR - FPR <= delta, and this attack's TPR - FPR = 0.4 is within it"
    )
    assert captured.err == f"lightning-privacy estimate: warning: {warning}\n"
    assert main(argv[:-3] + ["--delta", "0.05"]) == 0 and "warning" not in capsys.readouterr().err


def test_scores_mode_refuses_a_delta_its_held_out_half_cannot_use(tmp_path):
    """Holdout: the bound is computed on half of each class (10 + 10 of 20 + 20), at which delta = 0.7 is too large;
    the same delta with all of them (selection none) is not."""
    np.savetxt(tmp_path / "s.txt", np.r_[np.arange(20) + 100.0, np.arange(20)])  # a perfect attack
    np.savetxt(tmp_path / "l.txt", np.repeat([1, 0], 20), fmt="%d")
    args = ["estimate", "--scores", "s.txt", "--labels", "l.txt", "--delta", "0.7"]
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "`--delta` must be in [0, 0.6844) for the held-out half of 10 members and 10 non-members" in proc.stderr
    everything = _cli(*args, "--selection", "none", "--json", cwd=tmp_path)
    assert everything.returncode == 0, everything.stderr
    assert _one_strict_json_object(everything.stdout)["epsilon_lower"] > 0

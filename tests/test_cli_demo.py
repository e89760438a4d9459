import warnings

import pytest

from lightning_privacy.cli import main


def test_demo_runs_and_prints_the_summary(tmp_path, capsys):
    """...and warns of nothing about its own set-up: its Trainer runs one epoch past the plan on purpose (for the
    stopper to stop it), so DPSGD's "Trainer(max_epochs=2) exceeds the planned epochs=1" is not shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["demo", "--epochs", "1", "--logdir", str(tmp_path), "--no-progress"]) == 0
    shown = [str(w.message) for w in caught]
    assert not [m for m in shown if "exceeds the planned epochs" in m or "LeafSpec" in m], shown
    out = capsys.readouterr().out
    stopped = out.split("stopped by budget after step")[1].split()[0]
    assert stopped.isdigit() and f"/ {stopped}" in out  # the stopper ended the extra epoch at the planned steps
    for line in (
        "test accuracy",
        "β*_MIA closed form",
        "β*_MIA (exact, safe",
        "TPR bound at FPR 0.001 / 0.01 / 0.1",
        "ε at δ = 1e-05, PLD (add/remove)",
        "(certified upper bound)",
        "tensorboard --logdir",
    ):
        assert line in out
    accuracy = float(out.split("test accuracy")[1].split()[0])
    assert accuracy > 0.75  # Adult's majority class is 0.75; DP-SGD must beat it
    assert (tmp_path / "demo" / "version_0").is_dir()
    report = tmp_path / "demo" / "version_0" / "privacy_report.md"
    assert f"Privacy report:   {report}" in out
    assert report.read_text(encoding="utf-8").startswith("# Privacy report")
    page = report.with_suffix(".html")
    assert f"... as one page:  {page}" in out
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<h2>Bayes security against membership inference</h2>" in text
    # β* per epoch with the budget and the TPR-FPR region; the region on log-log axes
    assert text.count('<img src="data:image/png;base64,') == 2


def test_demo_rejects_bad_arguments(capsys):
    import pytest

    with pytest.raises(SystemExit, match="`--target` must be in"):
        main(["demo", "--target", "1.5"])


def test_make_demo_installs_the_package_alone_and_test_docs_lint_the_extras(tmp_path):
    """``make -n`` (what make would run) from a fresh venv: ``demo`` installs CPU torch and the package without extras
    (nothing of transformers, peft, MLflow, W&B, MkDocs: the demo imports none); ``test``, ``docs`` and ``lint``
    install ``.[dev,lm,loggers]`` on top."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root, venv = Path(__file__).resolve().parents[1], tmp_path / "venv"

    def planned(target):
        # Under `make test` (CI) MAKELEVEL/MAKEFLAGS are inherited and a nested make prints "Entering directory" lines.
        env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        command = ["make", "--no-print-directory", "-n", target, f"VENV={venv}"]
        out = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]

    demo = planned("demo")
    assert demo[-1] == f"{venv}/bin/lightning-privacy demo"
    installs = [line for line in demo if "pip install" in line]
    assert len(installs) == 2 and installs[0].startswith(f'{venv}/bin/pip install --quiet "torch==')
    assert installs[1] == f"{venv}/bin/pip install --quiet -e ."  # no extras
    for target in ("test", "docs", "lint"):
        lines = planned(target)
        base, extras = f"{venv}/bin/pip install --quiet -e .", f'{venv}/bin/pip install --quiet -e ".[dev,lm,loggers]"'
        assert base in lines and extras in lines and lines.index(base) < lines.index(extras), (target, lines)


@pytest.mark.slow
def test_the_demo_imports_no_extra(tmp_path):
    """What ``make demo`` leaves out, the demo does not import: transformers, peft, MLflow, W&B, MkDocs, pytest (beyond
    what its own dependencies import where they find them: Lightning imports transformers when it is installed)."""
    import subprocess
    import sys

    code = (
        "import sys, lightning.pytorch, opacus, torchmetrics, tensorboard, matplotlib, sklearn\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        "from lightning_privacy.cli import main\n"
        f"main(['demo', '--epochs', '1', '--logdir', {str(tmp_path)!r}, '--no-progress'])\n"
        "extras = ('transformers', 'peft', 'mlflow', 'wandb', 'mkdocs', 'pytest', 'dp_accounting', 'jsonargparse')\n"
        "print(sorted(({m.split('.')[0] for m in sys.modules} - before) & set(extras)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"

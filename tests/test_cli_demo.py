from lightning_privacy.cli import main


def test_demo_runs_and_prints_the_summary(tmp_path, capsys):
    assert main(["demo", "--epochs", "1", "--logdir", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
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

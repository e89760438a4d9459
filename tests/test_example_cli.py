"""The LightningCLI example (examples/cli): the YAML configures every privacy callback, `attribute: age` included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning.pytorch.cli")  # jsonargparse on Lightning

ROOT = Path(__file__).resolve().parents[1]
SCRIPT, CONFIG = ROOT / "examples" / "cli" / "train.py", ROOT / "examples" / "cli" / "adult_dpsgd.yaml"


def test_the_config_builds_every_callback_with_the_attribute_by_name(tmp_path, monkeypatch):
    from lightning.pytorch.cli import LightningCLI

    from lightning_privacy import (
        DPSGD,
        AttributeInferenceMonitor,
        BayesSecurityMonitor,
        EpsilonStarAudit,
        PrivacyBudgetStopping,
    )
    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.models import TabularMLP

    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])  # pytest's own arguments are not the CLI's
    cli = LightningCLI(args=["--config", str(CONFIG), f"--trainer.default_root_dir={tmp_path}"], run=False)
    by_type = {type(c): c for c in cli.trainer.callbacks}
    for kind in (DPSGD, BayesSecurityMonitor, AttributeInferenceMonitor, PrivacyBudgetStopping, EpsilonStarAudit):
        assert kind in by_type, kind
    monitor = by_type[AttributeInferenceMonitor]
    assert monitor.attribute == "age" and monitor.tracked_attribute is None  # looked up at setup
    assert by_type[DPSGD].noise_multiplier == 1.0
    assert isinstance(cli.model, TabularMLP) and isinstance(cli.datamodule, AdultDataModule)
    assert cli.trainer.max_epochs == 2 and cli.trainer.limit_train_batches == 20  # tiny on purpose


@pytest.mark.slow
def test_the_example_trains_and_logs_bayes_security_against_attribute_inference(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # this tree's package
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "fit",
            "--config",
            str(CONFIG),
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=5",
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (run,) = (tmp_path / "adult_dpsgd_cli").iterdir()
    assert "attribute: age" in (run / "config.yaml").read_text()
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    (ai,) = scalars["privacy/ai_bayes_security"]  # one epoch: one point, at the last step (5 steps: index 4)
    (mia,) = scalars["privacy/mia_bayes_security"]
    assert ai[0] == mia[0] == 4
    assert mia[1] <= ai[1] < 1  # R_t <= 2C: never below the membership bound, and some leakage is measured
    assert "audit/epsilon_star" in scalars and scalars["dp/steps"][-1][1] == 5

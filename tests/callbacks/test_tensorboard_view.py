"""What a user sees: the run's scalar series and HPARAMS row, read through TensorBoard's own server."""

import shutil
import subprocess

import lightning.pytorch as pl
import matplotlib.image
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_privacy import DPSGD, AttributeInferenceMonitor, BayesSecurityMonitor, EpsilonStarAudit, names
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP
from tests._tensorboard import TensorBoardView

pytestmark = pytest.mark.filterwarnings(
    "ignore:AttributeInferenceMonitor.*Section 5.3", "ignore:The closed-form", "ignore:.*hparams.*"
)
EPOCHS = 4
#: Chromium as root, with no network: the flags that keep it from reaching out (see the machine notes).
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The issue's run: DPSGD + both monitors + EpsilonStarAudit(every_n_epochs=2), 4 epochs, default logger."""
    root = tmp_path_factory.mktemp("tb")
    torch.manual_seed(0)
    dm = AdultDataModule(batch_size=1024)
    dm.setup("fit")
    model = TabularMLP(dm.num_features, hidden=(64, 32), lr=0.5)
    dpsgd = DPSGD(noise_multiplier=1.0, log_clipping=True)
    monitor = BayesSecurityMonitor()
    ai = AttributeInferenceMonitor(attribute=dm.sensitive_attribute("age"), values="extremes")
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        logger=TensorBoardLogger(root),
        callbacks=[dpsgd, monitor, ai, EpsilonStarAudit(every_n_epochs=2)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    return trainer, TensorBoardView(root)


def test_every_per_epoch_series_has_one_point_per_epoch_at_increasing_steps(run):
    trainer, view = run
    (run_name,) = view.scalar_tags()
    keys = [
        names.MIA_BAYES_SECURITY,
        names.MIA_ADVANTAGE,
        names.MIA_TPR_BOUND_FPR_0_01,
        names.DP_EPSILON,
        names.DP_STEPS,
        names.AI_BAYES_SECURITY,
        names.DP_CLIP_FRACTION,
        names.DP_GRAD_NORM_MEDIAN,
    ]
    for key in keys:
        points = view.scalars(run_name, key)
        steps = [s for s, _ in points]
        assert len(points) == EPOCHS, (key, points)
        assert all(a < b for a, b in zip(steps, steps[1:])), (key, points)
    beta = [v for _, v in view.scalars(run_name, names.MIA_BAYES_SECURITY)]
    assert all(a >= b for a, b in zip(beta, beta[1:]))  # β* never rises under a fixed σ
    assert beta[-1] == pytest.approx(trainer.callback_metrics[names.MIA_BAYES_SECURITY].item(), abs=1e-6)
    steps = [v for _, v in view.scalars(run_name, names.DP_STEPS)]
    assert steps[-1] == trainer.global_step
    audits = [s for s, _ in view.scalars(run_name, names.EPSILON_STAR)]
    assert len(audits) == EPOCHS // 2 and audits == sorted(set(audits))


def test_hparams_tab_shows_privacy_settings_beside_the_model_and_privacy_metrics(run):
    trainer, view = run
    params, metrics = view.hparams()
    for key in (names.DP_NOISE_MULTIPLIER, names.DP_MAX_GRAD_NORM, names.DP_SAMPLE_RATE, names.DP_DELTA):
        assert key in params
    assert {"lr", "hidden"} <= set(params)  # the model's own hyperparameters are in the same session
    for key in ("hp_metric", names.MIA_BAYES_SECURITY, names.DP_EPSILON, names.AI_BAYES_SECURITY, names.EPSILON_STAR):
        assert key in metrics
    (session,) = view.sessions()
    assert session["hparams"][names.DP_NOISE_MULTIPLIER] == pytest.approx(1.0)
    assert session["hparams"][names.DP_SAMPLE_RATE] == pytest.approx(trainer.callbacks[0].sample_rate)
    assert session["hparams"][names.DP_ACCOUNTANT] == "pld" and session["hparams"][names.DP_GRAD_SAMPLE_MODE] == "hooks"
    assert session["metrics"][names.MIA_BAYES_SECURITY] == pytest.approx(
        trainer.callback_metrics[names.MIA_BAYES_SECURITY].item(), abs=1e-6
    )
    assert session["metrics"][names.DP_EPSILON] == pytest.approx(trainer.callbacks[0].epsilon(), rel=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_scalars_page_renders_in_chromium(run, tmp_path):
    """The SCALARS page as a person opens it: headless Chromium renders the privacy section's charts."""
    _, view = run
    png = tmp_path / "scalars.png"
    subprocess.run(
        [
            "chromium",
            *CHROMIUM_FLAGS,
            "--window-size=1400,1200",
            "--virtual-time-budget=15000",
            f"--screenshot={png}",
            f"{view.url}/?tagFilter=privacy%2Fmia#scalars",
        ],
        capture_output=True,
        timeout=180,
        check=False,
    )
    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 1000 and image.shape[1] >= 1000
    # TensorBoard's orange header and the charts' lines: far more than a blank or error page's few colours
    colours = {tuple(px) for px in (image[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 200

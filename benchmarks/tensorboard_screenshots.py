"""Screenshots of what a user sees in TensorBoard for the README: the SCALARS page and the HPARAMS tab.

Trains the README's Adult MLP with DPSGD + BayesSecurityMonitor + AttributeInferenceMonitor (age) +
EpsilonStarAudit(every_n_epochs=2) for 4 epochs under Lightning's default TensorBoardLogger, starts TensorBoard's
own server on it (loopback, a free port) and takes headless-Chromium screenshots (Debian's ``chromium``).

    python benchmarks/tensorboard_screenshots.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_privacy import DPSGD, AttributeInferenceMonitor, BayesSecurityMonitor, EpsilonStarAudit
from lightning_privacy.data import AdultDataModule
from lightning_privacy.models import TabularMLP

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def train(root: Path) -> None:
    torch.manual_seed(0)
    dm = AdultDataModule(batch_size=256)
    dm.setup("fit")
    model = TabularMLP(dm.num_features, hidden=(64, 32), lr=0.5)
    callbacks = [
        DPSGD(noise_multiplier=1.0, log_clipping=True),
        BayesSecurityMonitor(),
        AttributeInferenceMonitor(attribute="age", values="extremes"),
        EpsilonStarAudit(every_n_epochs=2),
    ]
    trainer = pl.Trainer(max_epochs=4, logger=TensorBoardLogger(root), callbacks=callbacks, enable_progress_bar=False)
    trainer.fit(model, datamodule=dm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--logdir", type=Path, default=None, help="screenshot this run instead of training one")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium: apt-get install -y chromium")
    torch.set_num_threads(1)
    root = args.logdir
    if root is None:
        root = Path(tempfile.mkdtemp())
        train(root)
        print(f"run in {root}")
    from tensorboard import program

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(root), "--port", str(port), "--host", "127.0.0.1"])
    url = board.launch().rstrip("/")
    time.sleep(5)
    urllib.request.urlopen(url, timeout=30).read()
    args.out.mkdir(parents=True, exist_ok=True)
    # (fragment, window): the SCALARS page filtered to the privacy keys; HPARAMS wide enough for the metric columns
    pages = {
        "scalars": ("#scalars&tagFilter=privacy%2F&_smoothingWeight=0", "1500,1150"),
        "hparams": ("#hparams", "2600,600"),
    }
    for name, (suffix, window) in pages.items():
        png = args.out / f"tensorboard_{name}.png"
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--window-size={window}",
                "--virtual-time-budget=20000",
                f"--screenshot={png}",
                f"{url}/{suffix}",
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )
        print(f"wrote {png}")


if __name__ == "__main__":
    main()

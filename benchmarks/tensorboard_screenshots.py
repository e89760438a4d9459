"""Screenshots of what a user sees in TensorBoard for ``docs/guides/tensorboard.md``: the SCALARS page and the HPARAMS tab.

Trains the Adult MLP with DPSGD + BayesSecurityMonitor + AttributeInferenceMonitor (age) +
EpsilonStarAudit(every_n_epochs=2) for 4 epochs under Lightning's default TensorBoardLogger, starts TensorBoard's
own server on it (loopback, a free port) and takes headless-Chromium screenshots (Debian's ``chromium``).

The SCALARS page is photographed with TensorBoard's "Ignore outliers in chart scaling" off, so every epoch's point is
inside its chart (with it on, the y-range leaves out the extreme values, here the first and last epochs of each
monotone series), and without smoothing. That setting lives in the browser's local storage, not in the URL: the
server is wrapped so that its page first runs a one-line script that stores it (:data:`LOCAL_STORAGE`).

    python benchmarks/tensorboard_screenshots.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
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


# TensorBoard settings kept in local storage (the SCALARS dashboard reads them when it starts).
LOCAL_STORAGE = {"_ignoreYOutliers": "false"}
SETTINGS_SCRIPT = "/lightning-privacy-screenshot-settings.js"
# HPARAMS shows only its first 5 hyperparameters (alphabetical) until boxes are ticked: tick them all, so the model's
# and the datamodule's own hyperparameters appear beside the dp/ settings (the query pane sits in shadow DOMs).
SHOW_ALL_HPARAMS = """
setInterval(function () {
  var panes = [];
  (function walk(root) {
    root.querySelectorAll("*").forEach(function (el) {
      if (el.localName === "tf-hparams-query-pane") panes.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    });
  })(document);
  panes.forEach(function (pane) {
    (pane._hparams || []).forEach(function (h, i) {
      if (!h.displayed) pane.set("_hparams." + i + ".displayed", true);
    });
  });
}, 500);
"""


def with_settings(app, local_storage: dict):
    """TensorBoard's WSGI app whose index page first runs a script storing ``local_storage`` (same origin)."""
    script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in local_storage.items())
    script = (script + SHOW_ALL_HPARAMS).encode()
    tag = f'<head><script src=".{SETTINGS_SCRIPT}"></script>'.encode()  # a file: the page's CSP refuses inline code

    def wrapped(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == SETTINGS_SCRIPT:
            start_response("200 OK", [("Content-Type", "text/javascript"), ("Content-Length", str(len(script)))])
            return [script]
        if path not in ("/", "/index.html"):
            return app(environ, start_response)
        got = {}
        body = b"".join(app({**environ, "HTTP_ACCEPT_ENCODING": "identity"}, lambda s, h, e=None: got.update(s=s, h=h)))
        if b"<head>" not in body:
            raise RuntimeError("TensorBoard's index page has no <head>: cannot store the screenshot settings")
        body = body.replace(b"<head>", tag, 1)
        headers = [(k, v) for k, v in got["h"] if k.lower() != "content-length"] + [("Content-Length", str(len(body)))]
        start_response(got["s"], headers)
        return [body]

    return wrapped


def train(root: Path) -> None:
    torch.manual_seed(0)
    dm = AdultDataModule(batch_size=256)
    dm.setup("fit")
    model = TabularMLP(dm.num_features, hidden=(64, 32), lr=0.5)
    callbacks = [
        # fixed batches and noise: the same charts on every run
        DPSGD(noise_multiplier=1.0, log_clipping=True, sampling_seed=0, noise_seed=0),
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
    board = program.TensorBoard(
        server_class=lambda app, flags: program.create_port_scanning_werkzeug_server(
            with_settings(app, LOCAL_STORAGE), flags
        )
    )
    board.configure(argv=[None, "--logdir", str(root), "--port", str(port), "--host", "127.0.0.1"])
    url = board.launch().rstrip("/")
    time.sleep(5)
    urllib.request.urlopen(url, timeout=30).read()
    args.out.mkdir(parents=True, exist_ok=True)
    # (fragment, window): the SCALARS page filtered to the privacy keys; HPARAMS wide enough for every column
    pages = {
        "scalars": ("#scalars&tagFilter=privacy%2F&_smoothingWeight=0", "1500,1150"),
        "hparams": ("#hparams", "5200,420"),
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

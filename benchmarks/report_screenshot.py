"""A screenshot of the self-contained HTML privacy report for ``docs/guides/html_report.md``, taken by headless Chromium.

Trains that page's example (section "One page to share": the Adult MLP with DPSGD planned for β*_MIA ≥ 0.9
after 2 epochs, BayesSecurityMonitor, PrivacyBudgetStopping, EpsilonStarAudit and a gradient CanaryAudit), writes
``log_privacy_report(trainer, "privacy_report.html")`` and photographs the whole page with Debian's ``chromium``
(the page height is measured in the browser first, so nothing is cut off).

    python benchmarks/report_screenshot.py [--out benchmarks/results] [--width 1200] [--keep-html]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def train_and_report(page: Path) -> None:
    """The block of ``docs/guides/html_report.md``, with fixed seeds (``seed_everything``, DPSGD's ``sampling_seed`` and ``noise_seed``), logs in a temporary folder."""
    import lightning.pytorch as pl
    import torch

    from lightning_privacy import DPSGD, BayesSecurityMonitor, CanaryAudit, EpsilonStarAudit, PrivacyBudgetStopping
    from lightning_privacy.data import AdultDataModule
    from lightning_privacy.models import TabularMLP
    from lightning_privacy.report import log_privacy_report

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    callbacks = [
        DPSGD(target_bayes_security=0.9, epochs=2, sampling_seed=0, noise_seed=0),  # the same page on every run
        BayesSecurityMonitor(),
        PrivacyBudgetStopping(min_bayes_security=0.9),
        EpsilonStarAudit(),
        CanaryAudit("gradient", num_canaries=1000),
    ]
    trainer = pl.Trainer(
        max_epochs=2, callbacks=callbacks, enable_progress_bar=False, default_root_dir=page.parent, logger=False
    )
    trainer.fit(TabularMLP(104, hidden=(64, 32), lr=0.5), datamodule=AdultDataModule(batch_size=256))
    log_privacy_report(trainer, page)


def page_height(chromium: str, page: Path, width: int) -> int:
    """The rendered page's height in CSS pixels, read from a copy that records it in the DOM."""
    probe = page.with_name("probe.html")
    script = (
        "<script>addEventListener('load',()=>document.body.dataset.h=document.documentElement.scrollHeight)</script>"
    )
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--window-size={width},800", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = re.search(r'data-h="(\d+)"', dom)
    if found is None:
        raise SystemExit("could not measure the page height in chromium")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--keep-html", action="store_true", help="also copy the HTML page to --out")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium: `make browser` (apt-get install -y chromium)")
    folder = Path(tempfile.mkdtemp())
    page = folder / "privacy_report.html"
    start = time.perf_counter()
    train_and_report(page)
    print(f"trained and wrote {page} ({page.stat().st_size / 1024:.0f} KiB) in {time.perf_counter() - start:.1f} s")
    height = page_height(chromium, page, args.width)
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "privacy_report_html.png"
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--window-size={args.width},{height}", f"--screenshot={png}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    print(f"wrote {png} ({args.width}x{height}, {png.stat().st_size / 1024:.0f} KiB)")
    if args.keep_html:
        shutil.copy(page, args.out / page.name)
        print(f"wrote {args.out / page.name}")


if __name__ == "__main__":
    main()

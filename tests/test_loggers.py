"""Figures, histograms and text on every logger (lightning_privacy.loggers): a DP-SGD fit with the monitors and three
audits under TensorBoard, then the same fit under MLflow (a local sqlite store), Weights & Biases (offline) and CSV at
once; each store is read back as its user reads it (EventAccumulator, MLflow's client, the W&B offline run folder, the
files beside metrics.csv) and holds every (figure / histogram / text, tag, step) the TensorBoard run has. Nothing
leaves the machine: W&B is offline and a socket guard refuses any connection beyond loopback. No mocks."""

from __future__ import annotations

import html
import ipaddress
import json
import re
import socket
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import matplotlib.image
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from lightning_privacy import (
    DPSGD,
    AttributeInferenceMonitor,
    BayesSecurityMonitor,
    CanaryAudit,
    EpsilonStarAudit,
    MembershipAudit,
    names,
)
from lightning_privacy.functional.attributes import SensitiveAttribute
from lightning_privacy.loggers import log_figure, log_histogram, log_text
from lightning_privacy.models import TabularMLP
from lightning_privacy.report import log_privacy_report
from tests.callbacks._tiny import tiny_dataset, tiny_loader, tiny_module, trainer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings(
    "ignore:AttributeInferenceMonitor.*Section 5.3",
    "ignore:The closed-form",
    "ignore:.*Epsilon\\*",
    "ignore:.*(CanaryAudit|MembershipAudit|EpsilonStarAudit):",
    "ignore:.*(anonymous|wandb|mlflow|pkg_resources|Pydantic|pydantic).*",
    "ignore::DeprecationWarning",
    "ignore::FutureWarning",
)
ATTRIBUTE = SensitiveAttribute.numeric(column=0, values=[-1.0, 0.0, 1.0], name="x0")
#: The media this fit writes, (kind, tag): every one must reach TensorBoard (so the comparison compares something).
EXPECTED = {
    ("figure", names.BAYES_SECURITY_FIGURE),
    ("figure", names.CANARY_FIGURE),
    ("figure", names.MEMBERSHIP_FIGURE),
    ("figure", names.EPSILON_STAR_FIGURE),
    ("histogram", names.DP_GRAD_NORMS),
    ("histogram", names.EPSILON_STAR_MEMBER_LOSSES),
    ("histogram", names.EPSILON_STAR_NONMEMBER_LOSSES),
    ("text", names.CANARY_SUMMARY),
    ("text", names.MEMBERSHIP_SUMMARY),
    ("text", names.EPSILON_STAR_SUMMARY),
    ("text", names.PRIVACY_REPORT),
}
FILE = re.compile(r"^(figures|histograms|text)/(.+)_step(\d+)\.(png|md)$")
KINDS = {"figures": "figure", "histograms": "histogram", "text": "text"}
WANDB_KINDS = {"image-file": "figure", "histogram": "histogram", "html-file": "text"}


# --- set-up: offline, nothing beyond loopback ---------------------------------------------------------------------
def _local(address) -> bool:
    if not isinstance(address, tuple):  # a Unix socket's path
        return True
    host = str(address[0])
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """W&B offline with its folders in a temporary one, MLflow's and W&B's telemetry off, and any Python connection
    beyond loopback (or a name lookup of another host) refused: the loggers must work with no network at all."""
    home = tmp_path_factory.mktemp("offline")
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def guarded(method):
        def call(self, address, *args):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address):
                raise OSError(f"test_loggers: a connection to {address!r} was attempted (the loggers must be offline)")
            return method(self, address, *args)

        return call

    def lookup(host, *args, **kwargs):
        if host not in (None, "localhost") and not _local((host,)):
            raise OSError(f"test_loggers: a name lookup of {host!r} was attempted (the loggers must be offline)")
        return getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_CONSOLE": "off",
            "WANDB_DISABLE_CODE": "true",
            "WANDB_DIR": str(home),
            "WANDB_CONFIG_DIR": str(home / "config"),
            "WANDB_CACHE_DIR": str(home / "cache"),
            "WANDB_DATA_DIR": str(home / "data"),
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
        }.items():
            mp.setenv(key, value)
        mp.setattr(socket.socket, "connect", guarded(connect))
        mp.setattr(socket.socket, "connect_ex", guarded(connect_ex))
        mp.setattr(socket, "getaddrinfo", lookup)
        yield home


def _fit(root: Path, loggers) -> dict:
    """DPSGD (clipping histograms) + BayesSecurityMonitor + AttributeInferenceMonitor + gradient canaries + a LOSS
    attack + Epsilon* after each epoch, 2 epochs of the tiny data; then log_privacy_report."""
    torch.manual_seed(0)
    callbacks = [
        DPSGD(noise_multiplier=1.5, log_clipping=True),
        BayesSecurityMonitor(),
        AttributeInferenceMonitor(attribute=ATTRIBUTE),
        CanaryAudit("gradient", num_canaries=100),
        MembershipAudit("loss", nonmember_dataloader=DataLoader(tiny_dataset(1), batch_size=64)),
        EpsilonStarAudit(every_n_epochs=1),
    ]
    t = trainer(callbacks, root, max_epochs=2, logger=loggers)
    t.fit(tiny_module(), tiny_loader(), DataLoader(tiny_dataset(1), batch_size=64))
    report = log_privacy_report(t)
    return {"trainer": t, "report": report}


# --- reading each store back --------------------------------------------------------------------------------------
def _tensorboard_media(log_dir: str) -> set:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"images": 0, "histograms": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    media = {("figure", tag, e.step) for tag in tags["images"] for e in events.Images(tag)}
    media |= {("histogram", tag, e.step) for tag in tags["histograms"] for e in events.Histograms(tag)}
    suffix = "/text_summary"
    media |= {("text", tag[: -len(suffix)], e.step) for tag in tags["tensors"] for e in events.Tensors(tag)}
    return media


def _from_paths(paths) -> set:
    found = set()
    for path in paths:
        match = FILE.match(path)
        if match:
            found.add((KINDS[match[1]], match[2], int(match[3])))
    return found


def _mlflow_paths(client, run_id: str, path=None) -> list:
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _mlflow_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def _wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): LevelDB's log format (32 KiB blocks of chunks with a 7-byte
    header: CRC, length, type full/first/middle/last) after W&B's 7-byte header, each record a ``Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic)
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        _, length, kind = struct.unpack("<IHB", data[position : position + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):  # the block's zero padding
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _wandb_run_file(run_dir: Path, timeout: float = 60.0) -> list:
    """The records of a finished W&B run: ``finish()`` may return before W&B's service has written the run file (seen
    once in three runs: the file still held its 7-byte header), so wait for its ``exit`` record."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        (run_file,) = run_dir.glob("run-*.wandb")
        records = list(_wandb_records(run_file))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _wandb_media(run_dir: Path) -> tuple:
    """``({(kind, tag, step)}, {(kind, tag, step): media file})`` from the run's history (in its ``.wandb`` file)."""
    found, files = set(), {}
    for record in _wandb_run_file(run_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for key, value in items.items():
            if key.endswith("/_type") and value in WANDB_KINDS:
                tag = key[: -len("/_type")]
                entry = (WANDB_KINDS[value], tag, int(items["trainer/global_step"]))
                found.add(entry)
                if f"{tag}/path" in items:
                    files[entry] = run_dir / "files" / items[f"{tag}/path"]
    return found, files


@pytest.fixture(scope="module")
def tensorboard_run(offline, tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard")
    logger = TensorBoardLogger(root, name="tb")
    fitted = _fit(root, logger)
    return {**fitted, "media": _tensorboard_media(logger.log_dir)}


@pytest.fixture(scope="module")
def other_loggers(offline, tmp_path_factory):
    """The same fit under MLflow, W&B and CSV at once (no TensorBoard: the figures are drawn for them alone)."""
    root = tmp_path_factory.mktemp("loggers")
    mlflow_uri = f"sqlite:///{root}/mlflow.db"
    mlflow_logger = MLFlowLogger("privacy", tracking_uri=mlflow_uri, artifact_location=str(root / "artifacts"))
    wandb_logger = WandbLogger(project="privacy", save_dir=str(root), offline=True)
    csv_logger = CSVLogger(root, name="csv")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = _fit(root, [mlflow_logger, wandb_logger, csv_logger])
    run_dir = Path(wandb_logger.experiment.dir).parent
    wandb_logger.experiment.finish()  # writes the rest of the run file (Lightning leaves the run open)
    return {
        **fitted,
        "mlflow": mlflow_logger,
        "mlflow_uri": mlflow_uri,
        "wandb_dir": run_dir,
        "csv": csv_logger,
        "warnings": [str(w.message) for w in caught],
    }


# --- the tests ----------------------------------------------------------------------------------------------------
def test_the_tensorboard_run_has_every_figure_histogram_and_text(tensorboard_run):
    media = tensorboard_run["media"]
    assert {(kind, tag) for kind, tag, _ in media} == EXPECTED
    steps = {step for kind, tag, step in media if (kind, tag) == ("histogram", names.DP_GRAD_NORMS)}
    assert len(steps) == 2  # one histogram per epoch
    epsilon_star = {step for kind, tag, step in media if (kind, tag) == ("figure", names.EPSILON_STAR_FIGURE)}
    assert len(epsilon_star) == 2  # after each epoch (the fit-end audit would measure the same model)


def test_mlflow_holds_every_figure_histogram_and_text_of_the_tensorboard_run(tensorboard_run, other_loggers, tmp_path):
    from mlflow.tracking import MlflowClient

    logger = other_loggers["mlflow"]
    client = MlflowClient(other_loggers["mlflow_uri"])
    paths = _mlflow_paths(client, logger.run_id)
    assert _from_paths(paths) == tensorboard_run["media"]
    assert all(FILE.match(p) for p in paths), paths  # nothing else
    step = other_loggers["trainer"].global_step
    report = Path(client.download_artifacts(logger.run_id, f"text/privacy/report_step{step}.md", str(tmp_path)))
    assert report.read_text(encoding="utf-8") == other_loggers["report"]
    figure = Path(
        client.download_artifacts(logger.run_id, f"figures/{names.BAYES_SECURITY_FIGURE}_step{step}.png", str(tmp_path))
    )
    assert matplotlib.image.imread(figure).shape[1] >= 400
    # the scalars are there too (Lightning's own writing), in the same run
    assert names.MIA_BAYES_SECURITY in client.get_run(logger.run_id).data.metrics


def test_wandb_offline_run_holds_every_figure_histogram_and_text_of_the_tensorboard_run(tensorboard_run, other_loggers):
    found, files = _wandb_media(other_loggers["wandb_dir"])
    assert found == tensorboard_run["media"]
    assert {kind for kind, _, _ in files} == {"figure", "text"}  # histograms live in the run file itself
    for (kind, _, _), path in files.items():
        assert path.is_file(), path
        if kind == "figure":
            assert matplotlib.image.imread(path).shape[1] >= 400
    step = other_loggers["trainer"].global_step
    page = files[("text", names.PRIVACY_REPORT, step)].read_text(encoding="utf-8")
    assert html.escape(other_loggers["report"].splitlines()[0]) in page


def test_csv_logger_folder_holds_every_figure_histogram_and_text_of_the_tensorboard_run(tensorboard_run, other_loggers):
    log_dir = Path(other_loggers["csv"].log_dir)
    paths = [p.relative_to(log_dir).as_posix() for p in log_dir.rglob("*") if p.is_file()]
    media = [p for p in paths if p not in ("metrics.csv", "hparams.yaml")]
    assert _from_paths(media) == tensorboard_run["media"] and len(media) == len(tensorboard_run["media"]), media
    step = other_loggers["trainer"].global_step
    assert (log_dir / f"text/privacy/report_step{step}.md").read_text(encoding="utf-8") == other_loggers["report"]
    histogram = matplotlib.image.imread(log_dir / f"histograms/{names.DP_GRAD_NORMS}_step{step - 1}.png")
    assert histogram.shape[0] >= 200 and histogram.shape[1] >= 400
    assert "metrics.csv" in paths


def test_the_known_loggers_get_no_warning(other_loggers):
    assert not [w for w in other_loggers["warnings"] if "gets lightning-privacy's scalars but not" in w]


def _wandb_config(run_dir: Path) -> dict:
    """The run's config as W&B records it in the run file (its ``config`` records, later updates winning)."""
    config = {}
    for record in _wandb_run_file(run_dir):
        if record.WhichOneof("record_type") == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


def _privacy_settings(trainer_: pl.Trainer) -> dict:
    from lightning_privacy.callbacks._hparams import flat_hparams

    (dpsgd,) = [cb for cb in trainer_.callbacks if isinstance(cb, DPSGD)]
    settings = flat_hparams(dpsgd.privacy_settings())
    # C, δ, the accountant, the seeds' secrecy, the mode, the divisor and where q came from: all of them, every time
    assert {
        names.DP_MAX_GRAD_NORM,
        names.DP_DELTA,
        names.DP_ACCOUNTANT,
        names.DP_SAMPLING_SEED,
        names.DP_NOISE_SEED,
        names.DP_GRAD_SAMPLE_MODE,
        names.DP_EXPECTED_BATCH_SIZE,
        names.DP_SAMPLE_RATE_SOURCE,
    } <= set(settings), settings
    assert settings[names.DP_NOISE_MULTIPLIER] == 1.5 and settings[names.DP_NOISE_SEED].startswith("secret")
    return settings


def test_the_privacy_settings_are_mlflow_params_wandb_config_and_csv_hparams(other_loggers):
    """Runs compared by C, δ or the accountant in each tool: the settings TensorBoard's HPARAMS has, read back by
    MLflow's client, from W&B's run file and with Lightning's reader of the CSV logger's hparams.yaml, beside the
    model's own hyperparameters."""
    from lightning.pytorch.core.saving import load_hparams_from_yaml
    from mlflow.tracking import MlflowClient

    settings = _privacy_settings(other_loggers["trainer"])
    params = MlflowClient(other_loggers["mlflow_uri"]).get_run(other_loggers["mlflow"].run_id).data.params
    assert {key: params.get(key) for key in settings} == {key: str(value) for key, value in settings.items()}
    assert params["lr"] == "0.5"  # the model's hyper-parameters are still there
    config = _wandb_config(other_loggers["wandb_dir"])
    assert {key: config.get(key) for key in settings} == settings
    assert config["lr"] == 0.5
    hparams = load_hparams_from_yaml(str(Path(other_loggers["csv"].log_dir) / "hparams.yaml"))
    assert {key: hparams.get(key) for key in settings} == settings
    assert hparams["lr"] == 0.5


def test_a_logger_that_refuses_the_settings_is_warned_about_and_the_fit_goes_on(tmp_path):
    class Refusing(ListLogger):
        def log_hyperparams(self, params, *args, **kwargs) -> None:
            if any(key.startswith("dp/") for key in params):  # as MLflow refuses a changed param
                raise ValueError(f"no {sorted(params)[0]} here")

    logger = Refusing()
    t = trainer([DPSGD(noise_multiplier=1.5)], tmp_path, max_epochs=1, logger=logger)
    with pytest.warns(UserWarning, match=r"Refusing did not take the privacy settings as hyperparameters \(ValueError"):
        t.fit(tiny_module(), tiny_loader())
    assert t.current_epoch == 1 and t.global_step == 8 and logger.metrics  # the fit ran to its end, logged


class _NaNAfterThreeSteps(TabularMLP):
    """The tiny MLP whose loss turns NaN from the fourth optimizer step on (after DP-SGD's self-checked steps)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step >= 3 else loss


def test_a_fit_whose_gradient_norms_turn_nan_ends_on_tensorboard_with_a_labelled_figure(tmp_path):
    """Lightning's default logger: the second epoch's norms are all NaN (nothing to bin, which TensorBoard's
    add_histogram refuses with "The histogram is empty"): the fit ends, the first epoch's histogram shows its finite
    norms, the second is the labelled figure, and one warning says what was left out."""
    torch.manual_seed(0)
    logger = TensorBoardLogger(tmp_path, name="tb")
    t = trainer([DPSGD(noise_multiplier=1.5, log_clipping=True)], tmp_path, max_epochs=2, logger=logger)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(_NaNAfterThreeSteps(8, hidden=(16,), lr=0.5), tiny_loader())
    assert t.current_epoch == 2 and t.global_step >= 10
    ours = [str(w.message) for w in caught if str(w.message).startswith("The histogram 'dp/grad_norms'")]
    assert len(ours) == 1 and "non-finite value(s) (NaN or ±inf)" in ours[0], ours
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "histograms": 0}).Reload()
    (first,) = events.Histograms(names.DP_GRAD_NORMS)
    assert 0 < first.histogram_value.num < t.global_step * 64  # the finite norms of the first epoch only
    assert np.isfinite([first.histogram_value.min, first.histogram_value.max, first.histogram_value.sum]).all()
    assert [e.step for e in events.Images(names.DP_GRAD_NORMS)] == [t.global_step - 1]


def test_a_histogram_without_finite_values_is_the_same_labelled_figure_on_every_logger(offline, tmp_path):
    """No values, or only NaN / inf: TensorBoard, MLflow, W&B and CSV each get the labelled figure at its step (no
    error); some non-finite values: the finite ones binned; one warning per tag with non-finite values."""
    from mlflow.tracking import MlflowClient

    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    mlflow_uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow_logger = MLFlowLogger("privacy", tracking_uri=mlflow_uri, artifact_location=str(tmp_path / "artifacts"))
    wandb_logger = WandbLogger(project="privacy", save_dir=str(tmp_path), offline=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    t = pl.Trainer(
        logger=[tensorboard, mlflow_logger, wandb_logger, csv_logger],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    nan, inf = float("nan"), float("inf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_histogram(t, "dp/grad_norms", torch.tensor([nan, nan, inf]), step=3)
        log_histogram(t, "dp/grad_norms", np.array([nan]), step=4)  # the same tag: no second warning
        log_histogram(t, "audit/empty", [], step=5)
        log_histogram(t, "audit/partial", [1.0, 2.0, 3.0, nan], step=6)
    ours = [str(w.message) for w in caught if str(w.message).startswith("The histogram")]
    assert len(ours) == 2, ours
    assert ours[0].startswith("The histogram 'dp/grad_norms' at step 3 leaves out 3 non-finite value(s) (NaN or ±inf)")
    assert "nothing to bin" in ours[0] and "it shows the finite ones" in ours[1]
    figures = {("figure", "dp/grad_norms", 3), ("figure", "dp/grad_norms", 4), ("figure", "audit/empty", 5)}
    # TensorBoard: the labelled figures under IMAGES, the finite values binned
    media = _tensorboard_media(tensorboard.log_dir)
    assert media == figures | {("histogram", "audit/partial", 6)}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (partial,) = (
        EventAccumulator(tensorboard.log_dir, size_guidance={"histograms": 0}).Reload().Histograms("audit/partial")
    )
    assert (partial.histogram_value.num, partial.histogram_value.sum) == (3, 6.0)
    # MLflow and CSV: the histogram's file holds the drawn figure; W&B: an image under the key
    drawn = {(kind, tag, step) for kind, tag, step in figures} | {("histogram", "audit/partial", 6)}
    as_files = {("histogram", tag, step) for _, tag, step in drawn}
    client = MlflowClient(mlflow_uri)
    assert _from_paths(_mlflow_paths(client, mlflow_logger.run_id)) == as_files
    log_dir = Path(csv_logger.log_dir)
    assert _from_paths(p.relative_to(log_dir).as_posix() for p in log_dir.rglob("*.png")) == as_files
    run_dir = Path(wandb_logger.experiment.dir).parent
    wandb_logger.experiment.finish()
    found, files = _wandb_media(run_dir)
    assert found == drawn
    # the same figure everywhere: W&B's image and CSV's file of the empty histogram are the same picture
    wandb_png = matplotlib.image.imread(files[("figure", "audit/empty", 5)])
    csv_png = matplotlib.image.imread(log_dir / "histograms/audit/empty_step5.png")
    assert wandb_png.shape == csv_png.shape and np.allclose(wandb_png[..., :3], csv_png[..., :3], atol=0.02)


class ListLogger(Logger):
    """A logger lightning-privacy does not know: it keeps the scalars in a list."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def test_another_logger_gets_one_warning_naming_what_it_cannot_show(offline, tmp_path):
    unknown = [ListLogger(), ListLogger()]
    csv_logger = CSVLogger(tmp_path, name="csv")
    torch.manual_seed(0)
    t = trainer(
        [DPSGD(noise_multiplier=1.5, log_clipping=True), BayesSecurityMonitor()],
        tmp_path,
        max_epochs=2,
        logger=[*unknown, csv_logger],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(tiny_module(), tiny_loader())
        log_privacy_report(t)  # after the fit: the same Trainer, no second warning
    ours = [str(w.message) for w in caught if "gets lightning-privacy's scalars but not" in str(w.message)]
    assert len(ours) == 1, ours
    assert ours[0].startswith("ListLogger gets lightning-privacy's scalars but not its figures, histograms and text")
    assert all(name in ours[0] for name in ("TensorBoardLogger", "MLFlowLogger", "WandbLogger", "CSVLogger"))
    assert any(names.MIA_BAYES_SECURITY in metrics for _, metrics in unknown[0].metrics)  # the scalars still reach it
    log_dir = Path(csv_logger.log_dir)
    assert (log_dir / f"figures/{names.BAYES_SECURITY_FIGURE}_step{t.global_step}.png").is_file()
    assert len(list((log_dir / "histograms").rglob("*.png"))) == 2
    assert (log_dir / f"text/{names.PRIVACY_REPORT}_step{t.global_step}.md").is_file()


def test_file_names_from_any_tag_and_histograms_of_tensors_with_non_finite_values(tmp_path):
    t = pl.Trainer(logger=CSVLogger(tmp_path, name="csv"), enable_progress_bar=False, enable_model_summary=False)
    figure = Figure()
    figure.add_subplot().plot([0, 1])
    log_figure(t, "a b/../c:d", figure, step=3)
    log_histogram(t, "audit/h", torch.tensor([1.0, 2.0, float("inf"), float("nan")]), step=4)
    log_text(t, "/x/", "hello", step=5)
    log_dir = Path(t.loggers[0].log_dir)
    assert sorted(p.relative_to(log_dir).as_posix() for p in log_dir.rglob("*") if p.is_file()) == [
        "figures/a_b/c_d_step3.png",
        "histograms/audit/h_step4.png",
        "text/x_step5.md",
    ]
    assert (log_dir / "text/x_step5.md").read_text(encoding="utf-8") == "hello"
    assert matplotlib.image.imread(log_dir / "histograms/audit/h_step4.png").shape[1] >= 400
    np.testing.assert_array_equal(matplotlib.image.imread(log_dir / "figures/a_b/c_d_step3.png").shape[:2], (480, 640))


def test_mlflow_and_wandb_are_imported_only_when_such_a_logger_is_present(tmp_path):
    code = (
        "import sys, lightning.pytorch as pl\n"
        "import lightning_privacy, lightning_privacy.loggers as lp\n"
        "from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger\n"
        f"t = pl.Trainer(logger=[CSVLogger({str(tmp_path)!r}), TensorBoardLogger({str(tmp_path)!r})])\n"
        "lp.log_text(t, 'privacy/x', 'text'); lp.log_histogram(t, 'dp/h', [1.0, 2.0])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'wandb'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_loggers_extra_is_in_the_test_environment():
    """``make install`` (and ``make test``, ``docs``, ``lint``) installs ``.[dev,lm,loggers]``; dev carries the
    ``loggers`` extra's packages too (CI's fresh clone as well)."""
    import tomllib  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert {"mlflow-skinny", "wandb"} <= {re.split(r"[<>=\[]", r)[0] for r in extras["loggers"]}
    assert set(extras["loggers"]) <= set(extras["dev"])
    assert '".[dev,lm,loggers]"' in (ROOT / "Makefile").read_text(encoding="utf-8")

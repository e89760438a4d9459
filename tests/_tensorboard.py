"""Read a run's log directory the way a user sees it: through TensorBoard's own server and HTTP data API."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Tuple


class TensorBoardView:
    """TensorBoard's server (default loader, loopback, a free port) on ``logdir``, queried as its web page does."""

    def __init__(self, logdir: str, timeout: float = 60.0) -> None:
        from tensorboard import program

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.board = program.TensorBoard()
        self.board.configure(
            argv=[None, "--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1", "--reload_interval", "1"]
        )
        self.url = self.board.launch().rstrip("/")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the first load of the event files happens in the background
            if any(self.get("/data/plugin/scalars/tags").values()):
                break
            time.sleep(0.5)
        time.sleep(2.0)  # one more reload interval so every event is in

    def get(self, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def scalar_tags(self) -> Dict[str, List[str]]:
        return self.get("/data/plugin/scalars/tags")

    def scalars(self, run: str, tag: str) -> List[Tuple[int, float]]:
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        return [(int(step), float(value)) for _, step, value in self.get(f"/data/plugin/scalars/scalars?{query}")]

    def hparams(self) -> Tuple[List[str], List[str]]:
        """(hyperparameter names, metric tags) of the HPARAMS tab."""
        experiment = self.get("/data/plugin/hparams/experiment", {"experimentName": ""})
        return (
            [h["name"] for h in experiment.get("hparamInfos", [])],
            [m["name"]["tag"] for m in experiment.get("metricInfos", [])],
        )

    def sessions(self) -> List[Dict[str, Any]]:
        """Every session (run) of the HPARAMS table: its hyperparameter values and metric values."""
        params, metrics = self.hparams()
        request = {
            "experimentName": "",
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
            "colParams": [{"hparam": p} for p in params] + [{"metric": {"tag": m, "group": ""}} for m in metrics],
            "startIndex": 0,
            "sliceSize": 100,
        }
        groups = self.get("/data/plugin/hparams/session_groups", request).get("sessionGroups", [])
        out = []
        for group in groups:
            for session in group.get("sessions", []):
                values = {m["name"]["tag"]: m["value"] for m in session.get("metricValues", [])}
                out.append({"name": session["name"], "hparams": group.get("hparams", {}), "metrics": values})
        return out

"""Test-suite set-up.

`make test` runs two pytest workers on a 2-core machine. PyTorch's default of one OpenMP thread per
core would then oversubscribe the CPU, and OpenMP's spin-waiting makes that catastrophically slow
(measured: a 107-step Adult epoch took 28 s instead of 1.1 s). Each worker therefore uses one thread.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# pytest-xdist's controller re-creates each warning a worker reports by importing its category's module; importing
# lightning.fabric.utilities.warnings first, cold, fails on a circular import inside Lightning and kills the run
# (INTERNALERROR, seen once on a full run). Importing Lightning here, in every process, avoids that.
import lightning.pytorch  # noqa: E402,F401

# Property tests draw the same examples on every run (and every machine): a red suite then means a change, not a
# lucky draw. HYPOTHESIS_PROFILE=explore searches fresh examples locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


import logging  # noqa: E402

import pytest  # noqa: E402


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def rank_zero_infos():
    """The messages of Lightning's ``rank_zero_info`` during the test, captured on the logger it writes to.

    (``caplog`` listens at the root: a test that ran earlier in the same worker may have raised a Lightning logger's
    level or stopped its propagation, and ``caplog`` then hears nothing.)
    """
    from lightning_utilities.core import rank_zero

    log, handler = rank_zero.log, _Messages()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)
        log.setLevel(level)

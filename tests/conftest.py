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

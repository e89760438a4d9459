"""``benchmarks/results/fix_modules_batchnorm.md`` (issue 57 item 5): with ``fix_modules`` a BatchNorm MLP on Adult
trains as well as the MLP without normalisation (GroupNorm(1, C)), where Opacus' GroupNorm(C, C) erased the features
(the majority class's accuracy); the groups the benchmark uses are the package's."""

from __future__ import annotations

import re
from pathlib import Path

from torch import nn

from lightning_privacy.dpsgd.modules import fix_modules_in_place
from tests._results import markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "fix_modules_batchnorm.md"


def test_groupnorm_of_one_group_trains_as_the_plain_mlp_and_opacus_fix_erases():
    rows = {r["model"]: float(r["mean test accuracy"]) for r in markdown_table(RESULTS, "| model |")}
    majority = float(re.search(r"The majority class alone is (\d\.\d+)", RESULTS.read_text(encoding="utf-8"))[1])
    plain, ours = rows["no normalisation"], rows["BatchNorm1d, DPSGD's fix: GroupNorm(1, 32)"]
    opacus = rows["BatchNorm1d, Opacus' fix: GroupNorm(32, 32)"]
    assert ours >= plain - 0.01 and plain > majority + 0.05
    assert abs(opacus - majority) < 0.005  # the input erased: every prediction the same class
    model = nn.Sequential(nn.Linear(104, 32), nn.BatchNorm1d(32))
    fix_modules_in_place(model)
    assert model[1].num_groups == 1  # what the benchmark's "DPSGD's fix" row ran

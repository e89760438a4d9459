"""``benchmarks/results/user_level.md`` (``benchmarks/user_level.py``, issue 58 item 4): every (person ε, sampling) row of
both parts, σ and a row's ε recomputed from the ledger's calibration, canary people never contradicting the person's
claim, and the direction of a row's ε against the person's under each sampling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_privacy.analysis.composition import ComposedPLD
from lightning_privacy.ledger import PrivacyLedger
from tests._results import load_benchmark, markdown_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "user_level.md"


def _parts():
    bench = load_benchmark("user_level")
    text = RESULTS.read_text(encoding="utf-8")
    epochs = int(re.search(r"--epochs (\d+)", text).group(1))
    lm_epochs = int(re.search(r"--lm-epochs (\d+)", text).group(1))
    return bench, [
        (markdown_table(RESULTS, "| person ε |", 0), bench.RATE, epochs),
        (markdown_table(RESULTS, "| person ε |", 1), bench.LM_RATE, lm_epochs),
    ]


def test_both_parts_have_every_epsilon_and_sampling_and_the_canaries_never_contradict_the_person():
    bench, parts = _parts()
    for rows, _, _ in parts:
        assert [(r["person ε"], r["sampling"]) for r in rows] == [
            (f"{e:g}", s) for e in bench.EPSILONS for s in ("ULS (people)", "ELS (rows)")
        ]
        for row in rows:
            assert row["canaries contradict the person's claim"].startswith("0 of ")
            assert 0.0 <= float(row["canary people: bound ÷ ε"]) <= 1.0


@pytest.mark.parametrize("part", [0, 1])
def test_sigma_and_a_row_s_epsilon_are_the_ledger_s(part):
    bench, parts = _parts()
    rows, rate, epochs = parts[part]
    steps = epochs * round(1 / rate)
    for row in rows:
        epsilon, uls = float(row["person ε"]), row["sampling"].startswith("ULS")
        unit = {} if uls else {"relation": "add_remove", "group_size": bench.K}
        sigma = PrivacyLedger.calibrate(
            sample_rate=rate, steps=steps, target_epsilon=epsilon, delta=bench.DELTA, **unit
        )
        assert float(row["σ"]) == pytest.approx(sigma, abs=6e-4)
        pld = ComposedPLD(relation="add_remove").compose(
            sample_rate=rate, noise_multiplier=sigma / 2 if uls else sigma, steps=steps
        )
        record = pld.epsilon_uncapped(bench.DELTA)
        assert float(row["a row's ε (same run)"]) == pytest.approx(record, abs=0.006)
        assert record > epsilon if uls else record < epsilon  # ULS: a row moves S by 2C; ELS: one of k rows

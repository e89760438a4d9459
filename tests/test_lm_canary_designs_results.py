"""Language-model canary designs under DP-SGD (``benchmarks/lm_canary_designs.py`` →
``benchmarks/results/lm_canary_designs.md``; issue 50): the runs are the language-model benchmark's DP fine-tune and
ten times longer, every bound is the audit's test of the run's own canary scores (committed beside each file and read
again here), every ledger stays consistent with its canaries, the goals lines say what the rows show, the guide quotes
the file, and the low-prior rows do what they claim on a real GPT-2."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_privacy.analysis.canary_fdp import tightest_canary_bound
from tests._results import assert_printed, load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm_canary_designs.md"
GUIDE = ROOT / "docs" / "guides" / "language_models.md"


def _tables():
    """(part 1's rows, part 2's rows), each a dict of the header's cells."""
    return markdown_table(RESULTS, "| run |"), markdown_table(RESULTS, "| run |", occurrence=1)


def _ratio(row) -> float:
    return float(row["headline ÷ ε"])


def _headline(row) -> float:
    return float(row["headline"])


def _ceiling_headlines() -> dict:
    """{(steps, accountant ε): the ideal canary's headline as printed (the median of 50 seeds)} of
    ``results/lm_canary_ceiling.md``."""
    return {
        (int(r["steps"]), float(r["accountant ε"])): r["headline"].split()[0]
        for r in markdown_table(ROOT / "benchmarks" / "results" / "lm_canary_ceiling.md", "| run |")
    }


def _scores(name: str) -> list:
    """The runs' canary scores committed beside ``results/<name>.md`` (``--report ... --scores``)."""
    path = ROOT / "benchmarks" / "results" / f"{name}_scores.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _bound(run: dict, method: str, bench) -> float:
    """The ε lower bound of one test at all of α from a run's scores, as the audit computes it."""
    scores, included = np.asarray(run["scores"]), np.asarray(run["included"], dtype=bool)
    assert scores.shape == included.shape == (1000,) and 400 < included.sum() < 600  # m = 1,000, each in with ½
    return tightest_canary_bound(
        scores=scores, included=included, delta=bench.DELTA, alpha=bench.ALPHA, methods=(method,)
    ).epsilon_lower


@pytest.mark.parametrize("name", ["lm_canary_designs", "lm_canary_lr_sweep", "lm_canary_repetitions"])
def test_every_published_bound_is_the_audits_test_of_the_runs_own_scores(name):
    """Recomputed from the committed scores: the binomial test, the headline (the f-DP test of the (ε, δ) curve, the
    audit's sound default for canaries that share a model) and the Gaussian reading, each within one unit of what
    the table prints; and the headline is the audit's default, not the Gaussian reading."""
    from lightning_privacy.analysis.canary_fdp import SOUND_DEFAULT

    assert SOUND_DEFAULT == ("fdp",)
    bench = load_benchmark("lm_canary_designs")  # (its δ and α)
    path = ROOT / "benchmarks" / "results" / f"{name}.md"
    header = "| k |" if name == "lm_canary_repetitions" else "| run |"
    tables = 2 if name == "lm_canary_designs" else 1  # (parts 1 and 2)
    printed = [row for i in range(tables) for row in markdown_table(path, header, occurrence=i)]
    runs = _scores(name)
    assert len(runs) == len(printed)
    for row in printed:
        if "k" in row:
            (run,) = [r for r in runs if r["repetitions"] == int(row["k"])]
        else:
            (run,) = [
                r
                for r in runs
                if (r["run"], r["design"], r["fine-tuning"]) == (row["run"], row["canaries"], row["fine-tuning"])
                and f"{r['epsilon']:.3f}" == row["accountant ε"]
            ]
        for column, method in (("binomial", "binomial"), ("headline", "fdp"), ("Gaussian reading", "gdp")):
            assert_printed(_bound(run, method, bench), row[column], f"{name}: {row.get('run', row.get('k'))}: {column}")


def test_the_runs_are_the_language_model_benchmarks_and_ten_times_longer():
    part1, part2 = _tables()
    text = (ROOT / "benchmarks" / "results" / "language_model.md").read_text(encoding="utf-8")
    sigma8 = float(
        re.search(r"DP-SGD ε = 8 with the canaries \(either kind\): σ = ([\d.]+), q = [\d.]+, 120 steps", text)[1]
    )
    assert {r["canaries"] for r in part1} == {d[0] for d in load_benchmark("lm_canary_designs").DESIGNS}
    for row in part1:
        assert int(row["steps"]) == 120 and float(row["σ"]) == pytest.approx(sigma8, abs=1e-3)
        assert row["fine-tuning"] == "full" and float(row["accountant ε"]) == pytest.approx(8.0, abs=0.01)
    ceiling = load_benchmark("lm_canary_ceiling")
    assert {(r["fine-tuning"], round(float(r["accountant ε"]))) for r in part2} == {
        (kind, e) for kind in ("full", "LoRA r = 8") for e in (4, 8)
    }
    for row in part2:
        assert int(row["steps"]) == 1200
        sigma = ceiling.sigma_for(round(float(row["accountant ε"])) * 1.0, 1200)
        assert float(row["σ"]) == pytest.approx(sigma, abs=1e-3)  # the ceiling benchmark's long rows


def test_every_bound_is_below_its_runs_epsilon_and_every_ledger_consistent():
    part1, part2 = _tables()
    for row in part1 + part2:
        epsilon, headline, reading = float(row["accountant ε"]), _headline(row), float(row["Gaussian reading"])
        assert 0 <= headline < epsilon and _ratio(row) == pytest.approx(headline / epsilon, abs=6e-4)
        assert reading < epsilon and float(row["reading ÷ ε"]) == pytest.approx(reading / epsilon, abs=6e-4)
        assert row["ledger verdict"] == "consistent"  # true claims: never contradicted


def test_the_goals_lines_say_what_the_rows_show():
    _, part2 = _tables()
    text = RESULTS.read_text(encoding="utf-8")
    lines = re.findall(
        r"^- ten times longer \(50 epochs\), ε = (\d): headline ÷ ε = ([\d.]+): (met|not met)$", text, re.M
    )
    full = {round(float(r["accountant ε"])): _ratio(r) for r in part2 if r["fine-tuning"] == "full"}
    assert sorted(int(e) for e, _, _ in lines) == [4, 8]
    for epsilon, value, verdict in lines:
        assert float(value) == pytest.approx(full[int(epsilon)], abs=6e-4)
        assert verdict == ("met" if float(value) >= 0.25 else "not met")


def test_low_prior_rows_give_the_new_tokens_almost_no_probability(tmp_path):
    """On a GPT-2 (random weights, saved like the base): every old row unchanged, the new rows tied to the output,
    the new tokens' total probability at most the asked mass on the public sequences."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    designs = load_benchmark("lm_canary_designs")
    lm = designs.lm
    plain, folder = tmp_path / "plain", tmp_path / "low"
    lm.base_model().save_pretrained(plain)
    public = lm.MarkovSequences(64, seed=4, successors=8)
    lam, mass = designs.with_low_prior_tokens(str(plain), str(folder), lm.VOCAB + 100, public, mass=1e-4)
    assert lam >= 2.0 and 0.0 <= mass <= 1e-4
    old = AutoModelForCausalLM.from_pretrained(plain, local_files_only=True)
    new = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    rows = new.get_input_embeddings().weight
    assert rows.shape[0] == lm.VOCAB + 100 and rows.data_ptr() == new.get_output_embeddings().weight.data_ptr()
    torch.testing.assert_close(rows[: lm.VOCAB], old.get_input_embeddings().weight)
    loader = torch.utils.data.DataLoader(public, batch_size=32)
    with torch.no_grad():
        assert designs._new_mass(new, loader, lm.VOCAB) == pytest.approx(mass, rel=1e-4)
        resized = AutoModelForCausalLM.from_pretrained(plain, local_files_only=True).eval()
        resized.resize_token_embeddings(lm.VOCAB + 100)  # the default rows, for contrast
        assert designs._new_mass(resized, loader, lm.VOCAB) > 100 * mass


def test_the_guide_quotes_the_file():
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())
    part1, part2 = _tables()
    one = {r["canaries"]: r for r in part1}
    f = lambda row: f"{_ratio(row):.3f}"  # noqa: E731
    assert (
        f"show {float(one['new token, loss on all']['headline ÷ ε']):g} of ε when trained on all 32 tokens and "
        f"{f(one['new token, loss on secret'])} of ε on the secret alone, and four secret tokens of their own reach "
        f"{f(one['4 new tokens, loss on secret'])} — above the random-token canaries' {f(one['random tokens'])}"
        in guide
    )
    assert _ratio(one["new token, loss on secret"]) > _ratio(one["new token, loss on all"])  # what the default rests on
    low = one["4 new tokens, loss on secret, low-prior rows"]
    assert f": {f(low)} of ε against {f(one['4 new tokens, loss on secret'])} with the default rows)" in guide
    full = {round(float(r["accountant ε"])): r for r in part2 if r["fine-tuning"] == "full"}
    assert f"shows {f(full[4])} of ε at ε = 4 and {f(full[8])} at ε = 8" in guide
    assert all(_headline(r) == 0 for r in part2 if r["fine-tuning"] != "full")  # "Under LoRA it shows nothing"
    ceiling = _ceiling_headlines()
    assert f"of the ideal canary's headline, {ceiling[(1200, 4.0)]} and {ceiling[(1200, 8.0)]} there" in guide
    assert all(_ratio(full[e]) < float(ceiling[(1200, e * 1.0)]) for e in (4, 8))
    losses = [float(r["member loss"]) for r in full.values()]
    assert f"(mean token loss {min(losses):.1f}–{max(losses):.1f} after 1,200" in guide
    base = float(re.search(r"around the old rows' mean\) ([\d.]+)", RESULTS.read_text(encoding="utf-8"))[1])
    assert f"against {base:.1f} for the base with its new rows" in guide


# ------------------------------------------------------------------------------------------ part 3: repetitions
REPETITIONS = ROOT / "benchmarks" / "results" / "lm_canary_repetitions.md"


def _repetitions() -> list:
    return markdown_table(REPETITIONS, "| k |")


def test_repeated_canaries_are_audited_against_the_runs_group_claim():
    """Each row's group ε is recomputed from the run (q = 1 / batches per epoch, σ as DPSGD plans it for ε = 8 over
    those steps) with ``Claim.dp_sgd(..., group_size=k)``; every bound is below it and both claims stand."""
    from lightning_privacy.claims import Claim
    from lightning_privacy.ledger import PrivacyLedger

    bench = load_benchmark("lm_canary_designs")
    rows = _repetitions()
    assert [int(r["k"]) for r in rows] == list(bench.REPETITIONS)
    text = REPETITIONS.read_text(encoding="utf-8")
    assert f"{bench.LONG_DESIGN[0]} (part 1's canaries and inclusion, seed" in text
    for row in rows:
        k, steps = int(row["k"]), int(row["steps"])
        q = 5 / steps  # 5 epochs of Poisson batches at rate 1 / (batches per epoch)
        assert float(row["q"]) == pytest.approx(q, abs=6e-5)  # printed to 4 decimals
        sigma = PrivacyLedger.calibrate(sample_rate=q, steps=steps, target_epsilon=8.0, delta=bench.DELTA)
        assert float(row["σ"]) == pytest.approx(sigma, abs=1e-3)
        group = Claim.dp_sgd(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=bench.DELTA, group_size=k)
        assert float(row["group ε"]) == pytest.approx(group.epsilon, abs=2e-3)
        record = float(row["record ε"])
        assert record == pytest.approx(8.0, abs=0.01) and group.epsilon > k * record / 2
        headline, reading = _headline(row), float(row["Gaussian reading"])
        assert headline < group.epsilon and float(row["headline ÷ group ε"]) == pytest.approx(
            headline / group.epsilon, abs=6e-4
        )
        assert float(row["headline ÷ record ε"]) == pytest.approx(headline / record, abs=6e-4)
        assert reading < group.epsilon and float(row["reading ÷ group ε"]) == pytest.approx(
            reading / group.epsilon, abs=6e-4
        )
        assert row["group claim"] == row["record claim"] == "consistent"


def test_the_guide_quotes_the_repetitions():
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())
    rows = {int(r["k"]): r for r in _repetitions()}
    single = next(r for r in _tables()[0] if r["canaries"] == load_benchmark("lm_canary_designs").LONG_DESIGN[0])
    assert (
        f"{rows[2]['headline ÷ group ε']} of the group's ε with two copies and {rows[4]['headline ÷ group ε']} with "
        f"four, against {single['headline ÷ ε']} of the record's ε with one copy" in guide
    )
    assert f"the same bounds read {rows[2]['headline ÷ record ε']} and {rows[4]['headline ÷ record ε']}" in guide
    assert float(rows[4]["headline ÷ record ε"]) >= 0.25 > float(rows[2]["headline ÷ record ε"])


# ------------------------------------------------------------------------------------------ the learning-rate sweep
SWEEP = ROOT / "benchmarks" / "results" / "lm_canary_lr_sweep.md"


def _sweep() -> dict:
    """{(learning rate, ε): row} of the sweep's table."""
    rows = markdown_table(SWEEP, "| run |")
    return {(float(re.search(r"lr ([\d.e-]+)", r["run"])[1]), round(float(r["accountant ε"]))): r for r in rows}


def test_the_sweep_is_part_2s_full_fine_tune_at_other_learning_rates():
    _, part2 = _tables()
    long = {round(float(r["accountant ε"])): r for r in part2 if r["fine-tuning"] == "full"}
    sweep = _sweep()
    assert {lr for lr, _ in sweep} >= {0.0005, 0.001} and all(lr < 0.002 for lr, _ in sweep)
    for (_, eps), row in sweep.items():
        same = long[eps]  # the same canaries, σ, steps and ε; only the learning rate differs
        assert (row["canaries"], row["fine-tuning"], row["steps"], row["σ"]) == (
            same["canaries"], same["fine-tuning"], same["steps"], same["σ"],
        )  # fmt: skip
        headline = _headline(row)
        assert headline < float(row["accountant ε"]) and _ratio(row) == pytest.approx(
            headline / float(row["accountant ε"]), abs=6e-4
        )
        assert row["ledger verdict"] == "consistent"
    # at ε = 8 a smaller learning rate shows more and fits the members better (0.002: part 2's row)
    at8 = sorted([(lr, r) for (lr, e), r in sweep.items() if e == 8] + [(0.002, long[8])], key=lambda t: t[0])
    ratios = [_ratio(r) for lr, r in at8 if lr >= 0.0005]
    losses = [float(r["member loss"]) for lr, r in at8 if lr >= 0.0005]
    assert ratios == sorted(ratios, reverse=True) and losses == sorted(losses)


def test_the_guide_quotes_the_sweep():
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())
    sweep = _sweep()
    _, part2 = _tables()
    long8 = next(r for r in part2 if r["fine-tuning"] == "full" and round(float(r["accountant ε"])) == 8)
    assert (
        f"at ε = 8, {long8['headline ÷ ε']} of ε at 0.002 (part 2), {sweep[(0.001, 8)]['headline ÷ ε']} at 0.001, "
        f"{sweep[(0.0005, 8)]['headline ÷ ε']} at 0.0005 and {sweep[(0.00025, 8)]['headline ÷ ε']} at 0.00025" in guide
    )
    losses = [long8["member loss"]] + [sweep[(lr, 8)]["member loss"] for lr in (0.001, 0.0005, 0.00025)]
    assert f"the members' mean token loss {losses[0]}, {losses[1]}, {losses[2]} and {losses[3]}" in guide
    four = sweep[(0.0005, 4)]
    assert f"At ε = 4 the rate 0.0005 shows {four['headline ÷ ε']} of ε" in guide
    # "not met" under the sound headline; the Gaussian reading of the same runs is what issue 50's "met" rested on
    assert "the goal of 0.25 of ε at ε = 4 and 8 is **not met**" in guide
    assert all(_ratio(r) < 0.25 for r in sweep.values()) and _ratio(long8) < 0.25
    readings = [four["reading ÷ ε"], sweep[(0.0005, 8)]["reading ÷ ε"]]
    assert f"the same runs at the rate 0.0005 read {readings[0]} and {readings[1]} of ε" in guide
    assert all(float(r) >= 0.25 for r in readings)
    ceiling = _ceiling_headlines()
    assert f"whose headline at 1,200 steps is {ceiling[(1200, 4.0)]} and {ceiling[(1200, 8.0)]}" in guide
    assert float(ceiling[(1200, 8.0)]) < 0.25  # the ideal canary itself falls short at ε = 8

"""One accountant behind every ε: the ledger's default ε is the package's pessimistic PLD (add/remove), checked against
dp_accounting (an independent implementation) on a grid of runs, inside a real DPSGD fit, through a checkpoint of
0.2.0's RDP accountant, and equal to the ε of the claim made from the same ledger."""

from __future__ import annotations

import warnings

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_privacy import DPSGD
from lightning_privacy.claims import Claim
from lightning_privacy.ledger import PLDAccountant, PrivacyLedger
from tests.analysis.test_composition import _dp_accounting_pld
from tests.callbacks._tiny import tiny_dataset, tiny_module, trainer

GRID = [  # [(p, σ, steps), ...] per run: one segment, and σ or q changing within the run
    [(0.1, 2.0, 300)],
    [(0.01, 1.0, 1000)],
    [(0.00935, 0.734, 535)],
    [(0.05, 0.8, 40), (0.05, 1.6, 60)],
    [(0.02, 1.2, 50), (0.2, 1.2, 20), (0.02, 3.0, 30)],
]


def _reference(segments, delta, pessimistic=True):
    return _dp_accounting_pld(
        segments, relation="add_remove", grid=1e-4, pessimistic=pessimistic
    ).get_epsilon_for_delta(delta)


@pytest.mark.parametrize("segments", GRID, ids=lambda s: "+".join(f"q{p}s{sig}T{t}" for p, sig, t in s))
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_the_ledgers_epsilon_is_dp_accountings_pessimistic_pld_and_never_below_its_optimistic_one(segments, delta):
    ledger = PrivacyLedger(delta=delta)
    for p, sigma, steps in segments:  # read once per ~epoch, as a run does
        per_read = max(1, round(1 / p))
        for done in range(0, steps, per_read):
            ledger.step(noise_multiplier=sigma, sample_rate=p, steps=min(per_read, steps - done))
            ledger.epsilon()
    pessimistic, optimistic = _reference(segments, delta), _reference(segments, delta, pessimistic=False)
    assert ledger.epsilon() == pytest.approx(pessimistic, abs=2e-3)
    assert ledger.epsilon() >= optimistic
    assert ledger.epsilon_label == "PLD (add/remove), certified upper bound"
    # the claim of the same ledger states the same ε (one PLD behind both)
    assert Claim.from_ledger(ledger).epsilon == ledger.epsilon()


def test_rdp_stays_available_by_name_and_is_looser():
    pld, rdp = PrivacyLedger(), PrivacyLedger(accountant="rdp")
    for ledger in (pld, rdp):
        ledger.step(noise_multiplier=2.0, sample_rate=0.1, steps=300)
    assert round(pld.epsilon(), 2) == 4.18 and round(rdp.epsilon(), 2) == 4.56  # the two numbers
    assert rdp.epsilon_label == "Opacus RDP (add/remove), upper bound"


def test_a_dpsgd_fit_at_sigma_2_q_01_for_300_steps_reports_the_certified_4_18(tmp_path):
    """σ = 2, q = 0.1 (a loader of 10 batches), 30 epochs = 300 steps at δ = 1e-5 (the issue's done-when)."""
    dpsgd = DPSGD(noise_multiplier=2.0, delta=1e-5, sampling_seed=0, noise_seed=0)
    loader = DataLoader(tiny_dataset(), batch_size=26)  # 256 rows: 10 batches, q = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([dpsgd], tmp_path, max_epochs=30).fit(tiny_module(), train_dataloaders=loader)
    assert dpsgd.steps == 300 and dpsgd.sample_rate == 0.1
    pessimistic, optimistic = _reference([(0.1, 2.0, 300)], 1e-5), _reference([(0.1, 2.0, 300)], 1e-5, False)
    assert abs(dpsgd.epsilon() - pessimistic) < 0.01 and dpsgd.epsilon() >= optimistic
    assert isinstance(dpsgd.accountant, PLDAccountant) and dpsgd.accountant_mechanism == "pld"


def _rdp_checkpoint(tmp_path):
    """A checkpoint as 0.2.0 wrote it: DPSGD's state with the RDP accountant (its default then)."""
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    dpsgd = DPSGD(noise_multiplier=1.0, accountant="rdp", sampling_seed=0, noise_seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([dpsgd, ckpt], tmp_path, max_epochs=1, enable_checkpointing=True).fit(
            tiny_module(), train_dataloaders=_loader()
        )
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    (dp_state,) = [v for k, v in state["callbacks"].items() if k.startswith("DPSGD")]
    assert dp_state["accountant"] == "rdp" and dp_state["ledger"]["accountant"] == "rdp"
    return tmp_path / "last.ckpt", dpsgd


def _loader():
    return DataLoader(tiny_dataset(), batch_size=32)


def test_a_checkpoint_accounted_with_rdp_resumes_with_rdp_and_says_so_once(tmp_path):
    path, first = _rdp_checkpoint(tmp_path)
    resumed = DPSGD(noise_multiplier=1.0, sampling_seed=0, noise_seed=0)  # accountant not given: follows the file
    with pytest.warns(UserWarning, match="accounted with the 'rdp' accountant; the resumed run keeps it") as caught:
        trainer([resumed], tmp_path, max_epochs=2).fit(tiny_module(), train_dataloaders=_loader(), ckpt_path=path)
    assert sum("resumed run keeps it" in str(w.message) for w in caught) == 1
    assert resumed.accountant_mechanism == "rdp" and resumed.steps == 2 * first.steps
    reference = PrivacyLedger(accountant="rdp")
    reference.step(noise_multiplier=1.0, sample_rate=first.sample_rate, steps=resumed.steps)
    assert resumed.epsilon() == pytest.approx(reference.epsilon(), rel=1e-12)
    # an accountant given explicitly is a promise: another one in the file is refused
    explicit = DPSGD(noise_multiplier=1.0, accountant="pld", sampling_seed=0, noise_seed=0)
    with pytest.raises(RuntimeError, match="checkpoint accounted with 'rdp', this DPSGD uses 'pld'"):
        trainer([explicit], tmp_path, max_epochs=2).fit(tiny_module(), train_dataloaders=_loader(), ckpt_path=path)


def _read_every(reads, segments, ledger=None, done=0):
    """``benchmarks/accountants.py``'s ``_read`` (the benchmark measures what this test pins): record ``segments``
    [(σ, p, steps)] from step ``done`` on, reading ε and β* every ``reads`` steps (0: never)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from accountants import _read

    return _read(segments, reads, ledger=ledger, done=done)


@pytest.mark.parametrize("segments", [[(1.1, 0.05, 300)], [(1.1, 0.05, 120), (2.0, 0.05, 180)]], ids=["one", "two"])
def test_epsilon_does_not_depend_on_when_it_is_read_nor_on_a_resume(segments):
    """ε and β* after 300 steps: read every 10 steps, every 7, once at the end, or saved at step 150 (a checkpoint's
    state, through torch.save with weights_only) and resumed there read every 25 steps — the same number."""
    import io

    once = _read_every(0, segments)
    values = (once.epsilon(), once.bayes_security(), float(once.tpr_bounds(1e-3, relation="add_remove")))
    for reads in (10, 7):
        ledger = _read_every(reads, segments)
        assert (ledger.epsilon(), ledger.bayes_security()) == values[:2]
    first = _read_every(10, [(s, p, t) for s, p, t in _prefix(segments, 150)])
    buffer = io.BytesIO()
    torch.save({"ledger": first.state_dict()}, buffer)
    buffer.seek(0)
    resumed = PrivacyLedger()
    resumed.load_state_dict(torch.load(buffer, weights_only=True)["ledger"])
    _read_every(25, segments, ledger=resumed, done=150)
    assert resumed.steps == 300 and resumed.history == once.history
    assert (resumed.epsilon(), resumed.bayes_security()) == values[:2]
    assert float(resumed.tpr_bounds(1e-3, relation="add_remove")) == values[2]
    # and the numbers are the PLD's: within the accuracy the docs state of dp_accounting at the same grid
    grid = once.privacy_loss_distribution("add_remove").value_discretization_interval
    reference = _dp_accounting_pld(
        [(p, s, t) for s, p, t in segments], relation="add_remove", grid=grid
    ).get_epsilon_for_delta(1e-5)
    assert reference - 1e-9 <= values[0] <= reference + 1e-5


def _prefix(segments, steps):
    out, left = [], steps
    for sigma, rate, count in segments:
        if left <= 0:
            break
        out.append((sigma, rate, min(count, left)))
        left -= count
    return out


def test_a_state_saved_with_one_chunk_per_read_loads_to_the_uninterrupted_value():
    """The ledger of an earlier version saved one ε chunk per read (7 reads of 20 steps, 13 steps pending): it
    resumes to the value an uninterrupted run reads now; chunks that are not the history's steps are refused."""
    history = [[1.1, 0.05, 153]]
    old = {
        "version": 1,
        "accountant": "pld",
        "relation": "replace",
        "history": history,
        "chunks": [[0.05, 1.1, 20, 1.0]] * 7,
        "epsilon_chunks": [[0.05, 1.1, 20, 1.0]] * 7,
    }
    resumed, uninterrupted = PrivacyLedger(), PrivacyLedger()
    resumed.load_state_dict(old)
    uninterrupted.step(noise_multiplier=1.1, sample_rate=0.05, steps=153)
    assert resumed.epsilon() == uninterrupted.epsilon() and resumed.bayes_security() == uninterrupted.bayes_security()
    assert [c[2] for c in resumed.state_dict()["epsilon_chunks"]] == [153]  # the runs: one chunk per (σ, p)
    for key, chunks in (("epsilon_chunks", [[0.05, 1.1, 200, 1.0]]), ("chunks", [[0.05, 3.0, 20, 1.0]])):
        with pytest.raises(RuntimeError, match=f"'{key}'.*are not the steps of its history"):
            PrivacyLedger().load_state_dict({**old, key: chunks})


def test_the_budget_predictions_use_the_same_pld():
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=1.1, sample_rate=0.01, steps=500)
    ledger.epsilon()
    k = ledger.steps_within(noise_multiplier=1.1, sample_rate=0.01, max_epsilon=1.5)
    assert ledger.epsilon_after(k, noise_multiplier=1.1, sample_rate=0.01) <= 1.5
    assert ledger.epsilon_after(k + 1, noise_multiplier=1.1, sample_rate=0.01) > 1.5
    assert _reference([(0.01, 1.1, 500 + k)], 1e-5) <= 1.5 + 2e-3  # dp_accounting agrees the budget holds


def test_the_published_accountants_table_holds_what_the_docs_say():
    """benchmarks/results/accountants.md (embedded in the DP-SGD guide): PLD-planned σ 5–10 % below RDP's at every
    target, certified ε ≤ the target (rounded to 3 decimals) and equal to dp_accounting's, RDP's σ certified below."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "accountants.md").read_text()
    rows = [
        line.strip("|").split("|")
        for line in text.splitlines()
        if line.startswith("| ") and ("| RDP |" in line or "| PLD |" in line)
    ]
    table = {(float(r[0]), r[1].strip()): [c.strip() for c in r] for r in rows if r[1].strip() in ("RDP", "PLD")}
    assert {t for t, _ in table} == {1.0, 3.0, 8.0}
    for target in (1.0, 3.0, 8.0):
        rdp, pld = table[(target, "RDP")], table[(target, "PLD")]
        assert -0.10 <= float(pld[2]) / float(rdp[2]) - 1 <= -0.05
        assert float(pld[4]) <= target and abs(float(pld[4]) - float(pld[5])) <= 2e-3
        assert float(rdp[4]) < target - 0.1  # the RDP plan's noise buys a certified ε well below the target

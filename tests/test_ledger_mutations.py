"""One-line bugs in the ledger from issue 47's mutation run (item 5), each pinned by a fast test here.

- ``steps_within`` answering one step past the budget where its memoised guess is exact (``return guess + 1`` in
  ``PrivacyLedger._largest``): the answer is the budget's boundary after every step, as ``PrivacyBudgetStopping``
  asks it;
- a resumed ledger ignoring its saved ``epsilon_chunks``: they are checked against the history (an edited state is
  refused), and ε is the uninterrupted run's to the last digit.
"""

from __future__ import annotations

import pytest

from lightning_privacy.ledger import PrivacyLedger

SIGMA, RATE = 1.0, 0.02


def _asks(ledger, budget, steps):
    """``steps_within`` before each of ``steps`` steps, each taken at a σ a hair above ``SIGMA`` (a scheduled σ: the
    memo is then reused only as a guess, and the guess is the answer)."""
    answers = []
    for _ in range(steps):
        k = ledger.steps_within(noise_multiplier=SIGMA, sample_rate=RATE, **budget)
        answers.append(k)
        if "max_epsilon" in budget:
            after = [ledger.epsilon_after(j, noise_multiplier=SIGMA, sample_rate=RATE) for j in (k, k + 1)]
            assert after[0] <= budget["max_epsilon"] < after[1], (k, after)
        else:
            after = [ledger.bayes_security_after(j, noise_multiplier=SIGMA, sample_rate=RATE) for j in (k, k + 1)]
            assert after[0] >= budget["min_bayes_security"] > after[1], (k, after)
        ledger.step(noise_multiplier=SIGMA * (1 + 1e-9), sample_rate=RATE)
    return answers


@pytest.mark.parametrize("budget", [{"max_epsilon": 2.0}, {"min_bayes_security": 0.6}])
def test_steps_within_is_the_budgets_boundary_after_every_step_taken_at_another_sigma(budget):
    ledger = PrivacyLedger()
    ledger.step(noise_multiplier=SIGMA, sample_rate=RATE, steps=100)
    ledger.bayes_security()  # (composed: the β* memo keys on it)
    answers = _asks(ledger, budget, 3)
    assert answers[0] > 100 and answers == [answers[0] - i for i in range(3)]  # one step spent, one fewer left


def test_steps_within_is_exact_where_the_guess_is_the_answer():
    calls = []

    def ok(k):
        calls.append(k)
        return k <= 41

    assert PrivacyLedger._largest(ok, guess=41) == 41 and calls == [41, 42]  # the guess confirmed in two calls
    assert PrivacyLedger._largest(ok, guess=40) == 41 and PrivacyLedger._largest(ok, guess=60) == 41
    assert PrivacyLedger._largest(ok) == 41 and PrivacyLedger._largest(lambda k: False, guess=3) == 0


@pytest.mark.parametrize("reads", [[20, 20, 13], [7, 30, 16]])
def test_a_resumed_ledger_checks_its_saved_epsilon_chunks_and_gives_the_uninterrupted_epsilon(reads):
    """ε read after each chunk of ``reads`` steps, saved, resumed: the uninterrupted run's ε to the last digit, before
    and after more steps; a state whose saved ``epsilon_chunks`` are not its history's steps (edited, or another
    run's) is refused, not silently replaced by the history's."""
    ledger = PrivacyLedger()
    for steps in reads:
        ledger.step(noise_multiplier=1.1, sample_rate=0.05, steps=steps)
        ledger.epsilon()
    state = ledger.state_dict()
    assert ledger.history == [(1.1, 0.05, sum(reads))] and sum(c[2] for c in state["epsilon_chunks"]) == sum(reads)
    restored = PrivacyLedger()
    restored.load_state_dict(state)
    assert restored.epsilon() == ledger.epsilon()
    for one in (ledger, restored):
        one.step(noise_multiplier=1.1, sample_rate=0.05, steps=10)
    assert restored.epsilon() == ledger.epsilon()
    for chunks in ([[0.05, 1.1, sum(reads) + 1, 1.0]], [[0.05, 2.0, sum(reads), 1.0]], [[0.5, 1.1, sum(reads), 1.0]]):
        with pytest.raises(RuntimeError, match=r"'epsilon_chunks'.*are not the steps of its history"):
            PrivacyLedger().load_state_dict({**state, "epsilon_chunks": chunks})

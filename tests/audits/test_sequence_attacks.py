"""Membership attacks per sequence: RMIA and LiRA read a sequence's likelihood exp(−mean token loss × tokens), the
same numbers as the summed-loss signal and as the classification path fed the equivalent probabilities; a Min-K% score
is refused by them; reference models train on a language model's batches (mappings) end to end, through
``train_references`` and through ``MembershipAudit``."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Dataset

from lightning_privacy.analysis import membership_attacks as attacks
from lightning_privacy.audits import audit_membership
from lightning_privacy.callbacks.membership_audit import MembershipAudit
from lightning_privacy.functional.membership_loss import membership_losses_from_loader
from lightning_privacy.functional.sequence_loss import CausalLMSignal, causal_lm_signal, min_k_percent_signal
from lightning_privacy.references import train_references

V, T = 24, 10


class Sequences(Dataset):
    """Random token sequences of lengths 4..T, right-padded with 0: mappings, as a tokenizer's collator gives."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, T + 1, (n,), generator=g)
        self.mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        self.ids = torch.randint(1, V, (n, T), generator=g) * self.mask

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


class TinyLM(pl.LightningModule):
    """Embedding → GRU → vocabulary logits, trained on per-sequence losses (one module, with or without DPSGD)."""

    def __init__(self, lr: float = 0.02) -> None:
        super().__init__()
        self.embed, self.rnn = torch.nn.Embedding(V, 32), torch.nn.GRU(32, 64, batch_first=True)
        self.head, self.lr = torch.nn.Linear(64, V), lr

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.rnn(self.embed(input_ids))[0])

    def training_step(self, batch, batch_idx):
        losses = causal_lm_signal(self, batch)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def test_rmia_on_sequence_likelihoods_equals_the_classification_path_fed_the_same_probabilities():
    """RMIA with signal='nll' is RMIA with Pr(x|θ) = e^{−N}: fed as membership losses L = log((1 − p)/p), the same."""
    rng = np.random.default_rng(0)
    n, m, k = 40, 60, 3
    nll = lambda *shape: rng.uniform(2.0, 30.0, size=shape)
    tgt, ref, ptgt, pref = nll(n), nll(k, n), nll(m), nll(k, m)
    pinside = rng.random((k, m)) < 0.5
    as_loss = lambda v: np.log(-np.expm1(-v)) + v  # L with 1 / (1 + e^L) = e^{−v}
    a = attacks.fit_offline_a(pref, pinside, signal="nll")
    assert a == pytest.approx(attacks.fit_offline_a(as_loss(pref), pinside), rel=1e-9)
    got = attacks.rmia_scores(tgt, ref, ptgt, pref, population_inside=pinside, offline_a=a, signal="nll")
    want = attacks.rmia_scores(
        as_loss(tgt), as_loss(ref), as_loss(ptgt), as_loss(pref), population_inside=pinside, offline_a=a
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert attacks.log_probability([3.5], signal="nll").tolist() == [-3.5]
    with pytest.raises(ValueError, match=r"`signal` to be one of \('membership_loss', 'nll'\), but got 'mean'"):
        attacks.rmia_scores(tgt, ref, ptgt, pref, signal="mean")


def test_a_fitted_offline_a_would_swamp_sequence_likelihoods_and_a_equal_to_one_keeps_rmia_sharp():
    """Sequence likelihoods e^{−N} are tiny; a few short memorised IN rows make the fitted 1 − a larger than every
    one of them, and ``a·Pr_OUT + (1 − a)`` becomes one constant: RMIA then ranks by N alone (LOSS on the summed
    loss). With ``a = 1`` a common IN/OUT factor cancels and RMIA keeps the reference calibration."""
    rng = np.random.default_rng(0)
    k, n, m = 2, 400, 400
    # per-sequence N under a model that did not train on it
    difficulty = lambda size: rng.uniform(20.0, 60.0, size=size)
    d_audit, d_pop = difficulty(n), difficulty(m)
    member = np.arange(n) < n // 2
    tgt = d_audit - 3.0 * member  # training on a sequence makes it e^3 times as likely
    ref = np.stack([d_audit + rng.normal(0, 0.1, n) for _ in range(k)])  # offline: no reference trained on them
    pinside = rng.random((k, m)) < 0.5
    pref = np.stack([d_pop + rng.normal(0, 0.1, m) for _ in range(k)]) - 3.0 * pinside
    pref[:, :4] = np.where(pinside[:, :4], 2.0, pref[:, :4])  # four short sequences the IN references memorised
    ptgt = d_pop
    a = attacks.fit_offline_a(pref, pinside, signal="nll")
    assert 1.0 - a > np.exp(-tgt.min())  # the correction outweighs every audited likelihood
    auc = lambda s: attacks.auc(s, member)
    fitted = attacks.rmia_scores(tgt, ref, ptgt, pref, population_inside=pinside, offline_a=a, signal="nll")
    exact = attacks.rmia_scores(tgt, ref, ptgt, pref, population_inside=pinside, offline_a=1.0, signal="nll")
    assert auc(exact) > 0.99
    assert auc(fitted) == pytest.approx(auc(attacks.loss_scores(tgt)), abs=0.02) and auc(fitted) < 0.7


@pytest.fixture(scope="module")
def lm_audit_setup():
    members, nonmembers, population = Sequences(96, seed=1), Sequences(96, seed=2), Sequences(192, seed=3)
    member_loader, nonmember_loader = DataLoader(members, batch_size=32), DataLoader(nonmembers, batch_size=32)
    population_loader = DataLoader(population, batch_size=32)
    torch.manual_seed(0)
    model = TinyLM()
    train = DataLoader(members, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    pl.Trainer(max_epochs=40, **QUIET).fit(model, train)
    references = train_references(
        TinyLM,
        population_loader,
        num_references=2,
        trainer_kwargs={"max_epochs": 40},
        targets=(member_loader, nonmember_loader),
        seed=0,
    )
    return model.eval(), member_loader, nonmember_loader, population_loader, references


def test_rmia_and_lira_read_each_sequences_likelihood_mean_token_loss_times_tokens(lm_audit_setup):
    model, member_loader, nonmember_loader, population_loader, references = lm_audit_setup
    assert len(references) == 2 and references.online and references.trained == 2
    common = dict(references=references, population_loader=population_loader, warn=False)
    rmia = audit_membership(model, member_loader, nonmember_loader, attack="rmia", signal_fn=causal_lm_signal, **common)
    summed = audit_membership(
        model, member_loader, nonmember_loader, attack="rmia", signal_fn=CausalLMSignal("sum"), **common
    )
    np.testing.assert_allclose(rmia.scores, summed.scores, rtol=0, atol=1e-9)
    assert any("Pr(x | θ) = exp(−mean token loss × tokens)" in note for note in rmia.notes)

    # by hand: the summed token losses of every model, through the pure RMIA of the analysis layer
    nll = lambda m, loaders: np.concatenate(
        [membership_losses_from_loader(m, ld, signal_fn=CausalLMSignal("sum")).double().numpy() for ld in loaders]
    )
    both = [member_loader, nonmember_loader]
    pop_ref = np.stack([nll(r, [population_loader]) for r in references.models])
    want = attacks.rmia_scores(
        nll(model, both),
        np.stack([nll(r, both) for r in references.models]),
        nll(model, [population_loader]),
        pop_ref,
        inside=references.inside_targets,
        population_inside=references.inside_population,
        offline_a=1.0,  # no offline correction on sequence likelihoods (the next test shows why)
        signal="nll",
    )
    np.testing.assert_allclose(rmia.scores, want, rtol=1e-9, atol=1e-12)
    assert rmia.offline_a == 1.0 and any(
        "offline a = 1 (no correction) on sequence likelihoods" in n for n in rmia.notes
    )
    assert rmia.num_references == 2 and rmia.variant == "online"
    assert rmia.to_dict()["num_members"] == 96 and rmia.to_dict()["num_nonmembers"] == 96  # sequences, not tokens
    assert rmia.auc > 0.9  # an over-fitted model: members far more likely under it than under the references

    lira = audit_membership(model, member_loader, nonmember_loader, attack="lira", signal_fn=causal_lm_signal, **common)
    assert lira.variant == "online" and lira.auc > 0.8
    loss = audit_membership(
        model, member_loader, nonmember_loader, attack="loss", signal_fn=causal_lm_signal, warn=False
    )
    mink = audit_membership(
        model, member_loader, nonmember_loader, attack="loss", signal_fn=min_k_percent_signal, warn=False
    )
    assert loss.auc > 0.9 and mink.auc > 0.9
    with pytest.raises(ValueError, match=r"attack='rmia' needs a likelihood.*kind 'score'.*attack='loss'"):
        audit_membership(
            model, member_loader, nonmember_loader, attack="rmia", signal_fn=min_k_percent_signal, **common
        )


def test_membership_audit_callback_audits_a_language_model_per_sequence(tmp_path):
    members, nonmembers, population = Sequences(64, seed=11), Sequences(64, seed=12), Sequences(128, seed=13)
    audit = MembershipAudit(
        attack="rmia",
        num_references=2,
        population=DataLoader(population, batch_size=32),
        member_dataloader=DataLoader(members, batch_size=32),
        nonmember_dataloader=DataLoader(nonmembers, batch_size=32),
        model_factory=TinyLM,
        signal_fn=causal_lm_signal,
        log_figure=False,
    )
    torch.manual_seed(0)
    train = DataLoader(members, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    pl.Trainer(max_epochs=30, callbacks=[audit], **QUIET).fit(TinyLM(), train)
    result = audit.result
    assert result is not None and result.attack == "rmia" and len(audit.references) == 2
    assert result.to_dict()["num_members"] == 64 and result.auc > 0.8
    assert audit.results["audit/rmia_auc"] == result.auc
    with pytest.raises(Exception, match=r"min_k_percent_signal|kind 'score'"):
        MembershipAudit(attack="lira", signal_fn=min_k_percent_signal)


LM_FIX = r"mappings with keys \['attention_mask', 'input_ids'\].*pass `signal_fn=causal_lm_signal`"


def test_every_audit_reading_a_language_models_batches_names_causal_lm_signal():
    """The issue: `audit_membership` on mapping batches without `signal_fn` failed with `KeyError: 0`; Epsilon* and
    the privacy profile read batches the same way."""
    from lightning_privacy.audits import audit_epsilon_star, audit_privacy_profile
    from lightning_privacy.models import LogisticRegressionModule

    members, nonmembers = (
        DataLoader(Sequences(32, seed=21), batch_size=16),
        DataLoader(Sequences(32, 22), batch_size=16),
    )
    model = TinyLM()
    with pytest.raises(ValueError, match=LM_FIX):
        audit_membership(model, members, nonmembers, attack="loss")
    with pytest.raises(ValueError, match=LM_FIX):
        audit_epsilon_star(model, members, nonmembers)
    result = audit_epsilon_star(model, members, nonmembers, signal_fn=causal_lm_signal, warn=False)
    assert result.to_dict()["num_members"] == 32  # one loss per sequence
    with pytest.raises(ValueError, match=r"privacy profile reads batches of \(x, y\) rows.*not apply to a language"):
        audit_privacy_profile(LogisticRegressionModule(T), members, warn=False)


def test_audit_callbacks_refuse_a_language_models_batches_without_a_signal_before_training():
    """MembershipAudit found the missing `signal_fn` only at fit end, after training the model and its references."""
    from lightning_privacy.callbacks.epsilon_star_audit import EpsilonStarAudit

    members, nonmembers, population = Sequences(32, seed=31), Sequences(32, seed=32), Sequences(64, seed=33)
    loaders = dict(member_dataloader=DataLoader(members, batch_size=16))
    membership = MembershipAudit(
        attack="rmia",
        num_references=1,
        population=DataLoader(population, batch_size=16),
        nonmember_dataloader=DataLoader(nonmembers, batch_size=16),
        model_factory=TinyLM,
        log_figure=False,
        **loaders,
    )
    epsilon_star = EpsilonStarAudit(population_dataloader=DataLoader(nonmembers, batch_size=16), **loaders)
    for callback, who in ((membership, "MembershipAudit"), (epsilon_star, "EpsilonStarAudit")):
        trainer = pl.Trainer(max_epochs=1, callbacks=[callback], **QUIET)
        with pytest.raises(MisconfigurationException, match=rf"^{who}: the batches are {LM_FIX}"):
            trainer.fit(TinyLM(), DataLoader(members, batch_size=16))
        assert trainer.global_step == 0  # refused before the first step
    assert membership.references is None  # and before any reference model trained
    epsilon_star = EpsilonStarAudit(
        population_dataloader=DataLoader(nonmembers, batch_size=16), signal_fn=causal_lm_signal, **loaders
    )
    pl.Trainer(max_epochs=1, callbacks=[epsilon_star], **QUIET).fit(TinyLM(), DataLoader(members, batch_size=16))
    assert epsilon_star.result.to_dict()["num_members"] == 32

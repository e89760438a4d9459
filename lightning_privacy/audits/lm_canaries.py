"""A one-run, black-box canary audit of a language model's fine-tuning: random-token canary sequences, each inserted
into the fine-tuning data with probability 1/2, scored after training by the fine-tuned model against its base.

The game is Steinke, Nasr and Jagielski's ("Privacy Auditing with One (1) Training Run", NeurIPS 2023): m canaries,
canary j included independently with probability 1/2; after training the auditor scores every canary and the
guesses ("included" for the highest scores) become a lower bound on ε, with a verdict on a claimed guarantee —
:func:`~lightning_privacy.audits.canary.audit_canaries` and :meth:`~lightning_privacy.claims.Claim.check_canaries`,
the analysis the input and gradient canaries use. Panda et al. ("Privacy Auditing of Large Language Models", ICLR
2025, arXiv 2503.06808) run this game on LM fine-tuning with canaries designed for LMs. Two kinds here:

- random-token canaries (the default): sequences of tokens drawn uniformly at random (no model predicts them by
  chance, so a canary the fine-tuned model finds likely was trained on), scored over all their tokens;
- new-token canaries (``secret_token_ids=``, Panda et al.'s strongest kind): a random prefix followed by a secret of
  ``secret_length`` tokens drawn from ids that nothing but the canaries uses — tokens added to the tokenizer for the
  audit, never in the fine-tuning data nor in the base's — and scored on the secret alone (``labels`` −100 on the
  prefix). The base never saw those tokens and the training data never asks for them: the only rows that pull the
  secret's probability up are the inserted canaries. By default an inserted new-token canary is trained on its
  secret alone (``with_canaries(..., loss_on="secret")``: the prefix's labels −100), Panda et al.'s recipe. Given at least m × ``secret_length`` ids, no two canaries share
  a secret token, so training on one canary raises its own secret and nobody else's; with fewer, tokens are shared
  (``secret_tokens_shared``) and an included canary also raises the secrets of excluded ones, which costs the audit
  power. Under LoRA the new tokens' own embedding rows are frozen: only the adapters can move them. Their
  search-token and bigram constructions (rare tokens of the model's own vocabulary) are not implemented.

Steps: :func:`language_model_canaries` draws the canaries and the inclusion vector from ``seed``;
``canaries.with_canaries(train_dataset)`` appends the included ones to the fine-tuning data (before DP-SGD's
sampling: they are rows like any other); after training :func:`audit_language_model_canaries` scores all m canaries
and returns a :class:`~lightning_privacy.audits.canary.CanaryResult`. Scores (higher = "included"):

- ``"loss_difference"`` (default): the canary's mean token loss under the base minus under the fine-tuned model
  (:func:`~lightning_privacy.functional.base_reference.base_loss_difference`);
- ``"ezmia"``: EZ-MIA's Error Zone score against the base
  (:func:`~lightning_privacy.functional.base_reference.error_zone_scores`);
- ``"loss"``: minus the fine-tuned model's mean token loss (no base needed).

The base is the model with its PEFT adapters disabled, else ``base_model`` (the checkpoint fine-tuning started
from; it must not have seen the canaries — drawn fresh at random, it has not). Either is a function of the released
model or of public information fixed before training, so the bound stays valid whatever the score.

Validity needs: each canary inserted at most once — or, inserted k times (``with_canaries(..., repetitions=k)``, a
piece of Panda et al.'s recipe), tested against the guarantee for groups of k records
(``Claim.from_ledger(dpsgd.ledger, group_size=k)``: the one-run game is then over groups, and the bounds are bounds on
the group's ε, not the record's) — the inclusion vector drawn before training and never used in the score, and canaries sampled by the training
loop like every other row. What the audit cannot see: anything but the last model (no intermediate steps, no
gradients), so expect bounds far below the accountant's ε (Panda et al. reach ε ≈ 1 at ε = 4 with 1,000 canaries on
real LLMs); and m canaries can never give more than the ceiling the result reports (all guesses right).

Example::

    >>> canaries = language_model_canaries(8, vocab_size=50, length=6, seed=0)
    >>> len(canaries), canaries.input_ids.shape, int(canaries.included.sum()) == len(canaries.inserted())
    (8, torch.Size([8, 6]), True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

__all__ = [
    "SCORES",
    "LanguageModelCanaries",
    "audit_language_model_canaries",
    "canary_scores",
    "language_model_canaries",
]

SCORES = ("loss_difference", "ezmia", "loss")


class _Rows(Dataset):
    def __init__(self, input_ids: Tensor, attention_mask: Tensor, labels: Optional[Tensor] = None) -> None:
        self.input_ids, self.attention_mask, self.labels = input_ids, attention_mask, labels

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> Mapping[str, Tensor]:
        row = {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i]}
        if self.labels is not None:
            row["labels"] = self.labels[i]
        return row


@dataclass
class LanguageModelCanaries:
    """m random-token canary sequences and which of them were inserted (drawn from ``seed``).

    Attributes:
        input_ids, attention_mask: ``[m, T]`` (right padding with ``pad_token_id`` beyond the canary's tokens).
        included: ``[m]`` bools, Bernoulli(1/2), drawn with the tokens before training.
        seed: the seed both were drawn from.
        scored_from: the first position the audit scores (0: the whole canary; new-token canaries: the secret's).
        secret_tokens_shared: new-token canaries with fewer ids than m × secret length: some secrets share tokens.
    """

    input_ids: Tensor
    attention_mask: Tensor
    included: np.ndarray
    seed: int
    scored_from: int = 0
    secret_tokens_shared: bool = False

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def dataset(self) -> Dataset:
        """All m canaries as mappings ``{"input_ids", "attention_mask"}`` (in order), for scoring; with
        ``scored_from > 0`` also ``labels``: the ids with −100 before ``scored_from`` (the prefix is not scored)."""
        if self.scored_from == 0:
            return _Rows(self.input_ids, self.attention_mask)
        labels = self.input_ids.clone()
        labels[:, : self.scored_from] = -100
        return _Rows(self.input_ids, self.attention_mask, labels)

    def inserted(self, loss_on: Optional[str] = None, repetitions: int = 1) -> Dataset:
        """The included canaries only, each ``repetitions`` times: what the fine-tuning sees.

        Args:
            loss_on: ``"all"``: rows without ``labels``, every token trained on; ``"secret"`` (new-token canaries
                only): ``labels`` −100 on the prefix, so a canary's training loss — and so its clipped gradient —
                is its secret's alone, Panda et al.'s recipe (the prefix's random tokens would otherwise spend most
                of the clipping budget on tokens the audit never scores; measured in
                ``benchmarks/results/lm_canary_designs.md``). ``None``: ``"secret"`` for new-token canaries,
                ``"all"`` for random-token ones.
            repetitions: k ≥ 1 copies of each included canary (k > 1: audit against a claim for groups of k).
        """
        k = _int("repetitions", repetitions, 1)
        rows = (
            self.dataset()
            if _loss_on(loss_on, self.scored_from) == "secret"
            else _Rows(self.input_ids, self.attention_mask)
        )
        return Subset(rows, np.repeat(np.flatnonzero(self.included), k).tolist())

    def with_canaries(self, dataset: Dataset, loss_on: Optional[str] = None, repetitions: int = 1) -> Dataset:
        """``dataset`` followed by the included canaries, each once or ``repetitions`` times (``ConcatDataset``): build
        the training loader on it (k > 1 copies: test the audit against ``Claim.from_ledger(ledger, group_size=k)``).

        The rows of ``dataset`` must be mappings with ``input_ids`` and ``attention_mask`` of the canaries' length
        (or a collator that pads them). With ``loss_on="secret"`` (see :meth:`inserted`; the default for new-token
        canaries) the canaries carry
        ``labels``, so every row of ``dataset`` without them gets ``labels`` = its ``input_ids`` (one batch, one set
        of keys; the loss of those rows is unchanged)."""
        if _loss_on(loss_on, self.scored_from) == "secret":
            return ConcatDataset([_Labelled(dataset), self.inserted("secret", repetitions)])
        return ConcatDataset([dataset, self.inserted("all", repetitions)])


class _Labelled(Dataset):
    """``dataset``'s mapping rows, with ``labels`` = ``input_ids`` where a row has none."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Mapping[str, Tensor]:
        row = self.dataset[i]
        if not isinstance(row, Mapping) or "input_ids" not in row:
            raise TypeError(
                "with_canaries(..., loss_on='secret') needs dataset rows that are mappings with `input_ids`, but row "
                f"{i} is {type(row).__name__}"
            )
        return row if "labels" in row else {**row, "labels": row["input_ids"]}


LOSS_ON = ("all", "secret")


def _loss_on(loss_on: Optional[str], scored_from: int) -> str:
    from lightning_privacy.analysis._checks import expect_choice

    if loss_on is None:
        return "secret" if scored_from > 0 else "all"
    expect_choice("loss_on", loss_on, LOSS_ON)
    if loss_on == "secret" and scored_from == 0:
        raise ValueError(
            "loss_on='secret' is for new-token canaries (language_model_canaries(..., secret_token_ids=...)); these "
            "canaries have no secret: use loss_on='all'"
        )
    return loss_on


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"Expected argument `{name}` to be an int >= {low}, but got {value!r}")
    return int(value)


def language_model_canaries(
    num_canaries: int,
    *,
    vocab_size: int,
    length: int,
    seed: int = 0,
    exclude_token_ids: Sequence[int] = (),
    pad_to: Optional[int] = None,
    pad_token_id: int = 0,
    secret_token_ids: Optional[Sequence[int]] = None,
    secret_length: Optional[int] = None,
) -> LanguageModelCanaries:
    """Draw ``num_canaries`` canaries of ``length`` tokens uniform over the vocabulary (less ``exclude_token_ids``:
    the tokenizer's special tokens, padding) and their inclusion, each with probability 1/2, from ``seed``.

    With ``secret_token_ids`` (new-token canaries, Panda et al. 2025): the last ``secret_length`` tokens of each canary
    are drawn from those ids instead — without replacement, each canary's its own, when there are at least
    ``num_canaries × secret_length`` of them, else with replacement (``secret_tokens_shared``, a weaker audit) — the
    prefix from the rest of the vocabulary, and the audit scores the secret alone. The ids must be ones the
    fine-tuning data never contains (tokens added to the tokenizer for the audit, ``model.resize_token_embeddings``
    after ``tokenizer.add_tokens``): a token the data also uses gets gradients from every row, not only from the
    canaries.

    Example (new tokens 96–99 of a vocabulary whose data uses 1–95)::

        >>> c = language_model_canaries(4, vocab_size=100, length=6, secret_token_ids=range(96, 100), secret_length=2)
        >>> bool((c.input_ids[:, 4:] >= 96).all() and (c.input_ids[:, :4] < 96).all()), c.scored_from
        (True, 4)

    Args:
        num_canaries: m ≥ 1 (the bound's ceiling grows with m: hundreds to thousands for a useful audit).
        vocab_size: the model's vocabulary size.
        length: tokens per canary (≥ 3: the Error Zone score leaves the first target out).
        seed: seeds the tokens and the inclusion (a numpy ``SeedSequence``); keep it secret from the training code.
        exclude_token_ids: ids never drawn (special tokens, the pad token).
        pad_to: total length of each row, right-padded with ``pad_token_id`` (mask 0); default ``length``.
        pad_token_id: the padding id.
        secret_token_ids: the new tokens' ids (below ``vocab_size``, none excluded); ``None``: random-token canaries.
        secret_length: tokens of the secret, 1 ≤ ``secret_length`` ≤ ``length`` − 2 (the prefix keeps two tokens);
            required with ``secret_token_ids`` and only with them.

    Raises:
        ValueError: arguments out of range (named), or no token left to draw.
    """
    m, vocab = _int("num_canaries", num_canaries, 1), _int("vocab_size", vocab_size, 2)
    length, seed = _int("length", length, 3), _int("seed", seed, 0)
    total = length if pad_to is None else _int("pad_to", pad_to, length)
    excluded = np.asarray(list(exclude_token_ids), dtype=np.int64)
    secret = _secret(secret_token_ids, secret_length, vocab=vocab, length=length, excluded=excluded)
    allowed = np.setdiff1d(np.arange(vocab), np.concatenate([excluded, secret]))
    if allowed.size == 0:
        raise ValueError(f"`exclude_token_ids` leaves no token of the vocabulary ({vocab}) to draw canaries from")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    tokens = rng.choice(allowed, size=(m, length))
    included = rng.random(m) < 0.5
    scored_from, shared = 0, False
    if secret.size:  # (drawn after the inclusion: random-token canaries of a seed stay what they were)
        scored_from, k = length - int(secret_length), int(secret_length)
        shared = secret.size < m * k  # else every canary's secret tokens are its own
        tokens[:, scored_from:] = rng.choice(secret, size=m * k, replace=shared).reshape(m, k)
    input_ids = torch.full((m, total), int(pad_token_id), dtype=torch.long)
    input_ids[:, :length] = torch.from_numpy(tokens)
    attention_mask = (torch.arange(total)[None, :] < length).long().repeat(m, 1)
    return LanguageModelCanaries(input_ids, attention_mask, included, seed, scored_from, shared)


def _secret(
    ids: Optional[Sequence[int]], secret_length: Optional[int], *, vocab: int, length: int, excluded: np.ndarray
) -> np.ndarray:
    """The new tokens' ids, checked against the vocabulary, the excluded ids and ``secret_length``."""
    if ids is None:
        if secret_length is not None:
            raise ValueError(f"`secret_length` ({secret_length!r}) is for new-token canaries: pass `secret_token_ids`")
        return np.zeros(0, dtype=np.int64)
    secret = np.unique(np.asarray(list(ids), dtype=np.int64))
    if secret.size == 0 or secret.min() < 0 or secret.max() >= vocab:
        raise ValueError(f"Expected `secret_token_ids` to be ids in [0, {vocab}), but got {list(ids)!r}")
    if np.isin(secret, excluded).any():
        raise ValueError(
            f"`secret_token_ids` and `exclude_token_ids` share {np.intersect1d(secret, excluded).tolist()}"
        )
    if secret_length is None:
        raise ValueError("new-token canaries need `secret_length` (tokens of the secret at the end of each canary)")
    if _int("secret_length", secret_length, 1) > length - 2:
        raise ValueError(f"Expected `secret_length` <= length - 2 = {length - 2}, but got {secret_length!r}")
    return secret


def _signal(score: str, base_model: Any) -> Any:
    """The ``signal_fn`` of ``score``: low = "included" (the audits' convention), from the model and its base."""
    from lightning_privacy.functional.base_reference import BaseLossDifferenceSignal, ErrorZoneSignal
    from lightning_privacy.functional.sequence_loss import causal_lm_signal

    if score == "loss":
        return causal_lm_signal
    if score == "ezmia":
        return ErrorZoneSignal(base_model)
    return BaseLossDifferenceSignal(base_model)


def canary_scores(
    model: Any,
    canaries: LanguageModelCanaries,
    *,
    base_model: Any = None,
    score: str = "loss_difference",
    batch_size: int = 64,
    device: Any = None,
) -> np.ndarray:
    """``[m]``: every canary's score under ``model`` (higher = "included"; see the module's docstring for ``score``).

    Raises:
        ValueError: an unknown ``score``; ``"loss_difference"`` or ``"ezmia"`` on a model without PEFT adapters and
            without ``base_model`` (naming it).
    """
    from lightning_privacy.analysis._checks import expect_choice
    from lightning_privacy.functional.base_reference import check_base
    from lightning_privacy.functional.membership_loss import signals_from_loader

    expect_choice("score", score, SCORES)
    if not isinstance(canaries, LanguageModelCanaries):
        raise TypeError(f"Expected `canaries` from language_model_canaries(...), but got {type(canaries).__name__}")
    if score != "loss":
        check_base(model, base_model)
    loader = DataLoader(canaries.dataset(), batch_size=_int("batch_size", batch_size, 1), shuffle=False)
    values, _ = signals_from_loader(model, loader, device=device, signal_fn=_signal(score, base_model))
    return -values.double().numpy()


def audit_language_model_canaries(
    model: Any,
    canaries: LanguageModelCanaries,
    *,
    delta: float,
    base_model: Any = None,
    score: str = "loss_difference",
    alpha: float = 0.05,
    claim: Any = None,
    claim_tests: str = "both",
    correction: str = "bonferroni",
    accountant_epsilon: Optional[float] = None,
    batch_size: int = 64,
    device: Any = None,
) -> Any:
    """Score every canary (:func:`canary_scores`) and run the one-run analysis
    (:func:`~lightning_privacy.audits.canary.audit_canaries`): the headline ε lower bound (valid for every (ε, δ)-DP
    mechanism), the binomial bound, the Gaussian f-DP reading (only if μ-GDP), their
    ceiling for m, and with ``claim`` a verdict at confidence 1 − ``alpha``.

    Args:
        model: the fine-tuned causal LM (called as ``model(input_ids=..., attention_mask=...)``).
        canaries: from :func:`language_model_canaries`, the included ones trained on.
        delta: δ of the audited (ε, δ) guarantee.
        base_model, score, batch_size, device: as :func:`canary_scores`.
        alpha, claim, claim_tests, correction, accountant_epsilon: as
            :func:`~lightning_privacy.audits.canary.audit_canaries` (``claim``: a ``Claim``, DPSGD's ledger,
            ``(σ, q, T[, δ])`` or ``(ε, δ)``).

    Returns:
        A :class:`~lightning_privacy.audits.canary.CanaryResult` (kind ``"language-model canaries (<score>)"``).
    """
    from lightning_privacy.audits.canary import audit_canaries

    scores = canary_scores(model, canaries, base_model=base_model, score=score, batch_size=batch_size, device=device)
    return audit_canaries(
        scores,
        canaries.included,
        delta=delta,
        alpha=alpha,
        correction=correction,
        kind=f"language-model canaries ({score})",
        accountant_epsilon=accountant_epsilon,
        claim=claim,
        claim_tests=claim_tests,
    )

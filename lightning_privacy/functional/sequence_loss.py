"""Per-sequence membership signals for language models: one number per sequence, not per token.

A membership attack on a language model asks whether a *sequence* was trained on, so its signal is one number per
sequence. Three are ready as ``signal_fn`` of the membership audits (``audit_membership``, ``MembershipAudit``,
``train_references``' audits, the CLI's ``--signal``, and
:func:`~lightning_privacy.functional.membership_loss.membership_losses_from_loader`):

- :data:`causal_lm_signal` (a :class:`CausalLMSignal`): each sequence's mean next-token cross-entropy over the tokens
  that count (not padding, not labels set to ``ignore_index``). Low = member-like. It also counts those tokens
  (:meth:`CausalLMSignal.num_tokens`), so RMIA and LiRA use the sequence's likelihood
  ``Pr(x | θ) = exp(−mean token loss × number of counted tokens)``, the product of its next-token probabilities
  (:mod:`lightning_privacy.analysis.membership_attacks`).
- ``CausalLMSignal(reduction="sum")``: the summed token loss, ``−log Pr(x | θ)`` itself.
- :data:`min_k_percent_signal` (a :class:`MinKPercentSignal`): Min-K% Prob (Shi et al., "Detecting Pretraining Data
  from Large Language Models", ICLR 2024), a reference-free score for the LOSS attack.

A signal says what its numbers are through its ``kind`` (:data:`SIGNAL_KINDS`; a plain function has none and is read
as a classification membership loss). The per-token losses, ``[B·T]`` rows, are not examples: an audit over them
counts every token of a sequence as another member, padding included, and is refused.

The callables take a batch that is a mapping with ``input_ids``, optionally ``attention_mask`` and ``labels``
(default: ``input_ids``; ``-100`` marks tokens to leave out, as in Hugging Face), and call the model as Hugging Face
causal LMs are called, ``model(input_ids=..., attention_mask=...)`` (``.logits``, a tuple or a tensor back). Without
``attention_mask`` nothing is padding: a batch that holds the pad token id (the signal's ``pad_token_id``, else the
model's ``config.pad_token_id``) then warns once, since the same sequence scores differently with more padding.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from typing import Any, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_privacy.functional._precision import at_least_float32

__all__ = [
    "SIGNAL_KINDS",
    "CausalLMSignal",
    "MinKPercentSignal",
    "causal_lm_losses",
    "causal_lm_signal",
    "causal_lm_token_losses",
    "min_k_percent_signal",
    "position_ids",
    "signal_kind",
]

SIGNAL_KINDS = ("membership_loss", "mean_token_nll", "nll", "score")
"""What a ``signal_fn``'s numbers are (its ``kind`` attribute; low = member-like for all of them):

- ``"membership_loss"``: a classification membership loss ``L`` (the default; ``Pr(x | θ) = 1 / (1 + e^L)``);
- ``"mean_token_nll"``: a sequence's mean next-token loss; the signal also has ``num_tokens(batch)``, and
  ``Pr(x | θ) = exp(−mean × num_tokens)``;
- ``"nll"``: ``−log Pr(x | θ)`` of the whole example (e.g. a sequence's summed token loss);
- ``"score"``: a number with no likelihood behind it (e.g. Min-K%): only the reference-free LOSS attack reads it.
"""


def signal_kind(signal_fn: Any) -> str:
    """The ``kind`` of a ``signal_fn`` (:data:`SIGNAL_KINDS`); ``"membership_loss"`` for a callable without one.

    Example::

        >>> signal_kind(causal_lm_signal), signal_kind(min_k_percent_signal), signal_kind(lambda model, batch: 0)
        ('mean_token_nll', 'score', 'membership_loss')
    """
    kind = getattr(signal_fn, "kind", "membership_loss")
    if kind not in SIGNAL_KINDS:
        raise ValueError(f"Expected the `kind` of `signal_fn` to be one of {SIGNAL_KINDS}, but got {kind!r}")
    if kind == "mean_token_nll" and not callable(getattr(signal_fn, "num_tokens", None)):
        raise ValueError(
            "A `signal_fn` of kind 'mean_token_nll' must also have `num_tokens(batch)` (the tokens each mean is over), "
            f"but {signal_fn!r} has none"
        )
    return kind


def _counted(labels: Tensor, attention_mask: Optional[Tensor], ignore_index: int) -> Tensor:
    """``[B, T − 1]``: whether target token t + 1 is scored: its label is not ``ignore_index``, and neither it nor
    the token it is predicted from is padding (under left padding the first real token follows a pad: it is no
    target, as it is none in the unpadded sequence)."""
    counted = labels[:, 1:] != ignore_index
    if attention_mask is not None:
        counted &= attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return counted


def causal_lm_token_losses(
    logits: Tensor, labels: Tensor, attention_mask: Optional[Tensor] = None, *, ignore_index: int = -100
) -> Tuple[Tensor, Tensor]:
    """Every target token's next-token cross-entropy and whether it counts: ``([B, T − 1] losses, [B, T − 1] mask)``.

    Token t + 1 is predicted from ``logits[:, t]`` (the shift a causal LM's ``labels`` imply); a token counts when its
    label is not ``ignore_index`` and, with ``attention_mask``, neither it nor token t is padding (so a left-padded
    sequence counts the targets of the unpadded one). Losses of tokens that do not count are 0. The losses are in the
    logits' precision, float32 at least (bf16 and fp16 logits are widened; float64 stays float64).

    Args:
        logits: ``[B, T, V]`` next-token logits.
        labels: ``[B, T]`` token ids (usually ``input_ids``), ``ignore_index`` where a token is not scored.
        attention_mask: ``[B, T]``, 1 for tokens, 0 for padding.
        ignore_index: the label of tokens left out.

    Raises:
        ValueError: on shapes that do not match, or a sequence with no counted token (its loss is undefined).

    Example::

        >>> losses, counted = causal_lm_token_losses(torch.zeros(1, 3, 4), torch.tensor([[1, 2, 0]]),
        ...                                          torch.tensor([[1, 1, 0]]))
        >>> losses, counted  # log 4 for the one scored token; the padded last one left out
        (tensor([[1.3863, 0.0000]]), tensor([[ True, False]]))
    """
    if logits.ndim != 3:
        raise ValueError(f"Expected argument `logits` of shape [B, T, V], but got {list(logits.shape)}")
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"Expected `labels` of shape {list(logits.shape[:2])}, but got {list(labels.shape)}")
    if attention_mask is not None and attention_mask.shape != labels.shape:
        raise ValueError(
            f"Expected `attention_mask` of shape {list(labels.shape)}, but got {list(attention_mask.shape)}"
        )
    counted = _counted(labels, attention_mask, ignore_index)
    per_token = F.cross_entropy(
        at_least_float32(logits[:, :-1]).transpose(1, 2),
        labels[:, 1:].masked_fill(~counted, 0).long(),
        reduction="none",
    )
    counts = counted.sum(dim=1)
    if _any_outside_vmap(counts == 0):
        rows = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"sequence(s) {rows[:10]} of the batch have no scored token (all padding or ignore_index)")
    return per_token.masked_fill(~counted, 0.0), counted


def _any_outside_vmap(mask: Tensor) -> bool:
    """``bool(mask.any())``; ``False`` inside ``torch.func.vmap``, which cannot branch on data (DPSGD's functional
    mode runs each example alone under vmap, and the batch's own pass makes the check)."""
    try:
        return bool(mask.any())
    except RuntimeError as error:
        if "vmap" not in str(error):
            raise
        return False


def causal_lm_losses(
    logits: Tensor,
    labels: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Each sequence's next-token cross-entropy over its counted tokens (``[B]``; low = member-like).

    Args:
        logits: ``[B, T, V]`` next-token logits.
        labels: ``[B, T]`` token ids (usually ``input_ids``), ``ignore_index`` where a token is not scored.
        attention_mask: ``[B, T]``, 1 for tokens, 0 for padding.
        ignore_index: the label of tokens left out.
        reduction: ``"mean"`` over the counted tokens (the per-token loss training minimises) or ``"sum"``
            (``−log Pr(x | θ)``, the sequence's negative log-likelihood).

    Returns:
        ``[B]`` losses in the logits' precision, float32 at least (float64 logits give float64 losses).

    Raises:
        ValueError: on shapes that do not match, or a sequence with no counted token (its loss is undefined).

    Example::

        >>> logits = torch.zeros(2, 3, 5)  # uniform predictions: every token costs log 5
        >>> ids = torch.tensor([[1, 2, 3], [4, 0, 0]])
        >>> causal_lm_losses(logits, ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
        tensor([1.6094, 1.6094])
        >>> causal_lm_losses(logits, ids, torch.tensor([[1, 1, 1], [1, 1, 0]]), reduction="sum")  # 2 and 1 tokens
        tensor([3.2189, 1.6094])
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"Expected argument `reduction` to be 'mean' or 'sum', but got {reduction!r}")
    per_token, counted = causal_lm_token_losses(logits, labels, attention_mask, ignore_index=ignore_index)
    total = per_token.sum(dim=1)
    return total if reduction == "sum" else total / counted.sum(dim=1)


def _check_pad_token_id(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected argument `pad_token_id` to be an int token id or None, but got {value!r}")
    return int(value)


def _batch_parts(batch: Any, who: str) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise TypeError(
            f"{who} expects a batch mapping with `input_ids` (and optionally `attention_mask`, `labels`), "
            f"as Hugging Face collators give, but got {type(batch).__name__}"
        )
    input_ids, attention_mask = batch["input_ids"], batch.get("attention_mask")
    return input_ids, attention_mask, batch.get("labels", input_ids)


def _pad_token_id(model: Any, given: Optional[int]) -> Tuple[Optional[int], str]:
    """The pad token id and where it came from: ``given``, else the first ``config.pad_token_id`` of ``model`` or one
    of its submodules (a Hugging Face model, or a LightningModule holding one); ``(None, "")`` when unknown."""
    if given is not None:
        return int(given), "`pad_token_id`"
    modules = model.modules() if isinstance(model, torch.nn.Module) else [model]
    for module in modules:
        pad = getattr(getattr(module, "config", None), "pad_token_id", None)
        if isinstance(pad, int) and not isinstance(pad, bool):
            return pad, "the model's `config.pad_token_id`"
    return None, ""


def _warn_unmasked_padding(signal: Any, model: Any, batch: Mapping[str, Any], who: str) -> None:
    """Warn once per signal when ``batch`` holds the pad token id but no ``attention_mask``: padding then counts as
    tokens (and the model attends to it), so a sequence's score depends on how much padding its batch added."""
    if signal._warned_padding or batch.get("attention_mask") is not None:
        return
    pad, source = _pad_token_id(model, signal.pad_token_id)
    input_ids = batch.get("input_ids")
    if pad is None or not isinstance(input_ids, Tensor) or not bool((input_ids == pad).any()):
        return
    signal._warned_padding = True
    warnings.warn(
        f"{who}: the batch holds the pad token id {pad} (from {source}) but no `attention_mask`, so padding counts as "
        "tokens and each sequence's score depends on how much padding its batch added (the batch size, its longest "
        "sequence): put the tokenizer's `attention_mask` in the batch",
        UserWarning,
        stacklevel=3,
    )


def _takes_position_ids(model: Any) -> bool:
    """``model``'s ``forward`` names ``position_ids``, or takes ``**kwargs`` and is a Hugging Face model (a ``config``;
    PEFT's wrappers pass them on)."""
    forward = getattr(model, "forward", model)
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    if "position_ids" in parameters:
        return True
    keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return keywords and getattr(model, "config", None) is not None


def position_ids(attention_mask: Tensor) -> Tensor:
    """Each token's position among its sequence's real tokens, as Hugging Face's ``generate`` forms them
    (``cumsum − 1``; padding gets 1): a left-padded sequence's tokens keep the positions of the unpadded one.

    Example::

        >>> position_ids(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]))
        tensor([[1, 1, 0, 1, 2],
                [0, 1, 2, 1, 1]])
    """
    positions = attention_mask.long().cumsum(dim=-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)


def _logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
    kwargs = {"input_ids": input_ids}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
        if _takes_position_ids(model):  # (else GPT-2 and Llama count positions from the first pad)
            kwargs["position_ids"] = position_ids(attention_mask)
    out = model(**kwargs)
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    return logits


class CausalLMSignal:
    """The membership signal of every sequence of a batch under a causal LM (a ``signal_fn`` for the audits).

    ``signal(model, batch)`` returns ``[B]`` per-sequence losses (low = member-like): with ``reduction="mean"``
    (:data:`causal_lm_signal`) each sequence's mean next-token loss over its counted tokens — the LOSS attack's score
    is its negative, length-normalised as perplexity is — and ``num_tokens(batch)`` the number of counted tokens, from
    which RMIA and LiRA form the sequence's likelihood ``Pr(x | θ) = exp(−mean × num_tokens)``; with
    ``reduction="sum"`` the summed loss ``−log Pr(x | θ)`` (kind ``"nll"``), which every attack reads as it is.

    Padding is known from the batch's ``attention_mask``. A batch without one that holds the pad token id
    (``pad_token_id``, else the model's ``config.pad_token_id`` as Hugging Face models have) warns once: its padding
    then counts as tokens, and the same sequence scores differently in batches padded to different lengths.

    Args:
        reduction: ``"mean"`` (kind ``"mean_token_nll"``) or ``"sum"`` (kind ``"nll"``).
        ignore_index: the label of tokens left out (Hugging Face's ``-100``).
        pad_token_id: the tokenizer's pad token id, for the warning above (default: the model's
            ``config.pad_token_id``, if it has one).

    Raises:
        ValueError: an unknown ``reduction``.
        TypeError: a ``pad_token_id`` that is not an int.

    Example::

        >>> class TinyLM(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed, self.head = torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7)
        ...     def forward(self, input_ids, attention_mask=None):
        ...         return self.head(self.embed(input_ids))
        >>> batch = {"input_ids": torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]),
        ...          "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}
        >>> causal_lm_signal(TinyLM(), batch).shape  # one loss per sequence
        torch.Size([2])
        >>> causal_lm_signal.num_tokens(batch)  # the scored next tokens of each sequence
        tensor([3, 1])
        >>> CausalLMSignal(reduction="sum").kind
        'nll'
    """

    def __init__(
        self, reduction: str = "mean", *, ignore_index: int = -100, pad_token_id: Optional[int] = None
    ) -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"Expected argument `reduction` to be 'mean' or 'sum', but got {reduction!r}")
        self.reduction, self.ignore_index = reduction, int(ignore_index)
        self.pad_token_id, self._warned_padding = _check_pad_token_id(pad_token_id), False

    @property
    def kind(self) -> str:
        """``"mean_token_nll"`` or ``"nll"`` (:data:`SIGNAL_KINDS`)."""
        return "mean_token_nll" if self.reduction == "mean" else "nll"

    def num_tokens(self, batch: Mapping[str, Any]) -> Tensor:
        """``[B]``: how many next tokens of each sequence are scored (not padding, not ``ignore_index``)."""
        _, attention_mask, labels = _batch_parts(batch, type(self).__name__)
        return _counted(labels, attention_mask, self.ignore_index).sum(dim=1)

    def __call__(self, model: torch.nn.Module, batch: Mapping[str, Any]) -> Tensor:
        input_ids, attention_mask, labels = _batch_parts(batch, "causal_lm_signal")
        _warn_unmasked_padding(self, model, batch, "causal_lm_signal")
        return causal_lm_losses(
            _logits(model, input_ids, attention_mask),
            labels,
            attention_mask,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
        )

    def __repr__(self) -> str:
        return f"CausalLMSignal(reduction={self.reduction!r})"


class MinKPercentSignal:
    """Min-K% Prob (Shi et al., "Detecting Pretraining Data from Large Language Models", ICLR 2024, Sec. 3), as a
    ``signal_fn`` for the reference-free LOSS attack.

    The paper's score is the mean log-probability of a sequence's ``k``% least likely tokens,
    ``Min-K%(x) = (1/E) Σ_{x_i ∈ Min-K%(x)} log p(x_i | x_<i)`` with ``E = |Min-K%(x)|`` (higher = member); a member
    has few surprising tokens. This signal returns its negative, the mean loss of those tokens (low = member-like, as
    every signal here): ``E = max(1, ⌊k · n⌋)`` of the ``n`` counted tokens (the paper's code takes ``⌊k · n⌋``; at
    least one keeps short sequences scored). Its numbers are no likelihood (kind ``"score"``), so RMIA and LiRA refuse
    it.

    Args:
        k: the fraction of tokens, in (0, 1]; the paper's default is 0.2 (20%).
        ignore_index: the label of tokens left out.
        pad_token_id: the tokenizer's pad token id: a batch holding it without ``attention_mask`` warns once, as
            :class:`CausalLMSignal` does (default: the model's ``config.pad_token_id``, if it has one).

    Raises:
        ValueError: ``k`` outside (0, 1].
        TypeError: a ``pad_token_id`` that is not an int.

    Example::

        >>> logits = torch.log(torch.tensor([[[0.1, 0.9], [0.5, 0.5], [0.5, 0.5]]]))  # p(x_1 = 1) = 0.9, then ½
        >>> batch = {"input_ids": torch.tensor([[0, 1, 1]])}
        >>> MinKPercentSignal(k=0.5)(lambda input_ids: logits, batch)  # ⌊0.5 · 2⌋ = 1 token: −log ½
        tensor([0.6931])
    """

    kind = "score"

    def __init__(self, k: float = 0.2, *, ignore_index: int = -100, pad_token_id: Optional[int] = None) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0.0 < float(k) <= 1.0:
            raise ValueError(f"Expected argument `k` to be a fraction in (0, 1], but got {k!r}")
        self.k, self.ignore_index = float(k), int(ignore_index)
        self.pad_token_id, self._warned_padding = _check_pad_token_id(pad_token_id), False

    def losses(self, logits: Tensor, labels: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """``[B]``: −Min-K% of each sequence from its ``[B, T, V]`` logits."""
        per_token, counted = causal_lm_token_losses(logits, labels, attention_mask, ignore_index=self.ignore_index)
        n = counted.sum(dim=1)
        e = torch.clamp((self.k * n.double()).floor().long(), min=1)
        worst = per_token.masked_fill(~counted, float("-inf")).sort(dim=1, descending=True).values
        take = torch.arange(worst.shape[1], device=worst.device)[None, :] < e[:, None]
        return worst.masked_fill(~take, 0.0).sum(dim=1) / e

    def __call__(self, model: torch.nn.Module, batch: Mapping[str, Any]) -> Tensor:
        input_ids, attention_mask, labels = _batch_parts(batch, "min_k_percent_signal")
        _warn_unmasked_padding(self, model, batch, "min_k_percent_signal")
        return self.losses(_logits(model, input_ids, attention_mask), labels, attention_mask)

    def __repr__(self) -> str:
        return f"MinKPercentSignal(k={self.k:g})"


causal_lm_signal = CausalLMSignal()
"""Each sequence's mean next-token loss over its non-padding tokens, with its token count (``CausalLMSignal()``)."""

min_k_percent_signal = MinKPercentSignal()
"""Min-K% Prob with the paper's k = 20% (``MinKPercentSignal(0.2)``)."""

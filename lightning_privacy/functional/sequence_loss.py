"""Per-sequence membership losses for language models: one number per sequence, not per token.

A membership attack on a language model asks whether a *sequence* was trained on, so its signal is one loss per
sequence: the mean next-token cross-entropy over the tokens that count (not padding, not labels set to
``ignore_index``). Low = member-like, as :func:`~lightning_privacy.functional.membership_loss.membership_loss`.
(The per-token losses, ``[B·T]`` rows, are not examples: an audit over them counts every token of a sequence as
another member, padding included.)

:func:`causal_lm_signal` is a ready ``signal_fn`` for the membership audits (``audit_membership``,
``MembershipAudit``, and :func:`~lightning_privacy.functional.membership_loss.membership_losses_from_loader`): it calls a causal LM as Hugging Face models are called,
``model(input_ids=..., attention_mask=...)``, on a batch that is a mapping with ``input_ids``, optionally
``attention_mask`` and ``labels`` (default: ``input_ids``; ``-100`` marks tokens to leave out, as in Hugging Face).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["causal_lm_losses", "causal_lm_signal"]


def causal_lm_losses(
    logits: Tensor, labels: Tensor, attention_mask: Optional[Tensor] = None, *, ignore_index: int = -100
) -> Tensor:
    """Each sequence's mean next-token cross-entropy over its counted tokens (``[B]``; low = member-like).

    Token t + 1 is predicted from ``logits[:, t]`` (the shift a causal LM's ``labels`` imply); a token counts when its
    label is not ``ignore_index`` and, with ``attention_mask``, it is not padding.

    Args:
        logits: ``[B, T, V]`` next-token logits.
        labels: ``[B, T]`` token ids (usually ``input_ids``), ``ignore_index`` where a token is not scored.
        attention_mask: ``[B, T]``, 1 for tokens, 0 for padding.
        ignore_index: the label of tokens left out.

    Returns:
        ``[B]`` float losses (float32 at least).

    Raises:
        ValueError: on shapes that do not match, or a sequence with no counted token (its loss is undefined).

    Example::

        >>> logits = torch.zeros(2, 3, 5)  # uniform predictions: every token costs log 5
        >>> ids = torch.tensor([[1, 2, 3], [4, 0, 0]])
        >>> causal_lm_losses(logits, ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
        tensor([1.6094, 1.6094])
    """
    if logits.ndim != 3:
        raise ValueError(f"Expected argument `logits` of shape [B, T, V], but got {list(logits.shape)}")
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"Expected `labels` of shape {list(logits.shape[:2])}, but got {list(labels.shape)}")
    if attention_mask is not None and attention_mask.shape != labels.shape:
        raise ValueError(
            f"Expected `attention_mask` of shape {list(labels.shape)}, but got {list(attention_mask.shape)}"
        )
    targets = labels[:, 1:]
    counted = targets != ignore_index
    if attention_mask is not None:
        counted &= attention_mask[:, 1:].bool()
    per_token = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets.masked_fill(~counted, 0).long(), reduction="none"
    )
    counts = counted.sum(dim=1)
    if bool((counts == 0).any()):
        rows = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"sequence(s) {rows[:10]} of the batch have no scored token (all padding or ignore_index)")
    return (per_token * counted).sum(dim=1) / counts


def causal_lm_signal(model: torch.nn.Module, batch: Mapping[str, Any]) -> Tensor:
    """The membership loss of every sequence of ``batch`` under a causal LM (a ``signal_fn`` for the audits).

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
    """
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise TypeError(
            "causal_lm_signal expects a batch mapping with `input_ids` (and optionally `attention_mask`, `labels`), "
            f"as Hugging Face collators give, but got {type(batch).__name__}"
        )
    input_ids, attention_mask = batch["input_ids"], batch.get("attention_mask")
    labels = batch.get("labels", input_ids)
    kwargs = {"input_ids": input_ids}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    out = model(**kwargs)
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    return causal_lm_losses(logits, labels, attention_mask)

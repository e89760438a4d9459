"""The base model as a free reference: EZ-MIA's Error Zone score of each sequence (a fine-tuned LM against its base).

EZ-MIA (Ilić, Stanojević, Cvejoski, "Powerful Training-Free Membership Inference Against Autoregressive Language
Models", arXiv 2601.12104; code: JetBrains-Research/ez-mia, ``mia/ez_score.py`` ``error_zone_pos_neg_sum_ratio`` and
``mia/models.py`` ``compute_ez_scores``) needs no reference training: two forward passes, one through the fine-tuned
model and one through the pretrained model fine-tuning started from. Its observation is that memorisation shows most
where the fine-tuned model predicts the next token *wrongly*: there a member's true token has still gained probability
relative to the base, a non-member's has not.

What :func:`error_zone_scores` computes for one sequence ``x`` with counted target tokens ``t`` (not padding, label not
``ignore_index``; the target at position 0 of the unpadded sequence left out, as the code's ``ignore_bos`` does: its
prediction sees one token; under left padding the same token, and with labels ``-100`` on a prefix nothing more):

- the error zone ``E = {t : argmax_v p_ft(v | x_<t) ≠ x_t}``, where the fine-tuned model's top-1 token is not the true
  one;
- the shift of the true token's log-probability ``Δ_t = log p_ft(x_t | x_<t) − log p_base(x_t | x_<t)``;
- ``P⁺ = Σ_{t∈E} max(Δ_t, 0)`` and ``P⁻ = Σ_{t∈E} max(−Δ_t, 0)``, the upward and downward shifts in the zone.

The paper and its code score the ratio ``r = P⁺ / P⁻`` (higher = member). Where both sums are positive we return
``P⁺ / (P⁺ + P⁻)`` in (0, 1), the ratio's strictly increasing transform ``r ↦ r / (1 + r)``: every threshold attack,
ROC, AUC and TPR at any FPR is the same as the ratio's on those sequences. Where we differ, each time in a case the
published code maps to a constant score of 0 (the least member-like) and a heavily fine-tuned model meets often:

- ``P⁻ = 0 < P⁺`` (every shift in the zone upward): the ratio is +∞ (the code returns 0); we return ``1 + P⁺``, above
  every finite ratio, and among these sequences the larger upward shift ranks higher (the ratio ties them all, which
  leaves an attack no threshold at low FPR: on an over-fitted bigram model, TPR at 1 % FPR 0.875 with the tie broken,
  0 without);
- ``P⁺ = 0 < P⁻`` (every shift downward): the ratio is 0; we return ``−P⁻``, below every positive ratio;
- ``P⁺ = P⁻ = 0`` (no shift at all, e.g. an un-fine-tuned LoRA model, whose adapters start at zero): 0.5, balanced;
- fewer than ``min_error_tokens`` (the code's ``min_tokens = 2``) positions in the zone — a sequence the fine-tuned
  model predicts (almost) perfectly, as it does the members it memorised: the code returns 0; we take the same
  statistic over *all* counted tokens, since the zone is too small to say anything and a memorised sequence's shifts
  are then upward almost everywhere. On tiny over-fitted Llama and GPT-2 fine-tunes (LoRA and full, 16 members)
  the code's rule gives AUC 0.35–0.44, below chance: the members it memorised score 0. :func:`error_zone_parts`
  returns which sequences fell back.

:class:`ErrorZoneSignal` is the ``signal_fn`` (kind ``"score"``, the negative score: low = member-like like every
signal) that ``audit_membership(attack="ezmia")``, ``MembershipAudit(attack="ezmia")`` and ``lightning-privacy audit
membership --attack ezmia`` use. The base of a PEFT model (``peft.PeftModel`` anywhere inside the model, e.g. a
LightningModule's attribute) is the same model with its adapters disabled (``with peft_model.disable_adapter():``):
no copy, no training. A fully fine-tuned model has no such base: pass ``base_model``, the checkpoint fine-tuning
started from; without one the signal refuses, naming ``base_model``.

Torch only (no Lightning).
"""

from __future__ import annotations

import contextlib
from typing import Any, List, Mapping, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_privacy.functional._precision import at_least_float32
from lightning_privacy.functional.sequence_loss import (
    _batch_parts,
    _check_pad_token_id,
    _counted,
    _logits,
    _warn_unmasked_padding,
)

__all__ = [
    "BaseLossDifferenceSignal",
    "ErrorZoneParts",
    "ErrorZoneSignal",
    "adapter_models",
    "base_logits",
    "base_loss_difference",
    "error_zone_parts",
    "error_zone_scores",
]


class ErrorZoneParts(NamedTuple):
    """Per-sequence pieces of the Error Zone score (all ``[B]``).

    ``score``: ``P⁺ / (P⁺ + P⁻)`` where both are positive, ``1 + P⁺`` where ``P⁻ = 0``, ``−P⁻`` where ``P⁺ = 0``,
    0.5 where both are 0; ``positive``, ``negative``: ``P⁺`` and ``P⁻`` over the tokens
    used; ``errors``: the size of the error zone; ``fallback``: the zone had fewer than ``min_error_tokens`` tokens, so
    every counted token was used instead; ``tokens``: the counted tokens (after the first one left out).
    """

    score: Tensor
    positive: Tensor
    negative: Tensor
    errors: Tensor
    fallback: Tensor
    tokens: Tensor


def _scored(labels: Tensor, attention_mask: Optional[Tensor], ignore_index: int, skip_first: bool) -> Tensor:
    """``[B, T − 1]``: the counted targets, without, when ``skip_first``, each sequence's first target position — the
    token predicted from the sequence's first real token, position 0 of the unpadded sequence, as EZ-MIA's
    ``ignore_bos`` skips position 0 (a label of ``ignore_index`` there leaves nothing more to skip: a prefix masked
    by labels is not skipped into)."""
    counted = _counted(labels, attention_mask, ignore_index)
    if skip_first and counted.shape[1] > 0:
        first = (
            attention_mask.long().argmax(dim=1)  # (the first real token; 0 without padding or under right padding)
            if attention_mask is not None
            else torch.zeros(counted.shape[0], dtype=torch.long, device=counted.device)
        )
        counted = counted.clone()
        rows = torch.arange(counted.shape[0], device=counted.device)
        inside = first < counted.shape[1]
        counted[rows[inside], first[inside]] = False
    return counted


def error_zone_parts(
    logits: Tensor,
    base_logits: Tensor,
    labels: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
    min_error_tokens: int = 2,
    skip_first: bool = True,
) -> ErrorZoneParts:
    """The Error Zone score of each sequence and its pieces (see the module's docstring for the exact statistic).

    Args:
        logits: ``[B, T, V]`` next-token logits of the fine-tuned model.
        base_logits: ``[B, T, V]`` those of its base model on the same batch.
        labels: ``[B, T]`` token ids (usually ``input_ids``), ``ignore_index`` where a token is not scored.
        attention_mask: ``[B, T]``, 1 for tokens, 0 for padding.
        ignore_index: the label of tokens left out.
        min_error_tokens: the smallest error zone scored on its own (EZ-MIA's code: 2); smaller zones fall back to
            all counted tokens.
        skip_first: leave out each sequence's target at position 0 of the unpadded sequence (EZ-MIA's
            ``ignore_bos``).

    Raises:
        ValueError: shapes that do not match, ``min_error_tokens`` < 1, or a sequence with no scored token.

    Example::

        >>> labels = torch.tensor([[0, 1, 2, 3]])
        >>> ft = torch.log(torch.tensor([[[.1, .6, .3, 0.], [.1, .1, .5, .3], [.6, .1, .1, .2], [1, 0, 0, 0]]]) + 1e-9)
        >>> base = torch.log(torch.full((1, 4, 4), 0.25))
        >>> parts = error_zone_parts(ft, base, labels, skip_first=False)
        >>> parts.errors.tolist(), parts.fallback.tolist()  # targets 1 and 2 are top-1, 3 is not: one error
        ([1], [True])
        >>> round(parts.score.item(), 4)  # all three tokens: up log(.6/.25) + log(.5/.25), down log(.25/.2)
        0.8755
    """
    if logits.ndim != 3 or base_logits.shape != logits.shape:
        raise ValueError(
            f"Expected `logits` and `base_logits` of the same shape [B, T, V], but got {list(logits.shape)} and "
            f"{list(base_logits.shape)}"
        )
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"Expected `labels` of shape {list(logits.shape[:2])}, but got {list(labels.shape)}")
    if attention_mask is not None and attention_mask.shape != labels.shape:
        raise ValueError(
            f"Expected `attention_mask` of shape {list(labels.shape)}, but got {list(attention_mask.shape)}"
        )
    if isinstance(min_error_tokens, bool) or not isinstance(min_error_tokens, int) or min_error_tokens < 1:
        raise ValueError(f"Expected argument `min_error_tokens` to be an int >= 1, but got {min_error_tokens!r}")
    scored = _scored(labels, attention_mask, ignore_index, skip_first)
    tokens = scored.sum(dim=1)
    if bool((tokens == 0).any()):
        rows = torch.nonzero(tokens == 0).flatten().tolist()
        raise ValueError(
            f"sequence(s) {rows[:10]} of the batch have no scored token (all padding or ignore_index"
            + (", or one token: the first one is left out, `skip_first=True`)" if skip_first else ")")
        )
    target = labels[:, 1:].masked_fill(~scored, 0).long()
    ft = F.log_softmax(at_least_float32(logits[:, :-1]), dim=-1)
    base = F.log_softmax(at_least_float32(base_logits[:, :-1]), dim=-1)
    shift = ft.gather(-1, target[..., None])[..., 0] - base.gather(-1, target[..., None])[..., 0]
    wrong = (ft.argmax(dim=-1) != target) & scored
    errors = wrong.sum(dim=1)
    fallback = errors < min_error_tokens
    zone = torch.where(fallback[:, None], scored, wrong)
    positive = (shift.clamp(min=0) * zone).sum(dim=1)
    negative = ((-shift).clamp(min=0) * zone).sum(dim=1)
    share = positive / (positive + negative).clamp(min=torch.finfo(positive.dtype).tiny)
    score = torch.where((positive > 0) & (negative > 0), share, torch.full_like(share, 0.5))
    score = torch.where((negative == 0) & (positive > 0), 1.0 + positive, score)  # ratio +∞: by the upward shift
    score = torch.where((positive == 0) & (negative > 0), -negative, score)  # ratio 0: by the downward shift
    return ErrorZoneParts(score, positive, negative, errors, fallback, tokens)


def error_zone_scores(
    logits: Tensor,
    base_logits: Tensor,
    labels: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
    min_error_tokens: int = 2,
    skip_first: bool = True,
) -> Tensor:
    """``[B]``: each sequence's Error Zone score (higher = member-like; ``P⁺ / (P⁺ + P⁻)`` where both sums are positive,
    see the module's docstring for the rest); :func:`error_zone_parts` with its pieces."""
    return error_zone_parts(
        logits,
        base_logits,
        labels,
        attention_mask,
        ignore_index=ignore_index,
        min_error_tokens=min_error_tokens,
        skip_first=skip_first,
    ).score


def base_loss_difference(
    logits: Tensor,
    base_logits: Tensor,
    labels: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    ignore_index: int = -100,
) -> Tensor:
    """``[B]``: each sequence's mean next-token loss under the base minus under the fine-tuned model, over its counted
    tokens (higher = member-like): the reference-calibrated LOSS score with the base as the one reference
    (log-likelihood ratio per token; cf. Carlini et al., "Extracting Training Data from Large Language Models", 2021).

    Example::

        >>> ids = torch.tensor([[0, 1, 2]])
        >>> base_loss_difference(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4), ids)  # the same model: no gain
        tensor([0.])
    """
    from lightning_privacy.functional.sequence_loss import causal_lm_losses

    if base_logits.shape != logits.shape:
        raise ValueError(
            f"Expected `logits` and `base_logits` of the same shape, but got {list(logits.shape)} and "
            f"{list(base_logits.shape)}"
        )
    base = causal_lm_losses(base_logits, labels, attention_mask, ignore_index=ignore_index)
    return base - causal_lm_losses(logits, labels, attention_mask, ignore_index=ignore_index)


def adapter_models(model: Any) -> List[torch.nn.Module]:
    """The outermost PEFT models inside ``model`` (modules with ``disable_adapter()`` and a ``peft_config``), which
    ``with m.disable_adapter():`` turns into their base; ``[]`` for a model without adapters."""
    if not isinstance(model, torch.nn.Module):
        return []
    found: List[torch.nn.Module] = []
    for module in model.modules():
        if callable(getattr(module, "disable_adapter", None)) and hasattr(module, "peft_config"):
            if not any(any(m is module for m in outer.modules()) for outer in found):
                found.append(module)
    return found


def check_base(model: Any, base_model: Any) -> str:
    """How the base is obtained: ``"base_model"`` or ``"adapters disabled"``.

    Raises:
        ValueError: no ``base_model`` and no PEFT adapters in ``model`` (full fine-tuning), naming ``base_model``.
        TypeError: a ``base_model`` that is not callable.
    """
    if base_model is not None:
        if not callable(base_model):
            raise TypeError(f"Expected argument `base_model` to be a model (a callable module), but got {base_model!r}")
        return "base_model"
    if adapter_models(model):
        return "adapters disabled"
    raise ValueError(
        f"the base-model reference attack (EZ-MIA) needs the model fine-tuning started from: {type(model).__name__} "
        "holds no PEFT adapters (full fine-tuning), so pass `base_model=` (e.g. the pretrained checkpoint, loaded "
        "again); for a PEFT model the base is the same model with its adapters disabled"
    )


@contextlib.contextmanager
def _eval(module: Any):
    training = getattr(module, "training", None)
    if isinstance(module, torch.nn.Module):
        module.eval()
    try:
        yield
    finally:
        if isinstance(module, torch.nn.Module) and training is not None:
            module.train(training)


def base_logits(model: Any, input_ids: Tensor, attention_mask: Optional[Tensor], base_model: Any = None) -> Tensor:
    """The base model's ``[B, T, V]`` logits: ``base_model``'s (moved to ``input_ids``' device, in eval mode), else
    ``model``'s with every PEFT adapter inside it disabled (restored on exit). Raises as :func:`check_base`."""
    check_base(model, base_model)
    if base_model is not None:
        if isinstance(base_model, torch.nn.Module):
            param = next(iter(base_model.parameters()), None)
            if param is not None and param.device != input_ids.device:
                base_model.to(input_ids.device)
        with _eval(base_model):
            return _logits(base_model, input_ids, attention_mask)
    with contextlib.ExitStack() as stack:
        for peft_model in adapter_models(model):
            stack.enter_context(peft_model.disable_adapter())
        return _logits(model, input_ids, attention_mask)


class ErrorZoneSignal:
    """EZ-MIA's Error Zone score of every sequence of a batch, as a ``signal_fn`` (kind ``"score"``): returns
    ``−score`` (low = member-like, as every signal), the score being :func:`error_zone_scores` of the model's logits
    against its base's.

    The base: ``base_model`` when given (full fine-tuning: the checkpoint fine-tuning started from; it is moved to the
    batch's device and put in eval mode while scoring), else the model itself with its PEFT adapters disabled.
    Called on a model with neither, it raises ``ValueError`` naming ``base_model``.

    Args:
        base_model: the model fine-tuning started from, called like the fine-tuned one (``None`` for PEFT models).
        min_error_tokens: the smallest error zone scored on its own (EZ-MIA's code: 2).
        skip_first: leave out each sequence's target at position 0 of the unpadded sequence (EZ-MIA's
            ``ignore_bos``).
        ignore_index: the label of tokens left out.
        pad_token_id: for the warning on padding without ``attention_mask`` (as :class:`CausalLMSignal`).

    Example::

        >>> class TinyLM(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed, self.head = torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7)
        ...     def forward(self, input_ids, attention_mask=None):
        ...         return self.head(self.embed(input_ids))
        >>> batch = {"input_ids": torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]),
        ...          "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])}
        >>> model = TinyLM()
        >>> ErrorZoneSignal(base_model=model)(model, batch)  # the model against itself: no shift, 0.5 each
        tensor([-0.5000, -0.5000])
        >>> ErrorZoneSignal()(model, batch)
        Traceback (most recent call last):
        ...
        ValueError: the base-model reference attack (EZ-MIA) needs the model fine-tuning started from: TinyLM holds no PEFT adapters (full fine-tuning), so pass `base_model=` (e.g. the pretrained checkpoint, loaded again); for a PEFT model the base is the same model with its adapters disabled
    """

    kind = "score"

    def __init__(
        self,
        base_model: Any = None,
        *,
        min_error_tokens: int = 2,
        skip_first: bool = True,
        ignore_index: int = -100,
        pad_token_id: Optional[int] = None,
    ) -> None:
        if base_model is not None and not callable(base_model):
            raise TypeError(f"Expected argument `base_model` to be a model (a callable module), but got {base_model!r}")
        if isinstance(min_error_tokens, bool) or not isinstance(min_error_tokens, int) or min_error_tokens < 1:
            raise ValueError(f"Expected argument `min_error_tokens` to be an int >= 1, but got {min_error_tokens!r}")
        self.base_model, self.min_error_tokens, self.skip_first = base_model, min_error_tokens, bool(skip_first)
        self.ignore_index = int(ignore_index)
        self.pad_token_id, self._warned_padding = _check_pad_token_id(pad_token_id), False

    def check(self, model: Any) -> str:
        """``"base_model"`` or ``"adapters disabled"``: how this signal gets ``model``'s base (raises without one)."""
        return check_base(model, self.base_model)

    def parts(self, model: Any, batch: Mapping[str, Any]) -> ErrorZoneParts:
        """:func:`error_zone_parts` of the batch under ``model`` and its base."""
        input_ids, attention_mask, labels = _batch_parts(batch, "ErrorZoneSignal")
        _warn_unmasked_padding(self, model, batch, "ErrorZoneSignal")
        with torch.no_grad():
            base = base_logits(model, input_ids, attention_mask, self.base_model)
            logits = _logits(model, input_ids, attention_mask)
        return error_zone_parts(
            logits,
            base,
            labels,
            attention_mask,
            ignore_index=self.ignore_index,
            min_error_tokens=self.min_error_tokens,
            skip_first=self.skip_first,
        )

    def __call__(self, model: Any, batch: Mapping[str, Any]) -> Tensor:
        return -self.parts(model, batch).score

    def __repr__(self) -> str:
        base = "adapters disabled" if self.base_model is None else type(self.base_model).__name__
        return f"ErrorZoneSignal(base={base})"


class BaseLossDifferenceSignal:
    """The base as the one reference of the LOSS score, as a ``signal_fn`` (kind ``"score"``): each sequence's mean
    token loss under the fine-tuned model minus under its base, ``−``:func:`base_loss_difference` (low = member-like;
    "Ref" in Carlini et al. 2021). The base is found as :class:`ErrorZoneSignal` finds it (``base_model``, else the
    model with its PEFT adapters disabled).

    Example::

        >>> class TinyLM(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed, self.head = torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7)
        ...     def forward(self, input_ids, attention_mask=None):
        ...         return self.head(self.embed(input_ids))
        >>> batch = {"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.tensor([[1, 1, 1]])}
        >>> model = TinyLM()
        >>> BaseLossDifferenceSignal(base_model=model)(model, batch)  # the model against itself: no gain
        tensor([0.])
    """

    kind = "score"

    def __init__(self, base_model: Any = None) -> None:
        self.base_model = base_model

    def __call__(self, model: Any, batch: Mapping[str, Any]) -> Tensor:
        ids, mask, labels = _batch_parts(batch, "BaseLossDifferenceSignal")  # (labels −100: tokens not scored)
        with torch.no_grad():
            base = base_logits(model, ids, mask, self.base_model)
            return -base_loss_difference(_logits(model, ids, mask), base, labels, mask)

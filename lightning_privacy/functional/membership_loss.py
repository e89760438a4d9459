"""Per-example membership loss of Epsilon* (Negoescu et al. 2023, footnote 1), from logits.

Sign convention: **low loss = looks like a member** (training examples tend to have low loss); the
Epsilon* attack calls an example a member when its loss is ``<= tau``. For attacks that want
"higher score = more likely member" (e.g. ``MembershipEpsilon``), pass ``-loss``.

The paper's losses, with ``f`` the predicted probabilities:

- binary, ``f(x) = P(y = 1)``: ``l = (1 - 2y) (log f - log(1 - f))`` — minus the signed logit;
- multi-class, true class ``y``: ``l = -(log f_y - log(1 - f_y))`` — minus the logit of the true-class
  probability.

From logits ``z`` these are exact closed forms, computed without ever forming a probability:
``log f_y = z_y - logsumexp(z)`` and ``log(1 - f_y) = logsumexp_{j != y}(z_j) - logsumexp(z)``, so
``l = logsumexp_{j != y}(z_j) - z_y`` (for one binary logit ``z``: ``log sigmoid(z) - log sigmoid(-z) = z``
and ``l = (1 - 2y) z``). There is no log of a rounded probability, so the loss stays exact for logits
of any size (a probability of 1 - 1e-20 would round to 1 and give an infinite loss).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Tuple

import torch
from torch import Tensor

from lightning_privacy.functional._precision import at_least_float32

__all__ = ["membership_loss", "membership_losses_from_loader", "signals_from_loader"]


def _check_target(target: Tensor, num_classes: int, name: str = "target") -> Tensor:
    if target.is_floating_point():
        if not torch.all(target == target.round()):
            raise ValueError(f"Expected argument `{name}` to hold integer class labels, but got non-integers")
        target = target.long()
    elif target.dtype == torch.bool:
        target = target.long()
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        raise ValueError(
            f"Expected argument `{name}` to hold labels in [0, {num_classes - 1}], but got values in "
            f"[{int(target.min())}, {int(target.max())}]"
        )
    return target


def membership_loss(logits: Tensor, target: Tensor) -> Tensor:
    """The Epsilon* per-example loss from logits (low = looks like a member).

    Args:
        logits: ``(N,)`` or ``(N, 1)`` — one binary logit ``log(f / (1 - f))`` per example; or
            ``(N, C)`` with ``C >= 2`` — class logits (softmax). Half precision is computed in float32.
        target: ``(N,)`` labels — ``0``/``1`` for one binary logit, class indices in ``[0, C)`` otherwise
            — or ``(N, C)`` one-hot labels.

    Returns:
        ``(N,)`` losses in the logits' floating dtype (at least float32).

    Raises:
        ValueError: on shapes that do not match, labels out of range, non-one-hot ``(N, C)`` targets,
            or NaN/inf logits.

    Example::

        >>> membership_loss(torch.tensor([2.0, 2.0]), torch.tensor([1, 0]))
        tensor([-2.,  2.])
        >>> membership_loss(torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([1]))
        tensor([-1.6867])
        >>> membership_loss(torch.tensor([[-500.0, 500.0]]), torch.tensor([1]))  # P(y) = 1 in float32
        tensor([-1000.])
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError(
            f"Expected argument `logits` to be a floating-point tensor, but got {type(logits).__name__}"
            + (f" of dtype {logits.dtype}" if isinstance(logits, Tensor) else "")
        )
    if not isinstance(target, Tensor):
        target = torch.as_tensor(target)
    logits = at_least_float32(logits)
    bad = ~torch.isfinite(logits)
    if bad.any():
        raise ValueError(f"Expected argument `logits` to be finite, but got {int(bad.sum())} NaN/inf value(s)")
    if logits.ndim == 2 and logits.shape[1] == 1:
        logits = logits[:, 0]
    n = logits.shape[0] if logits.ndim else 0
    if logits.ndim == 1:
        if target.shape != logits.shape:
            raise ValueError(
                f"Expected `target` of shape {tuple(logits.shape)} for binary logits, but got {tuple(target.shape)}"
            )
        y = _check_target(target, 2).to(logits.dtype)
        return (1.0 - 2.0 * y) * logits
    if logits.ndim != 2:
        raise ValueError(f"Expected argument `logits` of shape (N,), (N, 1) or (N, C), but got {tuple(logits.shape)}")
    num_classes = logits.shape[1]
    if target.ndim == 2:
        if target.shape != logits.shape:
            raise ValueError(f"Expected one-hot `target` of shape {tuple(logits.shape)}, but got {tuple(target.shape)}")
        if not (torch.all((target == 0) | (target == 1)) and torch.all(target.sum(dim=1) == 1)):
            raise ValueError("Expected a 2-D `target` to be one-hot (exactly one 1 per row)")
        target = target.argmax(dim=1)
    if target.shape != (n,):
        raise ValueError(f"Expected `target` of shape ({n},), but got {tuple(target.shape)}")
    target = _check_target(target, num_classes).to(logits.device)
    true_logit = logits.gather(1, target[:, None])[:, 0]
    others = logits.scatter(1, target[:, None], float("-inf"))
    return torch.logsumexp(others, dim=1) - true_logit


def mapping_batch_refusal(batch: Any, fix: Optional[str] = None) -> Optional[str]:
    """The sentence refusing ``batch`` to the default ``forward_fn`` (``model(batch[0]), batch[1]``), or ``None``.

    A mapping (``{"input_ids": ..., "attention_mask": ...}``, as a tokenizer's collator gives) has no ``batch[0]``:
    a language model's sequences are scored by a ``signal_fn``, one loss per sequence. ``fix`` replaces what the
    sentence says to do (the CLI names its ``--signal``).

    Example::

        >>> mapping_batch_refusal((torch.zeros(2, 3), torch.zeros(2))) is None
        True
        >>> print(mapping_batch_refusal({"input_ids": torch.zeros(2, 3), "attention_mask": torch.ones(2, 3)}))
        the batches are mappings with keys ['attention_mask', 'input_ids'], not the (x, y) pairs ...: for a causal language model pass `signal_fn=causal_lm_signal` (...), one loss per sequence, ...
    """
    if not isinstance(batch, Mapping) or (0 in batch and 1 in batch):
        return None
    fix = fix or (
        "for a causal language model pass `signal_fn=causal_lm_signal` (lightning_privacy.functional.sequence_loss), "
        "one loss per sequence, or a `forward_fn(model, batch) -> (logits, target)` for this layout"
    )
    keys = sorted(map(str, batch))
    return f"the batches are mappings with keys {keys}, not the (x, y) pairs the default `forward_fn` reads: {fix}"


def _default_forward(module: torch.nn.Module, batch) -> tuple:
    refusal = mapping_batch_refusal(batch)
    if refusal is not None:
        raise ValueError(refusal)
    x, y = batch[0], batch[1]
    return module(x), y


def _num_examples(batch: Any) -> Optional[int]:
    """Rows of a batch: its (first) tensor's first dimension; ``input_ids`` of a mapping. None when there is none."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        first = batch.get("input_ids")
        items = [first] if isinstance(first, Tensor) else list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return None
    return next((int(t.shape[0]) for t in items if isinstance(t, Tensor) and t.ndim), None)


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(b.to(device) if isinstance(b, Tensor) else b for b in batch)
    return batch


def _one_per_example(losses: Tensor, batch: Any, what: str) -> Tensor:
    expected = _num_examples(batch)
    if expected is not None and (losses.ndim != 1 or losses.shape[0] != expected):
        raise ValueError(
            f"{what} gave {list(losses.shape)} losses for a batch of {expected} examples: an audit needs one "
            "membership loss per example. For sequences (language models), per-token logits [B·T, V] are not "
            "examples: pass `signal_fn=causal_lm_signal` (lightning_privacy.functional.sequence_loss), or a signal_fn "
            "returning one loss per sequence."
        )
    return losses


@torch.no_grad()
def membership_losses_from_loader(
    module: torch.nn.Module,
    batches: Iterable,
    *,
    forward_fn: Optional[Callable[[torch.nn.Module, object], tuple]] = None,
    device: Optional[torch.device] = None,
    signal_fn: Optional[Callable[[torch.nn.Module, object], Tensor]] = None,
) -> Tensor:
    """Membership losses of every example of ``batches`` (eval mode, no grad; mode restored after).

    Args:
        module: the model; by default ``module(x)`` gives logits for a batch ``(x, y, ...)``.
        batches: an iterable of batches (e.g. a DataLoader, in a fixed order).
        forward_fn: ``forward_fn(module, batch) -> (logits, target)`` for other batch layouts (classification).
        device: where to move the batch's tensors (default: the module's first parameter's device).
        signal_fn: ``signal_fn(module, batch) -> losses`` of shape ``[batch size]`` (low = member-like), for
            examples that are not classification rows, e.g.
            :data:`~lightning_privacy.functional.sequence_loss.causal_lm_signal` for language models. Instead of
            ``forward_fn``. Its ``kind`` (:data:`~lightning_privacy.functional.sequence_loss.SIGNAL_KINDS`) tells the
            attacks what the numbers are.

    Raises:
        ValueError: both ``forward_fn`` and ``signal_fn``, a batch whose losses are not one per example (e.g.
            token logits ``[B·T, V]`` for ``B`` sequences), or mapping batches (a language model's) without either
            (:func:`mapping_batch_refusal`), naming the fix.

    Returns:
        A float32/float64 CPU tensor of shape ``(num_examples,)``, in loader order.

    Example::

        >>> net = torch.nn.Linear(3, 2)
        >>> data = [(torch.zeros(4, 3), torch.tensor([0, 1, 0, 1]))]
        >>> membership_losses_from_loader(net, data).shape
        torch.Size([4])
    """
    return signals_from_loader(module, batches, forward_fn=forward_fn, device=device, signal_fn=signal_fn)[0]


@torch.no_grad()
def signals_from_loader(
    module: torch.nn.Module,
    batches: Iterable,
    *,
    forward_fn: Optional[Callable[[torch.nn.Module, object], tuple]] = None,
    device: Optional[torch.device] = None,
    signal_fn: Optional[Callable[[torch.nn.Module, object], Tensor]] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """:func:`membership_losses_from_loader` and, for a ``signal_fn`` of kind ``"mean_token_nll"``, each example's
    token count (``signal_fn.num_tokens(batch)``; else ``None``): what RMIA and LiRA need for a sequence's likelihood.

    Example::

        >>> from lightning_privacy.functional.sequence_loss import causal_lm_signal
        >>> lm = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5))
        >>> ids = torch.tensor([[1, 2, 3], [4, 1, 0]])
        >>> batches = [{"input_ids": ids, "attention_mask": (ids > 0).long()}]
        >>> losses, counts = signals_from_loader(lambda input_ids, attention_mask: lm(input_ids), batches,
        ...                                      signal_fn=causal_lm_signal, device=torch.device("cpu"))
        >>> losses.shape, counts
        (torch.Size([2]), tensor([2, 1]))
    """
    from lightning_privacy.functional.sequence_loss import signal_kind

    if forward_fn is not None and signal_fn is not None:
        raise ValueError("Give `forward_fn` (logits and targets) or `signal_fn` (one loss per example), not both")
    forward = forward_fn or _default_forward
    with_counts = signal_fn is not None and signal_kind(signal_fn) == "mean_token_nll"
    if device is None:
        param = next(iter(module.parameters()), None) if isinstance(module, torch.nn.Module) else None
        device = param.device if param is not None else torch.device("cpu")
    was_training = getattr(module, "training", False)
    if isinstance(module, torch.nn.Module):
        module.eval()
    out, counts = [], []
    try:
        for batch in batches:
            batch = _to(batch, device)
            if signal_fn is not None:
                losses = _one_per_example(torch.as_tensor(signal_fn(module, batch)), batch, "signal_fn")
                if with_counts:
                    counts.append(_one_per_example(torch.as_tensor(signal_fn.num_tokens(batch)), batch, "num_tokens"))
            else:
                logits, target = forward(module, batch)
                losses = _one_per_example(membership_loss(logits, target), batch, "forward_fn")
            out.append(losses.detach().cpu())
    finally:
        if isinstance(module, torch.nn.Module):
            module.train(was_training)
    if not out:
        return torch.empty(0), (torch.empty(0, dtype=torch.long) if with_counts else None)
    return torch.cat(out), (torch.cat(counts).cpu() if with_counts else None)

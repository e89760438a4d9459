"""What every post-training audit shares: the result protocol, loader passes, JSON values, progress.

No Lightning here: an audit is a plain function over a model and loaders (or over losses/scores), so it
runs in a notebook, a script or a callback alike.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "AuditResult",
    "ClaimChecked",
    "jsonable",
    "progress_stages",
    "refuse_mapping_batches",
    "sequential_loader",
    "unshard",
    "warnings_markdown",
]

DEFAULT_BATCH_SIZE = 256


class AuditResult:
    """What an audit function returns: the same four views for every audit.

    - :meth:`metrics`: ``{names.*: float}``, the scalars a callback logs;
    - :meth:`summary`: the Markdown text a callback writes to TensorBoard and prints;
    - :meth:`figure`: a :class:`matplotlib.figure.Figure` (no pyplot state, the backend is left alone);
    - :meth:`to_dict`: plain Python values, ready for :func:`json.dumps`.

    Every result also has ``warnings``: one sentence per reason its numbers carry little or no
    information (Normal fits the KS test rejects, too few correct guesses, scores that look reversed,
    ...), each found by an objective criterion the audit documents. They are in ``to_dict()["warnings"]``
    and at the top of :meth:`summary`, and the report, the TensorBoard text and the CLI show them.
    """

    warnings: Tuple[str, ...] = ()

    def metrics(self) -> Dict[str, float]:  # pragma: no cover - every result overrides it
        raise NotImplementedError

    def summary(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def figure(self) -> Any:  # pragma: no cover
        raise NotImplementedError

    def to_dict(self) -> Dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


class ClaimChecked:
    """Mixin for results that may test a claimed guarantee: ``verdict`` and ``evidence`` read from ``claim_verdict``."""

    claim_verdict: Any = None

    @property
    def verdict(self) -> Optional[str]:
        """``"consistent"`` or ``"contradicted"`` (at confidence 1 − α) when a claim was tested, else ``None``."""
        return None if self.claim_verdict is None else self.claim_verdict.verdict

    @property
    def evidence(self) -> Optional[Dict[str, Any]]:
        """The test that contradicted the claim (an FPR point, the ε lower bound or the canaries' guesses), else None."""
        return None if self.claim_verdict is None else self.claim_verdict.evidence


def warnings_markdown(warnings: Sequence[str]) -> str:
    """The Markdown block of a result's ``warnings``: one quoted "**Warning:**" paragraph each ("" for none).

    Example::

        >>> print(warnings_markdown(["the fits are rejected"]))
        > **Warning:** the fits are rejected
        >>> warnings_markdown([])
        ''
    """
    return "\n\n".join(f"> **Warning:** {w}" for w in warnings)


def jsonable(value: Any) -> Any:
    """``value`` as plain Python for :func:`json.dumps` (strict JSON: NaN and ±inf become ``None``).

    Example::

        >>> jsonable({"a": np.float32(0.5), "b": (np.int64(3), float("nan")), "c": np.arange(2)})
        {'a': 0.5, 'b': [3, None], 'c': [0, 1]}
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str):
        return value
    return str(value)


# --- data ------------------------------------------------------------------------------------
def sequential_loader(loader: Iterable, *, rank: int = 0, world_size: int = 1) -> Iterable:
    """A deterministic pass over ``loader``'s data, this rank's share only.

    A plain ``DataLoader`` over a map-style dataset is rebuilt without shuffling or special samplers
    (e.g. DP-SGD's Poisson sampler), so every example is read once in dataset order; any other
    iterable is returned unchanged. Reading it leaves torch's global random stream alone (the rebuilt loader
    has its own generator). With several processes rank ``r`` gets examples
    ``r, r + world_size, ...`` of the dataset (no padding, no duplicates; :func:`unshard` restores the
    order of the gathered values), which needs a ``DataLoader`` over a map-style dataset.

    Raises:
        ValueError: if several processes share an iterable that is not a DataLoader over a map-style
            dataset.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> shuffled = DataLoader(TensorDataset(torch.arange(5)), batch_size=2, shuffle=True)
        >>> [b[0].tolist() for b in sequential_loader(shuffled)]
        [[0, 1], [2, 3], [4]]
        >>> [b[0].tolist() for b in sequential_loader(shuffled, rank=1, world_size=2)]
        [[1, 3]]
    """
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        if world_size > 1:
            raise ValueError(
                "Audits under multiple processes need a DataLoader over a map-style dataset to shard, but got "
                f"{type(loader).__name__} (dataset {type(dataset).__name__})"
            )
        return loader
    if world_size > 1:
        dataset = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(
        dataset,
        batch_size=loader.batch_size or DEFAULT_BATCH_SIZE,
        shuffle=False,
        collate_fn=loader.collate_fn,
        num_workers=0,
        generator=torch.Generator(),  # iterating draws a base seed: from here, not from the caller's global stream
    )


def refuse_mapping_batches(
    loader: Iterable, *, forward_fn: Any = None, signal_fn: Any = None, fix: Optional[str] = None
) -> None:
    """Refuse, from its first batch, a loader of mappings (a language model's) that the default ``forward_fn`` would
    read as ``(x, y)``: the audit's own first pass fails the same way, but only after any reference training.

    Nothing is read when a ``forward_fn`` or ``signal_fn`` is given.

    Raises:
        ValueError: :func:`~lightning_privacy.functional.membership_loss.mapping_batch_refusal`'s sentence
            (``fix``: the fix it names).

    Example::

        >>> import torch
        >>> refuse_mapping_batches([{"input_ids": torch.zeros(2, 3, dtype=torch.long)}])
        Traceback (most recent call last):
        ...
        ValueError: the batches are mappings with keys ['input_ids'], ... pass `signal_fn=causal_lm_signal` ...
    """
    if forward_fn is not None or signal_fn is not None:
        return
    from lightning_privacy.functional.membership_loss import mapping_batch_refusal

    refusal = mapping_batch_refusal(next(iter(sequential_loader(loader)), None), fix)
    if refusal is not None:
        raise ValueError(refusal)


def unshard(values: np.ndarray, world_size: int) -> np.ndarray:
    """Dataset order from values gathered rank after rank of :func:`sequential_loader` shards.

    Rank ``r`` held examples ``r, r + world_size, ...``; the gather concatenates rank 0's, then rank
    1's, ... This puts example ``i`` back at position ``i``, so an audit under DDP sees its values in the
    same order as a single process (order matters where a seeded split is drawn, e.g. the holdout of
    the membership ε lower bound).

    Example::

        >>> unshard(np.array([0, 2, 4, 1, 3]), world_size=2)
        array([0, 1, 2, 3, 4])
    """
    values = np.asarray(values)
    if world_size <= 1:
        return values
    n = len(values)
    positions = np.concatenate([np.arange(r, n, world_size) for r in range(world_size)])
    out = np.empty_like(values)
    out[positions] = values
    return out


# --- progress --------------------------------------------------------------------------------
@contextlib.contextmanager
def progress_stages(
    title: str, stages: Sequence[str], enabled: Optional[bool] = None
) -> Iterator[Callable[[str], None]]:
    """A progress bar over the named stages of a long audit, on stderr.

    Yields ``advance(stage)``: call it when a stage starts (the bar shows the stage's name and counts
    the finished ones). ``enabled=None`` shows the bar only when stderr is a terminal; ``False`` never.

    Example::

        >>> with progress_stages("audit", ["one", "two"], enabled=False) as advance:
        ...     advance("one")
        ...     advance("two")
    """
    from tqdm.std import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    bar = tqdm(total=len(stages), desc=title, unit="stage", file=sys.stderr, disable=disable, leave=True)
    started = []

    def advance(stage: str) -> None:
        if started:
            bar.update(1)
        started.append(stage)
        bar.set_postfix_str(stage, refresh=True)

    try:
        yield advance
        if started:
            bar.update(1)
        bar.set_postfix_str("done", refresh=True)
    finally:
        bar.close()

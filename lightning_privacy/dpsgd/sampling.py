"""Poisson sampling for DP-SGD on every strategy: one independent, secret mask over the whole training set per step.

The accountants (RDP, PRV, PLD and :class:`~lightning_privacy.ledger.PrivacyLedger`) assume that at every optimizer
step each row of the *whole* training set joins the batch independently with probability ``p``, by randomness the
adversary does not know. :class:`PoissonBatchSampler` draws exactly that, whatever the number of processes:

- Step ``t`` draws one global Bernoulli(``p``) mask over all ``N`` rows; rank ``r`` of ``W`` takes the selected rows
  ``i`` with ``i mod W == r``. Every rank yields exactly one batch per step — empty when none of its rows was drawn —
  so all ranks take the single-process number of steps (a rank that skipped a step would leave the others waiting in
  the next all-reduce). The union of the ranks' batches is the single-process batch of the same seed, so DDP and
  FSDP2 train on the same rows as one process.
- The mask of step ``t`` is a function of ``(seed, t)`` only (NumPy's ``SeedSequence(seed, spawn_key=(t,))`` feeding
  a PCG64 generator). ``t`` is the number of optimizer steps taken before the epoch started (read from the run's
  ledger at every ``iter()``), so a resumed run continues the sequence instead of replaying the first epoch.
- **Cost O(batch), not O(N).** The selected rows are drawn as the gaps between them (:func:`global_rows`), never as
  one decision per row: a step costs time and memory proportional to its batch, so sampling 10⁸ rows at p = 10⁻⁵
  touches about a thousand numbers.
- ``seed=None`` (the default of ``DPSGD(sampling_seed=...)``) draws a 128-bit seed from the operating system's
  entropy at every fit (rank 0 draws, the others receive it), independent of the loader's generator and of
  ``seed_everything``; it is never written to a checkpoint, so a resumed run gets fresh masks. An int makes the masks
  reproducible — and public to whoever knows it: an adversary who knows the seed knows every batch, and the
  amplification by subsampling that the accounting relies on is lost.
- ``secure=True`` (``DPSGD(secure_mode=True)``) takes each rank's bits from the operating system's CSPRNG
  (``os.urandom``) at every step, nothing seeded and nothing to replay; the ranks' rows are disjoint, so their draws
  are independent.

**Why the gaps give the same law.** Rows 0, 1, …, N − 1 are scanned in order; the gap G from one selected row (or
from the start) to the next selected row is drawn as G = 1 + ⌊log U / log(1 − p)⌋ with U uniform on (0, 1], so
P(G > g) = P(U ≤ (1 − p)^g) = (1 − p)^g: G is Geometric(p), the waiting time to the first success in independent
Bernoulli(p) trials. Gaps are drawn independently, so the selected rows are exactly the successes of one sequence of
independent Bernoulli(p) trials, one per row (the renewal description of a Bernoulli process): every row is included
with probability p, independently of every other row, and the batch size is Binomial(N, p). U has 53 random bits
(PCG64's ``random``, or 53 of 64 bits from ``os.urandom``), so each inclusion probability is p up to about 2⁻⁵³.
Drawing stops at the first gap that passes row N − 1: about N·p + 1 gaps.

This draw replaced one uniform number per row (``rng.random(N) < p``) in release 0.2.0 (after 0.1.0): the law is the same, but a
given seed now selects other rows than before (CHANGELOG.md, "Sampling at O(batch)").
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, default_collate

__all__ = [
    "PoissonBatchSampler",
    "PoissonDataLoader",
    "batch_rows",
    "draw_seed",
    "global_mask",
    "global_rows",
    "is_empty_batch",
    "secure_rows",
]

SEED_BITS = 128


def draw_seed() -> int:
    """A fresh 128-bit sampling seed from the operating system's entropy."""
    return secrets.randbits(SEED_BITS)


def _gap_rows(uniform: Callable[[int], np.ndarray], num_rows: int, sample_rate: float) -> np.ndarray:
    """Sorted indices in ``[0, num_rows)`` of independent Bernoulli(``sample_rate``) successes, from geometric gaps.

    ``uniform(n)`` returns n uniform numbers in [0, 1); each gap is 1 + ⌊log(1 − u) / log(1 − p)⌋ (the module
    docstring proves the law). Memory and time are proportional to the number of successes, not to ``num_rows``.
    """
    if sample_rate >= 1.0:
        return np.arange(num_rows, dtype=np.int64)
    log_q = np.log1p(-sample_rate)
    chunks: List[np.ndarray] = []
    last = -1  # index of the last selected row
    expected = num_rows * sample_rate
    while True:
        n = int(expected + 6.0 * np.sqrt(expected) + 16)  # enough gaps to pass the end with overwhelming probability
        with np.errstate(divide="ignore"):
            gaps = 1.0 + np.floor(np.log1p(-uniform(n)) / log_q)  # 1 − u in (0, 1]: log finite, u = 0 → gap 1
        # a gap beyond the end ends the draw; clip before the cast so a huge gap cannot overflow int64
        rows = last + np.cumsum(np.minimum(gaps, float(num_rows + 1)).astype(np.int64))
        inside = rows[rows < num_rows]
        chunks.append(inside)
        if inside.size < rows.size:
            break
        last = int(rows[-1])
        expected = (num_rows - 1 - last) * sample_rate
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0]


def global_rows(seed: int, step: int, num_samples: int, sample_rate: float) -> np.ndarray:
    """The rows of step ``step``'s batch over all ``num_samples`` rows (sorted), a function of the four arguments only.

    Each row is included independently with probability ``sample_rate`` (see the module docstring); the cost is
    proportional to the batch, not to ``num_samples``.

    Example::

        >>> rows = global_rows(7, 0, 10**8, 1e-5)  # 10⁸ rows: about a thousand drawn, nothing per row
        >>> bool(800 < rows.size < 1200), bool((np.diff(rows) > 0).all()), bool(rows[-1] < 10**8)
        (True, True, True)
        >>> bool((rows == global_rows(7, 0, 10**8, 1e-5)).all()), rows.size == global_rows(7, 1, 10**8, 1e-5).size
        (True, False)
    """
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=(int(step),))))
    return _gap_rows(rng.random, num_samples, sample_rate)


def global_mask(seed: int, step: int, num_samples: int, sample_rate: float) -> np.ndarray:
    """:func:`global_rows` as a boolean mask over all ``num_samples`` rows (for tests and inspection: O(N) memory).

    Example::

        >>> m = global_mask(7, 0, 10_000, 0.1)
        >>> m.dtype, bool(abs(m.mean() - 0.1) < 0.01), bool((m == global_mask(7, 0, 10_000, 0.1)).all())
        (dtype('bool'), True, True)
        >>> bool((m == global_mask(7, 1, 10_000, 0.1)).all())
        False
    """
    mask = np.zeros(num_samples, dtype=bool)
    mask[global_rows(seed, step, num_samples, sample_rate)] = True
    return mask


def _os_uniform(n: int) -> np.ndarray:
    """n uniform numbers in [0, 1) with 53 bits each from the OS CSPRNG (``os.urandom``)."""
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return bits.astype(np.float64) * 2.0**-53


def secure_rows(rank: int, world_size: int, num_samples: int, sample_rate: float) -> List[int]:
    """Rank ``rank``'s rows of one batch, every decision from ``os.urandom``: gaps over the rank's own rows.

    The rank's rows are ``rank, rank + W, …``; the gaps run over that subsequence, so the cost is proportional to the
    rank's share of the batch. The ranks' rows are disjoint and their bits independent, so the union is one
    Bernoulli(p) mask over all rows.
    """
    own = len(range(rank, num_samples, world_size))
    return (rank + world_size * _gap_rows(_os_uniform, own, sample_rate)).tolist()


class PoissonBatchSampler(Sampler[List[int]]):
    """Yields this rank's share of one independent Poisson-sampled batch per step (see the module docstring).

    Args:
        num_samples: rows of the whole training set (all ranks).
        sample_rate: each row's inclusion probability per step.
        steps: batches per epoch (``iter()`` yields exactly this many, empty ones included).
        seed: the sampling seed (ignored with ``secure``); the caller resolves ``None`` to a fresh one per fit.
        rank, world_size: this process's place among the data-parallel ranks.
        start_step: called at every ``iter()``; the number of optimizer steps taken so far (the index of the epoch's
            first mask). Default: continue after the last yielded batch.
        secure: draw every decision from ``os.urandom`` instead of the seeded generator.
        units: ``None``: the units drawn are rows. Else a function from the drawn unit indices (sorted, this rank's:
            index mod ``world_size`` = ``rank``) to the rows of the batch — the people of user-level sampling, each
            bringing all their rows, or the rows kept under a contribution bound
            (:class:`~lightning_privacy.dpsgd.users.People`); ``num_samples`` then counts units.

    Example::

        >>> ranks = [PoissonBatchSampler(num_samples=8, sample_rate=0.5, steps=3, seed=1, rank=r, world_size=2)
        ...          for r in range(2)]
        >>> one = PoissonBatchSampler(num_samples=8, sample_rate=0.5, steps=3, seed=1)
        >>> [sorted(a + b) for a, b in zip(*ranks)] == list(one)  # the ranks' batches are the single-process batch
        True
    """

    def __init__(
        self,
        *,
        num_samples: int,
        sample_rate: float,
        steps: int,
        seed: Optional[int] = None,
        rank: int = 0,
        world_size: int = 1,
        start_step: Optional[Callable[[], int]] = None,
        secure: bool = False,
        units: Optional[Callable[[np.ndarray], np.ndarray]] = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"`num_samples` must be a positive int, got {num_samples!r}")
        if not 0.0 < float(sample_rate) <= 1.0:
            raise ValueError(f"`sample_rate` must be in (0, 1], got {sample_rate!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"`steps` must be a positive int, got {steps!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"`rank` must be in [0, world_size={world_size}), got {rank!r}")
        if seed is None and not secure:
            raise ValueError("`seed` is required unless `secure=True` (resolve None with draw_seed())")
        self.num_samples, self.sample_rate, self.steps = num_samples, float(sample_rate), steps
        self.seed, self.rank, self.world_size, self.secure = seed, rank, world_size, secure
        self.start_step = start_step
        self.units = units
        self.next_step = 0  # index of the next mask when no start_step is given
        self.last_step: Optional[int] = None  # index of the mask of the last yielded batch
        self.recent: Dict[int, List[int]] = {}  # the last batches' rows by step (the neighbour check re-collates them)

    def __len__(self) -> int:
        return self.steps

    def local_batch(self, step: int) -> List[int]:
        """This rank's rows of step ``step``'s batch (with ``secure``: a fresh draw, whatever ``step``)."""
        if self.secure:
            drawn = np.asarray(secure_rows(self.rank, self.world_size, self.num_samples, self.sample_rate), np.int64)
        else:
            drawn = global_rows(self.seed, step, self.num_samples, self.sample_rate)
            drawn = drawn[drawn % self.world_size == self.rank]
        return (drawn if self.units is None else self.units(drawn)).tolist()

    def __iter__(self) -> Iterator[List[int]]:
        first = int(self.start_step()) if self.start_step is not None else self.next_step
        for step in range(first, first + self.steps):
            self.last_step, self.next_step = step, step + 1
            rows = self.local_batch(step)
            self.recent[step] = rows
            self.recent.pop(step - 16, None)  # (a loader prefetches a few batches ahead, never 16)
            yield rows


class PoissonDataLoader(DataLoader):
    """The user's loader with its batches drawn by :class:`PoissonBatchSampler` (dataset, collate, workers kept).

    Empty batches have the structure of a collated batch (tensors of zero rows in the same tuples, lists and dicts:
    :func:`empty_batch_like`), whether or not a non-empty batch came first, for tuple and dict examples alike (Opacus'
    ``wrap_collate_with_empty`` failed on an empty first batch of dict examples, as a tokenizer gives).
    ``placeholder`` is the dataset's first example collated alone (one row): what a sharded module (FSDP2) runs
    with its loss multiplied by zero when this rank's batch is empty, since every rank must join the module's
    collectives (see :class:`~lightning_privacy.DPSGD`).
    """

    def __init__(self, loader: DataLoader, batch_sampler: PoissonBatchSampler) -> None:
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError("Poisson sampling needs a map-style dataset, got an IterableDataset")
        second = loader.dataset[1] if len(loader.dataset) > 1 else None
        collate = _CollateWithEmpty(loader.collate_fn or default_collate, loader.dataset[0], second)
        kwargs: Dict[str, Any] = dict(
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            persistent_workers=loader.persistent_workers,
        )
        if loader.num_workers > 0:
            kwargs["prefetch_factor"] = loader.prefetch_factor
        # the workers' base seed comes from the loader's own generator (or a private one), never from torch's global
        # generator: drawing it there would shift the user's random stream (e.g. the noise) at every epoch
        generator = loader.generator if loader.generator is not None else torch.Generator()
        super().__init__(loader.dataset, batch_sampler=batch_sampler, collate_fn=collate, generator=generator, **kwargs)
        self.sample_rate = batch_sampler.sample_rate
        self.original = loader
        self.placeholder = collate.placeholder
        self.per_example = collate.per_example  # which leaves of a batch hold its examples' rows (example_leaves)
        self.by_rows = collate.by_rows  # a batch splits into its examples by rows (splits_by_rows)


class _CollateWithEmpty:
    """The loader's ``collate_fn``, and for an empty list of rows :func:`empty_batch_like` a collated example."""

    def __init__(self, collate: Callable[[List[Any]], Any], example: Any, second: Any = None) -> None:
        self.collate = collate
        self.placeholder = collate([example])
        self.empty = empty_batch_like(self.placeholder)
        self.per_example = None if second is None else example_leaves(self.placeholder, collate([example, second]))
        # whether a batch splits into its examples by rows; else the per-example passes collate each one alone
        self.by_rows = second is None or splits_by_rows(
            self.placeholder, collate([second]), collate([example, second]), self.per_example
        )

    def __call__(self, rows: List[Any]) -> Any:
        return self.collate(rows) if rows else self.empty


def example_leaves(one: Any, two: Any) -> Optional[Tuple[bool, ...]]:
    """Which leaves of a collated batch hold one row per example, from the loader's own ``collate_fn`` on one example
    (``one``) and on two (``two``): a leaf is per-example when it is a tensor whose first dimension is 1 in the first
    batch and 2 in the second; anything else the collate adds (a class prior of shape [3], a batch-level scalar or
    [1] tensor) is shared by the batch's examples, whatever the batch's size. ``None`` when the two batches differ in
    structure (no leaf-by-leaf answer).

    Example::

        >>> collate = lambda rows: (torch.stack(rows), torch.zeros(3))  # rows, and a shared [3] prior
        >>> example_leaves(collate([torch.ones(2)]), collate([torch.ones(2), torch.ones(2)]))
        (True, False)
    """
    from torch.utils._pytree import tree_flatten

    first, spec = tree_flatten(one)
    second, spec_two = tree_flatten(two)
    if spec != spec_two:
        return None
    return tuple(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.ndim > 0 and b.ndim > 0
        and a.shape[0] == 1 and b.shape[0] == 2
        for a, b in zip(first, second)
    )  # fmt: skip


def splits_by_rows(one: Any, other: Any, two: Any, per_example: Optional[Sequence[bool]]) -> bool:
    """Whether a batch splits into its examples by rows: the loader's ``collate_fn`` on two examples (``two``) holds,
    leaf by leaf, the first example collated alone (``one``) as its first row and the second (``other``) as its
    second, and the leaves shared by the batch equal in all three. Values, not sizes, are compared, so a coincidence of
    sizes cannot pass; torchtext's ``(label, text, offsets)`` fails it (the texts are concatenated, the second offset
    counts from the batch's start). Where it fails the per-example passes collate each example alone
    (:class:`~lightning_privacy.dpsgd.functional.Examples`).

    Example::

        >>> def collate(rows):  # torchtext's: the texts concatenated, each one's offset
        ...     return torch.cat(rows), torch.tensor([0] + [len(r) for r in rows[:-1]]).cumsum(0)
        >>> a, b = torch.tensor([1, 2]), torch.tensor([3])
        >>> two = collate([a, b])
        >>> splits_by_rows(collate([a]), collate([b]), two, example_leaves(collate([a]), two))
        False
        >>> stack = lambda rows: torch.stack(rows)
        >>> splits_by_rows(stack([a]), stack([a + 1]), stack([a, a + 1]), (True,))
        True
    """
    from torch.utils._pytree import tree_flatten

    first, spec = tree_flatten(one)
    second, spec_other = tree_flatten(other)
    both, spec_two = tree_flatten(two)
    if per_example is None or spec != spec_other or spec != spec_two or len(per_example) != len(both):
        return False

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
        return type(a) is type(b) and a == b

    for flag, a, b, ab in zip(per_example, first, second, both):
        if flag and not (same(ab[:1], a) and same(ab[1:2], b)):
            return False
        if not flag and not (same(a, ab) and same(b, ab)):
            return False
    return True


def empty_batch_like(batch: Any) -> Any:
    """``batch`` with every tensor cut to zero rows (same dtype, device and trailing shape; tuples, lists, dicts kept).

    Anything else in the batch (a string, a number) cannot be emptied without inventing a value, and raises
    ``TypeError`` naming its type: a batch with no rows must carry nothing of any row.

    Example::

        >>> empty = empty_batch_like({"input_ids": torch.ones(1, 5, dtype=torch.long), "label": torch.ones(1)})
        >>> {k: tuple(v.shape) for k, v in empty.items()}
        {'input_ids': (0, 5), 'label': (0,)}
    """
    if isinstance(batch, torch.Tensor):
        return batch[:0].clone() if batch.ndim else batch.new_zeros(())
    if isinstance(batch, dict):
        return type(batch)((k, empty_batch_like(v)) for k, v in batch.items())
    if isinstance(batch, (tuple, list)):
        items = [empty_batch_like(v) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    raise TypeError(
        f"Poisson sampling cannot form an empty batch holding a {type(batch).__name__}: a batch of no rows must carry "
        "nothing of any row; let the loader's collate_fn return tensors (in tuples, lists or dicts) only."
    )


def replaced_sampler_name(loader: DataLoader) -> Optional[str]:
    """The class name of a custom sampler or batch sampler of ``loader`` that Poisson sampling replaces, or None."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return type(batch_sampler).__name__
    sampler = getattr(loader, "sampler", None)
    if sampler is not None and type(sampler) not in (RandomSampler, SequentialSampler, DistributedSampler):
        return type(sampler).__name__
    return None


def is_empty_batch(batch: Any) -> bool:
    """True when every tensor in ``batch`` (nested tuples, lists, dicts) has no rows: an empty Poisson batch."""
    if isinstance(batch, torch.Tensor):
        return batch.ndim > 0 and batch.shape[0] == 0
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        found = [is_empty_batch(item) for item in batch if isinstance(item, (torch.Tensor, tuple, list, dict))]
        return bool(found) and all(found)
    return False


def batch_rows(batch: Any, per_example: Optional[Tuple[bool, ...]] = None) -> Optional[int]:
    """The examples in ``batch``: the first dimension of its first per-example leaf (``per_example``, from
    :func:`example_leaves`, where it matches the batch's leaves), else of its first tensor of at least one dimension
    (nested tuples, lists, dicts; batch-first, as Opacus' hooks assume), or ``None`` when it holds no such tensor."""
    if per_example is not None:
        from torch.utils._pytree import tree_flatten

        leaves, _ = tree_flatten(batch)
        if len(leaves) == len(per_example):
            found = [x for x, flag in zip(leaves, per_example) if flag and isinstance(x, torch.Tensor) and x.ndim > 0]
            if found:
                return int(found[0].shape[0])
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for item in batch:
            rows = batch_rows(item)
            if rows is not None:
                return rows
    return None

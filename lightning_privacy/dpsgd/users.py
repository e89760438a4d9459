"""The privacy unit as a person: who owns each row, the contribution bound, and what a step samples and clips.

``DPSGD(privacy_unit="user", user_ids=..., max_examples_per_user=k)`` protects people, not rows: neighbouring
training sets differ by all the rows of one person (Charles et al., SaTML 2025, arXiv 2407.07737; Chua et al. 2024,
arXiv 2406.14322). :class:`People` is built once per fit from the train dataset's row order:

- **who**: ``user_ids`` gives each row's person (any hashable values; ``None``/NaN refused); people are numbered
  0 … U − 1 in order of first appearance.
- **the contribution bound k**: a person with more than k rows keeps k of them, chosen by a rule fixed before
  training — a secret uniform choice (the fit's sampling seed, or the OS's entropy) — and the rest are never sampled;
  :attr:`People.rows_left_out` and :attr:`People.people_capped` count them (the report and the statement say so).
- **what a step samples**: under user-level sampling (``user_sampling=True``, "ULS") each *person* joins a step with
  probability q, bringing all their kept rows (:meth:`People.rows_of_people`); under example-level sampling ("ELS")
  each kept *row* joins on its own (:meth:`People.kept_rows`). The Poisson sampler draws unit indices either way
  (:class:`~lightning_privacy.dpsgd.sampling.PoissonBatchSampler`'s ``units``), so DDP ranks split people, never a
  person.
- **what a step clips** (ULS): each person's gradient is the sum (or mean, ``user_reduction``) of their rows' per-example
  gradients, clipped to C as one vector (:func:`fold`); ELS clips each row, as record-level DP-SGD does.

No Lightning import here: this is data bookkeeping the sampler, the clipping engines and the statement share.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import secrets
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["People", "fold", "person_index"]


class People:
    """Each row's person and the rows kept under the contribution bound (see the module docstring).

    Args:
        user_ids: the person of each of the ``len(user_ids)`` rows, in the train dataset's row order.
        max_examples_per_user: k ≥ 1, the most rows of one person any step can see; ``None``: no bound (each
            person's count is then part of the accounting's group size only through ELS's ``k``, so ULS alone may go
            without it).
        seed: the secret seed of the choice of kept rows (``None``: the OS's entropy).

    Example::

        >>> people = People(["ann", "bob", "ann", "ann", "cy"], max_examples_per_user=2, seed=0)
        >>> people.num_people, people.rows_left_out, people.people_capped
        (3, 1, 1)
        >>> [len(people.rows_of(u)) for u in range(3)]
        [2, 1, 1]
        >>> sorted(people.rows_of_people(np.array([1, 2])).tolist())
        [1, 4]
    """

    def __init__(self, user_ids: Sequence[Any], *, max_examples_per_user: Optional[int], seed: Optional[int]) -> None:
        ids = list(user_ids)
        missing = [i for i, v in enumerate(ids) if v is None or (isinstance(v, float) and math.isnan(v))]
        if missing:
            raise ValueError(
                f"`user_ids` has no person for {len(missing)} row(s) (None or NaN), the first at row {missing[0]}: "
                "give every training row its person's id."
            )
        numbering: dict = {}
        person = np.empty(len(ids), dtype=np.int64)
        for i, value in enumerate(ids):
            key: Hashable = value.item() if isinstance(value, (np.generic, torch.Tensor)) else value
            person[i] = numbering.setdefault(key, len(numbering))
        self.person_of = person  # every row's person, 0 … U − 1 in order of first appearance
        self.num_people = len(numbering)
        self.max_examples_per_user = max_examples_per_user
        order = np.argsort(person, kind="stable")
        counts = np.bincount(person, minlength=self.num_people)
        starts = np.concatenate([[0], np.cumsum(counts)])
        key = secrets.randbits(128) if seed is None else int(seed)
        keys = list(numbering)
        kept: List[np.ndarray] = []
        for u in range(self.num_people):
            rows = order[starts[u] : starts[u + 1]]
            if max_examples_per_user is not None and len(rows) > max_examples_per_user:
                # each person's choice from a generator of its own (the key and the person's id): another person's
                # presence changes nothing of it, as add/remove of one person requires
                rng = np.random.default_rng(np.random.SeedSequence(key, spawn_key=(_stable_hash(keys[u]),)))
                rows = np.sort(rng.choice(rows, size=max_examples_per_user, replace=False))
            kept.append(rows)
        self._kept = kept
        self._flat = np.sort(np.concatenate(kept)) if kept else np.zeros(0, dtype=np.int64)
        self.rows_left_out = int(len(ids) - len(self._flat))
        self.people_capped = int(sum(len(r) < c for r, c in zip(kept, counts)))
        self.largest = int(max((len(r) for r in kept), default=0))  # the most rows one person has after the bound

    @property
    def num_rows(self) -> int:
        return len(self.person_of)

    def rows_of(self, person: int) -> np.ndarray:
        """The kept rows of ``person`` (sorted)."""
        return self._kept[int(person)]

    def kept_rows(self, selected: np.ndarray) -> np.ndarray:
        """ELS: the kept rows at positions ``selected`` of the sorted kept rows (the Poisson sampler's units)."""
        return self._flat[np.asarray(selected, dtype=np.int64)]

    @property
    def num_kept(self) -> int:
        return len(self._flat)

    def rows_of_people(self, selected: np.ndarray) -> np.ndarray:
        """ULS: every kept row of the people ``selected``, person by person (each person's rows contiguous)."""
        parts = [self._kept[int(u)] for u in np.asarray(selected).reshape(-1)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _stable_hash(value: Hashable) -> int:
    """A hash of a person's id that is the same in every process (Python's ``hash`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little")


def person_index(people: People, rows: Sequence[int], device: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """For a batch of dataset ``rows`` (in batch order): each row's person numbered 0 … P − 1 within the batch (in
    order of first appearance) and each of the P people's row count."""
    persons = people.person_of[np.asarray(rows, dtype=np.int64)]
    _, first, inverse, counts = np.unique(persons, return_index=True, return_inverse=True, return_counts=True)
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))  # numbered by first appearance
    index = torch.as_tensor(rank[inverse], dtype=torch.long, device=device)
    return index, torch.as_tensor(counts[np.argsort(first, kind="stable")], dtype=torch.long, device=device)


def fold(per_example: torch.Tensor, index: torch.Tensor, counts: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-example gradients ``[B, ...]`` summed per person ``[P, ...]`` (``reduction="mean"``: divided by the
    person's rows in the batch).

    Example::

        >>> g = torch.tensor([[1.0], [2.0], [4.0]])
        >>> fold(g, torch.tensor([0, 1, 0]), torch.tensor([2, 1]), "sum").tolist()
        [[5.0], [2.0]]
        >>> fold(g, torch.tensor([0, 1, 0]), torch.tensor([2, 1]), "mean").tolist()
        [[2.5], [2.0]]
    """
    out = per_example.new_zeros((len(counts), *per_example.shape[1:]))
    out.index_add_(0, index.to(per_example.device), per_example)
    if reduction == "mean":
        out /= counts.to(out.device, out.dtype).reshape(-1, *[1] * (out.dim() - 1))
    return out


def check_user_arguments(privacy_unit: Any, user_ids: Any, k: Any, user_sampling: Any, user_reduction: Any) -> None:
    """One sentence naming the argument and the fix for each bad user-level argument."""
    if privacy_unit not in ("example", "user"):
        raise ValueError(f"DPSGD(privacy_unit={privacy_unit!r}): use 'example' (rows, the default) or 'user' (people).")
    if privacy_unit == "example":
        given = [n for n, v in (("user_ids", user_ids), ("max_examples_per_user", k)) if v is not None]
        if given:
            raise ValueError(
                f"DPSGD({given[0]}=...) describes people, but privacy_unit='example' protects rows: pass "
                "privacy_unit='user' to protect people."
            )
        return
    if user_ids is None:
        raise ValueError(
            "DPSGD(privacy_unit='user') needs `user_ids`: the person of each training row (a sequence in the train "
            "dataset's row order, or the name of the dataset's field holding it)."
        )
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
        raise ValueError(
            f"DPSGD(max_examples_per_user={k!r}): the contribution bound must be a whole number ≥ 1 (the most rows of "
            "one person a step can see)."
        )
    if not isinstance(user_sampling, bool):
        raise ValueError(f"DPSGD(user_sampling={user_sampling!r}): True (sample people) or False (sample rows).")
    if not user_sampling and k is None:
        raise ValueError(
            "DPSGD(privacy_unit='user', user_sampling=False) samples rows, so a person's privacy rests on how many rows "
            "they have: give max_examples_per_user=k (the accounting is then for groups of k rows)."
        )
    if user_reduction not in ("sum", "mean"):
        raise ValueError(
            f"DPSGD(user_reduction={user_reduction!r}): 'sum' or 'mean' of a person's rows' gradients before clipping."
        )


def unit_row(unit: Dict[str, Any]) -> Tuple[str, str]:
    """A person-level run's unit as the report and the statement show it, from its record (``{"unit": "user",
    "max_examples_per_user", "user_sampling", "user_reduction"}``): the value and how a person's rows were used."""
    k = unit.get("max_examples_per_user")
    value = f"person, at most {k} rows" if k else "person, all their rows (no bound)"
    if unit.get("user_sampling"):
        return (
            value,
            f"people sampled whole, each person's {unit.get('user_reduction', 'sum')} of gradients clipped to C",
        )
    return value, f"rows sampled one by one, each clipped to C, accounted for groups of {k} rows"


def report_rows(dp: Any) -> List[Tuple[str, str, str]]:
    """The privacy report's rows of a person-level run (none for a row-level one): the unit and its bound, the
    people and the rows left out, and the same run's ε for one row beside the person's."""
    if getattr(dp, "privacy_unit", "example") != "user":
        return []
    k = dp.max_examples_per_user
    record = {"unit": "user", "max_examples_per_user": k, "user_sampling": dp.user_sampling,
              "user_reduction": dp.user_reduction}  # fmt: skip
    rows = [("privacy unit", *unit_row(record))]
    people = getattr(dp, "people", None)
    if people is not None:
        rows.append((
            "people",
            f"{people.num_people} ({people.rows_left_out} rows of {people.people_capped} people left out)",
            f"the rows beyond k = {k} per person, by a secret choice fixed before training, never sampled"
            if k else "no contribution bound",
        ))  # fmt: skip
    if dp.steps:
        rows.append((
            f"ε of one row at δ = {dp.delta:g}",
            f"{dp.record_epsilon():.4g}",
            "the same run's guarantee for adding or removing one row (not a person): "
            + ("a row of a sampled person moves their clipped gradient by up to 2C" if dp.user_sampling
               else "one row's Poisson-sampled Gaussian"),
        ))  # fmt: skip
    return rows


def row_epsilon(history: Sequence[Tuple[float, float, int]], *, user_sampling: bool, delta: float) -> float:
    """A person-level run's ε for one *row* (add/remove) from its ledger's ``history`` of (σ, q, steps): under
    example-level sampling a row's own Poisson-subsampled Gaussian (one of the person's k rows); under user-level
    sampling the Gaussian of sensitivity 2C (a row of a sampled person moves their clipped gradient by up to 2C: σ/2
    at sensitivity C). A certified upper bound (the pessimistic PLD); 0 before a step.

    Example::

        >>> round(row_epsilon([(2.0, 0.1, 300)], user_sampling=False, delta=1e-5), 3)  # a row-level run's ε
        4.183
    """
    from lightning_privacy.analysis.composition import ComposedPLD

    steps = [(s, q, t) for s, q, t in history if t > 0]
    if not steps:
        return 0.0
    pld = ComposedPLD(relation="add_remove")
    for sigma, rate, count in steps:
        pld.compose(sample_rate=rate, noise_multiplier=sigma / (2.0 if user_sampling else 1.0), steps=count)
    return float(pld.epsilon_uncapped(delta))

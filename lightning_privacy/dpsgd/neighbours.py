"""The neighbour check: removing one example moves the step's pre-noise clipped sum by at most C — the DP premise.

Every other check compares an example's gradient with another computation of the same example's gradient. This one
tests the premise DP-SGD's guarantee rests on: the step's clipped sum S over a batch and the sum S₋ᵢ over the same
batch without example i differ by at most C, ‖S − S₋ᵢ‖ ≤ C, whatever else the model does. A model can break it while
every per-example gradient is computed exactly: a loss averaged over the batch's *padded* length (the longest row sets
everyone's padding, so its presence rescales every other example's loss), a buffer written from the batch in
``forward`` and used in the output (running statistics), a batch statistic.

On the first steps and on a share ``rate`` of the later ones (drawn from a private generator: the same steps on every
rank, never torch's global random stream), before the step's forward pass, the check takes this step's rows from the
train loader's dataset (the indices its Poisson sampler drew for the step), collates them with the loader's own
``collate_fn`` — all of them, and all but one — and computes both clipped sums with the functional engine
(:class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`: each example's whole gradient, clipped to C), in
train mode with dropout off, the module's buffers restored around each pass. The examples removed: the one whose collated row is
largest (the one that sets a padded batch's length) and one drawn at random. A difference above C (with a float
allowance) stops the fit before the step's noised update, naming the likely causes; the largest ratio ‖S − S₋ᵢ‖ / C is
kept for the report. A step whose forward pass stays random with dropout off (``F.dropout`` in the model's code: the
full batch's sum differs between two passes) is counted as not comparable, not compared. Under FSDP2 (sharded
parameters) it does not run.

Example::

    >>> import torch
    >>> data = [torch.tensor([float(i)]) for i in range(1, 5)]
    >>> lin = torch.nn.Linear(1, 1, bias=False)
    >>> step = lambda rows: (lin(rows) ** 2).sum() / 2  # one example's loss
    >>> check = NeighbourCheck(lin, max_grad_norm=1.0, dataset=data, collate=torch.stack, rate=0.0)
    >>> ratio = check.run([0, 1, 2, 3], step)
    >>> 0 < ratio <= 1.0  # each example moves the sum by its clipped gradient, at most C
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_privacy import _compat
from lightning_privacy.dpsgd import functional, users
from lightning_privacy.dpsgd.sampled_exactness import dropout_off

__all__ = ["DEFAULT_RATE", "FIRST_STEPS", "NeighbourCheck", "NeighbourRecord", "NeighbourViolation"]

#: share of the later steps checked (drawn before each step); the first steps are always checked
DEFAULT_RATE = 0.005
FIRST_STEPS = 2
#: float allowance on ‖S − S₋ᵢ‖ ≤ C: relative to C, and to the sum's size (the two sums round apart)
RTOL, SUM_TOL = 1e-4, 1e-6

CAUSES = (
    "a loss averaged over the batch's padded length (the longest row sets every row's padding: divide each example's "
    "loss by its own length), a buffer written from the batch in `forward` and used in the output (running "
    "statistics), or a statistic of the batch (BatchNorm in train mode, `x - x.mean(0)`)"
)


class NeighbourViolation(MisconfigurationException):
    """Removing one example moved the step's clipped sum by more than C."""


@dataclasses.dataclass
class NeighbourRecord:
    """What the neighbour check compared in a fit: ``steps`` checked, ``removed`` examples, the largest
    ``‖S − S₋ᵢ‖ / C`` seen (``None``: not run; ``reason`` says why) and the steps not comparable."""

    steps: int = 0
    removed: int = 0
    max_ratio: Optional[float] = None
    not_comparable: int = 0  # steps whose forward pass stayed random (two passes of the same batch differ)
    rate: float = DEFAULT_RATE
    reason: str = ""


class NeighbourCheck:
    """Checks ‖S − S₋ᵢ‖ ≤ C on the first and sampled later steps (see the module docstring).

    Args:
        module: the module trained (its ``training_step`` runs on the re-collated batches).
        max_grad_norm: C.
        dataset: the train loader's dataset (indexable by the sampler's indices).
        collate: the train loader's ``collate_fn`` (a list of dataset items to a batch).
        rate: share of the later steps checked (0: the first steps only).
        first_steps: steps always checked at the start.
        per_example: which leaves of a batch hold its examples (``sampling.example_leaves``).
        to_device: moves a collated batch where the module is (default: unchanged).
        rtol: the allowance on ‖S − S₋ᵢ‖ ≤ C relative to C (DPSGD gives 16-bit precision 5e-2, as its other checks).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        max_grad_norm: float,
        dataset: Any,
        collate: Callable[[List[Any]], Any],
        rate: float = DEFAULT_RATE,
        first_steps: int = FIRST_STEPS,
        per_example: Optional[Sequence[bool]] = None,
        to_device: Optional[Callable[[Any], Any]] = None,
        rtol: float = RTOL,
    ) -> None:
        self.module, self.max_grad_norm = module, float(max_grad_norm)
        self.dataset, self.collate = dataset, collate
        self.rate, self.first_steps, self.rtol = float(rate), int(first_steps), float(rtol)
        self.to_device = to_device or (lambda batch: batch)
        self.engine = functional.FunctionalClipping(module, max_grad_norm=max_grad_norm)
        self.engine.per_example = None if per_example is None else tuple(per_example)
        self.record = NeighbourRecord(rate=self.rate)
        self._steps = torch.Generator().manual_seed(3)  # which later steps: the same draws on every rank
        self._examples = torch.Generator().manual_seed(4)  # which example besides the largest
        self._seen = 0
        self.disabled = False  # the check could not run this model (the record's reason says why)
        #: user-level sampling (:mod:`~lightning_privacy.dpsgd.users`): the unit removed is a person — all their rows —
        #: and each person's summed (or averaged: ``reduction``) gradient is clipped, as the step clips it
        self.people: Any = None
        self.reduction = "sum"
        self.by_rows = True  # a batch splits into its examples by rows; else each is collated alone (torchtext's)

    def due(self) -> bool:
        """At every batch (empty ones too, so that every rank draws alike): is this step checked?"""
        self._seen += 1
        draw = float(torch.rand((), generator=self._steps)) < self.rate if self.rate > 0 else False
        return self._seen <= self.first_steps or draw

    def disable(self, error: BaseException) -> str:
        """Stop checking (the check cannot run this model or data); returns the reason, kept in the record."""
        self.disabled = True
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        self.record.reason = f"not run: the functional passes failed ({type(error).__name__}: {first[:200]})"
        return self.record.reason

    def run(self, indices: Sequence[int], step: Callable[[Any], Any]) -> float:
        """‖S − S₋ᵢ‖ / C for this step's rows ``indices`` (the largest over the examples removed); raises above 1.

        Raises:
            NeighbourViolation: removing one example moved the clipped sum by more than C (the sentence names the
                example, the ratio and the likely causes).
        """
        indices = [int(i) for i in indices]
        groups = self._units(indices)  # positions in the batch of each unit: a row, or a person's rows
        if len(groups) < 2:
            return 0.0
        items = [self.dataset[i] for i in indices]
        removed = self._removed(items, groups)
        everyone = list(range(len(items)))
        saved = {name: b.detach().clone() for name, b in self.module.named_buffers()}
        with dropout_off(self.module), _compat.backward_hooks_detached(self.module):  # (train mode: a buffer shows)
            full = self._sum(indices, items, everyone, step, saved)
            scale = float(torch.sqrt(sum(s.double().pow(2).sum() for s in full)))
            worst = 0.0
            for group in removed:
                rest = [p for p in everyone if p not in set(group)]
                without = self._sum(indices, items, rest, step, saved)
                moved = float(torch.sqrt(sum((a.double() - b.double()).pow(2).sum() for a, b in zip(full, without))))
                ratio = moved / self.max_grad_norm
                worst = max(worst, ratio)
                if moved > self.max_grad_norm * (1 + self.rtol) + SUM_TOL * scale:
                    if self._random(indices, items, step, saved, full):  # (the forward pass stayed random)
                        self.record.not_comparable += 1
                        return 0.0
                    self._count(len(removed), worst)
                    what = (
                        f"one person ({len(group)} row(s) of this step's batch of {len(items)})"
                        if self.people is not None
                        else f"one example (row {group[0]} of this step's batch of {len(items)})"
                    )
                    unit = "person" if self.people is not None else "example"
                    raise NeighbourViolation(
                        f"DPSGD: removing {what}, the batch collated again by the train loader's collate_fn, moved the "
                        f"step's clipped sum by {ratio:.3g}·C, more than the C = {self.max_grad_norm:g} that DP-SGD's "
                        f"guarantee rests on (one {unit} moves the step by at most C), so ε does not bound this "
                        f"training: the examples' gradients depend on each other. Likely causes: {CAUSES}. The fit "
                        "stops before this step's noised update."
                    )
        self._count(len(removed), worst)
        return worst

    def _units(self, indices: List[int]) -> List[List[int]]:
        """The batch's units as lists of positions: each row, or (user-level sampling) each person's rows."""
        if self.people is None:
            return [[p] for p in range(len(indices))]
        groups: Dict[int, List[int]] = {}
        for position, row in enumerate(indices):
            groups.setdefault(int(self.people.person_of[row]), []).append(position)
        return list(groups.values())

    def _random(
        self,
        indices: List[int],
        items: List[Any],
        step: Callable[[Any], Any],
        saved: Dict[str, torch.Tensor],
        full: list,
    ) -> bool:
        """Whether the full batch's clipped sum comes out otherwise a second time (``F.dropout`` in the model's code,
        which ``nn.Dropout`` switched off does not reach): then no difference says anything."""
        again = self._sum(indices, items, list(range(len(items))), step, saved)
        return any(not torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(full, again))

    def _count(self, removed: int, worst: float) -> None:
        self.record.steps += 1
        self.record.removed += removed
        self.record.max_ratio = max(self.record.max_ratio or 0.0, worst)

    def _removed(self, items: List[Any], groups: List[List[int]]) -> List[List[int]]:
        """The units to remove: the one holding the largest example once collated alone (a padded batch's length),
        and one at random."""
        from torch.utils._pytree import tree_leaves

        sizes = [
            sum(x.numel() for x in tree_leaves(self.collate([item])) if isinstance(x, torch.Tensor)) for item in items
        ]
        largest = max(range(len(groups)), key=lambda g: max(sizes[p] for p in groups[g]))
        other = int(torch.randint(len(groups), (), generator=self._examples))
        return [groups[largest]] if other == largest else [groups[largest], groups[other]]

    def _sum(
        self,
        indices: List[int],
        items: List[Any],
        positions: List[int],
        step: Callable[[Any], Any],
        saved: Dict[str, torch.Tensor],
    ) -> List[torch.Tensor]:
        """The clipped sum over the ``items`` at ``positions`` collated as one batch (per person under user-level
        sampling), the module's buffers as at the step's start."""
        self._restore(saved)
        items = [items[p] for p in positions]
        if self.people is not None:
            rows = [indices[p] for p in positions]
            device = self.engine.params[0].device if self.engine.params else None
            self.engine.units = lambda: (*users.person_index(self.people, rows, device=device), self.reduction)
        try:
            batch = self.to_device(self.collate(items))
            if not self.by_rows:
                batch = functional.Examples([self.to_device(self.collate([item])) for item in items], batch=batch)
            return self.engine.clipped_sum(batch, step).sums
        finally:
            self._restore(saved)

    def _restore(self, saved: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, buffer in self.module.named_buffers():
                if name in saved:
                    buffer.copy_(saved[name])

"""DPSGD's stand-in for the module's ``training_step`` and ``backward``: what every mode shares, and the dispatch to
the fit's mode (:mod:`lightning_privacy.dpsgd.modes`: hooks, ghost, functional, auto).

The contract (documented on :class:`~lightning_privacy.DPSGD`): ``training_step`` returns a reduced loss, one loss per
example (shape ``[batch_size]``), or a dict with both ``"loss"`` (what a plain ``Trainer`` trains on) and
``"per_example_loss"``, which DPSGD trains on, so one module trains unchanged with and without DPSGD. DPSGD stands in
for ``training_step`` on the instance for one fit to make that swap (Lightning passes only ``"loss"`` to
``backward``), and replaces ``LightningModule.backward`` — the documented hook for "perform backward on the loss
returned in training_step" — with the mode's.

Every step, whatever the mode: the trainable parameters are those of the fit's start; the neighbour check
(:mod:`lightning_privacy.dpsgd.neighbours`) and the sampled exactness check are drawn (the same draws on every rank);
a batch whose rows are not its examples (torchtext's) has each example collated alone for the per-example passes.

Empty Poisson batches never reach the module (on one process and under DDP): the step's gradient is zero for every
parameter (a backward pass of ``0 · Σ p``: DDP's reducer sees every parameter), and the DP optimizer adds the noise,
the noise-only update the accountant counts as one step. Under FSDP2 such a rank runs the module on a placeholder row
(:attr:`~lightning_privacy.dpsgd.sampling.PoissonDataLoader.placeholder`) whose loss ghost mode multiplies by zero.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_privacy.dpsgd import auto as auto_mode
from lightning_privacy.dpsgd import exactness, functional
from lightning_privacy.dpsgd.functional_mode import FunctionalMode
from lightning_privacy.dpsgd.ghost_mode import GhostMode
from lightning_privacy.dpsgd.hooks_mode import HooksMode
from lightning_privacy.dpsgd.modes import Mode, distributed, zero_missing_grads
from lightning_privacy.dpsgd.neighbours import NeighbourViolation
from lightning_privacy.dpsgd.sampled_exactness import SampledExactness
from lightning_privacy.dpsgd.sampling import batch_rows, is_empty_batch
from lightning_privacy.dpsgd.step_guards import StepGuards

__all__ = ["PerExampleBackward"]

_OVERRIDDEN = {
    "ghost": "runs its own two backward passes (norms, then the clipped sum)",
    "functional": "computes each example's gradient by torch.func instead of a backward pass of the batch",
}


class PerExampleBackward(StepGuards):
    """Stands in for ``pl_module.backward`` and ``training_step`` while DPSGD trains (see the module docstring).

    Args:
        pl_module: the module whose ``backward`` is replaced until :meth:`remove`.
        mode: ``"hooks"``, ``"ghost"`` or ``"functional"``.
        loss_reduction: ``"mean"`` or ``"sum"``, how per-example losses are reduced.
        hooks: Opacus' per-example hooks (``GradSampleHooks`` or ``GradSampleHooksFastGradientClipping``).
        param_names: parameter names by ``id``, for messages.
        should_check: true on the steps DPSGD self-checks (:mod:`lightning_privacy.dpsgd.exactness`).
        rtol: the exactness check's relative tolerance (16-bit precision needs more than 32-bit).
        record: where the exactness check records what it compared.
        exactness_examples: examples the exactness check compares per checked step (``None``: every one); a larger
            batch has that many drawn uniformly (the check's own generator, seeded 0; the global one is untouched).
        sharded: the module is sharded by FSDP2 (Opacus' FSDP hooks; no exactness check).
        one_pass: form ghost clipping's clipped sum by book-keeping where the module allows (not when sharded).
        engine: functional mode's :class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`.
        sampled: the exactness check on sampled later steps
            (:class:`~lightning_privacy.dpsgd.sampled_exactness.SampledExactness`; ``None``: not run).
        auto: ``grad_sample_mode="auto"`` started in hooks mode (:class:`~lightning_privacy.dpsgd.auto.AutoMode`).

    Attributes:
        impl: the fit's :class:`~lightning_privacy.dpsgd.modes.Mode` (``auto`` replaces it when it switches).
        last_norms: the per-example gradient norms of the last ghost or functional step (``None`` in hooks mode).
        last_rows: the examples of the last batch (0 for an empty one; ``None`` where the batch holds no tensor).

    Raises:
        MisconfigurationException: ghost or functional mode on a module that overrides ``backward``.
    """

    stands_in_for_a_fit = True  # (a copy of the module, e.g. a hook-free twin, leaves it out)

    def __init__(
        self,
        pl_module: pl.LightningModule,
        *,
        mode: str,
        loss_reduction: str,
        hooks: Any = None,
        param_names: Optional[Dict[int, str]] = None,
        should_check: Callable[[], bool] = lambda: False,
        rtol: float = 1e-3,
        record: Optional[exactness.ExactnessRecord] = None,
        exactness_examples: Optional[int] = exactness.MAX_EXAMPLES,
        sharded: bool = False,
        one_pass: bool = True,
        engine: Optional[functional.FunctionalClipping] = None,
        sampled: Optional[SampledExactness] = None,
        auto: Optional[auto_mode.AutoSwitch] = None,
    ) -> None:
        if mode in _OVERRIDDEN and is_overridden("backward", pl_module, parent=pl.LightningModule):
            raise MisconfigurationException(
                f"{type(pl_module).__name__} overrides `backward`, but DPSGD(grad_sample_mode={mode!r}) "
                f"{_OVERRIDDEN[mode]}, so remove the override or use grad_sample_mode='hooks'."
            )
        self.pl_module, self.loss_reduction, self.hooks, self.sharded = pl_module, loss_reduction, hooks, sharded
        self.sampled = sampled
        self._sampled_batch: Any = None  # a sampled later step: a copy of its batch and its training_step on rows
        self._sampled_step: Optional[Callable[[Any], Any]] = None
        self.param_names = param_names or {}
        self.should_check = should_check
        self.rtol = rtol
        self.record = record if record is not None else exactness.ExactnessRecord()
        # ghost mode: every step's sum is 16-bit (setup said so), and what counts a step bounded up to 16-bit rounding
        self.rounds_16_bit, self.on_rounded_step = False, lambda: None
        self.exactness_examples = exactness_examples
        self._rows_generator = torch.Generator().manual_seed(0)
        self.last_norms: Optional[torch.Tensor] = None
        self.clipping_rule: Any = None  # the rule ghost clipping's second pass applies (None: fixed at C)
        self.per_example: Optional[tuple] = None  # which batch leaves hold examples (set_example_leaves)
        # the neighbour check (dpsgd.neighbours) and this step's rows in the train loader's dataset (set by install)
        self.neighbours: Any = None
        self.current_rows: Callable[[], Optional[List[int]]] = lambda: None
        # a batch that rows do not split into its examples: each example collated alone (functional.Examples)
        self.examples_of: Optional[Callable[[Any], Any]] = None
        self.trainable = [p for p in pl_module.parameters() if p.requires_grad]
        # checked unchanged at every step, by name: FSDP2 swaps a module's parameter objects between sharded and
        # unsharded ones (the root's stay unsharded after a forward without backward, e.g. the sanity check)
        self._trainable_names = {name for name, p in pl_module.named_parameters() if p.requires_grad}
        self._layers = [
            (name, m) for name, m in pl_module.named_modules() if any(p.requires_grad for p in m.parameters(False))
        ]
        self._empty_step = False  # one process / DDP: this batch is empty and skipped the module
        self.last_rows: Optional[int] = None  # this batch's examples, from the batch itself
        self.impl: Mode = (
            FunctionalMode(self, engine) if mode == "functional"
            else GhostMode(self, one_pass=one_pass) if mode == "ghost"
            else auto_mode.AutoMode(self, auto) if auto is not None
            else HooksMode(self)
        )  # fmt: skip
        self._starter: Optional[Mode] = None  # the mode this step began in (auto may switch within it)
        self._original = pl_module.backward
        self._had_own = "backward" in vars(pl_module)
        pl_module.backward = self
        self._original_step = pl_module.training_step
        self._had_own_step = "training_step" in vars(pl_module)
        pl_module.training_step = self._training_step

    @property
    def mode(self) -> str:
        """``"hooks"``, ``"ghost"`` or ``"functional"``: what the current step runs in."""
        return self.impl.name

    @property
    def engine(self) -> Optional[functional.FunctionalClipping]:
        """Functional mode's engine (``None`` in the other modes)."""
        return getattr(self.impl, "engine", None)

    # ------------------------------------------------------------------------------------------- training_step
    def _training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``training_step`` through the fit's mode; an empty batch does not reach it (see the module
        docstring)."""
        batch = args[0] if args else kwargs.get("batch")
        self._check_trainable_unchanged()
        self._starter = self.impl
        empty = is_empty_batch(batch)
        # a batch whose rows are not its examples (torchtext's): the per-example passes take each collated alone
        examples = self.examples_of(batch) if self.examples_of is not None and not empty else batch
        self._start_sampled(examples, args, kwargs, empty=empty)
        self._check_neighbours(args, kwargs, empty=empty)
        self._empty_step = empty and not self.sharded
        if self._empty_step:  # a zero loss that reaches every trainable parameter (DDP's reducer waits for each)
            self.last_rows = 0
            return {"loss": torch.stack([p.sum() for p in self.trainable]).sum() * 0.0}
        if empty:  # FSDP2: the placeholder row, whose loss ghost mode multiplies by zero
            batch = self._placeholder()
            args, kwargs = ((batch, *args[1:]), kwargs) if args else (args, {**kwargs, "batch": batch})
        self.last_rows = batch_rows(batch, self.per_example)
        return self.impl.step(examples if not empty else batch, args, kwargs)

    # ------------------------------------------------------------------------------------------------ backward
    def __call__(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        starter, self._starter = self._starter, None
        if starter is not None and starter.finish(loss, *args, **kwargs):  # (auto: verified, perhaps switched)
            return
        if self._empty_step:
            self.empty_skipped(loss, *args, **kwargs)
            return
        self.check_rows(loss)
        self.impl.backward(loss, *args, **kwargs)

    def set_example_leaves(self, per_example: Optional[tuple]) -> None:
        """Which leaves of a batch hold one row per example (the train loader's collate on one and two examples,
        :func:`~lightning_privacy.dpsgd.sampling.example_leaves`): the batch's rows and the functional passes' split."""
        self.per_example = per_example
        for engine in (self.engine, getattr(self.sampled, "engine", None)):
            if engine is not None:
                engine.per_example = per_example

    def _check_neighbours(self, args: tuple, kwargs: Dict[str, Any], *, empty: bool) -> None:
        """On the neighbour check's steps, before the step's forward pass: removing one example moves the clipped sum
        by at most C (:mod:`lightning_privacy.dpsgd.neighbours`); every rank draws alike and decides together."""
        check = self.neighbours
        if check is None or not check.due():
            return
        rows = None if empty or check.disabled else self.current_rows()
        error: Optional[MisconfigurationException] = None
        if rows is not None and len(rows) > 1:
            if self.hooks is not None:
                self.hooks.disable_hooks()
            try:
                check.run(rows, self.rows_step(args, kwargs))
            except NeighbourViolation as err:
                error = err
            except Exception as err:  # noqa: BLE001 (a model or data the functional passes cannot run: said, not fatal)
                rank_zero_warn(f"DPSGD: the neighbour check is {check.disable(err)}; the fit goes on without it.")
            finally:
                if self.hooks is not None:
                    self.hooks.enable_hooks()
                self.impl.forget_captures()  # (ghost's book-keeping: what the check's passes captured)
        if distributed() and self.pl_module.trainer.strategy.reduce_boolean_decision(error is not None, all=False):
            error = error or MisconfigurationException(
                "DPSGD: on another process, removing one example moved the step's clipped sum by more than C (that "
                "process's error names it); the fit stops before this step's noised update."
            )
        if error is not None:
            raise error

    def rows_step(self, args: tuple, kwargs: Dict[str, Any]) -> Callable[[Any], Any]:
        """The user's ``training_step`` on other rows, its other arguments as Lightning gave them."""

        def step(rows: Any) -> Any:
            return self._original_step(rows, *args[1:], **kwargs) if args else self._original_step(**kwargs, batch=rows)

        return step

    def _start_sampled(self, batch: Any, args: tuple, kwargs: Dict[str, Any], *, empty: bool) -> None:
        """Every batch (empty ones too, so that every rank draws alike): is this step one of the sampled later steps
        the exactness check compares (:mod:`lightning_privacy.dpsgd.sampled_exactness`)?"""
        self._sampled_batch = self._sampled_step = None
        if self.sampled is None:
            return
        # hooks mode compares a few examples alone on its self-checked steps too: with a reduced loss the exactness
        # check there sees only the sum, which examples mixed by the model (`h - h.mean(0)`) keep
        first = self.should_check()
        if self.sampled.start_step(first_steps=first, force=first and self.mode == "hooks") and not empty:
            self._sampled_batch, self._sampled_step = functional._copy(batch), self.rows_step(args, kwargs)

    def check_sampled(self, got: Callable[[int, torch.Tensor], torch.Tensor], *, what: str, norms_only: bool,
                       losses: Optional[torch.Tensor]) -> None:  # fmt: skip
        """A sampled later step, after its backward: what it clips for a few examples against their gradients alone
        (Opacus' hooks off meanwhile); dropout back on."""
        batch, step = self._sampled_batch, self._sampled_step
        self._sampled_batch = self._sampled_step = None
        if batch is None or self.sampled is None:
            return
        if self.hooks is not None:
            self.hooks.disable_hooks()
        try:
            self.sampled.check(
                batch, step, got, what=what, norms_only=norms_only, batch_losses=losses, rows=int(self.last_rows or 0)
            )
        finally:
            if self.hooks is not None:
                self.hooks.enable_hooks()
            self.sampled.end_step()

    def start_batch(self, *, empty: bool) -> None:
        """Called at every batch start (the mode's: ghost's book-keeping, FSDP2's empty batches)."""
        self.impl.start_batch(empty=empty)

    def remove(self) -> None:
        """Give the module its own ``backward`` and ``training_step`` back (and remove the mode's hooks)."""
        if self.sampled is not None:
            self.sampled.end_step()
        self.impl.remove()
        for name, had_own, original in (
            ("backward", self._had_own, self._original),
            ("training_step", self._had_own_step, self._original_step),
        ):
            if had_own:
                setattr(self.pl_module, name, original)
            elif name in vars(self.pl_module):
                delattr(self.pl_module, name)

    def sampled_rows(self) -> Dict[str, Any]:
        """The exactness check's sample of a batch's examples (its size and its own generator)."""
        return {"max_examples": self.exactness_examples, "generator": self._rows_generator}

    def name_of(self, param: torch.Tensor) -> str:
        return self.param_names.get(id(param), f"<unnamed parameter of shape {tuple(param.shape)}>")

    def empty_skipped(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """An empty batch that skipped the module: zero gradients (DDP's reducer sees each parameter), no example."""
        self._empty_step = False
        if loss.requires_grad:
            self._original(loss, *args, **kwargs)
        zero_missing_grads(self.trainable)
        for param in self.trainable if self.mode == "hooks" else ():
            param.grad_sample = param.new_zeros((0, *param.shape))
        self.last_norms = loss.detach().new_zeros(0) if self.mode in ("ghost", "functional") else None

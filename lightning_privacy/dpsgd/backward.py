"""DPSGD's backward: per-example losses from ``training_step``, and ghost clipping's two backward passes.

The contract (documented on :class:`~lightning_privacy.DPSGD`):

- ``grad_sample_mode="hooks"`` (default): ``training_step`` returns the usual reduced loss, or the per-example losses
  (shape ``[batch_size]``), which DPSGD reduces with ``loss_reduction``. Per-example gradients come from Opacus'
  hooks and are clipped by the ``DPOptimizer``.
- ``grad_sample_mode="ghost"``: ``training_step`` must return the per-example losses (shape ``[batch_size]``, e.g.
  ``F.cross_entropy(logits, y, reduction="none")``), as a tensor or as the ``"loss"`` of a dict. A reduced loss
  has lost what ghost clipping needs and is refused, naming what was returned.
- Either mode: a dict with both ``"loss"`` (the reduced loss, what a plain ``Trainer`` trains on) and
  ``"per_example_loss"`` (shape ``[batch_size]``) is trained on its per-example losses, so one module trains
  unchanged with and without DPSGD. DPSGD stands in for ``training_step`` on the instance for one fit to make that
  swap (Lightning passes only ``"loss"`` to ``backward``).

Ghost clipping (Li et al. 2022; Bu et al. 2023) as in Opacus' ``DPTensorFastGradientClipping.backward``: a first
backward pass of the reduced loss lets Opacus' fast-gradient-clipping hooks compute each example's gradient norm
``‖∇ℓᵢ‖`` layer by layer, without storing per-example gradients (Linear and Embedding by the ghost-norm identity;
other layers materialise their own per-example gradients one layer at a time); the coefficients
``cᵢ = min(1, C / (‖∇ℓᵢ‖ + 1e-6))`` then weight a second pass, with the hooks off, of ``Σᵢ cᵢ·ℓᵢ`` whose gradient is
the clipped sum that the ``DPOptimizerFastGradientClipping`` noises. Where every trainable layer ran once and has a
known per-example gradient form, the second pass is replaced by book-keeping (Bu et al. 2023,
:mod:`lightning_privacy.dpsgd.bookkeeping`): the clipped sum formed from the first pass's layer inputs and output gradients.
In the steps DPSGD self-checks, the exactness check (:mod:`lightning_privacy.dpsgd.exactness`) compares what is clipped with every example's
whole gradient by autograd, and book-keeping's sum with the second pass's; a mismatch stops the fit before its first
optimizer step, naming the parameter (nothing is trained through a disagreement).

Empty Poisson batches never reach the module (on one process and under DDP): ``training_step`` is not called, the
step's gradient is zero for every parameter (a backward pass of ``0 · Σ p`` so that DDP's reducer sees every
parameter), and the DP optimizer adds the noise: the noise-only update the accountant counts as one step. Under FSDP2
every rank must join the all-gathers and reduce-scatters of the module's forward and backward, so a rank whose batch
is empty runs the module, with Opacus' hooks off, on a placeholder row (the dataset's first example,
:attr:`~lightning_privacy.dpsgd.sampling.PoissonDataLoader.placeholder`) whose loss is multiplied by zero: its gradient is
exactly zero (a non-finite placeholder loss stops the fit), so the rank adds no example and the step is as noisy as
any other. A ``training_step`` that logs its loss logs the placeholder's on such a step.
``LightningModule.backward`` is the documented hook for "perform backward on the loss returned in training_step";
DPSGD replaces it (and wraps ``training_step``) on the instance for one fit.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_privacy import _compat
from lightning_privacy.dpsgd import auto as auto_mode
from lightning_privacy.dpsgd import exactness, functional
from lightning_privacy.dpsgd.bookkeeping import BookKeeping, sums_or_none
from lightning_privacy.dpsgd.checks import _grad_sample, check_per_sample_gradients, odd_batch_message
from lightning_privacy.dpsgd.neighbours import NeighbourViolation
from lightning_privacy.dpsgd.sampled_exactness import SampledExactness
from lightning_privacy.dpsgd.sampling import batch_rows, is_empty_batch

__all__ = ["PER_EXAMPLE_LOSS", "PerExampleBackward"]

PER_EXAMPLE_LOSS = "per_example_loss"  # training_step's dict key for the per-example losses (beside "loss")

EXAMPLE = (
    "e.g. `F.cross_entropy(logits, y, reduction='none')`, or for a language model one loss per sequence from "
    "`lightning_privacy.functional.sequence_loss.causal_lm_losses`"
)
REENTRANT = (
    "DPSGD(grad_sample_mode={mode!r}): the model runs reentrant `torch.utils.checkpoint` (use_reentrant=True), which "
    "torch cannot differentiate with `torch.autograd.grad` as DP-SGD's per-example computations and checks do, so use "
    "`use_reentrant=False` with grad_sample_mode='functional' (or 'auto'), or turn gradient checkpointing off."
)
DIFFERENTIATES = (
    "DPSGD(grad_sample_mode={mode!r}): `training_step` runs a backward pass of its own (`torch.autograd.grad`, e.g. "
    "an input-gradient penalty), which fires Opacus' per-layer hooks before DP-SGD's backward pass and leaves them "
    "without the layers' inputs, so use grad_sample_mode='auto' (the default) or 'functional', which differentiate "
    "each example's whole loss, penalty included."
)
# torch/utils/hooks.py, BackwardHook: a full backward hook fired on a module none of whose inputs needs a gradient
FULL_BACKWARD_HOOK_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


@contextlib.contextmanager
def opacus_hooks_backward() -> Iterator[None]:
    """A backward pass through Opacus' per-example hooks, without torch's "Full backward hook is firing…" warning.

    Opacus registers a full backward hook on every trainable layer; on the first one (whose input is data and needs
    no gradient) torch warns that the hook's ``grad_input`` will be ``None``. Opacus' hooks
    (``capture_backprops_hook``) read only ``grad_output``, which torch still passes, so the warning says nothing
    about the run. Only that message is ignored, and only during the backward passes DPSGD runs (the filters are
    restored after), so a user's own hooks elsewhere still warn.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FULL_BACKWARD_HOOK_WARNING, category=UserWarning)
        yield


def _describe(loss: Any) -> str:
    if not isinstance(loss, torch.Tensor):
        return f"a {type(loss).__name__}"
    if loss.ndim == 0:
        return "a reduced loss (a tensor of shape [])"
    return f"a tensor of shape {list(loss.shape)}"


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _zero_missing_grads(params: List[torch.Tensor]) -> None:
    """A zero gradient for every parameter the backward pass left without one (an empty batch's step)."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


def _first_sentence(err: BaseException) -> str:
    """An error's first line, as part of a sentence (``auto``'s reason for a switch)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.rstrip(".")


def _reduce(loss: torch.Tensor, loss_reduction: str) -> torch.Tensor:
    return loss.mean() if loss_reduction == "mean" else loss.sum()


class PerExampleBackward:
    """Stands in for ``pl_module.backward`` while DPSGD trains (see the module docstring).

    Args:
        pl_module: the module whose ``backward`` is replaced until :meth:`remove`.
        mode: ``"hooks"``, ``"ghost"`` or ``"functional"`` (:mod:`lightning_privacy.dpsgd.functional`).
        loss_reduction: ``"mean"`` or ``"sum"``, how per-example losses are reduced.
        hooks: Opacus' per-example hooks (``GradSampleHooks`` or ``GradSampleHooksFastGradientClipping``).
        param_names: parameter names by ``id``, for messages.
        should_check: true on the steps DPSGD self-checks: the exactness check (:mod:`lightning_privacy.dpsgd.exactness`) runs, and in
            ghost mode book-keeping's sum is compared with the second pass's.
        rtol: the exactness check's relative tolerance (16-bit precision needs more than 32-bit).
        record: where the exactness check records what it compared.
        exactness_examples: examples the exactness check compares per checked step (``None``: every one); a larger
            batch has that many drawn uniformly (the check's own generator, seeded 0; the global one is untouched).
        sharded: the module is sharded by FSDP2 (Opacus' FSDP hooks; every step runs two backward passes, the
            reduce-scatters every rank must join, empty batches included; no exactness check).
        one_pass: form ghost clipping's clipped sum by book-keeping where the module allows (not when sharded).
        engine: functional mode's :class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`.
        sampled: the exactness check on sampled later steps
            (:class:`~lightning_privacy.dpsgd.sampled_exactness.SampledExactness`; ``None``: not run).
        auto: ``grad_sample_mode="auto"`` started in hooks mode: every step is verified, and on a disagreement
            redone in functional mode, which the fit keeps (:mod:`lightning_privacy.dpsgd.auto`; ``None``: no switch).

    Attributes:
        last_norms: the per-example gradient norms of the last ghost or functional step (``None`` in hooks mode).
        last_rows: the examples of the last batch (0 for an empty one; ``None`` where the batch holds no tensor).

    Raises:
        MisconfigurationException: ghost mode on a module that overrides ``backward``.
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
        if mode == "ghost" and is_overridden("backward", pl_module, parent=pl.LightningModule):
            raise MisconfigurationException(
                f"{type(pl_module).__name__} overrides `backward`, but DPSGD(grad_sample_mode='ghost') runs its own "
                "two backward passes (norms, then the clipped sum). Remove the override or use grad_sample_mode='hooks'."
            )
        if mode == "functional" and is_overridden("backward", pl_module, parent=pl.LightningModule):
            raise MisconfigurationException(
                f"{type(pl_module).__name__} overrides `backward`, but DPSGD(grad_sample_mode='functional') computes "
                "each example's gradient by torch.func instead of a backward pass of the batch, so remove the override "
                "or use grad_sample_mode='hooks'."
            )
        self.engine = engine
        self.sampled = sampled
        self.auto = auto if mode == "hooks" else None
        self._auto_step = False  # this step started in hooks mode under auto: its backward decides on the switch
        self._auto_reason: Optional[str] = None  # the hooks' forward pass failed on this step (switched already)
        self._inputs: Any = None  # this step's batch and training_step arguments, for a redo in functional mode
        self._sampled_batch: Any = None  # a sampled later step: a copy of its batch and its training_step on rows
        self._sampled_step: Optional[Callable[[Any], Any]] = None
        self._functional_sums: Optional[List[torch.Tensor]] = None
        self.pl_module = pl_module
        self.mode = mode
        self.loss_reduction = loss_reduction
        self.hooks = hooks
        self.param_names = param_names or {}
        self.should_check = should_check
        self.rtol = rtol
        self.record = record if record is not None else exactness.ExactnessRecord()
        self.exactness_examples = exactness_examples
        self._rows_generator = torch.Generator().manual_seed(0)
        self.last_norms: Optional[torch.Tensor] = None
        self.per_example: Optional[tuple] = None  # which batch leaves hold examples (set_example_leaves)
        # the neighbour check (dpsgd.neighbours) and this step's rows in the train loader's dataset (set by install)
        self.neighbours: Any = None
        self.current_rows: Callable[[], Optional[List[int]]] = lambda: None
        # a batch that rows do not split into its examples: each example collated alone (functional.Examples)
        self.examples_of: Optional[Callable[[Any], Any]] = None
        self.sharded = sharded
        self.trainable = [p for p in pl_module.parameters() if p.requires_grad]
        # checked unchanged at every step, by name: FSDP2 swaps a module's parameter objects between sharded and
        # unsharded ones (the root's stay unsharded after a forward without backward, e.g. the sanity check)
        self._trainable_names = {name for name, p in pl_module.named_parameters() if p.requires_grad}
        self._layers = [
            (name, m) for name, m in pl_module.named_modules() if any(p.requires_grad for p in m.parameters(False))
        ]
        self.bookkeeping: Optional[BookKeeping] = None
        if mode == "ghost" and one_pass and not sharded:
            keeper = BookKeeping(pl_module, loss_reduction=loss_reduction)
            self.bookkeeping = keeper if keeper.supported else None
            if not keeper.supported:
                keeper.remove()
        self._skipping = False  # FSDP2: this batch is empty; the placeholder row runs with the hooks off
        self._empty_step = False  # one process / DDP: this batch is empty and skipped the module
        self.last_rows: Optional[int] = None  # this batch's examples, from the batch itself
        self._original = pl_module.backward
        self._had_own = "backward" in vars(pl_module)
        pl_module.backward = self
        self._original_step = pl_module.training_step
        self._had_own_step = "training_step" in vars(pl_module)
        pl_module.training_step = self._training_step

    # ------------------------------------------------------------------------------------------- training_step
    def _training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``training_step``, its ``"per_example_loss"`` put where Lightning takes the loss from; an
        empty batch does not reach it (see the module docstring)."""
        batch = args[0] if args else kwargs.get("batch")
        self._check_trainable_unchanged()
        self._auto_step, self._auto_reason = self.auto is not None and self.mode == "hooks", None
        empty = is_empty_batch(batch)
        # a batch whose rows are not its examples (torchtext's): the per-example passes take each collated alone
        examples = self.examples_of(batch) if self.examples_of is not None and not empty else batch
        self._start_sampled(examples, args, kwargs, empty=empty)
        self._check_neighbours(args, kwargs, empty=empty)
        self._empty_step = empty and not self.sharded
        if self._empty_step:  # a zero loss that reaches every trainable parameter (DDP's reducer waits for each)
            self.last_rows = 0
            return {"loss": torch.stack([p.sum() for p in self.trainable]).sum() * 0.0}
        if empty:  # FSDP2: the placeholder row, whose loss _empty_sharded multiplies by zero
            batch = self._placeholder()
            args, kwargs = ((batch, *args[1:]), kwargs) if args else (args, {**kwargs, "batch": batch})
        self.last_rows = batch_rows(batch, self.per_example)
        batch = examples if not empty else batch
        if self.mode == "functional":
            return self._functional_step(batch, args, kwargs)
        self._inputs = (batch, args, kwargs) if self._auto_step else None
        try:
            with self._no_per_step_sync():
                out = self._original_step(*args, **kwargs)
        except NotImplementedError as err:
            if self.mode == "ghost" and "Parameter tying is not supported" in str(err):
                raise MisconfigurationException(self._called_twice_message()) from err
            if not self._auto_step:
                raise
            return self._forward_failed(err, batch, args, kwargs)
        except IndexError as err:  # (Opacus' hooks, when training_step runs a backward pass of its own)
            if self._auto_step:
                return self._forward_failed(err, batch, args, kwargs)
            if "pop from empty list" in str(err):
                raise MisconfigurationException(DIFFERENTIATES.format(mode=self.mode)) from err
            raise
        except Exception as err:  # noqa: BLE001 (auto: the hooks' forward failed; functional mode takes the step)
            if not self._auto_step:
                raise
            return self._forward_failed(err, batch, args, kwargs)
        self._check_train_mode()
        if isinstance(out, dict) and PER_EXAMPLE_LOSS in out:
            losses = out[PER_EXAMPLE_LOSS]
            if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
                raise MisconfigurationException(
                    f"`training_step` returned {PER_EXAMPLE_LOSS!r} as {_describe(losses)}; DPSGD expects one loss per "
                    f"example, a tensor of shape [batch_size] ({EXAMPLE})."
                )
            out = {**out, "loss": losses}
        return out

    def set_example_leaves(self, per_example: Optional[tuple]) -> None:
        """Which leaves of a batch hold one row per example (the train loader's collate on one and two examples,
        :func:`~lightning_privacy.dpsgd.sampling.example_leaves`): the batch's rows and the functional passes' split."""
        self.per_example = per_example
        for engine in (self.engine, getattr(self.sampled, "engine", None)):
            if engine is not None:
                engine.per_example = per_example

    def _check_trainable_unchanged(self) -> None:
        """Every step: the trainable parameters are those of the fit's start (Opacus' hooks and the DP optimizer
        took them then: a parameter unfrozen since would be updated without clipping or noise)."""
        for name, param in self.pl_module.named_parameters():
            if param.requires_grad != (name in self._trainable_names):
                became = "trainable" if param.requires_grad else "frozen"
                raise MisconfigurationException(
                    f"DPSGD: parameter `{name}` became {became} during the fit (at global step "
                    f"{self.pl_module.trainer.global_step}; e.g. a fine-tuning scheduler's unfreezing), but DP-SGD's "
                    "per-example gradients, clipping and noise cover the parameters trainable when the fit started, so "
                    f"{'its updates would be neither clipped nor noised' if param.requires_grad else 'its step would break'}"
                    ": set `requires_grad` before `trainer.fit`, or end the fit and start another with the new "
                    "trainable set (the ledger composes both fits' steps on the same module)."
                )

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
                check.run(rows, self._rows_step(args, kwargs))
            except NeighbourViolation as err:
                error = err
            except Exception as err:  # noqa: BLE001 (a model or data the functional passes cannot run: said, not fatal)
                rank_zero_warn(f"DPSGD: the neighbour check is {check.disable(err)}; the fit goes on without it.")
            finally:
                if self.hooks is not None:
                    self.hooks.enable_hooks()
                if self.bookkeeping is not None:
                    self.bookkeeping.start()  # (forget what the check's passes captured)
        if _distributed() and self.pl_module.trainer.strategy.reduce_boolean_decision(error is not None, all=False):
            error = error or MisconfigurationException(
                "DPSGD: on another process, removing one example moved the step's clipped sum by more than C (that "
                "process's error names it); the fit stops before this step's noised update."
            )
        if error is not None:
            raise error

    def _rows_step(self, args: tuple, kwargs: Dict[str, Any]) -> Callable[[Any], Any]:
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
            self._sampled_batch, self._sampled_step = functional._copy(batch), self._rows_step(args, kwargs)

    def _check_sampled(self, got: Callable[[int, torch.Tensor], torch.Tensor], *, what: str, norms_only: bool,
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

    @contextlib.contextmanager
    def _no_per_step_sync(self) -> Iterator[None]:
        """Under DDP, refuse ``self.log(..., sync_dist=True)`` of a per-step value inside ``training_step``.

        Such a log all-reduces at the call, but a rank whose Poisson batch is empty skips ``training_step`` (the
        module never sees an empty batch), so the other ranks would wait in an all-reduce it never joins: the ranks
        fall out of step ("Connection closed by peer", or a hang). FSDP2 runs every rank's step (the placeholder row).
        """
        module = self.pl_module
        if self.sharded or not _distributed() or torch.distributed.get_world_size() < 2:
            yield
            return
        log, own = module.log, vars(module).get("log")

        def guarded(name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("sync_dist") and kwargs.get("on_step", True) is not False:
                raise MisconfigurationException(
                    f"DPSGD under DDP: `self.log({name!r}, ..., sync_dist=True)` in training_step all-reduces at every "
                    "step, but a rank whose Poisson batch is empty skips training_step, so the ranks would fall out "
                    "of step. Log the rank's own value (no sync_dist), or log it with on_step=False, on_epoch=True."
                )
            return log(name, value, *args, **kwargs)

        module.log = guarded
        try:
            yield
        finally:
            if own is None:
                del module.log  # (the class's method again)
            else:
                module.log = own

    def _placeholder(self) -> Any:
        """FSDP2: the train loader's placeholder (its dataset's first example, one row), on the module's device."""
        trainer = self.pl_module.trainer
        placeholder = getattr(trainer.train_dataloader, "placeholder", None)
        if placeholder is None:
            raise MisconfigurationException(
                "DPSGD under FSDP2: this rank's Poisson batch is empty and the train loader has no placeholder row "
                f"to run the sharded module on (got a {type(trainer.train_dataloader).__name__}, not DPSGD's "
                "PoissonDataLoader)."
            )
        return trainer.strategy.batch_to_device(placeholder)

    def _called_twice_message(self) -> str:
        """Ghost mode: the layer Opacus found called twice (its recorded inputs), named."""
        twice = [f"`{name}` ({type(m).__name__})" for name, m in self._layers if len(getattr(m, "activations", ())) > 1]
        layer = ", ".join(twice) if twice else "a Linear or Embedding layer"
        return (
            f"DPSGD(grad_sample_mode='ghost'): {layer} ran more than once in one step (called twice in the forward "
            "pass, or re-run in the backward pass by gradient checkpointing, `torch.utils.checkpoint`), and ghost "
            "clipping computes one gradient norm per call of a Linear or Embedding layer that it cannot combine into "
            "the example's norm, so use grad_sample_mode='functional' (or 'auto'), which differentiates each "
            "example's loss itself, or grad_sample_mode='hooks' for a layer called twice without checkpointing."
        )

    def _check_train_mode(self) -> None:
        """Every trainable layer ran in train mode (Opacus records no input of a layer in eval mode)."""
        for name, module in self._layers:
            if not module.training:
                raise MisconfigurationException(
                    f"DPSGD: trainable layer `{name or type(module).__name__}` ({type(module).__name__}) is in eval "
                    "mode during training (`model.eval()` or `.train(False)` inside the fit, e.g. in "
                    "`on_train_epoch_start`), and Opacus' hooks record no per-example input for a layer in eval mode, "
                    "so its gradient cannot be clipped: keep trainable layers in train mode, or freeze the layer "
                    "(`requires_grad_(False)`) to keep it in eval mode."
                )

    def _check_rows(self, losses: torch.Tensor) -> None:
        if self.last_rows is not None and losses.ndim == 1 and losses.shape[0] != self.last_rows:
            raise MisconfigurationException(
                f"DPSGD: `training_step` returned {losses.shape[0]} per-example losses for a batch of {self.last_rows} "
                f"examples; DP-SGD clips each example's gradient through that example's own loss, so return one loss "
                f"per example ({EXAMPLE}), not one per token."
            )

    def start_batch(self, *, empty: bool) -> None:
        """Called at every batch start: book-keeping forgets the last step; under FSDP2 an empty batch runs without
        hooks (see the module docstring)."""
        if self.mode != "ghost":
            return
        if self.bookkeeping is not None:
            self.bookkeeping.start()
        if not self.sharded:
            return
        if self._skipping:  # the last empty batch had no backward (training_step returned None)
            self.hooks.enable_hooks()
        self._skipping = empty
        if empty:
            self.hooks.disable_hooks()

    def remove(self) -> None:
        """Give the module its own ``backward`` and ``training_step`` back (and remove book-keeping's hooks)."""
        if self.sampled is not None:
            self.sampled.end_step()
        if self.bookkeeping is not None:
            self.bookkeeping.remove()
            self.bookkeeping = None
        for name, had_own, original in (
            ("backward", self._had_own, self._original),
            ("training_step", self._had_own_step, self._original_step),
        ):
            if had_own:
                setattr(self.pl_module, name, original)
            elif name in vars(self.pl_module):
                delattr(self.pl_module, name)

    # ------------------------------------------------------------------------------------------------ backward
    def __call__(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        verifying, self._auto_step = self._auto_step, False
        reason, self._auto_reason = self._auto_reason, None
        if self._empty_step:
            self._empty_skipped(loss, *args, **kwargs)
        elif self.mode == "functional":
            if isinstance(loss, torch.Tensor) and loss.ndim == 1:
                self._check_rows(loss)
            self._functional_backward(loss, *args, **kwargs)
        else:
            if isinstance(loss, torch.Tensor) and loss.ndim == 1:
                self._check_rows(loss)
            if verifying:
                reason = self._verified_hooks(loss, *args, **kwargs)
            else:
                self._per_layer_backward(loss, *args, **kwargs)
        if verifying:
            self._decide(reason, *args, **kwargs)

    def _per_layer_backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """Hooks or ghost mode's backward, Opacus' and torch's errors that name no layer and no fix put in words."""
        try:
            with opacus_hooks_backward():
                if self.mode == "hooks":
                    self._hooks_mode(loss, *args, **kwargs)
                else:
                    self._ghost(loss, *args, **kwargs)
        except NotImplementedError as err:  # (Opacus' words for it name no layer and no fix)
            if self.mode == "ghost" and "Parameter tying is not supported" in str(err):
                raise MisconfigurationException(self._called_twice_message()) from err
            raise
        except RuntimeError as err:  # (torch's words for it name no layer and no fix)
            if "use_reentrant=True" in str(err):
                raise MisconfigurationException(REENTRANT.format(mode=self.mode)) from err
            raise
        except IndexError as err:  # (Opacus' hooks, after training_step ran a backward pass of its own)
            if "pop from empty list" in str(err):
                raise MisconfigurationException(DIFFERENTIATES.format(mode=self.mode)) from err
            raise

    # ------------------------------------------------------------------------------------------------- auto
    def _verified_hooks(self, loss: Any, *args: Any, **kwargs: Any) -> Optional[str]:
        """``auto`` in hooks mode: the hooks' backward and its checks; why they cannot be trusted on this step
        (``None``: they can) — an error, a parameter without per-example gradients for the batch, a mismatch."""
        try:
            with opacus_hooks_backward():
                self._hooks_mode(loss, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 (said as the reason; functional mode redoes the step)
            if isinstance(err, MisconfigurationException) and "DPSGD expects `training_step`" in str(err):
                raise  # (what training_step returned: no mode trains it)
            gap = auto_mode.hooks_gap(self.trainable, self.last_rows, self.param_names)
            if gap is None and isinstance(err, MisconfigurationException):  # (a check's finding, without its advice)
                return _first_sentence(err).split(", so ")[0]
            return gap or f"Opacus' hooks' backward pass failed ({_first_sentence(err)})"
        gap = auto_mode.hooks_gap(self.trainable, self.last_rows, self.param_names)
        if gap is not None:
            return gap
        pending = None if self.sampled is None else self.sampled.pending
        if pending is not None:
            self.sampled.pending = None
            return _first_sentence(pending).split(", so ")[0]
        return None

    def _decide(self, reason: Optional[str], *args: Any, **kwargs: Any) -> None:
        """``auto``: every rank decides together whether to leave hooks mode; if so this step is redone in functional
        mode before its noise (a rank whose forward failed switched already; an empty batch has nothing to redo)."""
        trainer = self.pl_module.trainer
        if not auto_mode.collectively(trainer, reason is not None) or self.mode != "hooks":
            self._inputs = None
            return
        self._switch(reason or "another process's per-example gradients from Opacus' hooks could not be verified")
        inputs, self._inputs = self._inputs, None
        if inputs is None or self._empty_step or not self.last_rows:
            _zero_missing_grads(self.trainable)
            self.last_norms = torch.zeros(0)
            return
        batch, step_args, step_kwargs = inputs
        for param in self.trainable:
            param.grad = None
        self._functional_sums, self.last_norms = self._functional_sum(batch, step_args, step_kwargs, checking=True)
        self._functional_backward(None, *args, **kwargs)

    def _switch(self, reason: str) -> None:
        auto, self.auto = self.auto, None
        auto.switch(reason)
        if self.sampled is not None:
            self.sampled.pending = None  # (what the hooks got wrong on this step: the reason, not raised)
        self.hooks, self.mode, self.engine = None, "functional", auto.engine(self.pl_module)
        self.engine.per_example = self.per_example

    def _forward_failed(self, err: BaseException, batch: Any, args: tuple, kwargs: Dict[str, Any]) -> Any:
        """``auto``: the model's forward pass failed under Opacus' hooks; functional mode takes this step and the fit."""
        self._auto_reason = f"the forward pass under Opacus' hooks failed ({_first_sentence(err)})"
        self._switch(self._auto_reason)
        self._inputs = None
        return self._functional_step(batch, args, kwargs, checking=True)

    def _sampled(self) -> Dict[str, Any]:
        return {"max_examples": self.exactness_examples, "generator": self._rows_generator}

    def _name(self, param: torch.Tensor) -> str:
        return self.param_names.get(id(param), f"<unnamed parameter of shape {tuple(param.shape)}>")

    def _hooks_mode(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        per_example = isinstance(loss, torch.Tensor) and loss.ndim == 1
        if per_example:
            reduced = _reduce(loss, self.loss_reduction)
        elif isinstance(loss, torch.Tensor) and loss.ndim == 0:
            reduced = loss
        else:
            raise MisconfigurationException(
                "DPSGD expects `training_step` to return a reduced loss or one loss per example (shape "
                f"[batch_size]: {EXAMPLE}); it returned {_describe(loss)}."
            )
        checking = self.should_check()
        self._original(reduced, *args, **({**kwargs, "retain_graph": True} if checking and per_example else kwargs))
        if self._sampled_batch is not None:
            rows = int(self.last_rows or 0)
            check_per_sample_gradients(self.trainable, self.param_names)  # (one per example, before indexing them)

            def got(j: int, index: torch.Tensor) -> torch.Tensor:
                param = self.sampled.engine.params[j]
                if getattr(param, "grad_sample", None) is None:
                    return torch.zeros(len(index), *param.shape, dtype=param.dtype, device=param.device)
                sample = _grad_sample(param)[-rows:]  # (this batch's rows)
                return sample[index.to(sample.device)]

            self._check_sampled(
                got, what="the per-example gradient that DP-SGD clips", norms_only=False,
                losses=loss.detach() if per_example else None,
            )  # fmt: skip
        if not checking:
            return
        params = [p for p in self.trainable if getattr(p, "grad_sample", None) is not None]
        samples = [_grad_sample(p) for p in params]
        if len({int(s.shape[0]) for s in samples}) > 1:
            return  # (the per-sample gradient check names the parameters whose batch differs)
        self.hooks.disable_hooks()
        try:
            if per_example:
                exactness.check_per_example_gradients(
                    loss, params, samples, self.param_names, rtol=self.rtol, record=self.record, **self._sampled()
                )
            else:
                exactness.check_summed_gradients(
                    params,
                    samples,
                    self.param_names,
                    loss_reduction=self.loss_reduction,
                    rtol=self.rtol,
                    record=self.record,
                )
        finally:
            self.hooks.enable_hooks()

    def _ghost(self, losses: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(losses, torch.Tensor) or losses.ndim != 1:
            raise MisconfigurationException(
                "DPSGD(grad_sample_mode='ghost') clips each example's gradient through that example's own loss, so "
                f"`training_step` must return one loss per example, a tensor of shape [batch_size] ({EXAMPLE}; "
                f"or a dict whose 'loss' is one); it returned {_describe(losses)}. DPSGD reduces them with "
                f"loss_reduction={self.loss_reduction!r}; log their mean yourself. Or use grad_sample_mode='auto' "
                "(the default), which takes a reduced loss."
            )
        params = self.hooks.trainable_parameters
        if self._skipping:
            self._skipping = False
            try:
                self._empty_sharded(losses, params, *args, **kwargs)
            finally:
                self.hooks.enable_hooks()
            return
        for param in params:  # Opacus never resets them: a stale norm would clip this batch with the last one's
            _compat.clear_norm_sample(param)
        keeper = self.bookkeeping
        # one pass: no weight gradients in the first pass (not under DDP, whose reducer waits for every parameter's)
        targets = keeper.first_pass_targets() if keeper is not None and not _distributed() else None
        if keeper is not None:
            keeper.capturing = True
        try:
            reduced = _reduce(losses, self.loss_reduction)
            if targets is not None:  # (what LightningModule.backward does, differentiating the layers' outputs only)
                torch.autograd.grad(reduced, targets, retain_graph=True)
            else:
                self._original(reduced, *args, retain_graph=True, **kwargs)
        finally:
            if keeper is not None:
                keeper.capturing = False
        # (Opacus' FSDP hooks keep the norms on the modules, one per parameter, and raise themselves when one is missing)
        norms = {} if self.sharded else {p: _compat.norm_sample(p) for p in params}
        missing = [self._name(p) for p, norm in norms.items() if norm is None]
        if missing:
            raise MisconfigurationException(
                f"DP-SGD (ghost clipping): trainable parameter(s) {', '.join(f'`{n}`' for n in missing[:5])} got no "
                "per-example gradient norm in this step: unused in the forward pass, or in a layer Opacus cannot "
                "handle. Freeze them (requires_grad=False) or replace the layer."
            )
        sizes = {self._name(p): int(norm.shape[0]) for p, norm in norms.items()}
        if len(set(sizes.values())) > 1:
            raise MisconfigurationException(odd_batch_message(sizes, what="gradient norms"))
        for param in params:
            param.grad = None
        coefficients = self.hooks.get_clipping_coef()
        self.last_norms = self.hooks.per_sample_gradient_norms.detach()
        if coefficients.shape != losses.shape:
            raise MisconfigurationException(
                f"DPSGD(grad_sample_mode='ghost'): `training_step` returned {losses.shape[0]} per-example losses but "
                f"the model's layers saw {coefficients.shape[0]} examples; return one loss per example of the batch "
                f"({EXAMPLE})."
            )
        if self._sampled_batch is not None:
            self._check_sampled(
                lambda j, index: norms[self.sampled.engine.params[j]].reshape(-1)[index.to(losses.device)],
                what="the norm that ghost clipping clipped with", norms_only=True, losses=losses.detach(),
            )  # fmt: skip
        self.hooks.disable_hooks()
        try:
            checking = not self.sharded and self.should_check()
            if checking:
                exactness.check_ghost_norms(
                    losses, params, norms, self.param_names, rtol=self.rtol, record=self.record, **self._sampled()
                )
            sums = sums_or_none(keeper, len(losses), coefficients)
            if sums is not None and all(p in sums for p in params) and not checking:
                for param in params:
                    param.grad = sums[param]
                return
            self._original((coefficients.to(device=losses.device) * losses).sum(), *args, **kwargs)
            differing = keeper.disagreeing(sums, params) if sums is not None and checking else None
            if differing is not None:  # nothing is trained through a disagreement
                raise MisconfigurationException(self._disagreement_message(differing, sums[differing]))
        finally:
            self.hooks.enable_hooks()
            if keeper is not None:
                keeper.clear()

    def _disagreement_message(self, param: torch.Tensor, kept: torch.Tensor) -> str:
        grad = param.grad.to(torch.float64)
        error = float((kept.to(torch.float64) - grad).norm())
        size = max(float(grad.norm()), 1e-30)
        return (
            f"DP-SGD self-check (ghost clipping): book-keeping's clipped sum for `{self._name(param)}` is {error:.4g} "
            f"away from the second backward pass's ({error / size:.1%} of its norm), so that parameter's gradient is "
            "not what its layer's per-example hooks see (the parameter used outside its layer, or a layer whose "
            "gradient is not what its type suggests): move that use into the layer, untie or freeze the parameter "
            "(`requires_grad_(False)`), or use grad_sample_mode='hooks'; DPSGD stops rather than train on either sum."
        )

    # ---------------------------------------------------------------------------------------------- functional
    def _functional_step(
        self, batch: Any, args: tuple, kwargs: Dict[str, Any], *, checking: Optional[bool] = None
    ) -> Any:
        """Functional mode's ``training_step``: the clipped sum of the examples' own gradients
        (:mod:`lightning_privacy.dpsgd.functional`; on the checked steps the examples' losses alone are first compared
        with the batch's), then the batch's ``training_step`` once without gradients for what it logs and returns."""
        step = self._rows_step(args, kwargs)
        self._functional_sums, self.last_norms = self._functional_sum(batch, args, kwargs, checking=checking)
        # what the module logs and returns, from the whole batch (with gradients: a step may differentiate inside, as
        # an input-gradient penalty does; nothing is differentiated from it)
        with torch.enable_grad(), self._no_per_step_sync():
            out = self._original_step(*args, **kwargs)
        loss = out.get(PER_EXAMPLE_LOSS, out.get("loss")) if isinstance(out, dict) else out
        if not isinstance(loss, torch.Tensor):
            raise MisconfigurationException(
                "DPSGD expects `training_step` to return a reduced loss or one loss per example (shape "
                f"[batch_size]: {EXAMPLE}); it returned {_describe(loss)}."
            )
        loss = loss.detach()
        if self._sampled_batch is not None:  # (mixing: the sampled examples' losses alone against the batch's)
            sampled_batch, self._sampled_batch = self._sampled_batch, None
            try:
                self.sampled.check_losses(
                    sampled_batch, step, loss if loss.ndim == 1 else None, int(self.last_rows or 0)
                )
            finally:
                self.sampled.end_step()
        if _distributed():  # DDP's reducer waits for every parameter's gradient: a zero that reaches each one
            loss = loss + torch.stack([p.sum() for p in self.trainable]).sum() * 0.0
        return {**out, "loss": loss} if isinstance(out, dict) else loss

    def _functional_sum(
        self, batch: Any, args: tuple, kwargs: Dict[str, Any], *, checking: Optional[bool] = None
    ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """The batch's clipped sum and its examples' norms by torch.func; on the checked steps (``checking``, default
        the self-checked ones) the parameters' swap and the examples' losses alone are checked first."""
        step = self._rows_step(args, kwargs)
        engine = self.engine
        before = engine.fallback
        checking = self.should_check() if checking is None else checking
        if checking:  # (before any gradient: a model that mixes examples, or hides a parameter, is refused at once)
            functional.check_parameters_swapped(engine, batch, step)
            error = functional.check_losses_alone(
                engine, batch, step, loss_reduction=self.loss_reduction, rtol=self.rtol
            )
        result = engine.clipped_sum(batch, step)
        if checking:
            self.record.add(f"{functional.FUNCTIONAL_REFERENCE} ({result.how})", int(self.last_rows or 0), error)
        if engine.fallback is not None and before is None:
            rank_zero_warn(
                f"DPSGD(grad_sample_mode='functional'): torch.func.vmap cannot run `training_step` because of "
                f"{engine.fallback}; each example's gradient is now computed by its own forward and backward pass "
                "(exact, one pass per example, slower)."
            )
        return result.sums, result.norms

    def _functional_backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        """Functional mode: ``p.grad`` is the step's clipped sum (under DDP after a zero backward for the reducer;
        under a GradScaler multiplied by its scale, which the step divides out)."""
        sums, self._functional_sums = self._functional_sums, None
        if sums is None:
            raise MisconfigurationException(
                "DPSGD(grad_sample_mode='functional'): `backward` ran without DPSGD's `training_step` before it; call "
                "the module's `training_step` through the Trainer (automatic optimization)."
            )
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            self._original(loss.sum() if loss.ndim else loss, *args, **kwargs)
        scaler = getattr(getattr(self.pl_module.trainer, "precision_plugin", None), "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        for param, total in zip(self.engine.params, sums):
            param.grad = total if scale == 1.0 else total * scale

    def _empty_skipped(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """An empty batch that skipped the module: zero gradients (DDP's reducer sees each parameter), no example."""
        self._empty_step = False
        if loss.requires_grad:
            self._original(loss, *args, **kwargs)
        _zero_missing_grads(self.trainable)
        for param in self.trainable if self.mode == "hooks" else ():
            param.grad_sample = param.new_zeros((0, *param.shape))
        self.last_norms = loss.detach().new_zeros(0) if self.mode in ("ghost", "functional") else None

    def _empty_sharded(self, losses: torch.Tensor, params: List[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        """FSDP2, an empty batch: the placeholder row's loss times zero, backward as often as a non-empty step on
        another rank (its FSDP reduce-scatters), so this rank adds an exactly zero gradient and no example."""
        if losses.numel() != 1 or not bool(torch.isfinite(losses.detach()).all()):
            raise MisconfigurationException(
                "DPSGD under FSDP2: this rank's Poisson batch was empty, and the placeholder row it runs the sharded "
                f"module on (the dataset's first example, loss multiplied by zero) gave the loss(es) "
                f"{losses.detach().flatten().tolist()[:4]}; one finite loss is needed for its gradient to be exactly "
                "zero."
            )
        zero = losses.sum() * 0.0
        if zero.requires_grad:
            self._original(zero, *args, retain_graph=True, **kwargs)
            for param in params:  # the first pass's reduce-scatter left the other ranks' unclipped sum in this shard
                param.grad = None
            self._original(zero, *args, **kwargs)
        _zero_missing_grads(params)
        self.last_norms = losses.detach().new_zeros(0)
        self.last_rows = 0  # no example of this step's batch

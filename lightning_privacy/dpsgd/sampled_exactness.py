"""DPSGD's exactness check over the whole run: sampled later steps against each example's gradient computed alone.

The exactness check of the first steps (:mod:`lightning_privacy.dpsgd.exactness`) vouches for those steps. A model
whose computation changes later (an auxiliary path that reuses a weight outside its layer after warm-up, inputs rare
enough to miss both checked batches) is not seen there. So after them, each optimizer step is checked with
probability ``exactness_rate`` (DPSGD's argument; drawn by this check's own generator, never torch's global one, and
the same on every rank): :data:`EXAMPLES` examples of its batch, drawn uniformly, get their gradient computed
**alone** — ``training_step`` on that example's row as a batch of one, differentiated by ``torch.func``
(:class:`~lightning_privacy.dpsgd.functional.FunctionalClipping`) — and compared with what the step clips for them:

- hooks mode, with per-example losses or a reduced loss: Opacus' per-example gradient of every trainable parameter;
  with a reduced loss this is what the first steps' sum invariant cannot see (per-example gradients that are wrong
  but sum right: a sequence-first layout where the sequence is as long as the batch, an operation that mixes
  examples);
- ghost mode: ghost clipping's per-parameter norm of each example's gradient;
- functional mode (each example's gradient is computed alone by construction): each example's loss alone against its
  loss in the batch, which says whether the model mixes examples (what it trains on would differ from the batch's
  loss; privacy does not depend on it).

On a checked step ``nn.Dropout`` modules are switched off (``p = 0``) for that step's forward pass and for the
reference, so both see the same function. Where they disagree, the examples' losses alone are evaluated twice more:
if those differ, the forward pass is still random (a functional dropout) and the step is counted as not comparable
rather than stopped.
A disagreement stops the fit before that step's noised update (the error is raised in the DP optimizer's pre-noise
check, collectively under DDP), in a sentence naming the parameter, the example, the size of the mismatch and the
likely cause. Not run under FSDP2 (the parameters are sharded, as for the first steps' check).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_privacy.dpsgd import functional
from lightning_privacy.dpsgd.exactness import ExactnessRecord, row_mismatch

__all__ = ["DEFAULT_RATE", "EXAMPLES", "SampledExactness", "dropout_off", "likely_causes"]

#: DPSGD's default ``exactness_rate``: the share of the steps after the first self-checked ones that are checked
DEFAULT_RATE = 0.01
EXAMPLES = 4  # examples compared on a sampled step (each costs about one forward and backward pass of one example)


@contextlib.contextmanager
def dropout_off(module: nn.Module) -> Iterator[None]:
    """Every ``nn.Dropout*`` module of ``module`` with ``p = 0`` inside (restored after)."""
    saved = [(m, m.p) for m in module.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    for m, _ in saved:
        m.p = 0.0
    try:
        yield
    finally:
        for m, p in saved:
            m.p = p


def likely_causes(module: nn.Module, param_name: str, *, mixes: Optional[bool]) -> str:
    """The likely causes of a per-example gradient of ``param_name`` that differs from the example's gradient alone,
    most specific first, as one phrase (``mixes``: each example's loss alone differs from its loss in the batch;
    ``None``: not known, a reduced loss)."""
    causes: List[str] = []
    if mixes:
        causes.append(
            "examples are mixed in the batch (an operation across the batch dimension such as `h - h.mean(0)`, batch "
            "statistics: each example's loss alone differs from its loss in the batch)"
        )
    elif mixes is None:
        causes.append(
            "examples are mixed in the batch (an operation across the batch dimension such as `h - h.mean(0)`, batch "
            "statistics), which a reduced loss hides"
        )
    for name, m in module.named_modules():
        if getattr(m, "batch_first", None) is False and any(p.requires_grad for p in m.parameters()):
            causes.append(
                f"`{name}` ({type(m).__name__}) is sequence-first (batch_first=False), and Opacus' hooks take the "
                "first dimension for the batch"
            )
    owner = param_name.rsplit(".", 1)[0] if "." in param_name else ""
    layer = dict(module.named_modules()).get(owner)
    if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        causes.append(
            f"`{owner}` ({type(layer).__name__}) gets a per-example gradient Opacus computes wrongly for its inputs "
            "(an index repeated within an example, `scale_grad_by_freq`)"
        )
    causes.append(
        f"`{param_name}` is used outside its layer on this step (`F.linear(x, layer.weight)`, a tied output head, an "
        "auxiliary path that starts after warm-up)"
    )
    return "; or ".join(causes)


class SampledExactness:
    """One fit's exactness check on sampled later steps (see the module docstring).

    Args:
        module: the LightningModule (its trainable parameters as at fit start).
        rate: the probability that a step after the first self-checked ones is checked (0: never).
        rtol: the relative tolerance (as the first steps' check).
        sixteen_bit: the fit trains in 16-bit precision: the step's per-example gradients come from a 16-bit forward
            pass and the reference from a float32 one (ReLU patterns flip: single examples' gradients differ by up to
            ~25 %), so the self-checked first steps are not forced to compare examples alone (the exactness check
            there differentiates the step's own 16-bit graph).
        names: parameter names by ``id``.
        record: the fit's :class:`~lightning_privacy.dpsgd.exactness.ExactnessRecord`, whose ``later_*`` fields and
            ``max_relative_error`` this check keeps.
        examples: examples compared per checked step.

    Attributes:
        pending: the disagreement found in this step's backward, raised before its noise (``None``: none).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        rate: float,
        rtol: float,
        sixteen_bit: bool = False,
        names: Dict[int, str],
        record: ExactnessRecord,
        examples: int = EXAMPLES,
    ) -> None:
        self.module, self.rate, self.rtol, self.names, self.record = module, float(rate), rtol, names, record
        self.sixteen_bit = sixteen_bit
        self.examples = examples
        record.later_rate = self.rate
        self.engine = functional.FunctionalClipping(module, max_grad_norm=1.0)
        self._steps = torch.Generator().manual_seed(1)  # which steps: the same draws on every rank
        self._examples = torch.Generator().manual_seed(2)  # which examples (each rank its own batch)
        self.pending: Optional[MisconfigurationException] = None
        self.active = False  # this step is checked (drawn at its batch's start)
        self.off: Optional[str] = None  # why the check cannot run (training_step fails on one example alone)
        self.first = False  # ...as a self-checked first step (hooks mode)
        self._dropout: Optional[contextlib.ExitStack] = None
        self._seconds: List[float] = []  # the first two checks' reference: by vmap, then by the loop

    # -------------------------------------------------------------------------------------------- the step's life
    def start_step(self, *, first_steps: bool, force: bool = False) -> bool:
        """At every batch's ``training_step`` (empty batches included, so every rank draws alike): draw whether this
        step is checked (``force``: checked whatever the draw, a self-checked first step of hooks mode, counted with
        those); if so, switch dropout off until :meth:`end_step`."""
        self.end_step()
        draw = float(torch.rand((), generator=self._steps)) < self.rate if self.rate > 0 else False
        force = force and not self.sixteen_bit
        self.active = (draw and not first_steps) or force
        self.first = force
        if self.active:
            self._dropout = contextlib.ExitStack()
            self._dropout.enter_context(dropout_off(self.module))
        return self.active

    def end_step(self) -> None:
        """Dropout back on (after the step's backward, or at the next batch)."""
        if self._dropout is not None:
            self._dropout.close()
            self._dropout = None

    def raise_pending(self) -> None:
        """Before the step's noise: raise the disagreement found in its backward (the DP optimizer's pre-noise check)."""
        error, self.pending = self.pending, None
        if error is not None:
            raise error

    # ------------------------------------------------------------------------------------------------ the check
    def check(
        self,
        batch: Any,
        step: Callable[[Any], Any],
        got: Callable[[int, torch.Tensor], torch.Tensor],
        *,
        what: str,
        norms_only: bool,
        batch_losses: Optional[torch.Tensor] = None,
        rows: int,
    ) -> None:
        """Compare ``got(j, index)`` — what the step clips for the examples ``index`` (per-example gradients of
        ``engine.params[j]``, or their norms with ``norms_only``) — with each example's gradient alone; a mismatch is
        kept in :attr:`pending`. ``batch_losses``: the batch's per-example losses (their graph not needed), compared
        with the losses alone to tell mixed examples apart."""
        index = self._rows(rows)
        if index is None or self.off is not None:
            return
        chosen = _select(batch, index, self.engine.per_example)
        try:
            grads, losses = self._gradients_alone(chosen, step)
        except functional.OneRowError as err:  # (hooks and ghost train the batch; the check cannot run one example)
            self._switch_off(err)
            return
        found: Optional[MisconfigurationException] = None
        worst = 0.0
        flat = [g.reshape(len(index), -1).to(torch.float64) for g in grads]
        total = torch.stack([f.pow(2).sum(1) for f in flat], 1).sum(1).sqrt()
        scale = float(total.max())
        mixes = self._mixes(batch_losses, index, losses)
        for j, (param, ref) in enumerate(zip(self.engine.params, flat)):
            mine = got(j, index).reshape(len(index), -1).to(torch.float64)
            error, bound, ref_size = row_mismatch(ref, mine, norms_only=norms_only, rtol=self.rtol, scale=scale)
            relative = error / total.clamp_min(1e-30)
            worst = max(worst, float(relative.max()))
            bad = torch.nonzero(error > bound).flatten()
            if bad.numel() and found is None:
                i = int(bad[relative[bad].argmax()])
                name = self.names.get(id(param), f"<parameter of shape {tuple(param.shape)}>")
                found = MisconfigurationException(
                    f"DP-SGD exactness check ({'a self-checked first step' if self.first else 'a sampled later step'}"
                    f"): {what} of `{name}` for example {int(index[i])} "
                    f"is {float(error[i]):.4g} away from that example's gradient computed alone by torch.func (norm "
                    f"{float(ref_size[i]):.4g}; {float(relative[i]):.1%} of the example's gradient norm), so what DP-SGD "
                    f"clips is not that example's gradient. Likely cause: "
                    f"{likely_causes(self.module, name, mixes=mixes)}. Fix that, or use grad_sample_mode='functional' "
                    "(or 'auto'), which computes each example's gradient alone; DPSGD stopped before this step's "
                    "noised update."
                )
        if found is not None and self._random(chosen, step):  # (only a disagreement pays for this test)
            self.record.later_not_comparable += 0 if self.first else 1
            return
        self.pending = self.pending or found
        self._compared(len(index), worst)

    def check_losses(
        self, batch: Any, step: Callable[[Any], Any], batch_losses: Optional[torch.Tensor], rows: int
    ) -> None:
        """Functional mode: the sampled examples' losses alone against their losses in the batch (mixing)."""
        index = self._rows(rows)
        if index is None or batch_losses is None or batch_losses.numel() != rows:
            return
        chosen = _select(batch, index, self.engine.per_example)
        alone = self.engine.losses_alone(chosen, step).to(torch.float64)
        together = batch_losses.detach().to(torch.float64).reshape(-1)[index.to(batch_losses.device)].cpu()
        alone = alone.cpu()
        scale = max(float(together.abs().max()), float(alone.abs().max()), 1e-12)
        error = (together - alone).abs()
        i = int(error.argmax())
        if float(error[i]) > self.rtol * scale and self._random(chosen, step):  # (only a disagreement pays for it)
            self.record.later_not_comparable += 1
            return
        if float(error[i]) > self.rtol * scale and self.pending is None:
            self.pending = MisconfigurationException(
                f"DPSGD(grad_sample_mode='functional') exactness check (a sampled later step): example "
                f"{int(index[i])}'s loss computed alone ({float(alone[i]):.6g}) differs from its loss in the batch "
                f"({float(together[i]):.6g}), so the model mixes examples in its forward pass on this step (an "
                "operation across the batch dimension such as `h - h.mean(0)`, batch statistics, a sequence-first "
                "layer fed batch-first data), and DP-SGD would train on other losses than the batch's: compute each "
                "example's output from that example alone; DPSGD stopped before this step's noised update."
            )
        self._compared(len(index), float(error.max()) / scale)

    def _switch_off(self, err: BaseException) -> None:
        """``training_step`` cannot run on one example alone: this check is off for the fit, said once and recorded."""
        self.off = str(err)
        self.record.later_rate = 0.0
        warnings.warn(
            "DPSGD: the exactness check on examples alone is off for this fit (what is clipped for an example is not "
            f"compared with its gradient computed alone): {err}",
            UserWarning,
            stacklevel=2,
        )

    def _compared(self, examples: int, worst: float) -> None:
        record = self.record
        if not self.first:  # (a self-checked first step is counted by the first steps' check)
            record.later_steps += 1
            record.later_examples += examples
        record.max_relative_error = max(record.max_relative_error, worst)

    def _gradients_alone(self, chosen: Any, step: Callable[[Any], Any]) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """The sampled examples' gradients alone, by vmap or by a loop of single-example passes, whichever the first
        two checked steps found faster (vmap over a Hugging Face model falls back to slow per-operation loops)."""
        if len(self._seconds) < 2:
            self.engine.loop = len(self._seconds) == 1
            began = time.perf_counter()
            grads, losses, _ = self.engine.gradients_alone(chosen, step)
            self._seconds.append(time.perf_counter() - began)
            if len(self._seconds) == 2:
                self.engine.loop = self._seconds[1] < self._seconds[0]
            return grads, losses
        grads, losses, _ = self.engine.gradients_alone(chosen, step)
        return grads, losses

    def _rows(self, rows: int) -> Optional[torch.Tensor]:
        if rows <= 0:
            return None
        k = min(self.examples, rows)
        return torch.randperm(rows, generator=self._examples)[:k].sort().values

    def _random(self, chosen: Any, step: Callable[[Any], Any]) -> bool:
        """The examples' losses alone, twice: different with dropout off means the forward pass is still random."""
        return not _same(self.engine.losses_alone(chosen, step), self.engine.losses_alone(chosen, step))

    @staticmethod
    def _mixes(batch_losses: Optional[torch.Tensor], index: torch.Tensor, alone: torch.Tensor) -> Optional[bool]:
        if batch_losses is None or batch_losses.ndim != 1 or int(index.max()) >= batch_losses.numel():
            return None  # (a reduced loss: not known)
        together = batch_losses.detach().to(torch.float64)[index.to(batch_losses.device)].cpu()
        alone = alone.detach().to(torch.float64).reshape(-1).cpu()
        scale = max(float(together.abs().max()), float(alone.abs().max()), 1e-12)
        return bool(((together - alone).abs() > 1e-4 * scale).any())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two evaluations of the same losses, up to float rounding (vmap with and without gradients may round apart);
    a dropout mask changes them far more."""
    a, b = a.detach().to(torch.float64).reshape(-1), b.detach().to(torch.float64).reshape(-1)
    return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-7 * max(1.0, float(a.abs().max()) if a.numel() else 1.0)))


def _select(batch: Any, index: torch.Tensor, per_example: Any = None) -> Any:
    """The rows ``index`` of every tensor of ``batch`` split by rows (as the functional engine splits a batch), or
    of a batch's :class:`~lightning_privacy.dpsgd.functional.Examples` those examples."""
    if isinstance(batch, functional.Examples):
        return functional.Examples([batch[int(i)] for i in index])
    leaves, spec, rows, batched = functional._split(batch, per_example)
    chosen: Sequence[torch.Tensor] = [leaves[i][index.to(leaves[i].device)] for i in batched]
    return functional._rebuild(leaves, spec, batched, chosen)

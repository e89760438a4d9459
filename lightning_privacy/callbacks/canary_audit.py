"""``CanaryAudit``: an ε lower bound from canaries inserted into the same training run (one-run auditing).

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023): m canaries, each
included with probability 1/2, scored after training; the guesses become a statistically valid lower
bound on ε (:mod:`lightning_privacy.analysis.canary`). The accountant gives the upper bound of the same run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from matplotlib.figure import Figure
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler, Subset
from typing_extensions import override

from lightning_privacy import _compat, names
from lightning_privacy.audits.canary import CORRECTIONS, CanaryResult, audit_canaries
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.callbacks import _strategies
from lightning_privacy.functional.membership_loss import membership_losses_from_loader

__all__ = ["CanaryAudit", "theory_vs_practice_figure"]

KINDS = ("gradient", "input")
SCORES = ("released_minus_batch", "released", "likelihood_ratio")
DEFAULT_DELTA = 1e-5
DEFAULT_NUM_CANARIES = 1000  # num_canaries=None: this many, or one per trainable coordinate when the model has fewer
STATE_VERSION = 1
SCORE_BATCH_SIZE = 256
_DRAW, _SAMPLE = 0, 1  # seed streams: the canary set and inclusion; the per-step Poisson sampling
_BLOCK = 64  # steps whose canary sampling is drawn at once
_NUMPY_DTYPES = (torch.float32, torch.float64)


def _bad(name: str, expected: str, value: Any) -> MisconfigurationException:
    return MisconfigurationException(f"`{name}` must be {expected}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class CanaryAudit(Callback):
    r"""One-run canary audit: an ε lower bound from the training run itself, beside the accountant's ε.

    ``num_canaries`` canaries are each included in training with probability 1/2 (drawn from ``seed``); at
    fit end each is scored (higher = looks included) and the best guesses on a grid fixed by m become a
    lower bound on ε at level ``alpha`` with a Bonferroni (or ``"split"``) correction
    (:func:`~lightning_privacy.analysis.canary.canary_audit_from_scores`), by Steinke et al.'s Theorem 3.1
    (``"binomial"``) and Mahloujifar et al.'s Gaussian trade-off test (``"gdp"``). A bound above the
    accountant's ε would mean the implementation leaks more than claimed. With m canaries no bound can
    exceed about log(q/(1 − q)), q = (α/27)^(1/m) (4.8 for m = 1000, α = 0.05, δ = 1e-5), whatever the true
    ε: the ceiling is logged beside the bound.

    ``kind="gradient"`` (white box, needs :class:`~lightning_privacy.DPSGD`): canary j is the Dirac
    gradient C·e_j (C = ``max_grad_norm``, so clipping leaves it unchanged) on one of m distinct random
    coordinates of the flattened trainable parameters. Every step each included canary joins the batch
    with DP-SGD's sample rate p and is added to the summed clipped gradient before the noise (through
    ``DPSGD.register_before_noise_hook``; under DDP on global rank 0 only, so it is counted once — every
    rank derives the same canaries, inclusion and per-step sampling from ``seed``). The scores come from
    g̃_t, the released noisy sum of step t, read from ``p.grad`` after the step (after DDP's all-reduce,
    the same on every rank) and expressed in units of the clipped sum. DP-SGD's analysis (Abadi et al.
    2016) assumes every g̃_t is released to an adversary who knows all the other training data: the
    accountant's ε holds against exactly that adversary, so scores built from those values audit what the
    accountant claims.

    - ``score="released_minus_batch"`` (default): Σ_t (g̃_t[j] − b_t[j]), where b_t is the sum of the
      batch's own clipped per-sample gradients (read in the hook before the canaries are added; summed
      over DDP ranks). The accountant's guarantee still holds when the adversary also knows every other
      example's clipped gradient and batch membership (Poisson amplification conditions on the other
      examples' sampling), so this is a valid — and the strongest — white-box score; it leaves C·(times
      canary j was sampled) plus the noise, and the bound then tracks the accountant's ε as privacy weakens.
    - ``score="likelihood_ratio"``: Σ_t log[(1 − p) + p·exp((y_t·C − C²/2) / (σC)²)] with y_t = g̃_t[j] − b_t[j]:
      at every step, the log-likelihood ratio of "canary j included" (the step's value is N(C, σ²C²) with
      probability p, else N(0, σ²C²)) against "excluded" (N(0, σ²C²)), with DPSGD's configured σ — the most
      powerful test of one step of the claimed mechanism (Neyman–Pearson), summed over the independent steps. It
      weighs a step by how far its value is from the noise instead of adding every step linearly, so it
      separates included canaries better than the sum when σ is small (the sum recovers only a fraction
      1/√(σ²(e^{1/σ²} − 1)) of the mechanism's μ: 0.76 at σ = 1, 0.94 at σ = 2). Any fixed score gives a valid
      bound; ``benchmarks/dp_violations.py`` compares the two.
    - ``score="released"``: Σ_t g̃_t[j], the released values alone. The real data's gradient at coordinate
      j adds a nuisance that is large for small models and big batches (Adult MLP, B ≈ 2,700: a bound of
      1.0 instead of 4.1 at σ = 0.3, 30 epochs; see ``benchmarks/canary_audit.py``).

    The canaries are real gradient terms: each moves its coordinate by at most C per step (C/B after
    averaging over the expected batch size B), so the audited run trains slightly differently from one
    without the audit.

    ``kind="input"`` (black box; with or without DP-SGD): canary j is a copy of a random training row
    with a wrong label (label y → (y + 1 + u) mod K, u uniform in [0, K − 2], K classes), an example the
    model would not fit by chance. Included canaries are appended to the training set (a
    ``ConcatDataset`` behind a loader with the same batch size and collate_fn, installed before DP-SGD's
    Poisson sampling, so they are sampled like every row). Score: minus the final model's membership loss
    (``logsumexp`` of the other logits minus the label's logit, monotone in cross-entropy) on every
    canary, included or not. Only the last model is seen, so expect bounds far below the accountant's ε.

    **A claim, checked.** ``claim`` is the guarantee the canaries test (the in/out game: add/remove): a
    :class:`~lightning_privacy.claims.Claim`, a ``PrivacyLedger``, ``(noise_multiplier, sample_rate, steps[, delta])``
    or ``(epsilon, delta)``; by default, with :class:`~lightning_privacy.DPSGD`, its ledger at fit end (the run's own
    claim). ``result.verdict`` is ``"contradicted"`` when the canaries refute it at confidence 1 − ``alpha`` (the
    binomial ε lower bound at the claim's δ beyond its ε, or the f-DP one-run test of the claim's own trade-off
    curve; :func:`~lightning_privacy.analysis.claims.check_canaries`), else ``"consistent"``; logged as
    ``audit/canary_claim_contradicted`` (1 or 0).

    Logged at fit end through ``trainer.loggers`` at ``trainer.global_step`` (rank 0):
    ``audit/canary_epsilon_lower``, ``audit/canary_epsilon_lower_gdp``, the guesses and correct guesses of
    both, the ceilings ``audit/canary_epsilon_lower_max(_gdp)`` and, with a claim,
    ``audit/canary_claim_contradicted``; to TensorBoard a "theory vs practice"
    figure (accountant ε, the canary bounds, and ε* and PANORAMIA ε̃ when those audits ran in the same
    fit) and a text summary. Skipped under ``fast_dev_run``.

    Args:
        kind: ``"gradient"`` or ``"input"``.
        num_canaries: m ≥ 1 (gradient: at most the number of trainable coordinates; input: of rows). ``None``
            (default): 1000, and for gradient canaries on a model with fewer trainable coordinates (LoRA adapters,
            a head fine-tuned on a frozen backbone) one canary on every coordinate (said at fit start).
        seed: non-negative int; the canaries, inclusion, per-step sampling and tie-breaking derive from it.
        alpha: significance of the bound, in (0, 1).
        delta: δ of the (ε, δ) claim tested, in (0, 1); default DPSGD's δ, else 1e-5.
        correction: ``"bonferroni"`` or ``"split"`` (see ``canary_audit_from_scores``).
        score: gradient canaries' score, ``"released_minus_batch"``, ``"likelihood_ratio"`` or ``"released"`` (see
            above).
        num_classes: K for the wrong labels (input); default the model's number of logits (2 for one).
        forward_fn: ``forward_fn(pl_module, batch) -> (logits, target)`` to score input canaries; default
            ``pl_module(batch[0]), batch[1]``.
        claim: the guarantee to test (see above); ``None``: DPSGD's ledger at fit end, if DPSGD trains the model.

    Attributes:
        results: the fit-end values by key: the logged ones plus the uncorrected best
            ``audit/canary_epsilon_optimistic(_gdp)`` (not a valid bound: kept for comparison with papers).
        result: the last :class:`~lightning_privacy.audits.canary.CanaryResult` (``result.verdict``,
            ``result.evidence``, ``result.claim``).
        details: the :class:`~lightning_privacy.analysis.canary.CanaryAuditResult` by method.
        accountant_epsilon: DPSGD's ε at the audit's δ (``None`` without DPSGD).

    Raises:
        MisconfigurationException: a bad argument (at construction); ``"gradient"`` without DPSGD, more
            canaries than coordinates or rows (naming ``num_canaries=`` and the largest allowed), or a train loader
            that cannot take canary rows (at fit).

    Example::

        >>> audit = CanaryAudit("gradient", num_canaries=1000, seed=3)
        >>> audit.state_key
        "CanaryAudit{'kind': 'gradient', 'num_canaries': 1000, 'seed': 3}"
        >>> CanaryAudit("labels")
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `kind` must be one of ('gradient', 'input'), got 'labels'
        >>> trainer = pl.Trainer(callbacks=[DPSGD(noise_multiplier=1.0), audit])  # doctest: +SKIP
    """

    hparams_metric_keys = (names.CANARY_EPSILON_LOWER,)

    def __init__(
        self,
        kind: str = "gradient",
        *,
        num_canaries: Optional[int] = None,
        seed: int = 0,
        alpha: float = 0.05,
        delta: Optional[float] = None,
        correction: str = "bonferroni",
        score: str = "released_minus_batch",
        num_classes: Optional[int] = None,
        forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
        claim: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise _bad("kind", f"one of {KINDS}", kind)
        if num_canaries is not None and (not _is_int(num_canaries) or num_canaries < 1):
            raise _bad("num_canaries", "None or a positive int", num_canaries)
        if not _is_int(seed) or seed < 0:
            raise _bad("seed", "a non-negative int", seed)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise _bad("alpha", "in (0, 1)", alpha)
        if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1):
            raise _bad("delta", "None or in (0, 1)", delta)
        if correction not in CORRECTIONS:
            raise _bad("correction", f"one of {CORRECTIONS}", correction)
        if score not in SCORES:
            raise _bad("score", f"one of {SCORES}", score)
        if num_classes is not None and (not _is_int(num_classes) or num_classes < 2):
            raise _bad("num_classes", "None or an int >= 2", num_classes)
        if claim is not None:
            from lightning_privacy.claims import Claim

            try:
                claim = claim if hasattr(claim, "privacy_loss_distribution") else Claim.parse(claim)
            except (TypeError, ValueError) as err:  # a ledger is read at fit end (it may still be empty here)
                raise MisconfigurationException(str(err)) from None
        self.claim = claim
        self._adaptive = num_canaries is None  # the default: 1000, fewer on a model with fewer coordinates
        self.num_canaries = DEFAULT_NUM_CANARIES if num_canaries is None else int(num_canaries)
        self._requested = self.num_canaries  # the state key's value: fixed at construction, whatever the run adapts
        self.kind, self.seed = kind, int(seed)
        self.alpha, self.delta, self.correction = float(alpha), None if delta is None else float(delta), correction
        self.score, self.num_classes, self.forward_fn = score, num_classes, forward_fn
        # the run's canaries (plain Python, in state_dict); drawn from the seed at the first fit
        self._space: Optional[int] = None  # trainable coordinates (gradient) or training rows (input)
        self._canaries: Optional[List[int]] = None  # coordinates or row indices
        self._labels: Optional[List[int]] = None  # the wrong labels (input)
        self._included: Optional[np.ndarray] = None
        self._scores = np.zeros(self.num_canaries)  # running Σ_t g̃_t[j] (gradient)
        self._steps = 0  # optimizer steps with canaries (seeds each step's sampling)
        self.result: Optional[CanaryResult] = None  # the last audit (lightning_privacy.audits.canary)
        self.results: Dict[str, float] = {}
        self.details: Dict[str, Any] = {}
        self.accountant_epsilon: Optional[float] = None
        # runtime only
        self._dpsgd: Any = None
        self._hooked: Any = None
        self._params: List[tuple] = []  # per parameter holding canaries, see on_train_start
        self._block: Optional[tuple] = None  # (block, uniforms) of the per-step sampling
        self._unit: Optional[float] = None  # p.grad × unit = the released noisy sum
        self._adds, self._world = False, 1
        self._pending: Optional[tuple] = None  # (batch sums at the canaries or None, p.grad unit) of this step
        self._sample_rate = 0.0
        self._source: Optional[Dataset] = None
        self._collate: Any = None
        self._figure_pending = False
        self._module: Any = None
        self._sharded = False  # FSDP2 (ModelParallelStrategy): sums and gradients are sharded DTensors

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(kind=self.kind, num_canaries=self._requested, seed=self.seed)

    def _start_over(self) -> None:
        """Forget the last model's canaries, scores and audit (as at construction)."""
        self.num_canaries = DEFAULT_NUM_CANARIES if self._adaptive else self._requested
        self._space, self._canaries, self._labels, self._included = None, None, None, None
        self._scores, self._steps = np.zeros(self.num_canaries), 0
        self.result, self.results, self.details, self.accountant_epsilon = None, {}, {}, None

    # ------------------------------------------------------------------------------ the canaries
    def _draw(self, space: int, what: str) -> None:
        """Draw (or, after a resume, check) the canary set and inclusion for ``space`` coordinates or rows."""
        if space < self.num_canaries and self._canaries is None:
            if self._adaptive and self.kind == "gradient":
                rank_zero_info(
                    f"CanaryAudit: the model has {space} trainable coordinates, fewer than the default "
                    f"{DEFAULT_NUM_CANARIES} canaries: one canary on each (num_canaries={space})."
                )
                self.num_canaries = int(space)
                self._scores = np.zeros(self.num_canaries)
            else:
                raise MisconfigurationException(self._too_many(space, what))
        if self._canaries is not None:
            if self._space != space:
                raise RuntimeError(
                    f"CanaryAudit state was drawn for {self._space} {what}, this run has {space}: not the same run"
                )
            return
        rng = np.random.default_rng([self.seed, _DRAW])
        self._space = int(space)
        self._canaries = [int(i) for i in rng.choice(space, size=self.num_canaries, replace=False)]
        self._included = rng.random(self.num_canaries) < 0.5

    def _too_many(self, space: int, what: str) -> str:
        given = "the default " if self._adaptive else ""
        text = (
            f"CanaryAudit(kind={self.kind!r}): {given}num_canaries={self.num_canaries} needs as many {what}, but the "
            f"run has {space}. Pass `CanaryAudit({self.kind!r}, num_canaries=m)` with m ≤ {space}"
        )
        if self.kind == "input":
            return text + (
                f" (each included canary is a mislabelled copy of a training row: about m/2 of them join the "
                f"{space} rows, so keep m well below {space})."
            )
        return text + " (at most one canary per trainable coordinate)."

    @property
    def included(self) -> Optional[np.ndarray]:
        """Whether each canary was included (known once the fit started)."""
        return None if self._included is None else self._included.copy()

    @property
    def scores(self) -> np.ndarray:
        """Running scores (gradient: Σ_t g̃_t[j] so far; input: filled at fit end)."""
        return self._scores.copy()

    def sampled(self, step: int) -> np.ndarray:
        """Which canaries join optimizer step ``step`` (0-based): included and Poisson-sampled at rate p.

        The uniforms come from a counter-based generator (Philox, key ``seed``, one counter block per
        ``_BLOCK`` steps), so any step's draw is reproducible on every rank and after a resume.
        """
        block, row = divmod(int(step), _BLOCK)
        if self._block is None or self._block[0] != block:
            bits = np.random.Philox(key=self.seed, counter=[0, block, _SAMPLE, 0])  # word 0 counts within a block
            self._block = (block, np.random.Generator(bits).random((_BLOCK, self.num_canaries)))
        return self._included & (self._block[1][row] < self._sample_rate)

    # ------------------------------------------------------------------------------ wiring
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_privacy.callbacks.dpsgd import DPSGD

        if self._module is not None and self._module is not pl_module and self._steps:
            self._start_over()  # reused for another model: its own canaries and scores (a checkpoint loads after)
        self._module = pl_module
        found = [cb for cb in trainer.callbacks if isinstance(cb, DPSGD)]
        self._dpsgd = found[0] if found else None
        if self.kind == "input":
            _compat.install_train_loader_transform(trainer, self._with_canaries, key="canaries", order=0)
            return
        if self._dpsgd is None:
            raise MisconfigurationException(
                "CanaryAudit(kind='gradient') adds canaries to DP-SGD's clipped gradients and needs the DPSGD callback "
                "in the same Trainer; use kind='input' to audit training without DP-SGD"
            )
        if self._hooked is not self._dpsgd:  # once per DPSGD, however often fit is called
            self._dpsgd.register_before_noise_hook(self._add_canaries)
            self._hooked = self._dpsgd

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.kind != "gradient":
            return
        named = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
        self._draw(sum(p.numel() for _, p in named), "trainable coordinates")
        optimized = {id(p) for group in trainer.strategy.optimizers[0].param_groups for p in group["params"]}
        coords = np.asarray(self._canaries, dtype=np.int64)
        self._params, start = [], 0
        for name, p in named:
            if id(p) not in optimized:
                raise MisconfigurationException(f"CanaryAudit: trainable parameter {name!r} is not in the optimizer")
            ids = np.flatnonzero((coords >= start) & (coords < start + p.numel()))
            if ids.size:  # (parameter, canary ids, their flat indices in it, the same on its device)
                local = coords[ids] - start
                self._params.append((p, ids, local, torch.as_tensor(local, device=p.device)))
            start += p.numel()
        self._sample_rate = float(self._dpsgd.sample_rate)
        self._sharded = _strategies.is_fsdp(trainer)
        # DDP: rank 0 adds each canary once to its clipped sum. FSDP2: the clipped sum is the ranks' reduce-scattered
        # average, sharded, so every rank adds C/W at the canaries its shard holds (once in all).
        self._adds, self._world = trainer.is_global_zero or self._sharded, trainer.world_size
        self._pending, self._unit = None, None

    def _gather(self, tensors: List[torch.Tensor]) -> np.ndarray:
        """Per-parameter tensors at the canary coordinates, as one float64 array in canary order."""
        out = np.zeros(self.num_canaries)
        for t, (_, ids, local, local_t) in zip(tensors, self._params):
            flat = t.detach().reshape(-1)
            if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES:  # numpy indexing: ~10x less per-call cost
                out[ids] = flat.numpy()[local]
            else:
                out[ids] = flat.index_select(0, local_t).double().cpu().numpy()
        return out

    def _add_canaries(self, optimizer: Any) -> None:
        """Before-noise hook: note the batch's own sum, then add C·e_j per canary sampled this step (once in all)."""
        step, self._steps = self._steps, self._steps + 1
        minus = self.score in ("released_minus_batch", "likelihood_ratio")
        known = None
        if minus:
            sums = [optimizer.summed(p) for p, *_ in self._params]
            if self._sharded:  # the average of the ranks' sums, all-gathered (a collective: every rank is here)
                sums = [s.full_tensor() * self._world for s in sums]
            known = self._gather(sums)
        if self._unit is None:  # p.grad = Σ_ranks (sum + noise) / unit after the step (DPSGD: no accumulation)
            mean = optimizer.loss_reduction == "mean"
            self._unit = float(
                optimizer.expected_batch_size * optimizer.accumulated_iterations * self._world if mean else 1
            )
        self._pending = (known, self._unit)
        if not self._adds:
            return
        sampled = self.sampled(step)
        value = float(self._dpsgd.max_grad_norm)
        if self._sharded:
            self._add_to_shards(optimizer, sampled, value / self._world)
            return
        for p, ids, local, local_t in self._params:
            hit = sampled[ids]
            if not hit.any():
                continue
            grad = p.summed_grad
            if (
                grad.device.type == "cpu"
                and grad.dtype in _NUMPY_DTYPES
                and grad.is_contiguous()
                and not grad.requires_grad
            ):
                grad.view(-1).numpy()[local[hit]] += value  # distinct coordinates: no index repeats
            else:
                flat = grad.reshape(-1)
                index = local_t[torch.as_tensor(hit, device=local_t.device)]
                flat.index_add_(0, index, torch.full(index.shape, value, dtype=flat.dtype, device=flat.device))
                if flat.data_ptr() != grad.data_ptr():  # reshape copied: write back
                    p.summed_grad = flat.view_as(grad)

    def _add_to_shards(self, optimizer: Any, sampled: np.ndarray, value: float) -> None:
        """FSDP2: add ``value`` at the sampled canaries that this rank's dim-0 shard of each parameter holds."""
        for p, ids, local, _ in self._params:
            hit = local[sampled[ids]]
            shard = optimizer.summed(p)
            mine = shard.to_local()
            if not hit.size or mine.numel() == 0:
                continue
            row = int(np.prod(p.shape[1:])) if p.dim() > 1 else 1
            first = _shard_offset(p, shard) * row  # flat index of this rank's first element
            inside = hit[(hit >= first) & (hit < first + mine.numel())] - first
            if inside.size:
                flat = mine.view(-1)
                flat.index_add_(0, torch.as_tensor(inside, device=flat.device), flat.new_full((inside.size,), value))

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is None:  # no DP step this batch (e.g. a skipped optimizer step): nothing released
            return
        known, unit = self._pending
        self._pending = None
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p, *_ in self._params]
        if self._sharded:  # every rank's shard of the released gradient (a collective: every rank is here)
            grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
        score = self._gather(grads) * unit  # the released noisy sum g̃_t at the canary coordinates
        if known is not None:
            if self._world > 1 and not self._sharded:  # every rank's own batch sum (a collective: every rank is here)
                known = trainer.strategy.reduce(torch.from_numpy(known).to(pl_module.device), reduce_op="sum")
                known = known.cpu().numpy()
            score -= known
        if self.score == "likelihood_ratio":  # the step's log-likelihood ratio, included vs excluded (see above)
            clip, sigma = float(self._dpsgd.max_grad_norm), float(self._dpsgd.noise_multiplier)
            z = (score * clip - clip**2 / 2) / (sigma * clip) ** 2
            score = np.logaddexp(np.log1p(-self._sample_rate), np.log(self._sample_rate) + z)
        self._scores += score

    def _with_canaries(self, loader: Any) -> DataLoader:
        """The train loader with the included canary rows appended (same batch size, collate_fn, shuffling)."""
        dataset = getattr(loader, "dataset", None)
        if not isinstance(loader, DataLoader) or loader.batch_size is None or isinstance(dataset, IterableDataset):
            raise MisconfigurationException(
                "CanaryAudit(kind='input') needs one DataLoader with a batch_size over a map-style dataset, got "
                f"{type(loader).__name__}" + (f" over {type(dataset).__name__}" if dataset is not None else "")
            )
        self._draw(len(dataset), "training rows")
        self._source, self._collate = dataset, loader.collate_fn
        if self._labels is None:
            self._labels = self._wrong_labels(dataset)
        rows = _CanaryRows(dataset, self._canaries, self._labels)
        kept = Subset(rows, np.flatnonzero(self._included).tolist())
        sampler = loader.sampler
        return DataLoader(
            ConcatDataset([dataset, kept]),
            batch_size=loader.batch_size,
            shuffle=isinstance(sampler, RandomSampler),
            generator=getattr(sampler, "generator", None) if isinstance(sampler, RandomSampler) else None,
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
        )

    def _wrong_labels(self, dataset: Dataset) -> List[int]:
        labels = [_label(dataset[i]) for i in self._canaries]
        classes = self.num_classes or self._classes_of_model(dataset)
        if max(labels) >= classes:
            raise MisconfigurationException(f"CanaryAudit: labels up to {max(labels)} but `num_classes`={classes}")
        shift = 1 + np.random.default_rng([self.seed, _DRAW, 1]).integers(0, classes - 1, size=len(labels))
        return [int((y + s) % classes) for y, s in zip(labels, shift)]

    def _classes_of_model(self, dataset: Dataset) -> int:
        module = self._module
        batch = next(iter(DataLoader(Subset(dataset, self._canaries[:1]), batch_size=1, collate_fn=self._collate)))
        with torch.no_grad():
            was = module.training
            module.eval()
            try:
                device = next(module.parameters()).device
                batch = [b.to(device) if isinstance(b, torch.Tensor) else b for b in batch]
                logits = (self.forward_fn or (lambda m, b: (m(b[0]), b[1])))(module, batch)[0]
            finally:
                module.train(was)
        return max(2, int(logits.shape[-1]) if logits.ndim > 1 else 2)

    # ------------------------------------------------------------------------------ the audit
    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fast_dev_run:
            rank_zero_info("CanaryAudit: skipped under fast_dev_run (no audit of a few debug batches).")
            return
        if self._included is None:
            return  # training never started
        if self.kind == "input":
            self._scores = -self._input_losses(pl_module)
        delta = self.delta or (self._dpsgd.delta if self._dpsgd is not None else DEFAULT_DELTA)
        self.accountant_epsilon = float(self._dpsgd.epsilon(delta)) if self._dpsgd is not None else None
        claim = self.claim
        if claim is None and self._dpsgd is not None and self._dpsgd.ledger.steps:
            from lightning_privacy.claims import Claim

            claim = Claim.from_ledger(self._dpsgd.ledger, delta=delta)  # the run's own claim, at the audit's δ
        self.result = audit_canaries(
            self._scores,
            self._included,
            delta=delta,
            alpha=self.alpha,
            correction=self.correction,
            seed=self.seed,
            kind=self.kind,
            accountant_epsilon=self.accountant_epsilon,
            claim=claim,
        )
        self.results, self.details = {**self.result.values, **self.result.metrics()}, dict(self.result.details)
        audit.log_scalars(trainer, self.result.metrics())
        text = self.summary()
        audit.log_text(trainer, names.CANARY_SUMMARY, text)
        rank_zero_info(text.splitlines()[0])
        for warning in self.result.warnings:
            rank_zero_warn(f"CanaryAudit: {warning}")
        self._figure_pending = True  # drawn in teardown, after every callback's on_fit_end (ε*, PANORAMIA)

    def _input_losses(self, pl_module: pl.LightningModule) -> np.ndarray:
        rows = _CanaryRows(self._source, self._canaries, self._labels)
        loader = DataLoader(rows, batch_size=SCORE_BATCH_SIZE, shuffle=False, collate_fn=self._collate)
        return membership_losses_from_loader(pl_module, loader, forward_fn=self.forward_fn).double().numpy()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self._figure_pending:
            return
        self._figure_pending = False
        if audit.tensorboard_experiments(trainer):
            audit.log_figure(trainer, names.CANARY_FIGURE, theory_vs_practice_figure(self, _other_audits(trainer)))

    def summary(self) -> str:
        """A Markdown table of the last audit (:meth:`lightning_privacy.audits.canary.CanaryResult.summary`)."""
        if self.result is None:
            raise RuntimeError("CanaryAudit.summary(): no audit has run yet (it runs at the end of fit)")
        return self.result.summary()

    # ------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "num_canaries": self.num_canaries,
            "seed": self.seed,
            "space": self._space,
            "canaries": None if self._canaries is None else list(self._canaries),
            "labels": None if self._labels is None else list(self._labels),
            "included": None if self._included is None else [bool(b) for b in self._included],
            "scores": [float(s) for s in self._scores],
            "steps": self._steps,
            "score": self.score,
            "results": dict(self.results),
        }

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        required = {"version", "kind", "num_canaries", "seed", "score", "space", "canaries", "included", "scores"}
        missing = required - set(state_dict)
        if missing:
            raise RuntimeError(f"CanaryAudit state is missing {sorted(missing)}: refusing to restart the audit")
        if state_dict["version"] != STATE_VERSION:
            raise RuntimeError(f"CanaryAudit state version {state_dict['version']!r} is not {STATE_VERSION}")
        if (
            self._adaptive
            and _is_int(state_dict["num_canaries"])
            and 1 <= state_dict["num_canaries"] <= self._requested
        ):
            self.num_canaries = int(state_dict["num_canaries"])  # the default, adapted to that run's coordinates
        for key in ("kind", "num_canaries", "seed", "score"):
            if state_dict[key] != getattr(self, key):
                raise RuntimeError(
                    f"checkpoint audited with {key}={state_dict[key]!r}, this CanaryAudit has {getattr(self, key)!r}"
                )
        if len(state_dict["scores"]) != self.num_canaries:
            raise RuntimeError(
                f"CanaryAudit state has {len(state_dict['scores'])} scores for {self.num_canaries} canaries"
            )
        self._space = state_dict["space"]
        self._canaries = None if state_dict["canaries"] is None else [int(i) for i in state_dict["canaries"]]
        self._labels = None if state_dict.get("labels") is None else [int(i) for i in state_dict["labels"]]
        self._included = None if state_dict["included"] is None else np.asarray(state_dict["included"], dtype=bool)
        self._scores = np.asarray(state_dict["scores"], dtype=float)
        self._steps = int(state_dict.get("steps", 0))
        self.results = {str(k): float(v) for k, v in state_dict.get("results", {}).items()}


def _shard_offset(param: torch.Tensor, shard: Any) -> int:
    """The first dim-0 row of ``param`` that this rank's FSDP2 shard holds (``torch.chunk`` over the mesh)."""
    rank, world = shard.device_mesh.get_local_rank(), shard.device_mesh.size()
    rows_per_rank = -(-param.shape[0] // world) if param.dim() else 1
    return min(rank * rows_per_rank, param.shape[0] if param.dim() else 0)


class _CanaryRows(Dataset):
    """Rows ``rows`` of ``dataset`` with their labels replaced by ``labels`` (canary j is item j)."""

    def __init__(self, dataset: Dataset, rows: List[int], labels: List[int]) -> None:
        self.dataset, self.rows, self.labels = dataset, rows, labels

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, j: int) -> Any:
        item = self.dataset[self.rows[j]]
        y = item[1]
        label = (
            torch.as_tensor(self.labels[j], dtype=y.dtype) if isinstance(y, torch.Tensor) else type(y)(self.labels[j])
        )
        return type(item)((item[0], label, *item[2:])) if isinstance(item, tuple) else [item[0], label, *item[2:]]


def _label(item: Any) -> int:
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise MisconfigurationException(
            f"CanaryAudit(kind='input') needs (x, y, ...) examples, got {type(item).__name__}"
        )
    y = item[1]
    if isinstance(y, torch.Tensor) and y.numel() != 1 or not (isinstance(y, torch.Tensor) or _is_int(y)):
        raise MisconfigurationException(
            f"CanaryAudit(kind='input') needs one integer class label per example, got {y!r}"
        )
    return int(y)


def _other_audits(trainer: pl.Trainer) -> Dict[str, float]:
    """ε* and PANORAMIA ε̃ of this fit, from the audits' attributes or ``trainer.callback_metrics``."""
    found: Dict[str, float] = {}
    for key in (names.EPSILON_STAR, names.PANORAMIA_EPSILON):
        for cb in trainer.callbacks:
            for attr in ("results", "last_values"):
                values = getattr(cb, attr, None)
                if isinstance(values, dict) and key in values:
                    found[key] = float(values[key])
        if key not in found and key in trainer.callback_metrics:
            found[key] = float(trainer.callback_metrics[key])
    return found


def theory_vs_practice_figure(canary: CanaryAudit, others: Dict[str, float]) -> Figure:
    """The accountant's ε (upper bound) beside the canary lower bounds, ε* and PANORAMIA ε̃, on one axis."""
    return dataclasses.replace(canary.result, others=dict(others)).figure()

"""The canaries of one training run, without a Trainer: drawing, inclusion, per-step sampling, insertion, scoring.

:class:`~lightning_privacy.CanaryAudit` translates Lightning's hooks into calls on these objects; the bounds from the
final scores are :func:`lightning_privacy.audits.canary.audit_canaries`.

- :class:`CanarySet`: which canaries (coordinates or rows), which are included, which join each step, the running
  scores and the wrong labels; plain Python and numpy, the callback's checkpoint state.
- :class:`GradientCanaries`: gradient canaries on a model's trainable parameters: before DP-SGD's noise, note the
  batch's own clipped sum and add C·e_j for each sampled canary (into the whole sum, or the shard an FSDP2 rank holds);
  after the step, score the released noisy sum.
- :class:`InputCanaries`: input canaries (:class:`CanaryRows`, training rows with :func:`wrong_labels`) appended to
  the training set (:func:`with_canaries`), scored by the final model's loss.

Errors a user can fix are ``ValueError``; a state that belongs to another run is ``RuntimeError``.

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
canary, included or not. Only the last model is seen, so expect bounds far below the accountant's ε. With
``examples`` (a map-style dataset of m ``(x, y)`` examples, e.g. optimised by
:func:`~lightning_privacy.audits.canary_design.optimize_input_canaries`) canary j is one of those examples with its
own label (their order drawn from ``seed``); their SHA-256 fingerprint is in the state, so a resume with other
canaries is refused.

Example::

    >>> canaries = CanarySet("gradient", num_canaries=4, seed=2)
    >>> canaries.draw(10, "trainable coordinates")  # 4 of 10 coordinates, each included with probability 1/2
    >>> canaries.canaries, canaries.included.tolist()
    ([9, 5, 0, 2], [False, False, True, True])
    >>> bool((canaries.sampled(0, sample_rate=1.0) == canaries.included).all())
    True
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler, Subset

from lightning_privacy.audits.canary import CORRECTIONS, CanaryResult, audit_canaries
from lightning_privacy.functional.membership_loss import membership_losses_from_loader

__all__ = [
    "CanaryRows",
    "CanarySet",
    "GradientCanaries",
    "audit_run",
    "check_arguments",
    "check_examples",
    "fingerprint",
    "classes_of_model",
    "InputCanaries",
    "label_of",
    "parse_claim",
    "shard_offset",
    "with_canaries",
    "wrong_labels",
]

KINDS = ("gradient", "input")
SCORES = ("released_minus_batch", "released", "likelihood_ratio")
DEFAULT_NUM_CANARIES = 1000  # num_canaries=None: this many, or one per trainable coordinate when the model has fewer
STATE_VERSION = 1
SCORE_BATCH_SIZE = 256
DEFAULT_DELTA = 1e-5
_DRAW, _SAMPLE = 0, 1  # seed streams: the canary set and inclusion; the per-step Poisson sampling
_BLOCK = 64  # steps whose canary sampling is drawn at once
_NUMPY_DTYPES = (torch.float32, torch.float64)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _bad(name: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"`{name}` must be {expected}, got {value!r}")


CLAIM_TESTS = ("both", "fdp")  # α split between the binomial and the f-DP test, or all on the f-DP test


def _is_open_unit(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < 1


def check_arguments(
    kind: Any,
    num_canaries: Any,
    seed: Any,
    alpha: Any,
    delta: Any,
    correction: Any,
    score: Any,
    num_classes: Any,
    claim_tests: Any = "both",
    rows_per_canary: Any = None,
) -> None:
    """Raise ``ValueError`` naming the first bad argument of a canary audit (and what is allowed)."""
    if rows_per_canary is not None and (not _is_int(rows_per_canary) or rows_per_canary < 1):
        raise _bad("rows_per_canary", "None or a positive int", rows_per_canary)
    if kind not in KINDS:
        raise _bad("kind", f"one of {KINDS}", kind)
    if num_canaries is not None and (not _is_int(num_canaries) or num_canaries < 1):
        raise _bad("num_canaries", "None or a positive int", num_canaries)
    if not _is_int(seed) or seed < 0:
        raise _bad("seed", "a non-negative int", seed)
    if not _is_open_unit(alpha):
        raise _bad("alpha", "in (0, 1)", alpha)
    if delta is not None and not _is_open_unit(delta):
        raise _bad("delta", "None or in (0, 1)", delta)
    if correction not in CORRECTIONS:
        raise _bad("correction", f"one of {CORRECTIONS}", correction)
    if score not in SCORES:
        raise _bad("score", f"one of {SCORES}", score)
    if num_classes is not None and (not _is_int(num_classes) or num_classes < 2):
        raise _bad("num_classes", "None or an int >= 2", num_classes)
    if claim_tests not in CLAIM_TESTS:
        raise _bad("claim_tests", f"one of {CLAIM_TESTS}", claim_tests)


def check_examples(examples: Any, kind: str, num_canaries: Optional[int]) -> Optional[int]:
    """m for canaries given as ``examples`` (``None`` when none are given); ``ValueError`` naming what is wrong."""
    if examples is None:
        return None
    if kind != "input":
        raise ValueError(f"`examples` are input canaries: pass them with kind='input', not kind={kind!r}")
    if isinstance(examples, IterableDataset) or not all(hasattr(examples, a) for a in ("__getitem__", "__len__")):
        raise _bad("examples", "a map-style dataset of (x, y) canary examples", type(examples).__name__)
    if len(examples) < 1:
        raise _bad("examples", "a non-empty dataset", examples)
    if num_canaries is not None and num_canaries != len(examples):
        raise ValueError(
            f"`num_canaries`={num_canaries} but `examples` holds {len(examples)} canaries: leave num_canaries=None"
        )
    return len(examples)


def fingerprint(examples: Dataset) -> str:
    """A SHA-256 digest of every canary example's input and label (a resumed audit checks its canaries by it)."""
    digest = hashlib.sha256()
    for j in range(len(examples)):
        item = examples[j]
        for part in (item[0], label_of(item)):
            digest.update(torch.as_tensor(part).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parse_claim(claim: Any) -> Any:
    """``None``, a ledger (read at the audit: it may still be empty), or a claim parsed by :meth:`Claim.parse`
    (``ValueError`` for anything else)."""
    if claim is None or hasattr(claim, "privacy_loss_distribution"):
        return claim
    from lightning_privacy.claims import Claim

    try:
        return Claim.parse(claim)
    except TypeError as err:
        raise ValueError(str(err)) from None


def audit_run(
    canaries: CanarySet,
    *,
    kind: str,
    alpha: float,
    delta: Optional[float],
    correction: str,
    claim: Any = None,
    dpsgd: Any = None,
    claim_tests: str = "both",
    score: Optional[str] = None,
) -> CanaryResult:
    """The audit of the run's final scores (:func:`~lightning_privacy.audits.canary.audit_canaries`).

    Gradient canaries scored ``"released_minus_batch"`` or ``"likelihood_ratio"`` are independent given their bits
    (distinct coordinates, independent noise and Poisson sampling, the batch's own sum removed), so the audit adds the
    order-statistic bound and claim test of :mod:`~lightning_privacy.analysis.canary_fdp` (``independent=True``).

    With DP-SGD's settings ``dpsgd`` (``delta``, ``epsilon(delta)``, ``ledger``): δ defaults to its δ, its ε at δ is
    the upper bound beside the canaries' lower bounds, and without a ``claim`` its ledger is the claim tested (the
    run's own, at the audit's δ). Without: δ defaults to :data:`DEFAULT_DELTA`.
    """
    delta = delta or (dpsgd.delta if dpsgd is not None else DEFAULT_DELTA)
    accountant_epsilon = float(dpsgd.epsilon(delta)) if dpsgd is not None else None
    if claim is None and dpsgd is not None and dpsgd.ledger.steps:
        from lightning_privacy.claims import Claim

        claim = Claim.from_ledger(dpsgd.ledger, delta=delta)
    return audit_canaries(
        canaries.person_scores(),
        canaries.included,
        delta=delta,
        alpha=alpha,
        correction=correction,
        seed=canaries.seed,
        kind=kind,
        accountant_epsilon=accountant_epsilon,
        claim=claim,
        claim_tests=claim_tests,
        independent=kind == "gradient" and score in ("released_minus_batch", "likelihood_ratio"),
    )


def canary_people(canaries: CanarySet, rows_per_canary: Optional[int], dpsgd: Any, score: str) -> None:
    """Make ``canaries`` canary people before they are drawn: ``rows_per_canary`` rows each (``None``: the
    ``max_examples_per_user`` of a person-level DPSGD, else 1), joining a step together under user-level sampling
    (each person's clipped gradient, C·Σ e / √rows) or each on its own under example-level sampling (C·e each)."""
    user = getattr(dpsgd, "privacy_unit", "example") == "user"
    rows = rows_per_canary or (dpsgd.max_examples_per_user if user and dpsgd.max_examples_per_user else 1)
    if rows > 1 and (canaries.kind != "gradient" or score == "likelihood_ratio"):
        raise ValueError(
            f"CanaryAudit(rows_per_canary={rows}): canary people are gradient canaries scored by the sum of their "
            f"rows' scores; use kind='gradient' with score='released_minus_batch' (got kind={canaries.kind!r}, "
            f"score={score!r})."
        )
    if canaries.canaries is None and rows != canaries.rows:
        canaries.rows = int(rows)
        canaries.start_over()
    canaries.whole = bool(user and dpsgd.user_sampling and canaries.rows > 1)


class CanarySet:
    """The canaries of a run: drawn from ``seed`` over a space of coordinates (gradient) or rows (input).

    ``num_canaries=None`` asks for :data:`DEFAULT_NUM_CANARIES`, or, for gradient canaries on a model with fewer
    trainable coordinates, one per coordinate (:meth:`draw` returns the sentence saying so).
    """

    def __init__(
        self, kind: str, num_canaries: Optional[int], seed: int, examples: Optional[str] = None, rows: int = 1
    ) -> None:
        self.kind, self.seed, self.examples = kind, int(seed), examples  # examples: the given canaries' fingerprint
        #: canary people (user-level DP): each canary is ``rows`` Dirac coordinates included or left out together and
        #: scored together (the sum of their scores: :meth:`person_scores`); 1: one coordinate, a row
        self.rows = int(rows)
        self.whole = False  # the rows of a canary join a step together (user-level sampling), else each on its own
        self.adaptive = num_canaries is None
        self.requested = DEFAULT_NUM_CANARIES if num_canaries is None else int(num_canaries)
        self._block: Optional[tuple] = None  # (block, uniforms) of the per-step sampling
        self.start_over()

    def start_over(self) -> None:
        """Forget the drawn canaries and their scores (as at construction)."""
        self.num_canaries = self.requested
        self.space: Optional[int] = None  # trainable coordinates (gradient) or training rows (input)
        self.canaries: Optional[List[int]] = None  # coordinates or row indices
        self.labels: Optional[List[int]] = None  # the wrong labels (input)
        self.included: Optional[np.ndarray] = None
        self.scores = np.zeros(self.num_canaries * self.rows)  # running Σ_t of each coordinate's score (gradient)
        self.steps = 0  # optimizer steps with canaries (seeds each step's sampling)

    def draw(self, space: int, what: str) -> Optional[str]:
        """Draw (or, after a resume, check) the canary set and inclusion for ``space`` coordinates or rows.

        Returns:
            A sentence when the default number of canaries was lowered to ``space``, else ``None``.

        Raises:
            ValueError: more canaries than ``space`` (naming ``num_canaries=`` and the largest allowed).
            RuntimeError: a resumed set drawn for another ``space``.
        """
        note = None
        if self.rows > 1 and space < self.num_canaries * self.rows and self.canaries is None:
            raise ValueError(
                f"CanaryAudit(rows_per_canary={self.rows}): {self.num_canaries} canary people of {self.rows} rows need "
                f"{self.num_canaries * self.rows} {what}, but the run has {space}: pass num_canaries ≤ "
                f"{space // self.rows}."
            )
        if space < self.num_canaries and self.canaries is None:
            if not (self.adaptive and self.kind == "gradient"):
                raise ValueError(self._too_many(space, what))
            note = (
                f"CanaryAudit: the model has {space} trainable coordinates, fewer than the default "
                f"{DEFAULT_NUM_CANARIES} canaries: one canary on each (num_canaries={space})."
            )
            self.num_canaries = int(space)
            self.scores = np.zeros(self.num_canaries)
        if self.canaries is not None:
            if self.space != space:
                raise RuntimeError(
                    f"CanaryAudit state was drawn for {self.space} {what}, this run has {space}: not the same run"
                )
            return note
        rng = np.random.default_rng([self.seed, _DRAW])
        self.space = int(space)
        size = self.num_canaries * self.rows  # canary j's coordinates: j·rows … (j + 1)·rows − 1 of the list
        self.canaries = [int(i) for i in rng.choice(space, size=size, replace=False)]
        self.included = rng.random(self.num_canaries) < 0.5
        return note

    def person_scores(self) -> np.ndarray:
        """Each canary's score: the sum of its rows' coordinates' scores (a row's own score when ``rows`` is 1)."""
        return self.scores.reshape(self.num_canaries, self.rows).sum(axis=1)

    def _too_many(self, space: int, what: str) -> str:
        given = "the default " if self.adaptive else ""
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

    def sampled(self, step: int, sample_rate: float) -> np.ndarray:
        """Which canaries join optimizer step ``step`` (0-based): included and Poisson-sampled at ``sample_rate``.

        The uniforms come from a counter-based generator (Philox, key ``seed``, one counter block per
        ``_BLOCK`` steps), so any step's draw is reproducible on every rank and after a resume.
        """
        block, row = divmod(int(step), _BLOCK)
        width = self.num_canaries if self.rows == 1 or self.whole else self.num_canaries * self.rows
        if self._block is None or self._block[0] != block or self._block[1].shape[1] != width:
            bits = np.random.Philox(key=self.seed, counter=[0, block, _SAMPLE, 0])  # word 0 counts within a block
            self._block = (block, np.random.Generator(bits).random((_BLOCK, width)))
        joins = self._block[1][row] < sample_rate
        if self.rows == 1:
            return self.included & joins
        included = np.repeat(self.included, self.rows)  # per coordinate: a person's rows are in or out together
        return included & (np.repeat(joins, self.rows) if self.whole else joins)

    def state_dict(self) -> Dict[str, Any]:
        """The drawn set and the running scores, as plain Python."""
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "num_canaries": self.num_canaries,
            "rows": self.rows,
            "seed": self.seed,
            "space": self.space,
            "canaries": None if self.canaries is None else list(self.canaries),
            "labels": None if self.labels is None else list(self.labels),
            "included": None if self.included is None else [bool(b) for b in self.included],
            "scores": [float(s) for s in self.scores],
            "steps": self.steps,
            "examples": self.examples,
        }

    def load_state_dict(self, state: Dict[str, Any], settings: Dict[str, Any]) -> None:
        """Continue the run of ``state``; ``settings`` (e.g. the score) must equal the state's (``RuntimeError``)."""
        required = {"version", "kind", "num_canaries", "seed", "space", "canaries", "included", "scores", *settings}
        missing = required - set(state)
        if missing:
            raise RuntimeError(f"CanaryAudit state is missing {sorted(missing)}: refusing to restart the audit")
        if state["version"] != STATE_VERSION:
            raise RuntimeError(f"CanaryAudit state version {state['version']!r} is not {STATE_VERSION}")
        if self.adaptive and _is_int(state["num_canaries"]) and 1 <= state["num_canaries"] <= self.requested:
            self.num_canaries = int(state["num_canaries"])  # the default, adapted to that run's coordinates
        state = {"rows": 1, **state}  # (a state from before canary people: one row per canary)
        ours = {"kind": self.kind, "num_canaries": self.num_canaries, "rows": self.rows, "seed": self.seed, **settings}
        for key in ("kind", "num_canaries", "rows", "seed", *settings):
            if state[key] != ours[key]:
                raise RuntimeError(f"checkpoint audited with {key}={state[key]!r}, this CanaryAudit has {ours[key]!r}")
        if state.get("examples") != self.examples:
            given = lambda f: "the mislabelled training rows" if f is None else f"canary examples {f[:12]}…"  # noqa: E731
            raise RuntimeError(
                f"checkpoint audited {given(state.get('examples'))}, this CanaryAudit has {given(self.examples)}"
            )
        if len(state["scores"]) != self.num_canaries * self.rows:
            raise RuntimeError(f"CanaryAudit state has {len(state['scores'])} scores for {self.num_canaries} canaries")
        self.space = state["space"]
        self.canaries = None if state["canaries"] is None else [int(i) for i in state["canaries"]]
        self.labels = None if state.get("labels") is None else [int(i) for i in state["labels"]]
        self.included = None if state["included"] is None else np.asarray(state["included"], dtype=bool)
        self.scores = np.asarray(state["scores"], dtype=float)
        self.steps = int(state.get("steps", 0))


class GradientCanaries:
    """Gradient canaries C·e_j on the trainable parameters of ``module`` (flattened in ``named_parameters`` order).

    Args:
        canaries: the :class:`CanarySet` (drawn here over the parameters' coordinates if it is not yet).
        module: the model; optimizer: the DP optimizer (it must update every trainable parameter).
        dpsgd: DP-SGD's settings: ``sample_rate`` p, ``max_grad_norm`` C and ``noise_multiplier`` σ (read at each step:
            σ only for the likelihood-ratio score).
        score: ``"released_minus_batch"``, ``"likelihood_ratio"`` or ``"released"``.
        adds: whether this process adds canaries (DDP: rank 0 only; FSDP2: every rank, to its shard).
        world: the number of processes; sharded: FSDP2 (sums and gradients are sharded DTensors).
    """

    def __init__(
        self,
        canaries: CanarySet,
        module: Any,
        optimizer: Any,
        dpsgd: Any,
        *,
        score: str,
        adds: bool = True,
        world: int = 1,
        sharded: bool = False,
    ) -> None:
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.note = canaries.draw(sum(p.numel() for _, p in named), "trainable coordinates")
        self.canaries, self.score = canaries, score
        self.dpsgd, self.sample_rate = dpsgd, float(dpsgd.sample_rate)
        self.adds, self.world, self.sharded = adds, world, sharded
        coords = np.asarray(canaries.canaries, dtype=np.int64)
        self.params, start = [], 0
        for name, p in named:
            if id(p) not in optimized:
                raise ValueError(f"CanaryAudit: trainable parameter {name!r} is not in the optimizer")
            ids = np.flatnonzero((coords >= start) & (coords < start + p.numel()))
            if ids.size:  # (parameter, canary ids, their flat indices in it, the same on its device)
                local = coords[ids] - start
                self.params.append((p, ids, local, torch.as_tensor(local, device=p.device)))
            start += p.numel()
        self.unit: Optional[float] = None  # p.grad × unit = the released noisy sum
        self.step_clip, self.step_sigma = float(dpsgd.max_grad_norm), float(dpsgd.noise_multiplier or 0.0)

    def gather(self, tensors: List[torch.Tensor]) -> np.ndarray:
        """Per-parameter tensors at the canary coordinates, as one float64 array in canary order."""
        out = np.zeros(len(self.canaries.canaries))
        for t, (_, ids, local, local_t) in zip(tensors, self.params):
            flat = t.detach().reshape(-1)
            if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES:  # numpy indexing: ~10x less per-call cost
                out[ids] = flat.numpy()[local]
            else:
                out[ids] = flat.index_select(0, local_t).double().cpu().numpy()
        return out

    def before_noise(self, optimizer: Any) -> tuple:
        """Note the batch's own sum, then add C·e_j per canary sampled this step (once in all).

        Returns:
            ``(known, unit, clip, sigma)``: the batch's clipped sums at the canaries (``None`` for the ``"released"``
            score), the factor from ``p.grad`` to the released noisy sum, the step's C and the gradient's σ;
            :meth:`after_step` takes them.
        """
        step = self.canaries.steps
        self.canaries.steps += 1
        known = None
        if self.score in ("released_minus_batch", "likelihood_ratio"):
            sums = [optimizer.summed(p) for p, *_ in self.params]
            if self.sharded:  # the average of the ranks' sums, all-gathered (a collective: every rank is here)
                sums = [s.full_tensor() * self.world for s in sums]
            known = self.gather(sums)
        if self.unit is None:  # p.grad = Σ_ranks (sum + noise) / unit after the step (DPSGD: no accumulation)
            mean = optimizer.loss_reduction == "mean"
            self.unit = float(
                optimizer.expected_batch_size * optimizer.accumulated_iterations * self.world if mean else 1
            )
        # the step's clipping norm and the gradient's noise multiplier (quantile clipping: C_t and z_Δ; dpsgd.clipping)
        self.step_clip = float(getattr(optimizer, "max_grad_norm", self.dpsgd.max_grad_norm))
        self.step_sigma = float(getattr(optimizer, "noise_multiplier", self.dpsgd.noise_multiplier or 0.0))
        if self.adds:
            self._add(optimizer, self.canaries.sampled(step, self.sample_rate))
        return known, self.unit, self.step_clip, self.step_sigma

    def _add(self, optimizer: Any, sampled: np.ndarray) -> None:
        clip = self.step_clip  # (C_t: the step's own clipping norm)
        if self.canaries.rows > 1 and self.canaries.whole:  # a canary person's clipped gradient: C over its rows
            clip /= float(np.sqrt(self.canaries.rows))
        if self.sharded:
            self._add_to_shards(optimizer, sampled, clip / self.world)
            return
        for p, ids, local, local_t in self.params:
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
                grad.view(-1).numpy()[local[hit]] += clip  # distinct coordinates: no index repeats
            else:
                flat = grad.reshape(-1)
                index = local_t[torch.as_tensor(hit, device=local_t.device)]
                flat.index_add_(0, index, torch.full(index.shape, clip, dtype=flat.dtype, device=flat.device))
                if flat.data_ptr() != grad.data_ptr():  # reshape copied: write back
                    p.summed_grad = flat.view_as(grad)

    def _add_to_shards(self, optimizer: Any, sampled: np.ndarray, value: float) -> None:
        """FSDP2: add ``value`` at the sampled canaries that this rank's dim-0 shard of each parameter holds."""
        for p, ids, local, _ in self.params:
            hit = local[sampled[ids]]
            shard = optimizer.summed(p)
            mine = shard.to_local()
            if not hit.size or mine.numel() == 0:
                continue
            row = int(np.prod(p.shape[1:])) if p.dim() > 1 else 1
            first = shard_offset(p, shard) * row  # flat index of this rank's first element
            inside = hit[(hit >= first) & (hit < first + mine.numel())] - first
            if inside.size:
                flat = mine.view(-1)
                flat.index_add_(0, torch.as_tensor(inside, device=flat.device), flat.new_full((inside.size,), value))

    def after_step(self, pending: tuple, reduce: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> np.ndarray:
        """This step's scores from the released gradient (``p.grad``), added to the set's running scores.

        ``reduce`` sums the ranks' batch sums under DDP (a collective: every rank calls it).
        """
        known, unit = pending[0], pending[1]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p, *_ in self.params]
        if self.sharded:  # every rank's shard of the released gradient (a collective: every rank is here)
            grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
        score = self.gather(grads) * unit  # the released noisy sum g̃_t at the canary coordinates
        if known is not None:
            if reduce is not None and self.world > 1 and not self.sharded:
                known = reduce(known)
            score -= known
        if self.score == "likelihood_ratio":  # the step's log-likelihood ratio, included vs excluded
            clip, sigma = pending[2], pending[3]  # (the step's own C and the gradient's σ)
            z = (score * clip - clip**2 / 2) / (sigma * clip) ** 2
            score = np.logaddexp(np.log1p(-self.sample_rate), np.log(self.sample_rate) + z)
        self.canaries.scores += score
        return score


def shard_offset(param: torch.Tensor, shard: Any) -> int:
    """The first dim-0 row of ``param`` that this rank's FSDP2 shard holds (``torch.chunk`` over the mesh)."""
    rank, world = shard.device_mesh.get_local_rank(), shard.device_mesh.size()
    rows_per_rank = -(-param.shape[0] // world) if param.dim() else 1
    return min(rank * rows_per_rank, param.shape[0] if param.dim() else 0)


# --- input canaries -----------------------------------------------------------------------------------
class CanaryRows(Dataset):
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


def label_of(item: Any) -> int:
    """The integer class label of an ``(x, y, ...)`` example (``ValueError`` for anything else)."""
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise ValueError(f"CanaryAudit(kind='input') needs (x, y, ...) examples, got {type(item).__name__}")
    y = item[1]
    if isinstance(y, torch.Tensor) and y.numel() != 1 or not (isinstance(y, torch.Tensor) or _is_int(y)):
        raise ValueError(f"CanaryAudit(kind='input') needs one integer class label per example, got {y!r}")
    return int(y)


def wrong_labels(dataset: Dataset, rows: List[int], classes: Union[int, Callable[[], int]], seed: int) -> List[int]:
    """Label y → (y + 1 + u) mod K, u uniform in [0, K − 2], for each row (K: ``classes``, or ``classes()``)."""
    labels = [label_of(dataset[i]) for i in rows]
    k = classes() if callable(classes) else classes
    if max(labels) >= k:
        raise ValueError(f"CanaryAudit: labels up to {max(labels)} but `num_classes`={k}")
    shift = 1 + np.random.default_rng([seed, _DRAW, 1]).integers(0, k - 1, size=len(labels))
    return [int((y + s) % k) for y, s in zip(labels, shift)]


def classes_of_model(module: Any, dataset: Dataset, row: int, collate: Any, forward_fn: Any = None) -> int:
    """K from the model's logits on one row (at least 2; a single logit is a binary classifier)."""
    batch = next(iter(DataLoader(Subset(dataset, [row]), batch_size=1, collate_fn=collate)))
    with torch.no_grad():
        was = module.training
        module.eval()
        try:
            device = next(module.parameters()).device
            batch = [b.to(device) if isinstance(b, torch.Tensor) else b for b in batch]
            logits = (forward_fn or (lambda m, b: (m(b[0]), b[1])))(module, batch)[0]
        finally:
            module.train(was)
    return max(2, int(logits.shape[-1]) if logits.ndim > 1 else 2)


def check_loader(loader: Any) -> Dataset:
    """The map-style dataset of a batched DataLoader (the only train loader that can take canary rows)."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or loader.batch_size is None or isinstance(dataset, IterableDataset):
        raise ValueError(
            "CanaryAudit(kind='input') needs one DataLoader with a batch_size over a map-style dataset, got "
            f"{type(loader).__name__}" + (f" over {type(dataset).__name__}" if dataset is not None else "")
        )
    return dataset


def with_canaries(loader: DataLoader, canaries: CanarySet, source: Optional[Dataset] = None) -> DataLoader:
    """``loader`` with the included canary rows (of ``source``, default its dataset) appended (same batch size,
    collate_fn, shuffling)."""
    dataset = loader.dataset
    rows = CanaryRows(dataset if source is None else source, canaries.canaries, canaries.labels)
    kept = Subset(rows, np.flatnonzero(canaries.included).tolist())
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


class InputCanaries:
    """Input canaries in ``loader``'s training set: wrong-label copies of ``canaries`` rows, drawn here if not yet,
    or the given ``examples`` (e.g. :func:`~lightning_privacy.audits.canary_design.optimize_input_canaries`).

    Args:
        canaries: the :class:`CanarySet` (its rows and wrong labels are drawn here at the first loader).
        loader: the train loader (a batched ``DataLoader`` over a map-style dataset, else ``ValueError``).
        num_classes: K; ``None``: the number of logits of ``model`` on one row (2 for one logit).
        model, forward_fn: to count the logits, and to score (``forward_fn(model, batch) -> (logits, target)``).
        examples: ``None`` (wrong-label training rows), or a map-style dataset of the m canaries, with their labels.

    Attributes:
        loader: the train loader with the included canary rows appended.
    """

    def __init__(
        self,
        canaries: CanarySet,
        loader: Any,
        *,
        num_classes: Optional[int],
        model: Any,
        forward_fn: Any = None,
        examples: Optional[Dataset] = None,
    ) -> None:
        self.dataset, self.collate, self.forward_fn = check_loader(loader), loader.collate_fn, forward_fn
        self.canaries, self.source = canaries, self.dataset if examples is None else examples
        canaries.draw(len(self.source), "training rows" if examples is None else "canary examples")
        if canaries.labels is None and examples is not None:
            canaries.labels = [label_of(examples[j]) for j in canaries.canaries]
        if canaries.labels is None:
            rows = canaries.canaries
            classes = num_classes or (lambda: classes_of_model(model, self.dataset, rows[0], self.collate, forward_fn))
            canaries.labels = wrong_labels(self.dataset, rows, classes, canaries.seed)
        self.loader = with_canaries(loader, canaries, self.source)

    def scores(self, model: Any) -> np.ndarray:
        """Minus the model's membership loss on every canary row (included or not): higher = looks included."""
        rows = CanaryRows(self.source, self.canaries.canaries, self.canaries.labels)
        loader = DataLoader(rows, batch_size=SCORE_BATCH_SIZE, shuffle=False, collate_fn=self.collate)
        return -membership_losses_from_loader(model, loader, forward_fn=self.forward_fn).double().numpy()

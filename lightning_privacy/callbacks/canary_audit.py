"""``CanaryAudit``: an ε lower bound from canaries inserted into the same training run (one-run auditing).

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023). The canaries (drawing,
sampling, insertion, scoring, wrong-label rows) are Trainer-free objects in :mod:`lightning_privacy.audits.canary_run`;
this callback wires them to Lightning's hooks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from matplotlib.figure import Figure
from typing_extensions import override

from lightning_privacy import _compat, names
from lightning_privacy.audits import canary_run as run
from lightning_privacy.audits.canary import CanaryResult
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.dpsgd import strategies

__all__ = ["CanaryAudit", "theory_vs_practice_figure"]


class CanaryAudit(Callback):
    r"""One-run canary audit: an ε lower bound from the training run itself, beside the accountant's ε.

    ``num_canaries`` canaries are each included in training with probability 1/2 (drawn from ``seed``); at fit end each
    is scored (higher = looks included) and the best guesses on a grid fixed by m become a lower bound on ε at level
    ``alpha`` (:func:`~lightning_privacy.analysis.canary.canary_audit_from_scores`: Steinke et al.'s Theorem 3.1,
    ``"binomial"``, and Mahloujifar et al.'s Gaussian trade-off test, ``"gdp"``). A bound above the accountant's ε
    would mean the implementation leaks more than claimed. No bound can exceed about log(q/(1 − q)), q = (α/27)^(1/m)
    (4.8 for m = 1000, α = 0.05, δ = 1e-5), whatever the true ε: this ceiling is logged beside the bound.

    ``kind="gradient"`` (white box, needs :class:`~lightning_privacy.DPSGD`): canary j is the Dirac gradient C·e_j on
    one of m random coordinates, added to the clipped sum before the noise at the steps it is sampled (rate p).
    ``kind="input"`` (black box): canary j is a training row with a wrong label (or ``examples[j]``), appended when
    included, scored by the final model's loss. Details (DDP, FSDP2, scores): :mod:`lightning_privacy.audits.canary_run`.

    **A claim, checked.** ``claim`` is the guarantee the canaries test (the in/out game: add/remove): a
    :class:`~lightning_privacy.claims.Claim`, a ``PrivacyLedger``, ``(noise_multiplier, sample_rate, steps[, delta])``
    or ``(epsilon, delta)``; by default, with :class:`~lightning_privacy.DPSGD`, its ledger at fit end (the run's own
    claim). ``result.verdict`` is ``"contradicted"`` when the canaries refute it at confidence 1 − ``alpha``
    (:func:`~lightning_privacy.analysis.claims.check_canaries`), else ``"consistent"``; logged as
    ``audit/canary_claim_contradicted`` (1 or 0).

    Logged at fit end through ``trainer.loggers`` at ``trainer.global_step`` (rank 0): ``audit/canary_epsilon_lower``,
    ``…_gdp``, the guesses and correct guesses of both, the ceilings ``…_max(_gdp)``, ``…_tightest`` (+ ``…_orderstat``,
    ``audit/canary_epsilon_gauss`` and the order-statistic claim test for gradient canaries not scored ``"released"``;
    ``analysis.canary_fdp``) and, with a claim, ``audit/canary_claim_contradicted``; to the loggers a
    "theory vs practice" figure (accountant ε, the canary bounds, and ε* and PANORAMIA ε̃ when those audits ran in the
    same fit) and a text summary. Skipped under ``fast_dev_run``.

    Args:
        kind: ``"gradient"`` or ``"input"``.
        num_canaries: m ≥ 1 (at most the trainable coordinates, or rows). ``None``: 1000, or one canary on every
            coordinate of a model with fewer (LoRA adapters, a head on a frozen backbone; said at fit start).
        seed: non-negative int; the canaries, inclusion, per-step sampling and tie-breaking derive from it.
        alpha: significance of the bound, in (0, 1).
        delta: δ of the claim tested, in (0, 1) (DPSGD's, else 1e-5).
        correction: ``"bonferroni"`` or ``"split"`` (see ``canary_audit_from_scores``).
        score: gradient canaries' score, ``"released_minus_batch"``, ``"likelihood_ratio"`` or ``"released"`` (see
            :mod:`~lightning_privacy.audits.canary_run`).
        num_classes: K for the wrong labels (input); default the model's number of logits (2 for one).
        forward_fn: ``forward_fn(pl_module, batch) -> (logits, target)`` for input canaries (``model(x), y``).
        claim: the guarantee to test (see above); ``None``: DPSGD's ledger at fit end, if DPSGD trains the model.
        claim_tests: ``"both"`` (α split between the binomial and the f-DP test) or ``"fdp"`` (all of α on the f-DP
            test of the claim's curve: the stronger test of a DP-SGD claim; ``Claim.check_canaries``).
        examples: input canaries to use instead of wrong-label rows: a map-style dataset of m ``(x, y)`` examples
            (e.g. :func:`~lightning_privacy.audits.canary_design.optimize_input_canaries`); m = its length.
        rows_per_canary: canary people (user-level DP): each gradient canary is k rows in or out together, scored by
            their sum; ``None``: a person-level DPSGD's ``max_examples_per_user`` (``run.canary_people``), else 1.

    Attributes:
        results: the fit-end values by key: the logged ones plus the uncorrected best
            ``audit/canary_epsilon_optimistic(_gdp)`` (not a valid bound: kept for comparison with papers).
        result: the last :class:`~lightning_privacy.audits.canary.CanaryResult` (``verdict``, ``evidence``, ``claim``).
        details: the :class:`~lightning_privacy.analysis.canary.CanaryAuditResult` by method.
        accountant_epsilon: DPSGD's ε at the audit's δ (``None`` without DPSGD).

    Raises:
        MisconfigurationException: a bad argument; at fit, ``"gradient"`` without DPSGD, more canaries than
            coordinates or rows (naming ``num_canaries=`` and the largest allowed), a loader that cannot take canaries.

    Example::

        >>> audit = CanaryAudit("gradient", num_canaries=1000, seed=3)
        >>> audit.state_key
        "CanaryAudit{'kind': 'gradient', 'num_canaries': 1000, 'seed': 3}"
        >>> CanaryAudit("labels")
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `kind` must be one of ('gradient', 'input'), got 'labels'
    """

    report_order = 90  # the report's sections: DP-SGD first, then monitors, then audits
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
        claim_tests: str = "both",
        examples: Any = None,
        rows_per_canary: Optional[int] = None,
    ) -> None:
        with audit.misconfiguration():
            run.check_arguments(kind, num_canaries, seed, alpha, delta, correction, score, num_classes, claim_tests,
                                rows_per_canary)  # fmt: skip
            claim, given = run.parse_claim(claim), run.check_examples(examples, kind, num_canaries)
            fingerprint = None if given is None else run.fingerprint(examples)
        self.claim, self.claim_tests, self.examples = claim, claim_tests, examples
        self.rows_per_canary = rows_per_canary
        self.canaries = run.CanarySet(kind, given or num_canaries, seed, fingerprint)  # canaries, scores: state_dict
        self.kind, self.seed = kind, int(seed)
        self.alpha, self.delta, self.correction = float(alpha), None if delta is None else float(delta), correction
        self.score, self.num_classes, self.forward_fn = score, num_classes, forward_fn
        self._start_over()  # result, results, details, accountant_epsilon: see the class' Attributes
        self._dpsgd: Any = None  # runtime only, from here
        self._hooked: Any = None
        self._gradient: Optional[run.GradientCanaries] = None  # see on_train_start
        self._input: Optional[run.InputCanaries] = None  # see _with_canaries
        self._pending: Optional[tuple] = None  # (batch sums at the canaries or None, p.grad unit) of this step
        self._sample_rate, self._figure_pending, self._module = 0.0, False, None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(kind=self.kind, num_canaries=self.canaries.requested, seed=self.seed)

    @property
    def num_canaries(self) -> int:
        """m: as given, or the default adapted to a model with fewer trainable coordinates."""
        return self.canaries.num_canaries

    @property
    def included(self) -> Optional[np.ndarray]:
        """Whether each canary was included (known once the fit started)."""
        return None if self.canaries.included is None else self.canaries.included.copy()

    @property
    def scores(self) -> np.ndarray:
        """Running scores (gradient: Σ_t g̃_t[j] so far; input: filled at fit end)."""
        return self.canaries.scores.copy()

    def sampled(self, step: int) -> np.ndarray:
        """Which canaries join optimizer step ``step`` (0-based): included and Poisson-sampled at rate p
        (:meth:`lightning_privacy.audits.canary_run.CanarySet.sampled`)."""
        return self.canaries.sampled(step, self._sample_rate)

    def _start_over(self) -> None:
        """Forget the last model's canaries, scores and audit (as at construction)."""
        self.canaries.start_over()
        self.result: Optional[CanaryResult] = None  # the last audit (lightning_privacy.audits.canary)
        self.results: Dict[str, float] = {}
        self.details: Dict[str, Any] = {}
        self.accountant_epsilon: Optional[float] = None

    # ------------------------------------------------------------------------------ wiring
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_privacy.callbacks.dpsgd import DPSGD

        if self._module is not None and self._module is not pl_module and self.canaries.steps:
            self._start_over()  # reused for another model: its own canaries and scores (a checkpoint loads after)
        self._module = pl_module
        self._dpsgd = next((cb for cb in trainer.callbacks if isinstance(cb, DPSGD)), None)
        with audit.misconfiguration():  # canary people under a person-level DPSGD (or rows_per_canary)
            run.canary_people(self.canaries, self.rows_per_canary, self._dpsgd, self.score)
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
        self._sample_rate, sharded = float(self._dpsgd.sample_rate), strategies.is_fsdp(trainer)
        with audit.misconfiguration():
            # DDP: rank 0 adds each canary once to its clipped sum. FSDP2: the clipped sum is the ranks'
            # reduce-scattered average, sharded, so every rank adds C/W at the canaries its shard holds (once in all).
            self._gradient = run.GradientCanaries(
                self.canaries, pl_module, trainer.strategy.optimizers[0], self._dpsgd, score=self.score,
                adds=trainer.is_global_zero or sharded, world=trainer.world_size, sharded=sharded,
            )  # fmt: skip
        if self._gradient.note:
            rank_zero_info(self._gradient.note)
        self._pending = None

    def _add_canaries(self, optimizer: Any) -> None:
        """Before-noise hook: note the batch's own sum, then add C·e_j per canary sampled this step (once in all)."""
        self._pending = self._gradient.before_noise(optimizer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is None:  # no DP step this batch (e.g. a skipped optimizer step): nothing released
            return

        def reduce(known: np.ndarray) -> np.ndarray:  # every rank's own batch sum (a collective: every rank is here)
            return trainer.strategy.reduce(torch.from_numpy(known).to(pl_module.device), reduce_op="sum").cpu().numpy()

        self._gradient.after_step(pending, reduce)

    def _with_canaries(self, loader: Any) -> Any:
        """The train loader with the included canary rows appended (same batch size, collate_fn, shuffling)."""
        with audit.misconfiguration():
            self._input = run.InputCanaries(self.canaries, loader, num_classes=self.num_classes, model=self._module,
                                            forward_fn=self.forward_fn, examples=self.examples)  # fmt: skip
        return self._input.loader

    # ------------------------------------------------------------------------------ the audit
    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fast_dev_run:
            rank_zero_info("CanaryAudit: skipped under fast_dev_run (no audit of a few debug batches).")
            return
        if self.canaries.included is None:
            return  # training never started
        if self.kind == "input":
            self.canaries.scores = self._input.scores(pl_module)
        self.result = run.audit_run(
            self.canaries, kind=self.kind, alpha=self.alpha, delta=self.delta, correction=self.correction,
            claim=self.claim, dpsgd=self._dpsgd, claim_tests=self.claim_tests, score=self.score,
        )  # fmt: skip
        self.accountant_epsilon = self.result.accountant_epsilon
        self.results, self.details = {**self.result.values, **self.result.metrics()}, dict(self.result.details)
        audit.log_scalars(trainer, self.result.metrics())
        audit.publish_summary(trainer, "CanaryAudit", names.CANARY_SUMMARY, self.summary(), self.result.warnings)
        self._figure_pending = True  # drawn in teardown, after every callback's on_fit_end (ε*, PANORAMIA)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self._figure_pending:
            return
        self._figure_pending = False
        if audit.shows_figures(trainer):
            audit.log_figure(
                trainer, names.CANARY_FIGURE, theory_vs_practice_figure(self, audit.other_epsilons(trainer))
            )

    def report_section(self, trainer: Any = None) -> Any:
        """The report's section (:mod:`lightning_privacy.reporting`): both bounds beside the accountant's ε, the claim,
        the theory-vs-practice figure (with ε* and PANORAMIA ε̃ when those audits ran)."""
        from lightning_privacy.audits.canary import REPORT_TITLE, report_rows

        if self.result is None:
            return audit.section(None, REPORT_TITLE, report_rows(self.results, self.accountant_epsilon, self.alpha))
        section = self.result.report_section()
        figure = lambda: theory_vs_practice_figure(self, audit.other_epsilons(trainer))  # noqa: E731
        section.figures = [(figure, caption) for _, caption in section.figures]
        return section

    def summary(self) -> str:
        """A Markdown table of the last audit (:meth:`lightning_privacy.audits.canary.CanaryResult.summary`)."""
        if self.result is None:
            raise RuntimeError("CanaryAudit.summary(): no audit has run yet (it runs at the end of fit)")
        return self.result.summary()

    @override
    def state_dict(self) -> Dict[str, Any]:
        state = {**self.canaries.state_dict(), "score": self.score, "results": dict(self.results)}  # + δ, digest
        return audit.sealed(state, delta=self.delta if self.result is None else self.result.details["binomial"].delta)

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.canaries.load_state_dict(state_dict, {"score": self.score})
        self.results = {str(k): float(v) for k, v in state_dict.get("results", {}).items()}


def theory_vs_practice_figure(canary: CanaryAudit, others: Dict[str, float]) -> Figure:
    """The accountant's ε (upper bound) beside the canary lower bounds, ε* and PANORAMIA ε̃, on one axis."""
    return dataclasses.replace(canary.result, others=dict(others)).figure()

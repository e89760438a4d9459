"""``MembershipAudit``: RMIA, LiRA or the LOSS attack on the model being trained, at fit end (and every n epochs)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.audits.membership import ATTACKS, REFERENCE_FREE, MembershipAuditResult, audit_membership
from lightning_privacy.callbacks import _audit_utils as audit

__all__ = ["MembershipAudit"]


class MembershipAudit(audit.ScheduledAudit):
    """A reference-model membership attack on the trained model: RMIA (default), LiRA, LOSS or EZ-MIA.

    At fit end (and after every ``every_n_epochs``-th epoch if asked) the callback trains ``num_references``
    reference models once — ``model_factory()`` (default: the module's class built from its saved
    hyper-parameters) on random halves of ``population`` with a fresh Trainer for as many epochs (or steps)
    as this one, cached in ``cache_dir`` when given — then calls
    :func:`~lightning_privacy.audits.audit_membership` on the members (``member_dataloader``, else the
    datamodule's ``member_dataloader()``, else the training data in a fixed order) and non-members
    (``nonmember_dataloader``, else the validation data). When a :class:`~lightning_privacy.DPSGD` callback
    trains the model, its ledger is passed: the figure shows the ROC inside the region the accountant allows for
    this in/out game (the add/remove relation) and a point beyond it is raised as a warning (``result.outside``).
    The guarantee the attack tests (``claim``; default: DPSGD's ledger) gets a verdict, ``"consistent"`` or
    ``"contradicted"`` at confidence 1 − ``alpha`` (``result.verdict``), logged as ``audit/<attack>_claim_contradicted``.

    The references are trained like the target: the same class and epochs (or steps) and, when a
    :class:`~lightning_privacy.DPSGD` trains the model, DP-SGD with the same σ, C, δ, loss reduction and gradient
    mode (each reference Poisson-samples its own half with the population loader's batch size); no other callback
    of this Trainer. ``reference_trainer_kwargs`` replaces all of that. Logged from rank 0 at ``trainer.global_step``: ``audit/<attack>_auc``,
    ``audit/<attack>_tpr_at_fpr_0.001`` / ``_0.01`` / ``_0.1``, ``audit/<attack>_epsilon_lower`` and, with a claim,
    ``audit/<attack>_claim_contradicted``; to the figure loggers (TensorBoard, MLflow, W&B, CSV)
    the log–log ROC (``audit/membership/roc``) and the summary table (``audit/membership/summary``).

    Single process only: the reference models are trained in this process. Under DDP or FSDP2 save a
    checkpoint and run ``lightning-privacy audit membership --checkpoint ...``.

    Args:
        attack: ``"rmia"``, ``"lira"``, ``"loss"`` or ``"ezmia"`` (a fine-tuned LM against its base, no references:
            ``audit_membership``'s; a full fine-tune needs ``base_model``, refused at ``on_train_start`` without).
        num_references: reference models for RMIA / LiRA (≥ 1).
        population: a DataLoader over a map-style dataset of rows neither member nor non-member (RMIA / LiRA);
            default: the datamodule's ``population_dataloader()`` (Adult's: its test split).
        member_dataloader, nonmember_dataloader: the audited examples (defaults above).
        model_factory: returns a fresh untrained module of the audited architecture.
        reference_trainer_kwargs: ``Trainer`` arguments for the references (default: this run's
            ``max_epochs`` / ``max_steps`` on CPU, with DP-SGD as above).
        cache_dir: where :func:`~lightning_privacy.references.train_references` stores the references.
        every_n_epochs: also audit after every ``n``-th epoch; ``None`` = only at fit end.
        seed, gamma, offline_a, alpha, delta, forward_fn: passed on to the reference training and the audit.
        signal_fn: one membership loss per example from ``signal_fn(model, batch)`` instead of ``forward_fn`` (e.g.
            :data:`~lightning_privacy.functional.sequence_loss.causal_lm_signal` for a language model: RMIA and LiRA
            then read each sequence's likelihood; a score such as Min-K% only with ``attack="loss"``). Member batches
            that are mappings (``{"input_ids": ..., "attention_mask": ...}``) without ``signal_fn`` or
            ``forward_fn`` are refused at ``on_train_start``, naming ``signal_fn=causal_lm_signal``.
        claim: the guarantee to test (a :class:`~lightning_privacy.claims.Claim`, a ``PrivacyLedger``,
            ``(noise_multiplier, sample_rate, steps[, delta])`` or ``(epsilon, delta)``); ``None``: DPSGD's ledger
            when DPSGD trains the model, else no verdict.
        log_figure: write the ROC figure to the figure loggers (:mod:`lightning_privacy.loggers`).
        base_model: EZ-MIA's reference for a full fine-tune (a PEFT model's base is itself, adapters disabled).
        user_ids: ``(member ids, non-member ids)``: score people, not rows (``audit_membership``'s ``user_ids``).

    Attributes:
        result: the last :class:`~lightning_privacy.audits.membership.MembershipAuditResult` (``None`` before).
        results: its metrics.
        references: the reference models (trained at the first audit).

    Example::

        >>> MembershipAudit(attack="lira", num_references=0)
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `num_references` must be an int >= 1 for attack='lira', got 0
    """

    report_order = 80  # the report's sections: DP-SGD first, then monitors, then audits

    def __init__(
        self,
        attack: str = "rmia",
        num_references: int = 2,
        population: Optional[Iterable] = None,
        *,
        member_dataloader: Optional[Iterable] = None,
        nonmember_dataloader: Optional[Iterable] = None,
        model_factory: Optional[Callable[[], pl.LightningModule]] = None,
        reference_trainer_kwargs: Optional[Mapping[str, Any]] = None,
        cache_dir: Optional[str] = None,
        every_n_epochs: Optional[int] = None,
        seed: int = 0,
        gamma: float = 2.0,
        offline_a: Optional[float] = None,
        alpha: float = 0.05,
        delta: Optional[float] = None,
        forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
        signal_fn: Optional[Callable[[Any, Any], Any]] = None,
        log_figure: bool = True,
        claim: Any = None,
        base_model: Any = None,
        user_ids: Optional[Tuple[Sequence[Any], Sequence[Any]]] = None,
    ) -> None:
        if attack not in ATTACKS:
            raise MisconfigurationException(f"`attack` must be one of {ATTACKS}, got {attack!r}")
        if attack == "ezmia" or base_model is not None:  # EZ-MIA's signal carries the base model
            from lightning_privacy.audits.membership import ezmia_signal

            if attack != "ezmia":
                raise MisconfigurationException(f"`base_model` is EZ-MIA's: it needs attack='ezmia', got {attack!r}")
            try:
                signal_fn = ezmia_signal(signal_fn, base_model)
            except (TypeError, ValueError) as err:
                raise MisconfigurationException(str(err)) from None
        if attack not in REFERENCE_FREE:
            if isinstance(num_references, bool) or not isinstance(num_references, int) or num_references < 1:
                raise MisconfigurationException(
                    f"`num_references` must be an int >= 1 for attack={attack!r}, got {num_references!r}"
                )
        if signal_fn is not None:
            from lightning_privacy.audits.membership import _attack_signal

            try:  # a score (Min-K%) has no likelihood for RMIA / LiRA: refused before training, not at fit end
                _attack_signal(attack, signal_fn)
            except ValueError as err:
                raise MisconfigurationException(str(err)) from None
        if not 0.0 < alpha < 1.0:
            raise MisconfigurationException(f"`alpha` must be in (0, 1), got {alpha!r}")
        if claim is not None and not hasattr(claim, "privacy_loss_distribution"):  # a ledger is read at the audit
            from lightning_privacy.claims import Claim

            try:
                claim = Claim.parse(claim)
            except (TypeError, ValueError) as err:
                raise MisconfigurationException(str(err)) from None
        self.claim = claim
        self.attack = attack
        self.num_references = num_references
        self.population = population
        self.member_dataloader = member_dataloader
        self.nonmember_dataloader = nonmember_dataloader
        self.model_factory = model_factory
        self.reference_trainer_kwargs = None if reference_trainer_kwargs is None else dict(reference_trainer_kwargs)
        self.cache_dir = cache_dir
        self.every_n_epochs = audit.check_every_n_epochs(every_n_epochs)
        self.seed, self.gamma, self.offline_a = seed, gamma, offline_a
        self.alpha, self.delta, self.forward_fn, self.signal_fn = alpha, delta, forward_fn, signal_fn
        self.user_ids = user_ids  # (member ids, non-member ids): the audit counts people
        self.log_figure = log_figure
        self.hparams_metric_keys = (names.membership_key(attack, "auc"),)
        self.result: Optional[MembershipAuditResult] = None
        self.results: Dict[str, float] = {}
        self.references: Any = None
        self._audited_step: Optional[int] = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.world_size > 1:
            raise MisconfigurationException(
                "MembershipAudit trains its reference models in this process and runs single-process only. Save a "
                "checkpoint and run `lightning-privacy audit membership --checkpoint last.ckpt` after training."
            )
        audit.announce_skip(trainer, type(self).__name__)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.attack == "ezmia":  # a full fine-tune without `base_model`: before training, not after it
            try:
                self.signal_fn.check(pl_module)
            except ValueError as err:
                raise MisconfigurationException(f"MembershipAudit: {err}") from None
        audit.refuse_member_mappings(
            trainer, self.member_dataloader, forward_fn=self.forward_fn, signal_fn=self.signal_fn, who="MembershipAudit"
        )

    def _population(self, trainer: pl.Trainer) -> Any:
        if self.population is not None or self.attack in REFERENCE_FREE:
            return self.population
        hook = getattr(trainer.datamodule, "population_dataloader", None)
        if callable(hook):
            return hook()
        raise MisconfigurationException(
            f"MembershipAudit: attack={self.attack!r} needs `population` (a DataLoader of rows neither member nor "
            "non-member) or a datamodule with `population_dataloader()`"
        )

    def _ledger(self, trainer: pl.Trainer) -> Any:
        from lightning_privacy.callbacks.dpsgd import DPSGD

        for cb in trainer.callbacks:
            if isinstance(cb, DPSGD) and cb.ledger.steps:
                return cb.ledger
        return None

    def audit(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Dict[str, float]:
        """Train the references (first call), attack, log from rank 0; returns the metrics."""
        members = audit.member_loader(trainer, self.member_dataloader)
        try:
            nonmembers = audit.population_loader(trainer, self.nonmember_dataloader)
        except MisconfigurationException as err:
            raise MisconfigurationException(
                "MembershipAudit: no non-member data to audit: pass `nonmember_dataloader` or give the Trainer "
                "validation data"
            ) from err
        population = self._population(trainer)
        if self.attack not in REFERENCE_FREE and self.references is None:
            from lightning_privacy.references import recipe_like, train_references

            try:
                factory, kwargs = recipe_like(
                    trainer, pl_module, model_factory=self.model_factory, trainer_kwargs=self.reference_trainer_kwargs
                )
                self.references = train_references(
                    factory,
                    population,
                    num_references=self.num_references,
                    trainer_kwargs=kwargs,
                    cache_dir=self.cache_dir,
                    seed=self.seed,
                    progress=audit.show_progress(trainer),
                )
            except (TypeError, ValueError) as err:
                raise MisconfigurationException(f"MembershipAudit: {err}") from err
            if self.references.trained:
                total = sum(self.references.seconds)
                rank_zero_info(
                    f"MembershipAudit: trained {self.references.trained} reference model(s) in {total:.1f} s"
                )
        ledger = self._ledger(trainer)
        try:
            result = audit_membership(
                pl_module,
                members,
                nonmembers,
                attack=self.attack,
                references=self.references,
                population_loader=population,
                ledger=ledger,
                claim=self.claim if self.claim is not None else ledger,
                alpha=self.alpha,
                delta=self.delta,
                gamma=self.gamma,
                offline_a=self.offline_a,
                forward_fn=self.forward_fn,
                signal_fn=self.signal_fn,
                user_ids=self.user_ids,
                warn=False,
            )
        except ValueError as err:
            raise MisconfigurationException(f"MembershipAudit: {err}") from err
        for message in (*result.outside, *result.warnings):
            rank_zero_warn(f"MembershipAudit: {message}")
        if result.claim_verdict is not None and result.claim_verdict.contradicted:
            rank_zero_warn(f"MembershipAudit: the claim {result.claim.label} is {result.claim_verdict.sentence()}")
        self.result, self.results = result, result.metrics()
        self._audited_step = trainer.global_step
        if trainer.is_global_zero:
            audit.log_scalars(trainer, self.results)
            if self.log_figure and audit.shows_figures(trainer):
                audit.log_figure(trainer, names.MEMBERSHIP_FIGURE, result.figure())
            audit.log_text(trainer, names.MEMBERSHIP_SUMMARY, result.summary())  # the table: loggers and report
            rank_zero_info(
                f"MembershipAudit at step {trainer.global_step}: "
                + ", ".join(f"{key} = {value:.4g}" for key, value in self.results.items())
            )
        return self.results

    @override
    def report_section(self, trainer: Any = None) -> Any:
        """The report's section (:mod:`lightning_privacy.reporting`): the attack, its references, the ROC figure."""
        from lightning_privacy.audits._membership_section import REPORT_TITLE, membership_section

        if self.result is None:
            return audit.section(
                None, REPORT_TITLE, [("membership attack", "—", "not run (it runs at the end of fit)")]
            )
        return membership_section(self.result, getattr(self, "references", None))

    def state_dict(self) -> Dict[str, Any]:
        delta = getattr(self.result, "delta", None) if self.result is not None else self.delta
        return audit.sealed(
            {"results": dict(self.results)}, delta=None if delta is None else float(delta)
        )  # its digest: the statement tells an edited result

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.results = dict(state_dict.get("results", {}))

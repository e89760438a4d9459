"""Membership attacks on a trained model: RMIA, LiRA, the LOSS baseline and, for a fine-tuned language model, EZ-MIA.

:func:`~lightning_privacy.references.train_references` trains reference models with a Lightning Trainer on random halves of a population
(rows that are neither the audited members nor the audited non-members) and caches them;
:func:`audit_membership` scores the audited examples with the model and the references and returns a
:class:`MembershipAuditResult` (``.metrics()``, ``.summary()``, ``.figure()``, ``.to_dict()``, ``.scores``,
``.roc``). With a :class:`~lightning_privacy.ledger.PrivacyLedger` (DP-SGD's) the figure draws the attack's
ROC inside the region the accountant allows for the in/out game these attacks play (the add/remove relation:
the model trained with or without the example), and a point outside it is flagged. With a ``claim`` (a
:class:`~lightning_privacy.claims.Claim`, a ledger, ``(σ, q, T[, δ])`` or ``(ε, δ)``) the result carries a verdict,
``"consistent"`` or ``"contradicted"`` at confidence 1 − α (:mod:`lightning_privacy.analysis.claims`). The attacks
themselves are :mod:`lightning_privacy.analysis.membership_attacks` (numpy only). ``attack="ezmia"`` needs no
reference model: a fine-tuned language model's own base is the reference (the model with its PEFT adapters disabled,
or ``base_model``), scored by EZ-MIA's Error Zone statistic (:mod:`lightning_privacy.functional.base_reference`).

No Lightning here: the reference models are trained in :mod:`lightning_privacy.references`.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lightning_privacy import names
from lightning_privacy.analysis import membership_attacks as attacks
from lightning_privacy.audits._common import AuditResult, ClaimChecked, jsonable, sequential_loader, warnings_markdown

__all__ = [
    "ATTACKS",
    "per_person_scores",
    "REPORTED_FPRS",
    "MembershipAuditResult",
    "audit_membership",
]

ATTACKS = ("rmia", "lira", "loss", "ezmia")
REFERENCE_FREE = ("loss", "ezmia")  # no reference models: the model alone, or the model against its own base
REPORTED_FPRS = (0.001, 0.01, 0.1)
RELATION = "add_remove"  # the in/out game of every attack here: trained with or without the example
RELATION_LABELS = {"add_remove": "add/remove", "replace": "replace"}


# ------------------------------------------------------------------------------------------------------------ data
def _fingerprint(*loaders: Any) -> str:
    """SHA-256 of every tensor of the loaders' data in dataset order (which rows, which values)."""
    import torch

    digest = hashlib.sha256()
    for loader in loaders:
        for batch in sequential_loader(loader):
            if isinstance(batch, Mapping):  # e.g. {"input_ids": ..., "attention_mask": ...}: keys and values
                items = [x for key in sorted(batch, key=str) for x in (str(key), batch[key])]
            else:
                items = batch if isinstance(batch, (list, tuple)) else [batch]
            for item in items:
                if isinstance(item, torch.Tensor):
                    digest.update(str(tuple(item.shape)).encode())
                    digest.update(item.detach().cpu().contiguous().numpy().tobytes())
                elif isinstance(item, np.ndarray):
                    digest.update(np.ascontiguousarray(item).tobytes())
                else:
                    digest.update(repr(item).encode())
        digest.update(b"|")
    return digest.hexdigest()


def _losses(model: Any, loaders: Sequence[Any], forward_fn, device, signal_fn=None, *, likelihood=False) -> np.ndarray:
    """Every example's signal, in loader order. ``likelihood=True``: what RMIA and LiRA read — for a signal of kind
    ``"mean_token_nll"`` the sequence's negative log-likelihood, mean token loss × its token count."""
    from lightning_privacy.functional.membership_loss import signals_from_loader

    parts = []
    for loader in loaders:
        values, counts = signals_from_loader(
            model, sequential_loader(loader), forward_fn=forward_fn, device=device, signal_fn=signal_fn
        )
        values = values.double().numpy()
        parts.append(values * counts.double().numpy() if likelihood and counts is not None else values)
    return np.concatenate(parts) if parts else np.zeros(0)


def _attack_signal(attack: str, signal_fn: Any) -> Tuple[str, Optional[str]]:
    """``(signal of the analysis functions, note)`` for ``attack`` on ``signal_fn``'s kind; refuses a score."""
    from lightning_privacy.functional.sequence_loss import signal_kind

    if attack == "ezmia":
        from lightning_privacy.functional.base_reference import ErrorZoneSignal

        if signal_fn is not None and not isinstance(signal_fn, ErrorZoneSignal):
            raise ValueError(
                f"attack='ezmia' scores sequences with its own signal (EZ-MIA's Error Zone score against the base "
                f"model), but got `signal_fn` {signal_fn!r}: drop it (pass `base_model=` where needed) or pass an "
                "ErrorZoneSignal"
            )
        return "score", None
    kind = "membership_loss" if signal_fn is None else signal_kind(signal_fn)
    if attack == "loss" or kind == "membership_loss":
        return "membership_loss", None
    if kind == "score":
        raise ValueError(
            f"attack={attack!r} needs a likelihood Pr(x | θ) from every model, but `signal_fn` {signal_fn!r} gives a "
            "score (kind 'score', e.g. Min-K%): use it with attack='loss', or give RMIA and LiRA a likelihood signal "
            "such as causal_lm_signal."
        )
    what = "mean token loss × tokens" if kind == "mean_token_nll" else "the signal"
    return "nll", f"{attack.upper()} on sequence likelihoods: Pr(x | θ) = exp(−{what}) of each sequence"


# ------------------------------------------------------------------------------------------------------ references
# ---------------------------------------------------------------------------------------------------------- figures
def _beyond(point: attacks.TprAtFpr, bound: float) -> bool:
    """A reported point beats the accountant: its TPR lower limit exceeds the bound at its FPR upper limit."""
    return point.tpr_low > bound


def draw_region(ax: Any, fpr: Any, bound: Any, *, floor: float, relation: Optional[str] = None) -> None:
    """The region a ledger's trade-off curve allows every membership attack (shaded, and the curve as the first line).

    ``relation`` (``"add_remove"`` or ``"replace"``) is named in the legend.
    """
    bound = np.clip(np.asarray(bound, dtype=float), floor, 1.0)
    game = f" ({RELATION_LABELS[relation]})" if relation else ""
    ax.fill_between(fpr, bound, floor / 1.6, color="C2", alpha=0.15, label=f"allowed by the accountant{game}")
    ax.plot(fpr, bound, color="C2", lw=1.5, label="accountant's TPR bound (trade-off curve)")


def draw_claim(ax: Any, fpr: Any, bound: Any, *, floor: float, label: str, contradicted: Optional[bool]) -> None:
    """A claimed guarantee's TPR bound as a dashed line (red when the evidence contradicts it)."""
    bound = np.clip(np.asarray(bound, dtype=float), floor, 1.0)
    verdict = "" if contradicted is None else (": CONTRADICTED" if contradicted else ": consistent")
    color = "red" if contradicted else "C1"
    ax.plot(fpr, bound, color=color, lw=1.5, ls="--", label=f"claim {label} (add/remove){verdict}")


def log_roc_axes(ax: Any, *, floor: float) -> None:
    """Log–log ROC axes from ``floor`` (the field's convention for low FPR) with the chance line."""
    grid = np.logspace(np.log10(floor), 0, 200)
    ax.plot(grid, grid, color="0.5", ls=":", lw=1, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor / 1.6, 1)
    ax.set_ylim(floor / 1.6, 1.05)
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")


# ---------------------------------------------------------------------------------------------------------- result
def metric_key(attack: str, quantity: str) -> str:
    """``audit/<attack>_<quantity>``, e.g. ``metric_key("rmia", "auc") == "audit/rmia_auc"`` (:mod:`names`)."""
    return names.membership_key(attack, quantity)


@dataclass
class MembershipAuditResult(ClaimChecked, AuditResult):
    """One membership attack on one model.

    Attributes:
        attack: ``"rmia"``, ``"lira"``, ``"loss"`` or ``"ezmia"``; ``variant``: ``"online"``, ``"offline"``,
            ``"reference-free"`` or, for EZ-MIA, ``"base: adapters disabled"`` / ``"base: base_model"``.
        scores: one score per audited example, members first (higher = more likely a member).
        is_member: the truth, aligned with ``scores``.
        auc: area under the ROC curve.
        tpr: the TPR at each FPR of :data:`REPORTED_FPRS`, with Clopper–Pearson intervals
            (:class:`~lightning_privacy.analysis.membership_attacks.TprAtFpr`).
        epsilon: the ε lower bound from the scores (:func:`~lightning_privacy.analysis.estimation.epsilon_lower_bound`,
            Bayesian interval, holdout threshold selection), as a dict.
        delta: the δ of that bound.
        num_references, gamma, offline_a: the attack's settings (``None`` where they do not apply).
        ledger_tpr_bounds: the accountant's TPR bound at each reported point's FPR upper limit, when a ledger was
            given; ``region``: ``(fpr grid, TPR bound)`` of the ledger's trade-off curve for the figure.
        outside: one sentence per reported point whose TPR lower limit exceeds the accountant's bound: the attack
            beat DP-SGD's guarantee — a bug, broken accounting or members and non-members not drawn alike.
        relation: the neighbouring relation of the region, the bounds and the claim: ``"add_remove"``, the in/out
            game these attacks play (not the replace game of the Bayes-security values).
        claim: the :class:`~lightning_privacy.claims.Claim` tested (``None`` without one); ``claim_verdict``: the
            :class:`~lightning_privacy.analysis.claims.ClaimVerdict` (``verdict`` and ``evidence`` read from it).
        notes, warnings: what was decided and why the numbers may carry little information.
        seconds: time of the audit (scoring and attack).
    """

    attack: str
    variant: str
    scores: np.ndarray
    is_member: np.ndarray
    auc: float
    tpr: Tuple[attacks.TprAtFpr, ...]
    epsilon: Dict[str, Any]
    delta: float
    num_references: int = 0
    gamma: Optional[float] = None
    offline_a: Optional[float] = None
    ledger_tpr_bounds: Optional[Tuple[float, ...]] = None
    region: Optional[Tuple[np.ndarray, np.ndarray]] = None
    outside: Tuple[str, ...] = ()
    notes: List[str] = field(default_factory=list)
    warnings: Tuple[str, ...] = ()
    seconds: float = math.nan
    relation: str = RELATION
    claim: Any = None
    claim_verdict: Any = None

    @property
    def roc(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(fpr, tpr, thresholds)`` of the attack."""
        return attacks.roc_curve(self.scores, self.is_member)

    def metrics(self) -> Dict[str, float]:
        """``audit/<attack>_auc``, ``audit/<attack>_tpr_at_fpr_{0.001,0.01,0.1}``, ``audit/<attack>_epsilon_lower``
        and, when a claim was tested, ``audit/<attack>_claim_contradicted`` (1.0 or 0.0)."""
        out = {metric_key(self.attack, "auc"): self.auc}
        for point in self.tpr:
            out[metric_key(self.attack, f"tpr_at_fpr_{point.fpr:g}")] = point.tpr
        out[metric_key(self.attack, "epsilon_lower")] = float(self.epsilon["epsilon_lower"])
        if self.claim_verdict is not None:
            out[metric_key(self.attack, "claim_contradicted")] = float(self.claim_verdict.contradicted)
        return out

    def summary(self) -> str:
        """A Markdown table: the warnings and any point outside the accountant's region first."""
        refs = f", {self.num_references} reference model(s)" if self.num_references else ""
        head = f"Membership attack: {self.attack.upper()} ({self.variant}{refs})"
        lines = [
            "| quantity | value |",
            "|---|---|",
            f"| members / non-members | {int(self.is_member.sum())} / {int((~self.is_member).sum())} |",
            f"| AUC | {self.auc:.4f} |",
        ]
        for j, p in enumerate(self.tpr):
            bound = ""
            if self.ledger_tpr_bounds is not None:
                bound = f"; accountant's bound {self.ledger_tpr_bounds[j]:.4f} ({RELATION_LABELS[self.relation]})"
            lines.append(
                f"| TPR at FPR ≤ {p.fpr:g} | {p.tpr:.4f} [{p.tpr_low:.4f}, {p.tpr_high:.4f}] (FPR {p.achieved_fpr:.4f}, "
                f"{p.tp}/{p.num_members} TP, {p.fp}/{p.num_nonmembers} FP{bound}) |"
            )
        e = self.epsilon
        lines.append(
            f"| ε lower bound (δ = {self.delta:.3g}, {int(100 * (1 - e['alpha']))}% Bayesian interval, holdout "
            f"threshold) | {e['epsilon_lower']:.4f} |"
        )
        if self.gamma is not None:
            lines.append(f"| RMIA γ / offline a | {self.gamma:g} / {self.offline_a:.3f} |")
        if self.claim_verdict is not None:
            lines.append(f"| claim tested ({RELATION_LABELS[self.relation]}) | {self.claim.label} |")
            lines.append(f"| verdict | {self.claim_verdict.sentence()} |")
        block = warnings_markdown([*self.outside, *self.warnings])
        notes = "\n\n" + "\n".join(f"- {n}" for n in self.notes) if self.notes else ""
        return head + "\n\n" + (block + "\n\n" if block else "") + "\n".join(lines) + notes

    def report_section(self, trainer: Any = None) -> Any:
        """The report's :class:`~lightning_privacy.reporting.ReportSection`: rows, warnings first, the ROC figure."""
        from lightning_privacy.audits._membership_section import membership_section

        return membership_section(self)

    def figure(self):
        """The ROC on log–log axes; behind it, with a ledger, the region the accountant allows (a Figure)."""
        from matplotlib.figure import Figure

        fpr, tpr, _ = self.roc
        neg = int((~self.is_member).sum())
        floor = 0.5 / max(neg, 1)
        fig = Figure(figsize=(6.2, 5.2), layout="tight")
        ax = fig.subplots()
        if self.region is not None:
            draw_region(ax, *self.region, floor=floor, relation=self.relation)
        if self.claim is not None:
            grid = np.logspace(np.log10(floor), 0, 121)
            contradicted = None if self.claim_verdict is None else self.claim_verdict.contradicted
            draw_claim(
                ax, grid, self.claim.tpr_bound(grid), floor=floor, label=self.claim.label, contradicted=contradicted
            )
        log_roc_axes(ax, floor=floor)
        ax.step(
            np.maximum(fpr, floor),
            np.maximum(tpr, floor),
            where="post",
            color="C0",
            lw=1.8,
            label=f"{self.attack.upper()} ({self.variant}), AUC {self.auc:.3f}",
        )
        for j, p in enumerate(self.tpr):
            bad = self.ledger_tpr_bounds is not None and _beyond(p, self.ledger_tpr_bounds[j])
            ax.errorbar(
                max(p.achieved_fpr, floor),
                max(p.tpr, floor),
                yerr=[[max(p.tpr - p.tpr_low, 0)], [max(p.tpr_high - p.tpr, 0)]],
                fmt="o",
                color="red" if bad else "C0",
                ms=4,
                capsize=3,
            )
        if self.outside:
            ax.text(
                0.03,
                0.97,
                "ATTACK OUTSIDE THE ACCOUNTANT'S REGION:\nbug, broken accounting or biased split",
                transform=ax.transAxes,
                va="top",
                color="red",
                weight="bold",
                fontsize=9,
            )
        ax.set_title(
            f"Membership attack ROC ({self.attack.upper()}, in/out game: {RELATION_LABELS[self.relation]})\n"
            "dots: TPR at FPR ≤ 0.001/0.01/0.1 (95% CP)",
            fontsize=9,
        )
        ax.legend(loc="lower right", fontsize=8)
        return fig

    def to_dict(self) -> Dict[str, Any]:
        """Everything but the figure, as plain values (scores and truth included)."""
        out = {
            **self.metrics(),
            "attack": self.attack,
            "variant": self.variant,
            "num_members": int(self.is_member.sum()),
            "num_nonmembers": int((~self.is_member).sum()),
            "num_references": self.num_references,
            "gamma": self.gamma,
            "offline_a": self.offline_a,
            "delta": self.delta,
            "tpr_at_fpr": [asdict(p) for p in self.tpr],
            "epsilon": dict(self.epsilon),
            "ledger_tpr_bounds": None if self.ledger_tpr_bounds is None else list(self.ledger_tpr_bounds),
            "outside": list(self.outside),
            "relation": self.relation,
            "claim": None if self.claim is None else self.claim.to_dict(),
            "verdict": self.verdict,
            "evidence": self.evidence,
            "claim_tests": None if self.claim_verdict is None else [dict(t) for t in self.claim_verdict.tests],
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "seconds": self.seconds,
            "scores": self.scores,
            "is_member": self.is_member,
        }
        return jsonable(out)


# ----------------------------------------------------------------------------------------------------------- audit
def _region_check(points, ledger) -> Tuple[Tuple[float, ...], Tuple[np.ndarray, np.ndarray], Tuple[str, ...]]:
    """The ledger's add/remove bounds at the reported points, its curve on a grid, and the points beyond it."""
    bounds = tuple(float(ledger.tpr_bounds(p.fpr_high, relation=RELATION)) for p in points)
    outside = tuple(
        f"the attack's TPR at FPR ≤ {p.fpr:g} is at least {p.tpr_low:.4f} ({int(100 * (1 - p.alpha))}% Clopper–Pearson "
        f"lower limit) but the accountant allows at most {b:.4f} there: DP-SGD's guarantee is broken (a bug, broken "
        "accounting) or members and non-members were not drawn from the same rows at random"
        for p, b in zip(points, bounds)
        if _beyond(p, b)
    )
    grid = np.logspace(-4, 0, 121)
    return bounds, (grid, np.asarray(ledger.tpr_bounds(grid, relation=RELATION), dtype=float)), outside


def audit_membership(
    model: Any,
    member_loader: Any,
    nonmember_loader: Any,
    *,
    attack: str = "rmia",
    references: Any = None,
    population_loader: Any = None,
    ledger: Any = None,
    claim: Any = None,
    alpha: float = 0.05,
    delta: Optional[float] = None,
    gamma: float = 2.0,
    offline_a: Optional[float] = None,
    forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
    device: Any = None,
    warn: bool = True,
    signal_fn: Optional[Callable[[Any, Any], Any]] = None,
    base_model: Any = None,
    user_ids: Optional[Tuple[Sequence[Any], Sequence[Any]]] = None,
) -> MembershipAuditResult:
    """Attack ``model``'s membership with RMIA, LiRA, the LOSS baseline or EZ-MIA and summarise the attack.

    The signal of every model is the membership loss (softmax probability of the true label, logit-scaled for
    LiRA; :mod:`lightning_privacy.analysis.membership_attacks`). RMIA compares each audited example with the
    ``population_loader``'s points; it and LiRA need ``references`` from :func:`~lightning_privacy.references.train_references` — online when
    the references were trained with these members and non-members as ``targets``, offline otherwise.

    Args:
        model: the trained ``torch.nn.Module`` returning logits.
        member_loader, nonmember_loader: the audited examples (read once in dataset order).
        attack: ``"rmia"``, ``"lira"``, ``"loss"`` or ``"ezmia"`` — EZ-MIA (Ilić et al., arXiv 2601.12104) on a
            fine-tuned causal language model: each sequence's Error Zone score against the model fine-tuning started
            from (:class:`~lightning_privacy.functional.base_reference.ErrorZoneSignal`; no reference training, two
            forward passes per batch).
        references: reference models (RMIA, LiRA).
        population_loader: RMIA's population points ``z`` (rows neither member nor non-member); usually the one the
            references were trained on (then each point's reference membership is known).
        ledger: a :class:`~lightning_privacy.ledger.PrivacyLedger` (e.g. ``DPSGD.ledger``): its add/remove trade-off
            curve bounds the TPR of any attack in this in/out game; the figure draws it and a point beyond it is
            flagged in ``outside``.
        claim: a guarantee to test — a :class:`~lightning_privacy.claims.Claim`, a ``PrivacyLedger``,
            ``(noise_multiplier, sample_rate, steps[, delta])`` of a Poisson subsampled Gaussian or ``(epsilon,
            delta)``; the result's ``verdict`` is ``"contradicted"`` when the scores refute it at confidence
            1 − ``alpha`` (ROC points and an ε lower bound, multiple comparisons accounted for:
            :func:`~lightning_privacy.analysis.claims.check_attack_scores`), else ``"consistent"``.
        alpha: significance of the TPR intervals, of the ε lower bound and of the claim's verdict.
        delta: δ of the ε lower bound (default: the ledger's δ, else the claim's, else 1e-5).
        gamma: RMIA's γ ≥ 1.
        offline_a: RMIA's offline ``a`` in [0, 1]; ``None`` fits it on the references' population rows
            (:func:`~lightning_privacy.analysis.membership_attacks.fit_offline_a`), or 1 (no correction) when the
            references' rows are unknown or the signal is a sequence likelihood (a language model's
            ``signal_fn``: a fitted ``1 − a`` would outweigh every sequence's ``e^{−N}``).
        forward_fn: ``forward_fn(model, batch) -> (logits, target)``; default ``model(batch[0]), batch[1]``.
        device: where to run the models.
        warn: issue each of the result's warnings and ``outside`` sentences as a ``UserWarning``.
        signal_fn: ``signal_fn(model, batch) -> losses`` (one per example, low = member-like) instead of
            ``forward_fn``, for examples that are not classification rows: for a causal language model
            :data:`~lightning_privacy.functional.sequence_loss.causal_lm_signal` (each sequence's mean next-token loss
            over its non-padding tokens, the LOSS attack's signal, and its token count: RMIA and LiRA use the
            sequence's likelihood ``Pr(x | θ) = exp(−mean token loss × tokens)``), or
            :data:`~lightning_privacy.functional.sequence_loss.min_k_percent_signal` (Min-K%, with ``attack="loss"``).
            The signal's ``kind`` (:data:`~lightning_privacy.functional.sequence_loss.SIGNAL_KINDS`) says which; RMIA
            and LiRA refuse a ``"score"``. With ``attack="ezmia"`` only ``None`` or an
            :class:`~lightning_privacy.functional.base_reference.ErrorZoneSignal` (its own settings and base).
        base_model: EZ-MIA's reference, the model fine-tuning started from (e.g. the pretrained checkpoint, called like
            ``model``): needed for full fine-tuning; a PEFT model's base is itself with its adapters disabled
            (``peft_model.disable_adapter()``), no copy. Refused with another attack.
        user_ids: ``(member ids, non-member ids)``, the person of each audited row of the two loaders: the audit is
            then over *people* (user-level DP, ``DPSGD(privacy_unit="user")``): a person's score is the mean of their
            rows' scores, every ROC point, ε bound and verdict counts people, and the claim to test is the person's
            (the run's ledger). A person's rows must all be members or all non-members. For a fine-tuned language
            model, ``attack="loss"`` with ``signal_fn=BaseLossDifferenceSignal(base_model)`` is the user inference
            attack of Kandpal et al. (2023): the mean over a person's sequences of their loss under the base minus
            under the fine-tune (per token; the paper sums a sequence's log-likelihoods) — the rows may be other
            samples of the same people than those trained on, as in the paper.

    Returns:
        A :class:`MembershipAuditResult`.

    Raises:
        ValueError: for an unknown attack, missing references or population, or references trained with other
            audited examples, ``attack="ezmia"`` on a model without PEFT adapters and without ``base_model`` (naming
            ``base_model``), ``base_model`` with another attack, a claim out of range, or batches that are mappings (a language model's
            ``{"input_ids": ..., "attention_mask": ...}``) without ``signal_fn`` or ``forward_fn``: the sentence names
            ``signal_fn=causal_lm_signal``.
        TypeError: a ``claim`` of another type.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> g = torch.Generator().manual_seed(0)
        >>> x, y = torch.randn(400, 5, generator=g), torch.randint(0, 2, (400,), generator=g)
        >>> model = torch.nn.Linear(5, 2)
        >>> members, nonmembers = (DataLoader(TensorDataset(x[s], y[s]), batch_size=100) for s in (slice(0, 200), slice(200, 400)))
        >>> result = audit_membership(model, members, nonmembers, attack="loss", claim=(1.0, 0.2, 150))
        >>> result.relation, result.verdict  # an untrained model: nothing contradicts the claim
        ('add_remove', 'consistent')
    """
    from lightning_privacy.analysis._checks import expect_choice, expect_real
    from lightning_privacy.analysis.estimation import epsilon_lower_bound, score_orientation
    from lightning_privacy.claims import Claim
    from lightning_privacy.functional.sequence_loss import signal_kind

    start = time.perf_counter()
    expect_choice("attack", attack, ATTACKS)
    alpha = expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)
    claim = None if claim is None else Claim.parse(claim)
    if delta is None:
        delta = float(ledger.delta) if ledger is not None else claim.delta if claim is not None else 1e-5
    delta = expect_real("delta", delta, low=0.0, high=1.0, high_open=True)
    notes: List[str] = []
    signal, note = _attack_signal(attack, signal_fn)
    variant = "reference-free"
    if attack == "ezmia":
        signal_fn, variant = _ezmia_signal(model, signal_fn, base_model, notes)
    elif base_model is not None:
        raise ValueError(f"`base_model` is EZ-MIA's reference: it needs attack='ezmia', but got attack={attack!r}")
    nll = signal == "nll" and signal_fn is not None and signal_kind(signal_fn) == "mean_token_nll"
    if note:
        notes.append(note)

    def read(m: Any, loaders: List[Any]) -> np.ndarray:
        return _losses(m, loaders, forward_fn, device, signal_fn, likelihood=nll)

    member_target, nonmember_target = read(model, [member_loader]), read(model, [nonmember_loader])
    target = np.r_[member_target, nonmember_target]
    is_member = np.r_[np.ones(member_target.size, bool), np.zeros(nonmember_target.size, bool)]
    k, used_gamma, used_a = 0, None, None
    if attack in REFERENCE_FREE:  # LOSS: −loss; EZ-MIA: the Error Zone score (its signal is the negative)
        scores = attacks.loss_scores(target)
    else:
        k = len(references) if references is not None else 0
        scores, variant, used_gamma, used_a = _reference_scores(
            attack, model, target, references, read, (member_loader, nonmember_loader), population_loader,
            gamma=gamma, offline_a=offline_a, signal=signal, notes=notes,
        )  # fmt: skip
    if user_ids is not None:  # the unit is a person: their rows' mean score, one member label per person
        scores, is_member = per_person_scores(scores, is_member, user_ids, (member_target.size, nonmember_target.size))
        notes.append(
            f"scored per person ({int(is_member.sum())} member and {int((~is_member).sum())} non-member people): the "
            "mean of each person's rows' scores; every point, bound and verdict counts people"
        )
    points = attacks.tpr_at_fpr(scores, is_member, REPORTED_FPRS, alpha=alpha)
    epsilon = epsilon_lower_bound(scores, is_member, delta=delta, alpha=alpha, selection="holdout", seed=0).as_dict()
    found: List[str] = []
    orientation = score_orientation(scores, is_member)
    if orientation.reversed:
        found.append(orientation.warning(fix="members and non-members may be swapped"))
    bounds = region = None
    outside: Tuple[str, ...] = ()
    if ledger is not None:
        bounds, region, outside = _region_check(points, ledger)
    verdict = None if claim is None else claim.check_attack_scores(scores, is_member, alpha=alpha)
    if warn:
        _warn(outside, found, claim, verdict)
    return MembershipAuditResult(
        attack=attack,
        variant=variant,
        scores=np.asarray(scores, dtype=float),
        is_member=is_member,
        auc=attacks.auc(scores, is_member),
        tpr=points,
        epsilon=epsilon,
        delta=delta,
        num_references=k,
        gamma=used_gamma,
        offline_a=used_a,
        ledger_tpr_bounds=bounds,
        region=region,
        outside=outside,
        notes=notes,
        warnings=tuple(found),
        seconds=time.perf_counter() - start,
        claim=claim,
        claim_verdict=verdict,
    )


def per_person_scores(
    scores: np.ndarray, is_member: np.ndarray, user_ids: Tuple[Sequence[Any], Sequence[Any]], sizes: Tuple[int, int]
) -> Tuple[np.ndarray, np.ndarray]:
    """Row scores (members first) → one score per person, the mean of their rows' (members first), and each
    person's membership. Raises ``ValueError`` for ids of the wrong length or a person among members and non-members.

    Example::

        >>> per_person_scores(np.array([1.0, 3.0, 0.0, 2.0]), np.array([1, 1, 0, 0], bool), (["a", "a"], ["b", "c"]), (2, 2))
        (array([2., 0., 2.]), array([ True, False, False]))
    """
    if not isinstance(user_ids, (tuple, list)) or len(user_ids) != 2:
        raise ValueError("`user_ids` must be (member ids, non-member ids): the person of each row of the two loaders")
    members, nonmembers = list(user_ids[0]), list(user_ids[1])
    for name, ids, size in (("member", members, sizes[0]), ("non-member", nonmembers, sizes[1])):
        if len(ids) != size:
            raise ValueError(f"`user_ids` has {len(ids)} {name} ids for {size} {name} rows: give one person per row")
    both = set(members) & set(nonmembers)
    if both:
        raise ValueError(
            f"`user_ids`: {len(both)} person(s) have rows among both members and non-members (e.g. {next(iter(both))!r}); "
            "under user-level DP a person is trained on with all their rows or none"
        )
    order: Dict[Any, List[int]] = {}
    for i, person in enumerate(members + nonmembers):
        order.setdefault(person, []).append(i)
    people = list(order)
    person_scores = np.array([float(np.mean(scores[order[p]])) for p in people])
    member_set = set(members)
    return person_scores, np.array([p in member_set for p in people], dtype=bool)


def ezmia_signal(signal_fn: Any, base_model: Any) -> Any:
    """EZ-MIA's :class:`~lightning_privacy.functional.base_reference.ErrorZoneSignal`: ``signal_fn`` (one, or ``None``)
    with ``base_model`` as its base where given. Raises ``ValueError`` for another signal or two different bases."""
    from lightning_privacy.functional.base_reference import ErrorZoneSignal

    _attack_signal("ezmia", signal_fn)
    if signal_fn is None:
        return ErrorZoneSignal(base_model)
    if base_model is None or signal_fn.base_model is base_model:
        return signal_fn
    if signal_fn.base_model is not None:
        raise ValueError("give EZ-MIA's base once: `base_model` or the ErrorZoneSignal's own, not two different ones")
    settings = ("min_error_tokens", "skip_first", "ignore_index", "pad_token_id")
    return ErrorZoneSignal(base_model, **{key: getattr(signal_fn, key) for key in settings})


def _ezmia_signal(model: Any, signal_fn: Any, base_model: Any, notes: List[str]) -> Tuple[Any, str]:
    """EZ-MIA's signal and the variant; refuses a model with no base (naming ``base_model``)."""
    signal_fn = ezmia_signal(signal_fn, base_model)
    how = signal_fn.check(model)
    notes.append(
        "EZ-MIA (Ilić et al. 2026): per sequence, at the tokens the model predicts wrongly, the share P⁺/(P⁺+P⁻) of "
        f"upward shifts of the true token's log-probability relative to the base ({how}; a monotone transform of the "
        "paper's P⁺/P⁻, its infinite and zero ratios ranked by the size of the shift); an error zone under "
        f"{signal_fn.min_error_tokens} tokens falls back to all tokens"
    )
    return signal_fn, f"base: {how}"


def _reference_scores(
    attack: str,
    model: Any,
    target: np.ndarray,
    references: Any,
    read: Callable[[Any, List[Any]], np.ndarray],
    audited: Tuple[Any, Any],
    population_loader: Any,
    *,
    gamma: float,
    offline_a: Optional[float],
    signal: str,
    notes: List[str],
) -> Tuple[np.ndarray, str, Optional[float], Optional[float]]:
    """LiRA's or RMIA's scores of the audited examples from the reference models: ``(scores, "online" | "offline",
    RMIA's γ, RMIA's a)``; ``read(model, loaders)`` is each model's signal over the loaders, in order."""
    from lightning_privacy.analysis._checks import expect_real

    if references is None or len(references) == 0:
        raise ValueError(
            f"Expected `references` for attack={attack!r}: train them with "
            "`train_references(model_factory, population_loader, num_references=..., trainer_kwargs=...)`."
        )
    inside = None
    if references.online:
        if _fingerprint(*audited) != references.targets_fingerprint:
            raise ValueError(
                "The references were trained with other audited examples (`targets`) than these members and "
                "non-members: pass the same loaders, or references trained without `targets` (offline)."
            )
        inside = references.inside_targets
    variant = "online" if inside is not None else "offline"
    ref = np.stack([read(m, list(audited)) for m in references.models])
    if attack == "lira":
        return attacks.lira_scores(target, ref, inside=inside, signal=signal), variant, None, None
    if population_loader is None:
        raise ValueError("Expected `population_loader` for attack='rmia' (its points are RMIA's z).")
    pop_target = read(model, [population_loader])
    pop_ref = np.stack([read(m, [population_loader]) for m in references.models])
    same = _fingerprint(population_loader) == references.population_fingerprint
    pop_inside = references.inside_population if same else None
    if not same:
        notes.append("the population is not the references' training population: every z counted as OUT")
    if offline_a is None and signal == "nll":
        used_a = 1.0  # see fit_offline_a: on sequence likelihoods a fitted 1 − a outweighs every e^{−N}
        notes.append(
            "offline a = 1 (no correction) on sequence likelihoods: the linear correction's 1 − a is on the scale of "
            "a probability and would outweigh every e^{−N}; a common factor between IN and OUT likelihoods cancels"
        )
    elif offline_a is None:
        used_a = attacks.fit_offline_a(pop_ref, pop_inside, signal=signal) if same else 1.0
        how = "fitted on the references' own rows" if same else "(no correction: the references' rows are unknown)"
        notes.append(f"offline a = {used_a:.3f} {how}")
    else:
        used_a = expect_real("offline_a", offline_a, low=0.0, high=1.0)
    scores = attacks.rmia_scores(
        target, ref, pop_target, pop_ref, inside=inside, population_inside=pop_inside, gamma=gamma,
        offline_a=used_a, signal=signal,
    )  # fmt: skip
    return scores, variant, float(gamma), used_a


def _warn(outside: Tuple[str, ...], found: List[str], claim: Any, verdict: Any) -> None:
    """The result's warnings, the points outside the ledger's region and a contradicted claim, as UserWarnings."""
    for message in (*outside, *found):
        warnings.warn(f"audit_membership: {message}", UserWarning, stacklevel=3)
    if verdict is not None and verdict.contradicted:
        warnings.warn(f"audit_membership: the claim {claim.label} is {verdict.sentence()}", UserWarning, stacklevel=3)

"""Reference-model membership attacks on a trained model: RMIA, LiRA and the LOSS baseline.

:func:`~lightning_privacy.references.train_references` (``lightning_privacy.audits.train_references``) trains reference models with a Lightning Trainer on random halves of a population
(rows that are neither the audited members nor the audited non-members) and caches them;
:func:`audit_membership` scores the audited examples with the model and the references and returns a
:class:`MembershipAuditResult` (``.metrics()``, ``.summary()``, ``.figure()``, ``.to_dict()``, ``.scores``,
``.roc``). With a :class:`~lightning_privacy.ledger.PrivacyLedger` (DP-SGD's) the figure draws the attack's
ROC inside the region the accountant allows, and a point outside it is flagged. The attacks themselves are
:mod:`lightning_privacy.analysis.membership_attacks` (numpy only).

No Lightning here: the reference models are trained in :mod:`lightning_privacy.references`.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lightning_privacy import names
from lightning_privacy.analysis import membership_attacks as attacks
from lightning_privacy.audits._common import AuditResult, jsonable, sequential_loader, warnings_markdown

__all__ = [
    "ATTACKS",
    "REPORTED_FPRS",
    "MembershipAuditResult",
    "audit_membership",
]

ATTACKS = ("rmia", "lira", "loss")
REPORTED_FPRS = (0.001, 0.01, 0.1)


# ------------------------------------------------------------------------------------------------------------ data
def _fingerprint(*loaders: Any) -> str:
    """SHA-256 of every tensor of the loaders' data in dataset order (which rows, which values)."""
    import torch

    digest = hashlib.sha256()
    for loader in loaders:
        for batch in sequential_loader(loader):
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


def _losses(model: Any, loaders: Sequence[Any], forward_fn, device) -> np.ndarray:
    from lightning_privacy.functional.membership_loss import membership_losses_from_loader

    parts = [
        membership_losses_from_loader(model, sequential_loader(loader), forward_fn=forward_fn, device=device)
        .double()
        .numpy()
        for loader in loaders
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


# ------------------------------------------------------------------------------------------------------ references
# ---------------------------------------------------------------------------------------------------------- figures
def _beyond(point: attacks.TprAtFpr, bound: float) -> bool:
    """A reported point beats the accountant: its TPR lower limit exceeds the bound at its FPR upper limit."""
    return point.tpr_low > bound


def draw_region(ax: Any, fpr: Any, bound: Any, *, floor: float) -> None:
    """The region a ledger's trade-off curve allows every membership attack (shaded, and the curve as the first line)."""
    bound = np.clip(np.asarray(bound, dtype=float), floor, 1.0)
    ax.fill_between(fpr, bound, floor / 1.6, color="C2", alpha=0.15, label="allowed by the accountant")
    ax.plot(fpr, bound, color="C2", lw=1.5, label="accountant's TPR bound (trade-off curve)")


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
class MembershipAuditResult(AuditResult):
    """One membership attack on one model.

    Attributes:
        attack: ``"rmia"``, ``"lira"`` or ``"loss"``; ``variant``: ``"online"``, ``"offline"`` or
            ``"reference-free"``.
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

    @property
    def roc(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(fpr, tpr, thresholds)`` of the attack."""
        return attacks.roc_curve(self.scores, self.is_member)

    def metrics(self) -> Dict[str, float]:
        """``audit/<attack>_auc``, ``audit/<attack>_tpr_at_fpr_{0.001,0.01,0.1}``, ``audit/<attack>_epsilon_lower``."""
        out = {metric_key(self.attack, "auc"): self.auc}
        for point in self.tpr:
            out[metric_key(self.attack, f"tpr_at_fpr_{point.fpr:g}")] = point.tpr
        out[metric_key(self.attack, "epsilon_lower")] = float(self.epsilon["epsilon_lower"])
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
                bound = f"; accountant's bound {self.ledger_tpr_bounds[j]:.4f}"
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
        block = warnings_markdown([*self.outside, *self.warnings])
        notes = "\n\n" + "\n".join(f"- {n}" for n in self.notes) if self.notes else ""
        return head + "\n\n" + (block + "\n\n" if block else "") + "\n".join(lines) + notes

    def figure(self):
        """The ROC on log–log axes; behind it, with a ledger, the region the accountant allows (a Figure)."""
        from matplotlib.figure import Figure

        fpr, tpr, _ = self.roc
        neg = int((~self.is_member).sum())
        floor = 0.5 / max(neg, 1)
        fig = Figure(figsize=(6.2, 5.2), layout="tight")
        ax = fig.subplots()
        if self.region is not None:
            draw_region(ax, *self.region, floor=floor)
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
            f"Membership attack ROC ({self.attack.upper()}); dots: TPR at FPR ≤ 0.001/0.01/0.1 (95% CP)", fontsize=9
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
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "seconds": self.seconds,
            "scores": self.scores,
            "is_member": self.is_member,
        }
        return jsonable(out)


# ----------------------------------------------------------------------------------------------------------- audit
def _region_check(points, ledger) -> Tuple[Tuple[float, ...], Tuple[np.ndarray, np.ndarray], Tuple[str, ...]]:
    bounds = tuple(float(ledger.tpr_bounds(p.fpr_high)) for p in points)
    outside = tuple(
        f"the attack's TPR at FPR ≤ {p.fpr:g} is at least {p.tpr_low:.4f} ({int(100 * (1 - p.alpha))}% Clopper–Pearson "
        f"lower limit) but the accountant allows at most {b:.4f} there: DP-SGD's guarantee is broken (a bug, broken "
        "accounting) or members and non-members were not drawn from the same rows at random"
        for p, b in zip(points, bounds)
        if _beyond(p, b)
    )
    grid = np.logspace(-4, 0, 121)
    return bounds, (grid, np.asarray(ledger.tpr_bounds(grid), dtype=float)), outside


def audit_membership(
    model: Any,
    member_loader: Any,
    nonmember_loader: Any,
    *,
    attack: str = "rmia",
    references: Any = None,
    population_loader: Any = None,
    ledger: Any = None,
    alpha: float = 0.05,
    delta: Optional[float] = None,
    gamma: float = 2.0,
    offline_a: Optional[float] = None,
    forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
    device: Any = None,
    warn: bool = True,
) -> MembershipAuditResult:
    """Attack ``model``'s membership with RMIA, LiRA or the LOSS baseline and summarise the attack.

    The signal of every model is the membership loss (softmax probability of the true label, logit-scaled for
    LiRA; :mod:`lightning_privacy.analysis.membership_attacks`). RMIA compares each audited example with the
    ``population_loader``'s points; it and LiRA need ``references`` from :func:`~lightning_privacy.references.train_references` — online when
    the references were trained with these members and non-members as ``targets``, offline otherwise.

    Args:
        model: the trained ``torch.nn.Module`` returning logits.
        member_loader, nonmember_loader: the audited examples (read once in dataset order).
        attack: ``"rmia"``, ``"lira"`` or ``"loss"``.
        references: reference models (RMIA, LiRA).
        population_loader: RMIA's population points ``z`` (rows neither member nor non-member); usually the one the
            references were trained on (then each point's reference membership is known).
        ledger: a :class:`~lightning_privacy.ledger.PrivacyLedger` (e.g. ``DPSGD.ledger``): its trade-off curve
            bounds the TPR of any attack; the figure draws it and a point beyond it is flagged in ``outside``.
        alpha: significance of the TPR intervals and of the ε lower bound.
        delta: δ of the ε lower bound (default: the ledger's δ, else 1e-5).
        gamma: RMIA's γ ≥ 1.
        offline_a: RMIA's offline ``a`` in [0, 1]; ``None`` fits it on the references' population rows
            (:func:`~lightning_privacy.analysis.membership_attacks.fit_offline_a`), or 1 (no correction) when the
            references' rows are unknown.
        forward_fn: ``forward_fn(model, batch) -> (logits, target)``; default ``model(batch[0]), batch[1]``.
        device: where to run the models.
        warn: issue each of the result's warnings and ``outside`` sentences as a ``UserWarning``.

    Returns:
        A :class:`MembershipAuditResult`.

    Raises:
        ValueError: for an unknown attack, missing references or population, or references trained with other
            audited examples.
    """
    from lightning_privacy.analysis._checks import expect_choice, expect_real
    from lightning_privacy.analysis.estimation import epsilon_lower_bound, score_orientation

    start = time.perf_counter()
    expect_choice("attack", attack, ATTACKS)
    alpha = expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)
    if delta is None:
        delta = float(ledger.delta) if ledger is not None else 1e-5
    delta = expect_real("delta", delta, low=0.0, high=1.0, high_open=True)
    notes: List[str] = []
    member_target = _losses(model, [member_loader], forward_fn, device)
    nonmember_target = _losses(model, [nonmember_loader], forward_fn, device)
    target = np.r_[member_target, nonmember_target]
    is_member = np.r_[np.ones(member_target.size, bool), np.zeros(nonmember_target.size, bool)]
    k, used_gamma, used_a, variant = 0, None, None, "reference-free"
    if attack == "loss":
        scores = attacks.loss_scores(target)
    else:
        if references is None or len(references) == 0:
            raise ValueError(
                f"Expected `references` for attack={attack!r}: train them with "
                "`train_references(model_factory, population_loader, num_references=..., trainer_kwargs=...)`."
            )
        k = len(references)
        inside = None
        if references.online:
            fp = _fingerprint(member_loader, nonmember_loader)
            if fp != references.targets_fingerprint:
                raise ValueError(
                    "The references were trained with other audited examples (`targets`) than these members and "
                    "non-members: pass the same loaders, or references trained without `targets` (offline)."
                )
            inside = references.inside_targets
        variant = "online" if inside is not None else "offline"
        ref = np.stack([_losses(m, [member_loader, nonmember_loader], forward_fn, device) for m in references.models])
        if attack == "lira":
            scores = attacks.lira_scores(target, ref, inside=inside)
        else:
            if population_loader is None:
                raise ValueError("Expected `population_loader` for attack='rmia' (its points are RMIA's z).")
            pop_target = _losses(model, [population_loader], forward_fn, device)
            pop_ref = np.stack([_losses(m, [population_loader], forward_fn, device) for m in references.models])
            same = _fingerprint(population_loader) == references.population_fingerprint
            pop_inside = references.inside_population if same else None
            if not same:
                notes.append("the population is not the references' training population: every z counted as OUT")
            if offline_a is None:
                used_a = attacks.fit_offline_a(pop_ref, pop_inside) if same else 1.0
                notes.append(
                    f"offline a = {used_a:.3f} "
                    + (
                        "fitted on the references' own rows"
                        if same
                        else "(no correction: the references' rows are unknown)"
                    )
                )
            else:
                used_a = expect_real("offline_a", offline_a, low=0.0, high=1.0)
            used_gamma = float(gamma)
            scores = attacks.rmia_scores(
                target,
                ref,
                pop_target,
                pop_ref,
                inside=inside,
                population_inside=pop_inside,
                gamma=gamma,
                offline_a=used_a,
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
    if warn:
        for message in (*outside, *found):
            warnings.warn(f"audit_membership: {message}", UserWarning, stacklevel=2)
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
    )

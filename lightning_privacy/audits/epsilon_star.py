"""Epsilon* (Negoescu et al. 2023) of a trained model: score members and non-members, fit, threshold MIA.

:func:`audit_epsilon_star` scores two loaders with the model;
:func:`audit_epsilon_star_from_losses` starts from per-example losses (e.g. computed by another
framework). Both return an :class:`EpsilonStarResult`. The math is
:mod:`lightning_privacy.analysis.epsilon_star` and :mod:`lightning_privacy.analysis.estimation`;
:class:`~lightning_privacy.EpsilonStarAudit` and ``lightning-privacy audit epsilon-star`` call these.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import (
    RATIO_NAMES,
    EpsilonStarDetails,
    _check_delta,
    default_delta,
    epsilon_star_details,
    transform_losses,
)
from lightning_privacy.audits._common import AuditResult, jsonable, sequential_loader, warnings_markdown
from lightning_privacy.reporting import ReportSection, result_warnings

__all__ = [
    "KS_LEVEL",
    "EpsilonStarResult",
    "audit_epsilon_star",
    "audit_epsilon_star_from_losses",
    "beyond_accountant_warning",
    "fit_warnings",
    "fits_rejected",
    "summary_text",
    "transformed_fit_figure",
]

METHOD_KEYS = (("parametric", names.EPSILON_STAR), ("empirical", names.EPSILON_STAR_EMPIRICAL))
KS_LEVEL = 0.01
"""The parametric ε* is flagged when a KS p-value of its Normal fits (Appendix 8.2: ≤ 1,000 held-out
transformed losses against as many draws from the fit) is below this level: the fit is rejected, and
ε* read off the fitted tails can be far from the losses' own (e.g. 4.1 against the empirical 2.8 for
Gamma losses whose fits have p ≈ 0.001). A correct fit is flagged with probability at most about
``2 × KS_LEVEL`` (two fits)."""


def fits_rejected(details: Mapping[str, EpsilonStarDetails], level: float = KS_LEVEL) -> bool:
    """Whether a KS test rejects one of the parametric Normal fits at ``level`` (``nan`` p-values never do).

    Example::

        >>> rng = np.random.default_rng(0)
        >>> from lightning_privacy.analysis.epsilon_star import epsilon_star_details
        >>> fits_rejected({"parametric": epsilon_star_details(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)})
        True
        >>> fits_rejected({"parametric": epsilon_star_details(rng.normal(1, 1, 2000), rng.normal(2, 1, 2000), delta=1e-4)})
        False
    """
    d = details.get("parametric")
    if d is None:
        return False
    pvalues = [p for p in (d.ks_pvalue_member, d.ks_pvalue_nonmember) if p is not None and np.isfinite(p)]
    return any(p < level for p in pvalues)


def fit_warnings(details: Mapping[str, EpsilonStarDetails], level: float = KS_LEVEL) -> List[str]:
    """The warnings about the parametric fits: rejected by their KS test (:data:`KS_LEVEL`), or not checkable."""
    d = details.get("parametric")
    if d is None:
        return []
    if fits_rejected(details, level):
        empirical = details.get("empirical")
        value = "" if empirical is None else f" = {empirical.epsilon_star:.3g}"
        return [
            f"the Normal fits of Epsilon* are rejected (KS p = {d.ks_pvalue_member:.2g} members / "
            f"{d.ks_pvalue_nonmember:.2g} non-members < {level:g}); the parametric ε* = {d.epsilon_star:.3g} from "
            f"them is not reliable: use the empirical ε*{value} (method='empirical', `{names.EPSILON_STAR_EMPIRICAL}`)"
        ]
    if not all(p is not None and np.isfinite(p) for p in (d.ks_pvalue_member, d.ks_pvalue_nonmember)):
        return [
            f"too few losses to check the Normal fits of Epsilon* ({d.num_members} members / {d.num_nonmembers} "
            "non-members, the KS check needs 20 of each): ε* from so few examples carries little information"
        ]
    return []


def _no_admissible_threshold(d: EpsilonStarDetails, members: np.ndarray, nonmembers: np.ndarray) -> bool:
    """Whether no threshold keeps both rates in the range the method admits (its supremum runs over nothing) while
    the members' losses are the lower ones: separated, not equal."""
    from scipy import stats

    from lightning_privacy.analysis.epsilon_star import EMPIRICAL_RATE_RANGE

    if d.method == "parametric":  # psi = −phi increases with the loss (analysis.epsilon_star._parametric)
        member = stats.norm(-d.member_mean, d.member_std)
        nonmember = stats.norm(-d.nonmember_mean, d.nonmember_std)
        low = max(nonmember.ppf(d.delta), member.ppf(d.delta))
        return d.member_mean > d.nonmember_mean and not low < min(nonmember.isf(d.delta), member.isf(d.delta))
    lo, hi = EMPIRICAL_RATE_RANGE
    thresholds = np.concatenate([members, nonmembers])
    fpr = np.searchsorted(np.sort(nonmembers), thresholds, side="right") / nonmembers.size
    fnr = 1.0 - np.searchsorted(np.sort(members), thresholds, side="right") / members.size
    admissible = (fpr > lo) & (fpr < hi) & (fnr > lo) & (fnr < hi)
    return bool(((1.0 - fnr) > fpr).any()) and not bool(admissible.any())  # some threshold: TPR > FPR


def separated_warning(
    details: Mapping[str, EpsilonStarDetails], members: np.ndarray, nonmembers: np.ndarray, mia_epsilon: float
) -> Optional[str]:
    """One sentence when an Epsilon* of 0 is no measurement but an empty supremum: the members' and non-members'
    losses are separated beyond the rates the method admits (e.g. an over-fitted language model's mean token losses),
    so no threshold is left to take it over; ``None`` otherwise.

    Example::

        >>> from lightning_privacy.analysis.epsilon_star import epsilon_star_details
        >>> members, nonmembers = np.linspace(0, 1, 50), np.linspace(5, 6, 50)  # perfectly separated
        >>> details = {"empirical": epsilon_star_details(members, nonmembers, delta=1e-3, method="empirical")}
        >>> details["empirical"].epsilon_star, separated_warning(details, members, nonmembers, 2.1)[:40]
        (0.0, 'Epsilon* = 0 (empirical) is no measureme')
    """
    zero = [m for m, d in details.items() if d.epsilon_star == 0.0 and _no_admissible_threshold(d, members, nonmembers)]
    if not zero:
        return None
    return (
        f"Epsilon* = 0 ({', '.join(zero)}) is no measurement here: the member and non-member losses are separated "
        "beyond the rates Epsilon* admits (no threshold keeps both its FPR and FNR in [δ, 1 − δ] under the parametric "
        "fits, or in (0.001, 0.999) empirically), so its supremum runs over no threshold at all — the model leaks so "
        f"much that this estimator cannot say how much; read the threshold attack's `{names.MIA_EPSILON_LOWER}` = "
        f"{mia_epsilon:.3g} (a valid lower bound) instead"
    )


def summary_text(
    values: Mapping[str, float], details: Mapping[str, EpsilonStarDetails], warnings: Sequence[str] = ()
) -> str:
    """The Markdown table of one Epsilon* audit: the warnings, the values, the fits, the threshold, the KS checks."""
    rejected = fits_rejected(details)
    lines = ["| quantity | value |", "|---|---|"]
    for key, value in values.items():
        flag = " (Normal fits rejected: not reliable)" if key == names.EPSILON_STAR and rejected else ""
        lines.append(f"| `{key}` | {value:.4f}{flag} |")
    for method, d in details.items():
        lines.append(
            f"| {method}: members / non-members / delta | {d.num_members} / {d.num_nonmembers} / {d.delta:.3g} |"
        )
        if d.ratio is not None:
            lines.append(
                f"| {method}: threshold (loss) / FPR / FNR / ratio | {d.threshold:.4g} / {d.fpr:.3g} / {d.fnr:.3g} / "
                f"{RATIO_NAMES[d.ratio - 1]} |"
            )
    d = details.get("parametric")
    if d is not None:
        lines.append(
            f"| Normal fits of φ: members / non-members | N({d.member_mean:.4f}, {d.member_std:.4f}²) / "
            f"N({d.nonmember_mean:.4f}, {d.nonmember_std:.4f}²) |"
        )
        verdict = f" (rejected at {KS_LEVEL:g})" if rejected else ""
        lines.append(
            f"| KS p-values of the fits: members / non-members | {d.ks_pvalue_member:.3g} / "
            f"{d.ks_pvalue_nonmember:.3g}{verdict} |"
        )
    block = warnings_markdown(warnings)
    return "Epsilon* audit\n\n" + (block + "\n\n" if block else "") + "\n".join(lines)


def transformed_fit_figure(details: EpsilonStarDetails, member_losses: Any, nonmember_losses: Any):
    """Histograms of the transformed losses ``phi`` of both sets with their fitted Normals (parametric).

    Returns a :class:`matplotlib.figure.Figure` (no pyplot: the user's backend is left alone).
    """
    from matplotlib.figure import Figure
    from scipy import stats

    low, high = details.loss_min, details.loss_max
    phi_tr = transform_losses(np.asarray(member_losses, dtype=np.float64), low=low, high=high)
    phi_pop = transform_losses(np.asarray(nonmember_losses, dtype=np.float64), low=low, high=high)
    fig = Figure(figsize=(7, 4), layout="tight")
    ax = fig.subplots()
    bins = np.linspace(min(phi_tr.min(), phi_pop.min()), max(phi_tr.max(), phi_pop.max()), 80)
    grid = np.linspace(bins[0], bins[-1], 400)
    for phi, mean, std, label, color in (
        (phi_tr, details.member_mean, details.member_std, "members (training)", "C0"),
        (phi_pop, details.nonmember_mean, details.nonmember_std, "non-members (population)", "C1"),
    ):
        ax.hist(phi, bins=bins, density=True, alpha=0.35, color=color, label=f"{label}, n = {phi.size}")
        ax.plot(grid, stats.norm.pdf(grid, mean, std), color=color, label=f"Normal fit N({mean:.3f}, {std:.3f}²)")
    if details.threshold is not None:
        phi_tau = transform_losses([details.threshold], low=low, high=high)[0]
        ax.axvline(phi_tau, color="k", linestyle="--", label=f"maximising threshold (ratio {details.ratio})")
    ax.set_xlabel("φ = logit(exp(−(normalised loss + 1)))   (members: φ ≥ threshold)")
    ax.set_ylabel("density")
    ax.set_title(f"Epsilon* = {details.epsilon_star:.4f} (parametric, δ = {details.delta:.2g})")
    ax.legend(fontsize=8)
    return fig


REPORT_TITLE = "Epsilon* audit"
FIGURE_CAPTION = (
    "Epsilon*: histograms of the transformed losses φ of members (training) and non-members with their Normal fits; "
    "the dashed line is the threshold that maximises the ratio."
)


def report_rows(values: Mapping[str, float], fits_rejected: bool = False) -> List[tuple]:
    """The report's rows for Epsilon* ``values`` (``fits_rejected``: the KS test rejects the Normal fits)."""
    meaning = {
        names.EPSILON_STAR: "estimate (parametric Normal fits), not a bound; empirical privacy of the loss-threshold attack"
        + ("; NOT RELIABLE here: the KS test rejects the Normal fits (see the warning)" if fits_rejected else ""),
        names.EPSILON_STAR_EMPIRICAL: "estimate from the empirical loss distributions, not a bound",
        names.MIA_EPSILON_LOWER: "lower bound (with confidence) on the ε of any DP guarantee, from the same losses",
    }
    return [(f"`{k}`", f"{v:.4g}", meaning.get(k, "")) for k, v in values.items()] or [("Epsilon*", "—", "not run")]


@dataclass
class EpsilonStarResult(AuditResult):
    """One Epsilon* audit.

    Attributes:
        member_losses, nonmember_losses: the per-example membership losses (float64, low = member-like).
        delta: the δ of Equation 7 that was used.
        values: ``audit/epsilon_star`` (parametric), ``audit/epsilon_star_empirical`` and
            ``audit/mia_epsilon_lower`` (the same losses as a threshold attack, score = −loss: a lower
            bound with confidence ``1 − mia_alpha`` on the ε of any DP guarantee).
        details: the :class:`~lightning_privacy.analysis.epsilon_star.EpsilonStarDetails` by method
            (a method whose fit failed is missing, see ``notes``).
        mia: the threshold attack's bound, interval, threshold and confusion counts.
        notes: what could not be computed, and why.
        warnings: why the values may carry little or no information: Normal fits that their KS test
            rejects at :data:`KS_LEVEL` (then ε* is flagged, see :attr:`fits_rejected`; use the
            empirical value), sets too small to check the fits, and losses that look reversed (members'
            higher than non-members' at the one-sided Mann-Whitney level
            :data:`~lightning_privacy.analysis.estimation.REVERSED_LEVEL`).
    """

    member_losses: np.ndarray
    nonmember_losses: np.ndarray
    delta: float
    values: Dict[str, float]
    details: Dict[str, EpsilonStarDetails]
    mia: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    warnings: Tuple[str, ...] = ()

    @property
    def epsilon_star(self) -> float:
        """The parametric Epsilon* (``audit/epsilon_star``)."""
        return self.values[names.EPSILON_STAR]

    @property
    def fits_rejected(self) -> bool:
        """The flag: a KS test rejects a Normal fit at :data:`KS_LEVEL`, so the parametric ε* is not reliable."""
        return fits_rejected(self.details)

    def metrics(self) -> Dict[str, float]:
        """``{audit/epsilon_star, audit/epsilon_star_empirical, audit/mia_epsilon_lower: float}``."""
        return dict(self.values)

    def summary(self) -> str:
        """The Markdown table (what :class:`~lightning_privacy.EpsilonStarAudit` writes and prints)."""
        return summary_text(self.values, self.details, self.warnings)

    def report_section(self, trainer: Any = None) -> ReportSection:
        """The report's section: the values, the warnings first, the figure (:mod:`lightning_privacy.reporting`)."""
        rows = report_rows(self.metrics(), self.fits_rejected)
        return ReportSection(
            REPORT_TITLE, rows, figures=[(self.figure, FIGURE_CAPTION)], warnings=result_warnings(self)
        )

    def figure(self):
        """The transformed losses of both sets with their Normal fits (a ``matplotlib.figure.Figure``).

        Raises:
            ValueError: when the parametric fit failed (see ``notes``).
        """
        parametric = self.details.get("parametric")
        if parametric is None:
            raise ValueError(f"no parametric fit to draw: {'; '.join(self.notes) or 'not computed'}")
        return transformed_fit_figure(parametric, self.member_losses, self.nonmember_losses)

    def to_dict(self) -> Dict[str, Any]:
        """The values, δ, the sample sizes, each method's details, the attack's bound and the notes."""
        out: Dict[str, Any] = dict(self.values)
        out.update(
            {
                "delta": self.delta,
                "num_members": int(self.member_losses.size),
                "num_nonmembers": int(self.nonmember_losses.size),
            }
        )
        for method, _ in METHOD_KEYS:
            if method in self.details:
                out[method] = dataclasses.asdict(self.details[method])
        if self.mia:
            out["mia"] = dict(self.mia)
        out["notes"] = list(self.notes)
        out["fits_rejected"] = self.fits_rejected
        out["warnings"] = list(self.warnings)
        return jsonable(out)


def beyond_accountant_warning(
    values: Mapping[str, float], details: Mapping[str, EpsilonStarDetails], *, epsilon: float, delta: float
) -> Optional[str]:
    """The warning for Epsilon* values above the accountant's ε at the same δ (``None`` when none is).

    The accountant's ε is an upper bound on every attack; Epsilon* is an estimate from one sample of losses (the
    empirical one from the few examples beyond its threshold), so exceeding ε says the estimate is noisy, not that
    the guarantee is broken — only a lower bound above ε (e.g. ``audit/mia_epsilon_lower``) would say that.
    """
    over = [
        (key, values[key]) for key in (names.EPSILON_STAR, names.EPSILON_STAR_EMPIRICAL) if values.get(key, 0) > epsilon
    ]
    if not over:
        return None
    rests = ""
    empirical = details.get("empirical")
    if empirical is not None and empirical.fnr is not None and empirical.fpr is not None:
        m, n = empirical.num_members, empirical.num_nonmembers
        members = min(round((1 - empirical.fnr) * m), round(empirical.fnr * m))
        nonmembers = min(round(empirical.fpr * n), round((1 - empirical.fpr) * n))
        rests = (
            f"; the empirical value rests on {members} of {m:,} members and {nonmembers} of {n:,} non-members on the "
            "rare side of its threshold"
        )
    lower = values.get(names.MIA_EPSILON_LOWER)
    bound = f" ({names.MIA_EPSILON_LOWER} = {lower:.3g})" if lower is not None else ""
    shown = ", ".join(f"{key} = {value:.3g}" for key, value in over)
    return (
        f"{shown} exceeds the accountant's certified ε = {epsilon:.3g} at δ = {delta:.3g}: Epsilon* is an estimate, "
        f"not a lower bound{rests}, so this does not show that the guarantee is broken; only a lower bound above ε "
        f"would{bound}"
    )


def _losses(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def audit_epsilon_star_from_losses(
    member_losses: Any,
    nonmember_losses: Any,
    *,
    delta: Optional[float] = None,
    mia_alpha: float = 0.05,
    warn: bool = True,
    ledger: Any = None,
) -> EpsilonStarResult:
    """Epsilon* (parametric and empirical) and the threshold attack's ε lower bound from losses.

    Args:
        member_losses: per-example losses of training examples (array or tensor; low = member-like,
            e.g. :func:`~lightning_privacy.functional.membership_loss.membership_loss`).
        nonmember_losses: the same for examples never trained on.
        delta: δ of Epsilon*, in ``(0, 0.5)``; ``None`` = ``1 / (n ln n)``, ``n`` = number of members
            (also the δ of the attack's bound).
        mia_alpha: significance of the attack's bound, in ``(0, 1)``.
        warn: issue a ``UserWarning`` for each method whose fit failed (it is also in ``notes``) and for each
            of the result's ``warnings``.
        ledger: the run's :class:`~lightning_privacy.ledger.PrivacyLedger` (e.g. ``dpsgd.ledger``): when an
            Epsilon* value exceeds its accountant's ε at the same δ, a warning says what that means — Epsilon* is an
            estimate, not a lower bound, and how many members its empirical threshold rests on.

    Returns:
        An :class:`EpsilonStarResult`.

    Raises:
        ValueError: for an empty set, non-finite losses, or ``delta`` / ``mia_alpha`` out of range.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> result = audit_epsilon_star_from_losses(rng.gamma(2, 5, 2000), rng.gamma(3, 5, 2000), delta=1e-4)
        >>> round(result.metrics()["audit/epsilon_star"], 2), round(result.metrics()["audit/mia_epsilon_lower"], 2)
        (4.12, 1.43)
        >>> result.fits_rejected, result.warnings[0].split(";")[0]  # Gamma losses: Normal fits of φ are poor
        (True, 'the Normal fits of Epsilon* are rejected (KS p = 0.0014 members / 0.00086 non-members < 0.01)')
        >>> print(result.summary().splitlines()[6])
        | `audit/epsilon_star` | 4.1219 (Normal fits rejected: not reliable) |
    """
    members, nonmembers = _losses(member_losses), _losses(nonmember_losses)
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError(f"Epsilon* needs member and non-member examples, got {members.size} and {nonmembers.size}")
    delta = default_delta(int(members.size)) if delta is None else _check_delta(delta)
    if isinstance(mia_alpha, bool) or not isinstance(mia_alpha, (int, float)) or not 0.0 < mia_alpha < 1.0:
        raise ValueError(f"`mia_alpha` must be in (0, 1), got {mia_alpha!r}")
    values: Dict[str, float] = {}
    details: Dict[str, EpsilonStarDetails] = {}
    notes: List[str] = []
    for method, key in METHOD_KEYS:
        try:
            details[method] = epsilon_star_details(members, nonmembers, delta=delta, method=method)
        except ValueError as err:  # e.g. a constant model: no Normal can be fitted
            notes.append(f"{key} not computed: {err}")
            if warn:
                warnings.warn(f"audit_epsilon_star: {notes[-1]}", UserWarning, stacklevel=2)
            continue
        values[key] = details[method].epsilon_star

    from lightning_privacy.analysis.estimation import epsilon_lower_bound, score_orientation

    scores = -np.concatenate([members, nonmembers])  # higher = more likely a member
    is_member = np.concatenate([np.ones(members.size, dtype=bool), np.zeros(nonmembers.size, dtype=bool)])
    mia = epsilon_lower_bound(
        scores, is_member, delta=delta, alpha=mia_alpha, method="bayes", selection="holdout", sided="two", seed=0
    ).as_dict()
    values[names.MIA_EPSILON_LOWER] = float(mia["epsilon_lower"])
    found = fit_warnings(details)
    separated = separated_warning(details, members, nonmembers, values[names.MIA_EPSILON_LOWER])
    if separated is not None:
        found.append(separated)
    orientation = score_orientation(scores, is_member)
    if orientation.reversed:
        found.append(
            f"members have higher losses than non-members (AUC of -loss = {orientation.auc:.3f} < 0.5, one-sided "
            f"test p = {orientation.pvalue:.2g} < {orientation.level:g}): the member and non-member sets look "
            f"swapped, or the values are not losses (low must mean member-like); `{names.MIA_EPSILON_LOWER}` = 0 "
            "then says nothing"
        )
    if ledger is not None and ledger.steps:
        beyond = beyond_accountant_warning(values, details, epsilon=ledger.epsilon(delta), delta=delta)
        if beyond is not None:
            found.append(beyond)
    if warn:
        for message in found:
            warnings.warn(f"audit_epsilon_star: {message}", UserWarning, stacklevel=2)
    return EpsilonStarResult(members, nonmembers, delta, values, details, mia=mia, notes=notes, warnings=tuple(found))


def audit_epsilon_star(
    model: Any,
    members: Iterable,
    nonmembers: Iterable,
    *,
    delta: Optional[float] = None,
    forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
    mia_alpha: float = 0.05,
    device: Any = None,
    warn: bool = True,
    ledger: Any = None,
    signal_fn: Optional[Callable[[Any, Any], Any]] = None,
    user_ids: Optional[Tuple[Sequence[Any], Sequence[Any]]] = None,
) -> EpsilonStarResult:
    """Epsilon* of ``model``: its membership losses on ``members`` (training data) and ``nonmembers``.

    Each loader is read once in dataset order (a ``DataLoader`` over a map-style dataset is rebuilt
    without shuffling or Poisson sampling, so a training loader can be passed as it is); the model runs
    in eval mode without gradients (its mode is restored). Then
    :func:`audit_epsilon_star_from_losses`.

    Args:
        model: a ``torch.nn.Module`` (e.g. a trained ``LightningModule``) returning logits.
        members: batches of training examples, e.g. ``datamodule.member_dataloader()``.
        nonmembers: batches of examples never trained on, e.g. ``datamodule.val_dataloader()``.
        delta: δ of Epsilon*, in ``(0, 0.5)``; ``None`` = ``1 / (n ln n)``, ``n`` = number of members.
        forward_fn: ``forward_fn(model, batch) -> (logits, target)``; default ``model(batch[0]), batch[1]``.
        mia_alpha: significance of the threshold attack's ε lower bound.
        device: where to run the model (default: where its parameters are).
        warn: see :func:`audit_epsilon_star_from_losses`.
        ledger: the run's privacy ledger, see :func:`audit_epsilon_star_from_losses`.
        signal_fn: ``signal_fn(model, batch) -> losses`` (one per example, low = member-like) instead of
            ``forward_fn``, e.g. :data:`~lightning_privacy.functional.sequence_loss.causal_lm_signal` for a causal
            language model's sequences (each one's mean next-token loss).
        user_ids: ``(member ids, non-member ids)``, the person of each row of the two loaders: Epsilon* of *people*
            (user-level DP), each person's loss the mean of their rows' (a person's rows all members or all not;
            :func:`~lightning_privacy.audits.membership.per_person_scores`).

    Returns:
        An :class:`EpsilonStarResult`: ``.metrics()``, ``.summary()``, ``.figure()``, ``.to_dict()``.

    Raises:
        ValueError: batches that are mappings (a language model's ``{"input_ids": ..., "attention_mask": ...}``)
            without ``signal_fn`` or ``forward_fn``, naming ``signal_fn=causal_lm_signal``.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> gen = torch.Generator().manual_seed(0)
        >>> x, y = torch.randn(600, 4, generator=gen), torch.randint(0, 2, (600,), generator=gen)
        >>> model = torch.nn.Linear(4, 2)
        >>> members = DataLoader(TensorDataset(x[:400], y[:400]), batch_size=100)
        >>> nonmembers = DataLoader(TensorDataset(x[400:], y[400:]), batch_size=100)
        >>> result = audit_epsilon_star(model, members, nonmembers)
        >>> sorted(result.metrics())
        ['audit/epsilon_star', 'audit/epsilon_star_empirical', 'audit/mia_epsilon_lower']
        >>> result.to_dict()["num_members"], type(result.figure()).__name__
        (400, 'Figure')
    """
    from lightning_privacy.functional.membership_loss import membership_losses_from_loader

    member_losses = membership_losses_from_loader(
        model, sequential_loader(members), forward_fn=forward_fn, device=device, signal_fn=signal_fn
    )
    nonmember_losses = membership_losses_from_loader(
        model, sequential_loader(nonmembers), forward_fn=forward_fn, device=device, signal_fn=signal_fn
    )
    member_losses, nonmember_losses = member_losses.double().numpy(), nonmember_losses.double().numpy()
    if user_ids is not None:  # one loss per person: the mean of their rows' (members first)
        from lightning_privacy.audits.membership import per_person_scores

        is_member = np.r_[np.ones(member_losses.size, bool), np.zeros(nonmember_losses.size, bool)]
        sizes = (member_losses.size, nonmember_losses.size)
        losses, is_member = per_person_scores(np.r_[member_losses, nonmember_losses], is_member, user_ids, sizes)
        member_losses, nonmember_losses = losses[is_member], losses[~is_member]
    return audit_epsilon_star_from_losses(
        member_losses, nonmember_losses, delta=delta, mia_alpha=mia_alpha, warn=warn, ledger=ledger
    )

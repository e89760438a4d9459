"""Data-resolved privacy profile (LeBlond et al., 2023) of a trained logistic-regression head.

:func:`audit_privacy_profile` takes the model and its training rows and returns a
:class:`PrivacyProfileResult`: which rows the head exposes most, and which ε is worth trying. The math
is :mod:`lightning_privacy.analysis.privacy_profile`, the torch helpers
:mod:`lightning_privacy.functional.privacy_profile`; :class:`~lightning_privacy.PrivacyProfileAudit`
calls this function.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lightning_privacy import names
from lightning_privacy.analysis import privacy_profile as pp
from lightning_privacy.audits._common import (
    AuditResult,
    jsonable,
    progress_stages,
    sequential_loader,
    warnings_markdown,
)
from lightning_privacy.reporting import ReportSection, ReportTable, result_warnings

__all__ = ["PrivacyProfileResult", "audit_privacy_profile", "transition_figure"]

STAGES = ("head inputs", "neighbours", "transition analysis", "typical profiles")


def transition_figure(transition: pp.TransitionAnalysis, profiles: Sequence[pp.TypicalProfile], epsilon=None):
    """Paper Figs. 5-6: the typical profile ``mean|l|/β`` by rank for several ε, and per rank across ε.

    Returns a :class:`matplotlib.figure.Figure` (no pyplot: the user's backend is left alone).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="tight")
    left, right = fig.subplots(1, 2)
    for profile in profiles:
        ranks = np.linspace(0, 1, profile.losses.size)
        left.plot(ranks, profile.losses / profile.beta, label=f"ε = {profile.epsilon:.3g}")
    left.set(xlabel="rank (fraction of rows, most exposed right)", ylabel="mean |l| / β", yscale="log")
    left.set_title("Typical privacy profile")
    left.legend(fontsize=8)
    for q, curve, lo, hi in zip(
        transition.quantiles, transition.curves, transition.low_plateau, transition.high_plateau
    ):
        (line,) = right.plot(transition.epsilons, curve, label=f"rank quantile {q:g}")
        right.hlines([lo, hi], transition.epsilons[0], transition.epsilons[-1], colors=line.get_color(), linestyles=":")
    right.axvspan(transition.epsilon_low, transition.epsilon_high, alpha=0.15, label="ε range worth trying")
    if epsilon is not None:
        right.axvline(epsilon, color="black", linestyle="--", label=f"this model, ε = {epsilon:g}")
    right.set(xlabel="ε", ylabel="mean |l| / β", xscale="log", yscale="log")
    right.set_title("Low plateau → transition → high plateau")
    right.legend(fontsize=8)
    return fig


def top_rows_text(top_rows: List[dict], transition: pp.TransitionAnalysis, epsilon: Optional[float]) -> str:
    """The Markdown table of the most exposed rows and the recommended ε range."""
    unit = "|l(x, y_i, M)|" if epsilon is not None else "|l(x, y_i, M)|/β (no ε given)"
    columns = [k for k in top_rows[0] if k not in ("row", "loss")] if top_rows else []
    lines = ["| rank | row | loss | " + " | ".join(columns) + " |", "|---" * (3 + len(columns)) + "|"]
    for r, row in enumerate(top_rows, 1):
        cells = " | ".join(f"{row[c]:.4g}" for c in columns)
        lines.append(f"| {r} | {row['row']} | {row['loss']:.4g} | {cells} |")
    return (
        f"Most exposed training rows (loss = {unit}):\n\n"
        + "\n".join(lines)
        + f"\n\nRecommended ε range: [{transition.epsilon_low:.3g}, {transition.epsilon_high:.3g}]"
    )


REPORT_TITLE = "Privacy profile audit"
FIGURE_CAPTION = (
    "Privacy profile: the typical profile of row losses by rank for several ε, and per rank across ε with the ε "
    "range worth trying."
)


def report_rows(values: Mapping[str, float]) -> List[tuple]:
    """The report's rows for a profile's ``metrics()``; "not run" for none."""
    if not values:
        return [("privacy profile", "—", "not run (or not on this rank)")]
    return [
        (
            "largest row loss",
            f"{values[names.PROFILE_MAX_LOSS]:.4g}",
            "|l| of the most exposed training row (|l|/β without ε)",
        ),
        (
            "recommended ε range",
            f"[{values[names.PROFILE_EPSILON_LOW]:.3g}, {values[names.PROFILE_EPSILON_HIGH]:.3g}]",
            "below: no privacy gain; above: no more loss",
        ),
        ("gradient norm ‖∇J‖", f"{values[names.PROFILE_GRADIENT_NORM]:.3g}", "0 at the optimum the analysis assumes"),
        (
            "approximation bound",
            f"{values[names.PROFILE_APPROXIMATION_BOUND]:.3g}",
            "bound on the relative error of the worst-case neighbours",
        ),
    ]


def top_rows_table(result: PrivacyProfileResult) -> List[ReportTable]:
    """The most exposed rows as a report table (none when there are none)."""
    top = result.top_rows
    if not top:
        return []
    columns = [k for k in top[0] if k not in ("row", "loss")]
    unit = "|l(x, y_i, M)|" if result.epsilon is not None else "|l(x, y_i, M)|/β (no ε given)"
    cells = [
        [str(rank), str(row["row"]), f"{row['loss']:.4g}", *(f"{row[c]:.4g}" for c in columns)]
        for rank, row in enumerate(top, 1)
    ]
    caption = f"Most exposed training rows (loss = {unit}), most exposed first"
    return [ReportTable(caption, ["rank", "row", "loss", *columns], cells)]


@dataclass
class PrivacyProfileResult(AuditResult):
    """One privacy-profile audit.

    Attributes:
        profile: the :class:`~lightning_privacy.analysis.privacy_profile.PrivacyProfile` (losses ranked).
        transition: the :class:`~lightning_privacy.analysis.privacy_profile.TransitionAnalysis` over ε.
        typical_profiles: typical profiles at five ε across the range (for the figure).
        gradient_norm: ``‖∇J(A(x))‖`` (0 at the optimum the analysis assumes).
        approximation_bound: bound on the relative error of the worst-case neighbours.
        top_rows: the most exposed rows, ``{"row", "loss", <feature>: value}``, most exposed first.
        epsilon: the ε the losses are expressed in (``None``: losses are ``|l|/β``).
        regularization: ``Λ``.
        notes: caveats found on the way (not at the optimum, rows outside the unit ball).

    ``warnings`` (every audit result has them) are the ``notes``: a head that is not at the optimum of its
    objective (the gradient criterion of :func:`audit_privacy_profile`) gives a profile that may be wrong.
    """

    profile: pp.PrivacyProfile
    transition: pp.TransitionAnalysis
    typical_profiles: List[pp.TypicalProfile]
    gradient_norm: float
    approximation_bound: float
    top_rows: List[dict]
    epsilon: Optional[float]
    regularization: float
    notes: List[str] = field(default_factory=list)

    def metrics(self) -> Dict[str, float]:
        """The largest loss, the recommended ε range, the gradient norm and the approximation bound."""
        return {
            names.PROFILE_MAX_LOSS: float(self.profile.losses[-1]),
            names.PROFILE_EPSILON_LOW: float(self.transition.epsilon_low),
            names.PROFILE_EPSILON_HIGH: float(self.transition.epsilon_high),
            names.PROFILE_GRADIENT_NORM: float(self.gradient_norm),
            names.PROFILE_APPROXIMATION_BOUND: float(self.approximation_bound),
        }

    @property
    def warnings(self) -> Tuple[str, ...]:
        """The ``notes``, as every audit result's ``warnings``."""
        return tuple(self.notes)

    def summary(self) -> str:
        """The warnings (if any), then the Markdown table of the most exposed rows and the recommended ε range."""
        block = warnings_markdown(self.warnings)
        return (block + "\n\n" if block else "") + top_rows_text(self.top_rows, self.transition, self.epsilon)

    def figure(self):
        """The typical profile across ranks and ε, with the recommended range."""
        return transition_figure(self.transition, self.typical_profiles, self.epsilon)

    def report_section(self, trainer: Any = None) -> ReportSection:
        """The report's section: the metrics, the most exposed rows, the warnings first, the figure."""
        return ReportSection(
            REPORT_TITLE,
            report_rows(self.metrics()),
            extras=top_rows_table(self),
            figures=[(self.figure, FIGURE_CAPTION)],
            warnings=result_warnings(self),
        )

    def to_dict(self) -> Dict[str, Any]:
        """The metrics, ε, Λ, the recommended range, the top rows and the notes."""
        return jsonable(
            {
                **self.metrics(),
                "epsilon": self.epsilon,
                "regularization": self.regularization,
                "num_rows": int(self.profile.losses.size),
                "recommended_range": list(self.transition.recommended_range),
                "top_rows": self.top_rows,
                "notes": self.notes,
                "warnings": list(self.warnings),
            }
        )


def model_regularization(model: Any, regularization: Optional[float]) -> float:
    """``Λ``: the argument if given, else the model's ``regularization`` attribute.

    Raises:
        ValueError: when neither is there.
    """
    if regularization is not None:
        return float(regularization)
    value = getattr(model, "regularization", None)
    if value is None:
        raise ValueError(f"{type(model).__name__} has no `regularization` attribute: pass `regularization` (Λ)")
    return float(value)


def audit_privacy_profile(
    model: Any,
    rows: Iterable,
    *,
    regularization: Optional[float] = None,
    epsilon: Optional[float] = None,
    base_weights: Any = None,
    layer: Any = None,
    top_k: int = 10,
    feature_names: Optional[Sequence[str]] = None,
    row_features: Optional[np.ndarray] = None,
    epsilons: Optional[Sequence[float]] = None,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99, 1.0),
    num_samples: int = 128,
    convergence_tolerance: float = 1e-2,
    seed: int = 0,
    progress: Optional[bool] = None,
    warn: bool = True,
) -> PrivacyProfileResult:
    """Which training rows the trained logistic-regression head exposes, and which ε is worth trying.

    From the trained head ``A(x)`` (``base_weights`` if the head holds a noised release ``M``) the audit
    gathers the head's inputs for every row (in dataset order), the per-row logistic gradients, the
    worst-case neighbours ``A_wc(y_i)``, the losses ``|l(x, y_i, M)|`` and the transition analysis
    over ε. It notes (and warns) when the head is not at the optimum of the regularised objective (the
    sphere bound assumes it) and when a row has norm > 1 (then ``β = nΛε/2`` is not the calibrated rate).

    Args:
        model: the trained model.
        rows: its training rows as ``(x, y)`` batches (a ``DataLoader`` is read once in dataset order).
        regularization: ``Λ`` (default: ``model.regularization``).
        epsilon: ε to express losses in; ``None``: losses are ``|l|/β`` (the ranking does not depend on ε).
        base_weights: ``A(x)`` when the head's weights are a noised release ``M``.
        layer: the head (see :func:`~lightning_privacy.functional.privacy_profile.resolve_linear_head`).
        top_k: rows in the exposure table.
        feature_names: column names for the table.
        row_features: ``(n, k)`` values to show in the table instead of the head inputs.
        epsilons, quantiles, num_samples, seed: see
            :func:`~lightning_privacy.analysis.privacy_profile.transition_analysis`.
        convergence_tolerance: the optimum check's tolerance, relative to the median neighbour shift.
        progress: a progress bar over the stages on stderr; ``None`` = only when stderr is a terminal.
        warn: issue a ``UserWarning`` for each note.

    Returns:
        A :class:`PrivacyProfileResult`: ``.metrics()``, ``.summary()``, ``.figure()``, ``.to_dict()``.

    Raises:
        ValueError: for an unsupported head, no ``Λ`` or no rows.

    Example::

        >>> import torch
        >>> from lightning_privacy.models import LogisticRegressionModule
        >>> x = torch.tensor([[0.6, 0.0], [0.0, 0.5], [-0.4, 0.3], [0.2, -0.7]], dtype=torch.float64)
        >>> model = LogisticRegressionModule(2)  # Λ = model.regularization
        >>> result = audit_privacy_profile(model, [(x, torch.tensor([1, 0, 0, 1]))], top_k=2, warn=False)
        >>> [row["row"] for row in result.top_rows], sorted(result.metrics())[0]
        ([3, 0], 'audit/profile_approximation_bound')
    """
    from lightning_privacy.functional.privacy_profile import (
        linear_head_inputs,
        logistic_per_example_gradients,
        resolve_linear_head,
    )

    notes: List[str] = []
    with progress_stages("privacy profile", STAGES, enabled=progress) as advance:
        advance(STAGES[0])
        head = resolve_linear_head(model, layer)
        lam = model_regularization(model, regularization)
        features, labels = linear_head_inputs(model, head, sequential_loader(rows))
        released = head.weight.detach()[0].cpu().double()
        base = released if base_weights is None else released.new_tensor(np.asarray(base_weights))
        gradients = logistic_per_example_gradients(base, features, labels).numpy()
        x, a, m = features.numpy(), base.numpy(), released.numpy()
        n = x.shape[0]

        advance(STAGES[1])
        gradient_norm = float(np.linalg.norm(gradients.mean(axis=0) + lam * a))
        neighbours = pp.worst_case_neighbours(a, gradients, regularization=lam)
        shift = float(np.median(np.linalg.norm(neighbours - a, axis=1)))
        if gradient_norm / lam > convergence_tolerance * shift:
            notes.append(
                f"the model is not at the optimum of the regularised objective: ‖∇J‖ = {gradient_norm:.3g}, so "
                f"‖A − A(x)‖ may reach {gradient_norm / lam:.3g}, more than {convergence_tolerance:g} × the median "
                f"neighbour shift {shift:.3g}. The sphere bound assumes the exact minimiser: train to convergence "
                "(full-batch L-BFGS) before trusting the profile."
            )
        norm = float(np.linalg.norm(x, axis=1).max())
        if norm > 1.0 + 1e-9:
            notes.append(
                f"a row has norm {norm:.3g} > 1, so β = nΛε/2 is not the calibrated noise rate (scale rows into "
                "the unit ball); the ranking is still valid."
            )
        approximation_bound = pp.worst_case_relative_error_bound(x, regularization=lam)
        beta = 1.0 if epsilon is None else pp.noise_scale(epsilon=epsilon, dataset_size=n, regularization=lam)
        profile = pp.privacy_profile(a, neighbours, m, beta=beta)

        advance(STAGES[2])
        transition = pp.transition_analysis(
            a,
            neighbours,
            dataset_size=n,
            regularization=lam,
            epsilons=epsilons,
            quantiles=tuple(quantiles),
            num_samples=num_samples,
            seed=seed,
        )

        advance(STAGES[3])
        shown = np.geomspace(transition.epsilons[0], transition.epsilons[-1], 5)
        typical_profiles = [
            pp.typical_profile(
                a,
                neighbours,
                epsilon=e,
                dataset_size=n,
                regularization=lam,
                num_samples=min(num_samples, 64),
                seed=seed,
            )
            for e in shown
        ]
    values = x if row_features is None else np.asarray(row_features)
    columns = feature_names or [f"x{j}" for j in range(values.shape[1])]
    index, losses = profile.most_exposed(min(top_k, n))
    top_rows = [
        {"row": int(i), "loss": float(loss), **{c: float(v) for c, v in zip(columns, values[i])}}
        for i, loss in zip(index, losses)
    ]
    if warn:
        for note in notes:
            warnings.warn(f"audit_privacy_profile: {note}", UserWarning, stacklevel=2)
    return PrivacyProfileResult(
        profile=profile,
        transition=transition,
        typical_profiles=typical_profiles,
        gradient_norm=gradient_norm,
        approximation_bound=approximation_bound,
        top_rows=top_rows,
        epsilon=epsilon,
        regularization=lam,
        notes=notes,
    )

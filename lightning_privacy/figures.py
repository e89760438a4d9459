"""Matplotlib figures logged by the privacy callbacks.

Figures are ``matplotlib.figure.Figure`` objects: no pyplot state, and the user's backend is left alone.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lightning_privacy import names
from lightning_privacy.audits.membership import draw_region, log_roc_axes


def bayes_security_figure(
    epochs: List[Dict[str, Any]], final: Dict[str, float], *, ledger: Any = None, budget: Optional[float] = None
) -> Figure:
    """β* per epoch (safe and closed form, the budget as a line) and the TPR–FPR region any attack lies in.

    Args:
        epochs: the monitor's records ``{"epoch", "safe", "closed"}``.
        final: the fit-end values (``privacy/mia_bayes_security``).
        ledger: the run's ledger, for the trade-off curve (without it only Prop. 9's line is drawn).
        budget: a ``min_bayes_security`` budget to draw as a horizontal line.
    """
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    _per_epoch(
        left,
        epochs,
        safe="β* (exact, safe: pessimistic PLD)",
        closed="closed form (Cor. 7, approx.)",
        budget=budget,
        budget_name="β*",
        ylabel="β*_MIA",
    )
    left.set_title("Bayes security against membership inference")

    beta = final[names.MIA_BAYES_SECURITY]
    fpr = np.concatenate([[0.0], np.logspace(-4, 0, 200)])
    prop9 = np.minimum(1.0, 1.0 + fpr - beta)
    if ledger is not None:
        curve = np.minimum(np.asarray(ledger.tpr_bounds(fpr), dtype=float), prop9)
        right.fill_between(fpr, 0, curve, alpha=0.25, label="attainable (trade-off curve, exact)")
        right.plot(fpr, curve, color="C0")
    else:
        right.fill_between(fpr, 0, prop9, alpha=0.25, label="attainable (Prop. 9)")
    right.plot(fpr, prop9, color="C1", linestyle="--", label=f"Prop. 9: TPR ≤ FPR + 1 − β* (β* = {beta:.3f})")
    right.plot(fpr, fpr, color="grey", linestyle=":", label="random guess")
    right.set_xlabel("FPR")
    right.set_ylabel("TPR")
    right.set_title("Every membership attack's ROC lies in the shaded region")
    right.legend(loc="lower right", fontsize=8)
    right.grid(alpha=0.3)
    return fig


def membership_region_figure(ledger: Any, *, floor: float = 1e-5) -> Figure:
    """The TPR–FPR region DP-SGD's accountant allows every membership attack, on log–log axes.

    The same trade-off curve as the right panel of :func:`bayes_security_figure` (``ledger.tpr_bounds``), drawn
    where attacks are judged today (low FPR, Carlini et al. 2022): a linear plot squeezes FPR ≤ 1% into a few
    pixels. The bounds at FPR 0.001, 0.01 and 0.1 are marked. The curve is for the ledger's own relation (the game of
    its β*), named in the legend and title; the in/out game of RMIA, LiRA and canaries is add/remove
    (``ledger.tpr_bounds(fpr, relation="add_remove")``, drawn by the membership audit's figure).

    Args:
        ledger: the run's :class:`~lightning_privacy.ledger.PrivacyLedger` (with at least one step).
        floor: the smallest FPR and TPR drawn.
    """
    fpr = np.logspace(np.log10(floor), 0, 200)
    fig = Figure(figsize=(6.2, 5.2), layout="constrained")
    ax = fig.subplots()
    draw_region(ax, fpr, ledger.tpr_bounds(fpr), floor=floor, relation=ledger.relation)
    log_roc_axes(ax, floor=floor)
    marks = np.array([0.001, 0.01, 0.1])
    bounds = np.asarray(ledger.tpr_bounds(marks), dtype=float)
    ax.plot(marks, np.maximum(bounds, floor), "o", color="C2", ms=4)
    for x, y in zip(marks, bounds):  # upper bounds, labelled rounded up (never below the bound)
        scale = 10.0 ** (np.floor(np.log10(y)) - 2) if y > 0 else 1.0
        label = f"{np.ceil(y / scale) * scale:.3g}"
        ax.annotate(label, (x, max(y, floor)), textcoords="offset points", xytext=(-6, 6), ha="right", fontsize=8)
    game = "replace" if ledger.relation == "replace" else "add/remove"
    ax.set_title(f"Membership attacks allowed by DP-SGD after {ledger.steps} steps ({game}, log–log)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def attribute_inference_figure(
    epochs: List[Dict[str, Any]], *, attribute: str = "", budget: Optional[float] = None
) -> Figure:
    """β*_AI after each epoch: the safe value (pessimistic PLD) and the approximate closed form (Cor. 10).

    Args:
        epochs: the monitor's records ``{"epoch", "steps", "safe", "closed"}``.
        attribute: the attribute's name, for the title.
        budget: a ``min_bayes_security`` budget of ``PrivacyBudgetStopping(threat="ai")``, drawn as a line.
    """
    fig = Figure(figsize=(6.8, 4.2), layout="constrained")
    ax = fig.subplots()
    _per_epoch(
        ax,
        epochs,
        safe="β*_AI (safe: pessimistic PLD over the measured R_t)",
        closed="closed form (Cor. 10, approx.)",
        budget=budget,
        budget_name="β*_AI",
        ylabel="β*_AI",
    )
    what = f" (attribute {attribute!r})" if attribute else ""
    ax.set_title(f"Bayes security against attribute inference{what}", fontsize=10)
    return fig


def _per_epoch(
    ax: Any,
    epochs: List[Dict[str, Any]],
    *,
    safe: str,
    closed: str,
    budget: Optional[float],
    budget_name: str,
    ylabel: str,
) -> None:
    """β* after each epoch: the safe value and the closed form (records ``{"epoch", "safe", "closed"}``), a budget."""
    xs = [e["epoch"] + 1 for e in epochs]  # epochs completed
    ax.plot(xs, [e["safe"] for e in epochs], marker="o", label=safe)
    ax.plot(xs, [e["closed"] for e in epochs], marker="x", ls="--", label=closed)
    if budget is not None:
        ax.axhline(budget, color="C3", ls=":", label=f"budget {budget_name} ≥ {budget:g}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epochs completed")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

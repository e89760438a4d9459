"""Matplotlib figures logged by the privacy callbacks.

Figures are ``matplotlib.figure.Figure`` objects: no pyplot state, and the user's backend is left alone.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lightning_privacy import names


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
    xs = [e["epoch"] + 1 for e in epochs]  # epochs completed
    left.plot(xs, [e["safe"] for e in epochs], marker="o", label="β* (exact, safe: pessimistic PLD)")
    left.plot(xs, [e["closed"] for e in epochs], marker="x", linestyle="--", label="closed form (Cor. 7, approx.)")
    if budget is not None:
        left.axhline(budget, color="C3", linestyle=":", label=f"budget β* ≥ {budget:g}")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("epochs completed")
    left.set_ylabel("β*_MIA")
    left.set_title("Bayes security against membership inference")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)

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

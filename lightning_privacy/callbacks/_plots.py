"""Matplotlib figures logged by the privacy callbacks.

Figures are ``matplotlib.figure.Figure`` objects: no pyplot state, and the user's backend is left alone.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
from matplotlib.figure import Figure

from lightning_privacy import names


def bayes_security_figure(epochs: List[Dict[str, Any]], final: Dict[str, float]):
    """β* per epoch (closed form vs exact) and the TPR–FPR region the final β* allows."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    xs = [e["epoch"] for e in epochs]
    left.plot(xs, [e["closed"] for e in epochs], marker="o", label="closed form (Cor. 7)")
    exact = [(e["epoch"], e["exact"]) for e in epochs if e.get("exact") is not None]
    if exact:
        left.plot(*zip(*exact), marker="x", linestyle="--", label="exact (PLD, δ at ε=0)")
    left.set_xlabel("epoch")
    left.set_ylabel("β*_MIA")
    left.set_title("Bayes security against membership inference")
    left.legend()
    left.grid(alpha=0.3)

    beta = final[names.MIA_BAYES_SECURITY]
    fpr = np.linspace(0, 1, 201)
    bound = np.minimum(1.0, 1.0 + fpr - beta)
    right.fill_between(fpr, 0, bound, alpha=0.25, label=f"attainable (β* = {beta:.3f})")
    right.plot(fpr, bound, label="TPR ≤ 1 + FPR − β* (Prop. 9)")
    right.plot(fpr, fpr, color="grey", linestyle=":", label="random guess")
    right.set_xlabel("FPR")
    right.set_ylabel("TPR")
    right.set_title("Any membership attack's ROC lies in the shaded region")
    right.legend(loc="lower right")
    right.grid(alpha=0.3)
    return fig

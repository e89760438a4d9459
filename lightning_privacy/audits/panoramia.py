"""PANORAMIA (Kazmi et al., NeurIPS 2024) of a trained model: members against generated non-members.

:func:`audit_panoramia` takes the model and the member rows the auditor holds (a table, ``(x, y)``
arrays, or a loader of ``(x, y)`` batches) and returns a :class:`PanoramiaAuditResult`. The pipeline
is :func:`lightning_privacy.functional.panoramia.panoramia_audit`, the bounds
:mod:`lightning_privacy.analysis.panoramia`; :class:`~lightning_privacy.PanoramiaAudit` and
``lightning-privacy audit panoramia`` call this function.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from lightning_privacy import names
from lightning_privacy.audits._common import AuditResult, jsonable, progress_stages, sequential_loader
from lightning_privacy.functional.panoramia import PHASES, PanoramiaResult, panoramia_audit, summary_text
from lightning_privacy.generators import _data
from lightning_privacy.reporting import ReportSection, result_warnings

__all__ = [
    "SUPPORTED",
    "FloatRows",
    "PanoramiaAuditResult",
    "audit_panoramia",
    "member_arrays",
    "panoramia_figure",
    "unsupported_members",
]

SUPPORTED = (
    "tables (a datamodule with `train_table`/`to_dataset`, or a table with `encode=`), rows of float features "
    "(N, d) and float images (N, H, W) or (N, C, H, W) with H, W >= 2"
)
"""What PANORAMIA's default generators can make non-members of (anything else needs a ``generator``)."""


def _dtype_kind(x: Any) -> tuple:
    """``(numpy kind letter, dtype name)`` of an array or a torch tensor (without importing torch)."""
    if hasattr(x, "is_floating_point") and hasattr(x, "is_complex"):  # a torch tensor
        name = str(x.dtype).removeprefix("torch.")
        if x.is_floating_point():
            return "f", name
        return ("c" if x.is_complex() else "b" if name == "bool" else "i"), name
    dtype = np.asarray(x).dtype
    return dtype.kind, str(dtype)


def unsupported_members(x: Any, *, generator: Any = None) -> Optional[str]:
    """The one-line refusal for member inputs ``x`` (``(N, ...)``) that no default generator can imitate, else None.

    Checked before any work (:func:`member_arrays` on the first batch, :func:`audit_panoramia` on arrays).
    Without a ``generator`` the defaults make only :data:`SUPPORTED`, so these are refused:

    - integer or boolean inputs of shape ``(N,)`` or ``(N, L)``: token ids or codes (a model with an
      embedding needs ids, and a generator of valid sequences is a language model, not a table generator);
    - inputs of more than 4 dimensions, images with a side below 2 pixels, or a dtype that is not a number.

    With a ``generator`` the caller vouches for the data: nothing is refused here.

    Example::

        >>> unsupported_members(np.zeros((8, 16), dtype=np.int64)).split(":")[0]
        'PANORAMIA cannot generate non-members like these members'
        >>> unsupported_members(np.zeros((8, 3, 32, 32), dtype=np.float32)) is None
        True
        >>> unsupported_members(np.zeros((8, 16), dtype=np.int64), generator=object()) is None
        True
    """
    kind, dtype = _dtype_kind(x)
    shape = tuple(x.shape[1:])
    if generator is not None:
        return None
    if kind not in "iubf":
        what = f"x holds values of dtype {dtype}"
    elif kind in "iub" and len(shape) <= 1:
        what = f"x holds integers ({dtype}) of shape {shape} per example (token ids?)"
    elif len(shape) > 3:
        what = f"x has shape {shape} per example ({len(shape) + 1}-d inputs)"
    elif len(shape) >= 2 and min(shape[-2:]) < 2:
        what = f"x has shape {shape} per example (an image side below 2 pixels)"
    else:
        return None
    return (
        f"PANORAMIA cannot generate non-members like these members: {what}, and its default generators make only "
        f"{SUPPORTED}; pass a generator whose sample(n) returns (x, y) like yours: `--generator pkg.module:Class` "
        "on the command line, `generator=` in Python"
    )


def panoramia_figure(result: PanoramiaResult):
    """Left: precision–recall of baseline vs MIA. Right: ``c_lb`` / ``{c+eps}_lb`` over recall.

    Returns a :class:`matplotlib.figure.Figure` (no pyplot: the user's backend is left alone).
    """
    from matplotlib.figure import Figure
    from sklearn.metrics import precision_recall_curve

    b = result.bounds
    fig = Figure(figsize=(11, 4), layout="tight")
    left, right = fig.subplots(1, 2)
    mia_label = "MIA (x + target loss)" if result.mia_features == "target_loss" else "MIA (x + target & helper losses)"
    for scores, label, color in (
        (result.baseline_scores, "baseline b (x + helper loss)", "C0"),
        (result.mia_scores, mia_label, "C3"),
    ):
        precision, recall, _ = precision_recall_curve(result.labels, scores)
        left.plot(recall, precision, color=color, label=label)
    left.axhline(b.members / len(result.labels), color="grey", linestyle=":", label="share of members")
    left.set_xlabel("recall")
    left.set_ylabel("precision")
    left.set_title("Members vs generated rows in the audit game")
    left.legend(loc="lower left")
    left.grid(alpha=0.3)
    right.plot(b.baseline_recall, b.c_lb_curve, color="C0", label="c_lb (baseline)")
    right.plot(b.mia_recall, b.c_plus_epsilon_lb_curve, color="C3", label="{c+ε}_lb (MIA)")
    right.axhline(b.c_lb, color="C0", linestyle="--")
    right.axhline(b.c_plus_epsilon_lb, color="C3", linestyle="--")
    right.set_xscale("log")
    right.set_xlabel("recall (log scale)")
    right.set_ylabel("bound")
    right.set_title(f"ε̃ = {b.epsilon:.3f} (not an ε-DP lower bound)")
    right.legend(loc="upper right")
    right.grid(alpha=0.3)
    return fig


REPORT_TITLE = "PANORAMIA audit"
FIGURE_CAPTION = (
    "PANORAMIA: precision–recall of the baseline (generated vs real) and of the membership attack, and both lower "
    "bounds c_lb and {c+ε}_lb over recall."
)


def report_rows(values: Mapping[str, float]) -> List[tuple]:
    """The report's rows for PANORAMIA ``values`` (``metrics()``); "not run" for none."""
    if not values:
        return [("PANORAMIA", "—", "not run")]
    return [
        (
            "ε̃",
            f"{values[names.PANORAMIA_EPSILON]:.4g}",
            "NOT a lower bound on ε-DP: measured leakage beyond the generator's gap c_lb",
        ),
        (
            "c_lb",
            f"{values[names.PANORAMIA_C_LB]:.4g}",
            "how distinguishable generated rows are from real ones (lower bound)",
        ),
        (
            "{c+ε}_lb",
            f"{values[names.PANORAMIA_C_PLUS_EPSILON_LB]:.4g}",
            "the same for the membership attack on the model",
        ),
    ]


@dataclass
class PanoramiaAuditResult(PanoramiaResult, AuditResult):
    """A :class:`~lightning_privacy.functional.panoramia.PanoramiaResult` with the four audit views.

    ``epsilon`` (ε̃) is NOT a lower bound on ε-DP: it is the measured leakage beyond the generator's
    own gap ``c_lb`` (see :data:`~lightning_privacy.analysis.panoramia.MEANING`). ``warnings`` says when
    the result carries no information (``{c+ε}_lb = 0``: too few correct guesses at every recall level,
    :func:`~lightning_privacy.analysis.panoramia.information_warnings`); they lead :meth:`summary` and
    are in :meth:`to_dict`.
    """

    @classmethod
    def of(cls, result: PanoramiaResult) -> PanoramiaAuditResult:
        """The same result, with the audit views."""
        return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})

    def metrics(self) -> Dict[str, float]:
        """``{audit/panoramia_epsilon, audit/panoramia_c_lb, audit/panoramia_c_plus_epsilon_lb: float}``."""
        return {
            names.PANORAMIA_EPSILON: float(self.epsilon),
            names.PANORAMIA_C_LB: float(self.c_lb),
            names.PANORAMIA_C_PLUS_EPSILON_LB: float(self.c_plus_epsilon_lb),
        }

    def summary(self) -> str:
        """The Markdown report: the three numbers, what ε̃ means, the rows the baseline finds most obviously real."""
        return summary_text(self)

    def figure(self):
        """Precision–recall of baseline vs MIA, and both bounds over recall."""
        return panoramia_figure(self)

    def report_section(self, trainer: Any = None) -> ReportSection:
        """The report's section: the three numbers, the warnings first, the figure."""
        rows = report_rows(self.metrics())
        return ReportSection(
            REPORT_TITLE, rows, figures=[(self.figure, FIGURE_CAPTION)], warnings=result_warnings(self)
        )

    def to_dict(self) -> Dict[str, Any]:
        """The numbers, the level β, the sizes, the time per phase, the classifier settings and the meaning."""
        b = self.bounds
        return jsonable(
            {
                **self.metrics(),
                "epsilon": self.epsilon,
                "c_lb": self.c_lb,
                "c_plus_epsilon_lb": self.c_plus_epsilon_lb,
                "beta": b.beta,
                "num_thresholds": len(b.counts),
                "mia_features": self.mia_features,
                "sizes": self.sizes,
                "phase_seconds": self.seconds,
                "baseline_params": self.baseline_params,
                "mia_params": self.mia_params,
                "acceptance_rate": self.acceptance_rate,
                "meaning": self.meaning,
                "warnings": list(self.warnings),
            }
        )


@dataclass
class FloatRows:
    """Rows of float features as a table (numeric columns only), so the default tabular generator fits them.

    For datamodules whose batches are already float vectors: ``FloatRows.of(x, y)`` holds them, and
    :meth:`encode` turns rows back into the model's ``(x float32, y int64)`` tensors.

    Example::

        >>> rows = FloatRows.of(np.ones((3, 2)), np.array([0, 1, 1]))
        >>> rows.numeric.shape, rows.categorical.shape, [t.dtype for t in FloatRows.encode(rows)]
        ((3, 2), (3, 0), [torch.float32, torch.int64])
    """

    numeric: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray

    @classmethod
    def of(cls, x: Any, y: Any) -> FloatRows:
        x = np.asarray(x, dtype=np.float64)
        return cls(numeric=x.reshape(len(x), -1), categorical=np.empty((len(x), 0), dtype=str), labels=np.asarray(y))

    @staticmethod
    def encode(rows: FloatRows) -> tuple:
        import torch

        return (
            torch.as_tensor(np.asarray(rows.numeric), dtype=torch.float32),
            torch.as_tensor(np.asarray(rows.labels), dtype=torch.long),
        )


def member_arrays(batches: Any, *, generator: Any = None, allow_flat: bool = False) -> tuple:
    """``(x, y)`` numpy arrays from one pass over batches of ``(x, y)`` tensors (dataset order).

    Raises:
        ValueError: for batches that are not ``(x, y)`` pairs, no data, inputs no default generator can
            imitate without a ``generator`` (:func:`unsupported_members`, checked on the first batch,
            before the others are read), or flat features without a ``generator`` (the default
            generators make tables or images, not encoded feature vectors; ``allow_flat=True`` lets the
            caller treat them as :class:`FloatRows`).
    """
    xs, ys = [], []
    for batch in sequential_loader(batches):
        if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
            raise ValueError("PANORAMIA needs (x, y) batches, or member rows as a table or (x, y) arrays")
        if not xs:
            refusal = unsupported_members(batch[0], generator=generator)
            if refusal is not None:
                raise ValueError(refusal)
        xs.append(batch[0].detach().cpu().numpy())
        ys.append(batch[1].detach().cpu().numpy())
    if not xs:
        raise ValueError("PANORAMIA found no member data in the batches")
    x, y = np.concatenate(xs), np.concatenate(ys)
    if x.ndim < 3 and generator is None and not allow_flat:
        raise ValueError(
            f"cannot generate non-members for flat features of shape {x.shape[1:]}: pass `generator=` (and raw "
            "`members=` for tables), or use a datamodule with `train_table`/`to_dataset`"
        )
    return x, y


def _column_names(members: Any) -> Optional[tuple]:
    """``(numeric names, categorical names)`` of a table: its own ``column_names``, else Adult's for Adult tables."""
    given = getattr(members, "column_names", None)
    if given is not None:
        return tuple(given)
    from lightning_privacy.data.adult import CATEGORICAL, NUMERIC, AdultTable

    return (tuple(NUMERIC), tuple(CATEGORICAL)) if isinstance(members, AdultTable) else None


def audit_panoramia(
    model: Any,
    members: Any,
    *,
    encode: Optional[Callable] = None,
    generator: Any = None,
    member_fraction: float = 1.0,
    audit_size: Optional[int] = None,
    generator_size: Optional[int] = None,
    beta: float = 0.05,
    num_thresholds: int = 100,
    helper_epochs: int = 10,
    classifier: str = "auto",
    top_rows: int = 10,
    mia_features: str = "target_loss",
    seed: int = 0,
    num_threads: Optional[int] = 1,
    progress: Optional[bool] = None,
) -> PanoramiaAuditResult:
    """PANORAMIA on ``model`` with the member rows the auditor holds; non-members are generated.

    Args:
        model: the trained classifier (logits over classes); never modified or retrained.
        members: member rows: a table with ``numeric``/``categorical``/``labels`` (e.g.
            ``AdultDataModule.train_table``, with ``encode``), ``(x, y)`` arrays, or a loader of
            ``(x, y)`` batches (read once in dataset order; image-shaped ``x`` unless a ``generator``
            is given).
        encode: rows -> ``(x, y)`` tensors for the model (required for tables).
        generator: ``fit``/``sample`` generator (default: chosen by the pipeline for the data kind).
        member_fraction: share of the member rows the auditor uses, in ``(0, 1]`` (a subset seeded by
            ``seed``).
        audit_size, generator_size, beta, num_thresholds, helper_epochs, classifier, top_rows, mia_features, seed, num_threads: see
            :func:`~lightning_privacy.functional.panoramia.panoramia_audit`.
        progress: a progress bar over the phases on stderr; ``None`` = only when stderr is a terminal.

    Returns:
        A :class:`PanoramiaAuditResult`: ``.metrics()``, ``.summary()``, ``.figure()``, ``.to_dict()``.

    Raises:
        TypeError, ValueError: for unsupported members (e.g. token ids without a ``generator``, see
            :func:`unsupported_members`; refused before any work), too little data or a bad setting
            (named with its value).

    Example::

        >>> from sklearn.datasets import load_digits
        >>> import torch
        >>> digits = load_digits()
        >>> target = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> result = audit_panoramia(target, (digits.images[:600] / 16.0, digits.target[:600]))  # doctest: +SKIP
        >>> sorted(result.metrics())  # doctest: +SKIP
        ['audit/panoramia_c_lb', 'audit/panoramia_c_plus_epsilon_lb', 'audit/panoramia_epsilon']
    """
    if (
        isinstance(member_fraction, bool)
        or not isinstance(member_fraction, (int, float))
        or not 0 < member_fraction <= 1
    ):
        raise ValueError(f"`member_fraction` must be in (0, 1], got {member_fraction!r}")
    is_rows = all(hasattr(members, a) for a in ("numeric", "categorical", "labels")) or (
        isinstance(members, tuple) and len(members) == 2
    )
    if not is_rows:
        members = member_arrays(members, generator=generator)
    elif isinstance(members, tuple):
        refusal = unsupported_members(np.asarray(members[0]), generator=generator)
        if refusal is not None:
            raise ValueError(refusal)
    n = _data.length(members)
    kept = int(round(member_fraction * n))
    if kept < n:
        members = _data.subset(members, np.sort(np.random.default_rng(seed).permutation(n)[:kept]))
    column_names = _column_names(members) if _data.kind(members, "members") == _data.TABLE else None
    with progress_stages("PANORAMIA", PHASES, enabled=progress) as advance:
        result = panoramia_audit(
            model,
            members,
            encode=encode,
            generator=generator,
            audit_size=audit_size,
            generator_size=generator_size,
            beta=beta,
            num_thresholds=num_thresholds,
            classifier=classifier,
            helper_epochs=helper_epochs,
            top_rows=top_rows,
            seed=seed,
            num_threads=num_threads,
            mia_features=mia_features,
            column_names=column_names,
            progress=advance,
        )
    return PanoramiaAuditResult.of(result)

"""``PanoramiaAudit``: PANORAMIA privacy measurement at fit end, with generated non-members.

Kazmi et al., "PANORAMIA: Privacy Auditing of Machine Learning Models without Retraining" (NeurIPS
2024). The pipeline is :func:`lightning_privacy.functional.panoramia.panoramia_audit`, the bounds
:mod:`lightning_privacy.analysis.panoramia`; this file only gathers data and logs.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.functional.panoramia import PanoramiaResult, panoramia_audit, summary_text

__all__ = ["PanoramiaAudit", "panoramia_figure"]

FIGURE_TAG = f"{names.PANORAMIA_EPSILON}/curves"
SUMMARY_TAG = f"{names.PANORAMIA_EPSILON}/summary"


def panoramia_figure(result: PanoramiaResult):
    """Left: precision–recall of baseline vs MIA. Right: ``c_lb`` / ``{c+eps}_lb`` over recall."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from sklearn.metrics import precision_recall_curve

    b = result.bounds
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
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
    fig.tight_layout()
    return fig


class PanoramiaAudit(Callback):
    """Run PANORAMIA on the trained model at fit end and log ``audit/panoramia_*``.

    The auditor holds a subset of the training data (``member_fraction`` of it), no non-members and
    no retraining: non-members are generated. Logged on global rank 0 through ``trainer.loggers``:
    ``audit/panoramia_epsilon`` (``eps_tilde``), ``audit/panoramia_c_lb``,
    ``audit/panoramia_c_plus_epsilon_lb``; to TensorBoard loggers also a figure (precision–recall of
    baseline vs MIA, and the bounds over recall) and a text block stating what ``eps_tilde`` means
    (not a lower bound on ε-DP) and listing the rows the baseline finds most obviously real.

    Member data: ``members`` (a table with ``encode``, or ``(x, y)`` arrays), else the datamodule's
    raw ``train_table`` encoded with its ``to_dataset`` (e.g.
    :class:`~lightning_privacy.data.AdultDataModule`), else the training data as ``(x, y)`` arrays
    (image-shaped inputs only, with the default :class:`~lightning_privacy.generators.DigitsGenerator`,
    unless a ``generator`` is given).

    Args:
        members: member rows the auditor holds (optional, see above).
        encode: rows -> ``(x, y)`` tensors for the model (required with table ``members``).
        generator: a ``fit``/``sample`` generator (default: chosen by the pipeline for the data kind).
        member_fraction: share of the member rows the auditor uses, in ``(0, 1]`` (a seeded subset).
        audit_size, generator_size: ``m`` and ``|D_G|`` (default: a third of the members each).
        beta: confidence level of the pair of bounds, in ``(0, 1)``.
        num_thresholds: recall levels tried.
        helper_epochs: epochs of the helper model on synthetic data.
        classifier: ``"auto"``, ``"hgb"`` or ``"torch"``.
        top_rows: most-obviously-real rows listed in the text block.
        mia_features: ``"target_loss"`` (the paper's MIA: x + target loss) or ``"calibrated"`` (also the
            helper's loss as a reference; stronger on Adult, see the README).
        seed: seed of the whole audit.

    Attributes:
        result: the last :class:`~lightning_privacy.functional.panoramia.PanoramiaResult` (rank 0).

    Raises:
        MisconfigurationException: for a bad argument (at construction) or missing member data.

    Example::

        >>> audit = PanoramiaAudit(member_fraction=0.5, audit_size=3000, seed=1)
        >>> audit.state_key
        "PanoramiaAudit{'member_fraction': 0.5, 'audit_size': 3000, 'seed': 1}"
        >>> trainer = pl.Trainer(callbacks=[audit], max_epochs=10)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=AdultDataModule())  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        members: Any = None,
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
    ) -> None:
        if (
            isinstance(member_fraction, bool)
            or not isinstance(member_fraction, (int, float))
            or not 0 < member_fraction <= 1
        ):
            raise MisconfigurationException(f"`member_fraction` must be in (0, 1], got {member_fraction!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1:
            raise MisconfigurationException(f"`beta` must be in (0, 1), got {beta!r}")
        if classifier not in ("auto", "hgb", "torch"):
            raise MisconfigurationException(f"`classifier` must be 'auto', 'hgb' or 'torch', got {classifier!r}")
        if mia_features not in ("target_loss", "calibrated"):
            raise MisconfigurationException(
                f"`mia_features` must be 'target_loss' or 'calibrated', got {mia_features!r}"
            )
        for name, value, low in (
            ("num_thresholds", num_thresholds, 1),
            ("helper_epochs", helper_epochs, 1),
            ("top_rows", top_rows, 0),
            ("audit_size", audit_size, 20),
            ("generator_size", generator_size, 20),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise MisconfigurationException(f"`{name}` must be an int >= {low}, got {value!r}")
        if generator is not None and not (hasattr(generator, "fit") and hasattr(generator, "sample")):
            raise MisconfigurationException(
                f"`generator` must have fit(data) and sample(n), got {type(generator).__name__}"
            )
        self.members, self.encode, self.generator = members, encode, generator
        self.member_fraction = float(member_fraction)
        self.audit_size, self.generator_size = audit_size, generator_size
        self.beta, self.num_thresholds, self.helper_epochs = float(beta), num_thresholds, helper_epochs
        self.classifier, self.top_rows, self.seed = classifier, top_rows, seed
        self.mia_features = mia_features
        self.result: Optional[PanoramiaResult] = None
        self._last: Dict[str, float] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(
            member_fraction=self.member_fraction, audit_size=self.audit_size, seed=self.seed
        )

    def _member_data(self, trainer: pl.Trainer) -> tuple:
        if self.members is not None:
            return self.members, self.encode
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "train_table") and callable(getattr(dm, "to_dataset", None)):
            return dm.train_table, (self.encode or (lambda rows: dm.to_dataset(rows).tensors))
        xs, ys = [], []
        for batch in audit.member_loader(trainer):
            if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
                raise MisconfigurationException("PanoramiaAudit needs (x, y) batches or `members=`")
            xs.append(batch[0].detach().cpu().numpy())
            ys.append(batch[1].detach().cpu().numpy())
        if not xs:
            raise MisconfigurationException("PanoramiaAudit found no member data: pass `members=`")
        x, y = np.concatenate(xs), np.concatenate(ys)
        if x.ndim < 3 and self.generator is None:
            raise MisconfigurationException(
                f"PanoramiaAudit cannot generate non-members for flat features of shape {x.shape[1:]}: pass "
                "`generator=` (and raw `members=` for tables), or use a datamodule with `train_table`/`to_dataset`"
            )
        return (x, y), self.encode

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        from lightning_privacy.generators import _data

        members, encode = self._member_data(trainer)
        kept = int(round(self.member_fraction * _data.length(members)))
        if kept < _data.length(members):
            members = _data.subset(
                members, np.sort(np.random.default_rng(self.seed).permutation(_data.length(members))[:kept])
            )
        try:
            result = panoramia_audit(
                pl_module,
                members,
                encode=encode,
                generator=self.generator,
                audit_size=self.audit_size,
                generator_size=self.generator_size,
                beta=self.beta,
                num_thresholds=self.num_thresholds,
                classifier=self.classifier,
                helper_epochs=self.helper_epochs,
                top_rows=self.top_rows,
                seed=self.seed,
                mia_features=self.mia_features,
            )
        except (ValueError, TypeError) as err:
            raise MisconfigurationException(f"PanoramiaAudit: {err}") from err
        self.result = result
        self._last = {
            names.PANORAMIA_EPSILON: result.epsilon,
            names.PANORAMIA_C_LB: result.c_lb,
            names.PANORAMIA_C_PLUS_EPSILON_LB: result.c_plus_epsilon_lb,
        }
        audit.log_scalars(trainer, self._last)
        if audit.tensorboard_experiments(trainer):
            audit.log_figure(trainer, FIGURE_TAG, panoramia_figure(result))
        text = summary_text(result)
        audit.log_text(trainer, SUMMARY_TAG, text)
        rank_zero_info(text.splitlines()[0])

    @property
    def last_values(self) -> Dict[str, float]:
        """The last audit's logged scalars (ε̃, c_lb, {c+ε}_lb); kept in the callback's state."""
        return dict(self._last)

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"version": 1, "last": dict(self._last)}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._last = {str(k): float(v) for k, v in state_dict.get("last", {}).items()}

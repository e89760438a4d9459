"""Per-epoch Bayes-security bounds against membership inference for Opacus-private training."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_deprecation, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy._validation import check_choice, check_open_unit
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.callbacks._audit_utils import log_figure
from lightning_privacy.callbacks._hparams import write_privacy_hparams
from lightning_privacy.dpsgd.run import dp_optimizers, find_dpsgd, run_ledger
from lightning_privacy.figures import bayes_security_figure
from lightning_privacy.ledger import PrivacyLedger

#: False-positive rates at which the tight TPR bounds are logged, with their keys.
TPR_KEYS = {
    0.001: names.MIA_TPR_BOUND_FPR_0_001,
    0.01: names.MIA_TPR_BOUND_FPR_0_01,
    0.1: names.MIA_TPR_BOUND_FPR_0_1,
}


#: Bounds whose float32 logging rounds toward the safe side (β* down, the others up); the rest round to nearest.
_BOUNDS = frozenset({names.MIA_BAYES_SECURITY, names.MIA_ADVANTAGE, names.DP_EPSILON, *TPR_KEYS.values()})


def _float32_toward_safety(value: float, *, down: bool) -> float:
    """``value`` as the nearest float32 on the safe side: loggers store float32, whose round-to-nearest could
    lift a safe β* by half an ulp (6e-8 relative) above the computed bound."""
    f = np.float32(value)
    if down and float(f) > value:
        f = np.nextafter(f, np.float32(-np.inf))
    elif not down and float(f) < value:
        f = np.nextafter(f, np.float32(np.inf))
    return float(f)


class BayesSecurityMonitor(Callback):
    r"""Log safe Bayes security against membership inference (MIA) every training epoch.

    From the run's :class:`~lightning_privacy.ledger.PrivacyLedger` (DPSGD's ``dpsgd.ledger``; for a user's own
    Opacus ``make_private``, a ledger over the accountant found through the optimizer) it logs through
    ``pl_module.log`` (so ``EarlyStopping``, checkpointing and the progress bar can use them):

    - ``privacy/mia_bayes_security``: β*_MIA = 1 − δ(ε=0) of the composed DP-SGD mechanism (Cherubin et al. 2024,
      Prop. 8) from a pessimistic privacy-loss distribution — a certified lower bound on the true value at any
      sample rate, the same number whenever it is read (the ledger composes one chunk per run of steps at one
      (σ, p));
    - ``privacy/mia_bayes_security_closed_form``: the paper's closed form (Cor. 7), for comparison. It is an
      approximation and can overstate security (at p = 0.05, σ = 1 it is above the exact value at every epoch);
      the monitor warns once when it does;
    - ``privacy/mia_advantage`` (1 − β*), and ``privacy/mia_tpr_bound_fpr_0.001``, ``…_0.01``, ``…_0.1``: the
      largest TPR any membership attack reaches at that FPR — the composed mechanism's trade-off curve (from δ(ε)
      over all ε), never looser than Prop. 9's line TPR ≤ FPR + 1 − β*;
    - ``privacy/approximation_error`` (Proposition 4's worst-case term for the closed form);
    - ``dp/noise_multiplier``, ``dp/sample_rate``, ``dp/steps`` and ``dp/epsilon`` (the accountant's ε at δ; on the
      progress bar beside β*).

    At fit end the loggers (TensorBoard, MLflow, W&B, CSV) get a figure (``privacy/bayes_security``): β* per
    epoch (safe and closed form, with the budget of a :class:`~lightning_privacy.PrivacyBudgetStopping` as a
    line) and the attainable TPR–FPR region beside Prop. 9's line.

    Args:
        delta: δ for ``dp/epsilon``; default: DPSGD's ``delta``, else ``1e-5``.
        relation: neighbouring relation, ``"replace"`` (substitution, as in the paper) or ``"add_remove"``.
        accountant: an Opacus accountant to read instead of finding it through the trainer.
        exact: deprecated and ignored: the logged β* is the safe exact value every epoch.

    Attributes:
        epochs: one record per epoch of the current fit, ``{"epoch", "safe", "closed"}`` (for the figure and the
            report; a monitor reused for another fit starts over, a resumed fit gets its records back).
        final: every logged value at the end of fit (``privacy/mia_bayes_security_exact`` is the safe value too);
            empty when the fit took no step.
        final_closed_form: the closed-form β*_MIA at the end of fit (``None`` when it took no step).
        ledger: the ledger the values come from (found again at every fit).

    Example::

        >>> from lightning_privacy import BayesSecurityMonitor
        >>> monitor = BayesSecurityMonitor()
        >>> # Trainer(callbacks=[DPSGD(noise_multiplier=1.1), monitor, EarlyStopping(
        >>> #     monitor="privacy/mia_bayes_security", mode="max", divergence_threshold=0.9)])
    """

    report_order = 20  # the report's sections: DP-SGD first, then monitors, then audits

    draws_mia_region = True  # the report's DP-SGD section leaves the TPR–FPR region to this monitor's section

    def report_section(self, trainer: Any = None) -> Any:
        """This callback's section of the privacy report (:mod:`lightning_privacy.reporting`)."""
        from lightning_privacy.callbacks._sections import bayes_section

        return bayes_section(self, trainer)

    #: Metric columns this callback adds to the run's HPARAMS session (see ``callbacks/_hparams.py``).
    hparams_metric_keys = (names.MIA_BAYES_SECURITY, names.DP_EPSILON)

    def __init__(
        self,
        *,
        delta: Optional[float] = None,
        relation: str = "replace",
        accountant: Optional[IAccountant] = None,
        exact: Optional[str] = None,
    ) -> None:
        if exact is not None:
            check_choice("exact", exact, ("auto", "always", "never"), exc=MisconfigurationException)
            rank_zero_deprecation(
                "BayesSecurityMonitor(exact=...) is deprecated and ignored: privacy/mia_bayes_security is the safe "
                "exact value every epoch, and the closed form is logged beside it."
            )
        check_open_unit("delta", delta, exc=MisconfigurationException, optional=True, float_only=True)
        check_choice("relation", relation, bs.RELATIONS, exc=MisconfigurationException)
        self.delta = delta
        self.relation = relation
        self.accountant = accountant
        self.epochs: List[Dict[str, Any]] = []
        self.final: Dict[str, float] = {}
        self.final_closed_form: Optional[float] = None
        self.ledger: Optional[PrivacyLedger] = None
        self._computed: Optional[Tuple[int, Dict[str, float]]] = None  # (steps, values) of the last compute
        self._warned = False

    # ------------------------------------------------------------------------------ the ledger
    def _ledger(self, trainer: pl.Trainer) -> PrivacyLedger:
        if self.ledger is None:
            self.ledger = run_ledger(trainer, accountant=self.accountant, relation=self.relation, delta=self.delta)
        return self.ledger

    def compute(self, trainer: pl.Trainer) -> Dict[str, float]:
        """All logged values for the history so far (empty before the first step).

        Computed once per step count: the fit-end summary after the last epoch re-uses that epoch's values.
        """
        ledger = self._ledger(trainer)
        history = ledger.history
        if not history:
            return {}
        if self._computed is not None and self._computed[0] == ledger.steps:
            return dict(self._computed[1])
        safe = ledger.bayes_security()
        closed = ledger.bayes_security_closed_form()
        if closed > safe + 1e-9 and not self._warned:
            rank_zero_warn(
                f"The closed-form β*_MIA ({closed:.5f}) exceeds the exact value ({safe:.5f}) by {closed - safe:.2g}: "
                "the closed form overstates security here (it is an approximation; Cherubin et al. 2024, Fig. 4). "
                f"{names.MIA_BAYES_SECURITY} is the exact value."
            )
            self._warned = True
        values = {
            names.MIA_BAYES_SECURITY: safe,
            names.MIA_BAYES_SECURITY_CLOSED_FORM: closed,
            names.MIA_ADVANTAGE: 1.0 - safe,
            names.APPROXIMATION_ERROR: bs.approximation_error(**ledger.segments()),
        }
        bounds = ledger.tpr_bounds(list(TPR_KEYS))
        values.update({key: float(bound) for key, bound in zip(TPR_KEYS.values(), bounds)})
        sigma, rate, _ = history[-1]
        values[names.DP_NOISE_MULTIPLIER] = sigma
        values[names.DP_SAMPLE_RATE] = rate
        values[names.DP_STEPS] = float(ledger.steps)
        values[names.DP_EPSILON] = ledger.epsilon(self.delta)
        self._computed = (ledger.steps, dict(values))
        return values

    # ------------------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a reused monitor starts over (before a checkpoint's records are restored)
            self.epochs, self.final, self.final_closed_form = [], {}, None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.ledger, self._computed = None, None
        self._ledger(trainer)  # fail early, with a clear message, if training is not private
        if find_dpsgd(trainer) is None:  # a user's own make_private: the HPARAMS session is written here
            optimizers = dp_optimizers(trainer)
            settings = {names.DP_DELTA: self.ledger.delta}
            if optimizers:
                settings[names.DP_NOISE_MULTIPLIER] = float(optimizers[0].noise_multiplier)
                settings[names.DP_MAX_GRAD_NORM] = float(optimizers[0].max_grad_norm)
            write_privacy_hparams(trainer, pl_module, settings)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = self.compute(trainer)
        if not values:
            return
        for key, value in values.items():
            lower_is_safe = key == names.MIA_BAYES_SECURITY
            pl_module.log(
                key,
                _float32_toward_safety(value, down=lower_is_safe) if key in _BOUNDS else float(value),
                prog_bar=key in (names.MIA_BAYES_SECURITY, names.DP_EPSILON),
                on_epoch=True,
                on_step=False,
                reduce_fx="min" if lower_is_safe else "max",
                sync_dist=True,
            )
        self.epochs.append(
            {
                "epoch": trainer.current_epoch,
                "safe": values[names.MIA_BAYES_SECURITY],
                "closed": values[names.MIA_BAYES_SECURITY_CLOSED_FORM],
            }
        )

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = self.compute(trainer)
        if not values:
            return
        values[names.MIA_BAYES_SECURITY_EXACT] = values[names.MIA_BAYES_SECURITY]
        self.final_closed_form = values[names.MIA_BAYES_SECURITY_CLOSED_FORM]
        self.final = values
        if trainer.is_global_zero:
            budget = next(
                (
                    cb.min_bayes_security
                    for cb in trainer.callbacks
                    if getattr(cb, "threat", None) == "mia" and getattr(cb, "min_bayes_security", None) is not None
                ),
                None,
            )
            figure = bayes_security_figure(self.epochs, values, ledger=self.ledger, budget=budget)
            log_figure(trainer, names.BAYES_SECURITY_FIGURE, figure)

    # ------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"epochs": [dict(e) for e in self.epochs]}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.epochs = [dict(e) for e in state_dict.get("epochs", [])]

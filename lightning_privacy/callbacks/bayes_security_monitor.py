"""Per-epoch Bayes-security bounds against membership inference for Opacus-private training."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.accountants import IAccountant
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.analysis import bayes_security as bs
from lightning_privacy.callbacks._audit_utils import log_figure, log_scalars
from lightning_privacy.callbacks._hparams import write_privacy_hparams
from lightning_privacy.callbacks._opacus import accountant_history, dp_optimizers, find_accountant, find_dpsgd
from lightning_privacy.callbacks._plots import bayes_security_figure

EXACT_MODES = ("auto", "always", "never")
CLOSED_FORM = "_closed_form"  # internal: the raw closed form, kept for the figure


class BayesSecurityMonitor(Callback):
    r"""Log closed-form Bayes security against membership inference (MIA) every training epoch.

    From the DP-SGD history so far — ``(noise_multiplier, sample_rate, steps)`` segments read from
    the Opacus accountant — it logs through ``pl_module.log`` (so ``EarlyStopping``, checkpointing and
    the progress bar can use them):

    - ``privacy/mia_bayes_security``: β*_MIA, the closed form of Cherubin et al. (2024, Corollary 7)
      composed over segments; where an exact value was computed and is lower, the exact value (the
      bound never reports more security than the computation supports);
    - ``privacy/mia_bayes_security_exact``: 1 − δ(ε=0) from dp_accounting's pessimistic PLD, when
      computed (see ``exact``);
    - ``privacy/mia_advantage`` (1 − β*), ``privacy/mia_tpr_bound_fpr_0.01`` and ``…_0.1``
      (Proposition 9, uniform prior), ``privacy/approximation_error`` (Proposition 4's term);
    - ``dp/noise_multiplier``, ``dp/sample_rate``, ``dp/steps`` and ``dp/epsilon`` (the accountant's
      ε at ``delta``, for reference).

    The closed form is an approximation. The paper validates it against the PLD accountant (Figs. 4
    and 10): within 0.01 for σ ≥ 1 up to 50 epochs (p·T ≤ 50), and unreliable — overstating security —
    for σ < 1. Proposition 4's error term, logged as ``privacy/approximation_error``, is a worst-case
    bound that exceeds 1 after a few hundred steps, so it cannot by itself say when to trust the closed
    form. With ``exact="auto"`` the exact value is therefore computed whenever the run leaves the
    validated region (σ < 1 anywhere in the history, or more than ``max_trusted_epochs`` epochs), or
    when the error term exceeds ``error_threshold`` if one is given, and always at the end of fit; a
    warning is raised whenever the closed form exceeds the exact value. At fit end, TensorBoard loggers get a figure of β* per epoch
    (closed vs exact) and of the TPR–FPR region the final β* allows, and the hyper-parameters.

    Works with our :class:`~lightning_privacy.DPSGD` or with a user's own Opacus ``make_private``
    (pass ``accountant=privacy_engine.accountant`` if it cannot be found through the optimizer).

    Args:
        exact: ``"auto"``, ``"always"`` (every epoch) or ``"never"`` (only at fit end).
        max_trusted_epochs: epochs (Σ p·T) up to which ``"auto"`` trusts the closed form when σ ≥ 1.
        error_threshold: optional; ``privacy/approximation_error`` above which ``"auto"`` also computes
            the exact value (``None``: not used, see above).
        delta: δ for ``dp/epsilon``; default: DPSGD's ``delta``, else ``1e-5``.
        relation: neighbouring relation, ``"replace"`` (substitution, as in the paper) or ``"add_remove"``.
        accountant: an Opacus accountant to read instead of finding it through the trainer.

    Attributes:
        epochs: one record per epoch, ``{"epoch", "closed", "exact"}`` (exact is ``None`` where not computed).
        final: every logged value at the end of fit, with the exact β*.
        final_closed_form: the closed-form β*_MIA at the end of fit.

    Example::

        >>> from lightning_privacy import BayesSecurityMonitor
        >>> monitor = BayesSecurityMonitor(exact="auto")
        >>> # Trainer(callbacks=[DPSGD(noise_multiplier=1.1), monitor, EarlyStopping(
        >>> #     monitor="privacy/mia_bayes_security", mode="max", divergence_threshold=0.9)])
    """

    #: Metric columns this callback adds to the run's HPARAMS session (see ``callbacks/_hparams.py``).
    hparams_metric_keys = (names.MIA_BAYES_SECURITY, names.DP_EPSILON)

    def __init__(
        self,
        *,
        exact: str = "auto",
        max_trusted_epochs: float = 50.0,
        error_threshold: Optional[float] = None,
        delta: Optional[float] = None,
        relation: str = "replace",
        accountant: Optional[IAccountant] = None,
    ) -> None:
        if exact not in EXACT_MODES:
            raise MisconfigurationException(f"`exact` must be one of {EXACT_MODES}, got {exact!r}")
        if not (isinstance(max_trusted_epochs, (int, float)) and max_trusted_epochs > 0):
            raise MisconfigurationException(
                f"`max_trusted_epochs` must be a positive number, got {max_trusted_epochs!r}"
            )
        if error_threshold is not None and not (isinstance(error_threshold, (int, float)) and error_threshold > 0):
            raise MisconfigurationException(
                f"`error_threshold` must be a positive number or None, got {error_threshold!r}"
            )
        if delta is not None and not (isinstance(delta, float) and 0 < delta < 1):
            raise MisconfigurationException(f"`delta` must be a float in (0, 1), got {delta!r}")
        if relation not in ("replace", "add_remove"):
            raise MisconfigurationException(f"`relation` must be 'replace' or 'add_remove', got {relation!r}")
        self.exact = exact
        self.max_trusted_epochs = float(max_trusted_epochs)
        self.error_threshold = error_threshold
        self.delta = delta
        self.relation = relation
        self.accountant = accountant
        self.epochs: List[Dict[str, Any]] = []  # one record per logged epoch (for the figure)
        self._warned = False

    # ------------------------------------------------------------------------------ computation
    def _delta(self, trainer: pl.Trainer) -> float:
        if self.delta is not None:
            return self.delta
        dpsgd = find_dpsgd(trainer)
        return dpsgd.delta if dpsgd is not None else 1e-5

    def compute(self, trainer: pl.Trainer, *, with_exact: Optional[bool] = None) -> Dict[str, float]:
        """All logged values for the history so far (``with_exact`` overrides the ``exact`` mode)."""
        history = accountant_history(trainer, self.accountant)
        if not history:
            return {}
        segments = bs.history_segments(history)
        closed = bs.mia_bayes_security(**segments, relation=self.relation)
        error = bs.approximation_error(**segments)
        if with_exact is None:
            with_exact = self.exact == "always" or (self.exact == "auto" and not self._trusted(history, error))
        values = {names.MIA_BAYES_SECURITY: closed, names.APPROXIMATION_ERROR: error}
        security = closed
        if with_exact:
            exact = bs.mia_bayes_security_exact(**segments, relation=self.relation)
            values[names.MIA_BAYES_SECURITY_EXACT] = exact
            if closed > exact + 1e-9:
                if not self._warned:
                    rank_zero_warn(
                        f"The closed-form β*_MIA ({closed:.5f}) exceeds the exact value ({exact:.5f}) by "
                        f"{closed - exact:.2g}: the "
                        "closed form overstates security here (it is an approximation; Cherubin et al. 2024, Fig. 4). "
                        f"The exact value is logged as {names.MIA_BAYES_SECURITY}."
                    )
                    self._warned = True
                security = exact
        values[names.MIA_BAYES_SECURITY] = security
        values[names.MIA_ADVANTAGE] = 1.0 - security
        values[names.MIA_TPR_BOUND_FPR_0_01] = bs.tpr_upper_bound(bayes_security=security, fpr=0.01)
        values[names.MIA_TPR_BOUND_FPR_0_1] = bs.tpr_upper_bound(bayes_security=security, fpr=0.1)
        sigma, rate, _ = history[-1]
        values[names.DP_NOISE_MULTIPLIER] = sigma
        values[names.DP_SAMPLE_RATE] = rate
        values[names.DP_STEPS] = float(sum(t for _, _, t in history))
        accountant = self._find_accountant(trainer)
        values[names.DP_EPSILON] = float(accountant.get_epsilon(delta=self._delta(trainer)))
        values[CLOSED_FORM] = closed
        return values

    def _trusted(self, history: list, error: float) -> bool:
        """Whether the run is inside the region where the paper validated the closed form."""
        epochs = sum(p * t for _, p, t in history)
        if min(s for s, _, _ in history) < 1.0 or epochs > self.max_trusted_epochs:
            return False
        return self.error_threshold is None or error <= self.error_threshold

    def _find_accountant(self, trainer: pl.Trainer) -> IAccountant:
        return find_accountant(trainer, self.accountant)

    # ------------------------------------------------------------------------------ hooks
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._find_accountant(trainer)  # fail early, with a clear message, if training is not private
        if find_dpsgd(trainer) is None:  # a user's own make_private: the HPARAMS session is written here
            optimizers = dp_optimizers(trainer)
            settings = {names.DP_DELTA: self._delta(trainer)}
            if optimizers:
                settings[names.DP_NOISE_MULTIPLIER] = float(optimizers[0].noise_multiplier)
                settings[names.DP_MAX_GRAD_NORM] = float(optimizers[0].max_grad_norm)
            write_privacy_hparams(trainer, pl_module, settings)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = self.compute(trainer)
        if not values:
            return
        closed = values.pop(CLOSED_FORM)
        for key, value in values.items():
            lower_is_safe = key in (names.MIA_BAYES_SECURITY, names.MIA_BAYES_SECURITY_EXACT)
            pl_module.log(
                key,
                float(value),
                prog_bar=key in (names.MIA_BAYES_SECURITY, names.DP_EPSILON),
                on_epoch=True,
                on_step=False,
                reduce_fx="min" if lower_is_safe else "max",
                sync_dist=True,
            )
        self.epochs.append(
            {"epoch": trainer.current_epoch, "closed": closed, "exact": values.get(names.MIA_BAYES_SECURITY_EXACT)}
        )

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        values = self.compute(trainer, with_exact=True)
        if not values:
            return
        self.final_closed_form = values.pop(CLOSED_FORM)
        self.final = values
        if self.epochs and self.epochs[-1]["exact"] is None:
            self.epochs[-1]["exact"] = values[names.MIA_BAYES_SECURITY_EXACT]
        self._log_report(trainer, values)

    def _log_report(self, trainer: pl.Trainer, values: Dict[str, float]) -> None:
        # Fit-end values go at the last step or later (TensorBoard purges a series written at an earlier step).
        log_scalars(trainer, {names.MIA_BAYES_SECURITY_EXACT: values[names.MIA_BAYES_SECURITY_EXACT]})
        if trainer.is_global_zero:
            log_figure(trainer, names.BAYES_SECURITY_FIGURE, bayes_security_figure(self.epochs, values))

    # ------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"epochs": [dict(e) for e in self.epochs]}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.epochs = [dict(e) for e in state_dict.get("epochs", [])]

"""``EpsilonStarAudit``: Epsilon* of the trained model, at fit end and optionally every n epochs."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_privacy import names
from lightning_privacy.analysis.epsilon_star import (
    RATIO_NAMES,
    EpsilonStarDetails,
    default_delta,
    epsilon_star_details,
    transform_losses,
)
from lightning_privacy.callbacks import _audit_utils as audit
from lightning_privacy.functional.membership_loss import membership_losses_from_loader
from lightning_privacy.metrics.epsilon_star import EpsilonStar

__all__ = ["EpsilonStarAudit", "transformed_fit_figure"]

MEMBER_LOSSES_TAG = f"{names.EPSILON_STAR}/member_losses"
NONMEMBER_LOSSES_TAG = f"{names.EPSILON_STAR}/nonmember_losses"
FIGURE_TAG = f"{names.EPSILON_STAR}/transformed_fits"
SUMMARY_TAG = f"{names.EPSILON_STAR}/summary"


def _membership_epsilon_class() -> Optional[type]:
    try:  # the estimation metric is optional: the audit works without it
        from lightning_privacy.metrics.membership_epsilon import MembershipEpsilon
    except ImportError:  # pragma: no cover - only before the estimation issue landed
        return None
    return MembershipEpsilon


def transformed_fit_figure(details: EpsilonStarDetails, member_losses: Any, nonmember_losses: Any):
    """Histograms of the transformed losses ``phi`` of both sets with their fitted Normals (parametric)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from scipy import stats

    low, high = details.loss_min, details.loss_max
    phi_tr = transform_losses(np.asarray(member_losses, dtype=np.float64), low=low, high=high)
    phi_pop = transform_losses(np.asarray(nonmember_losses, dtype=np.float64), low=low, high=high)
    fig, ax = plt.subplots(figsize=(7, 4))
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
    fig.tight_layout()
    return fig


class EpsilonStarAudit(Callback):
    """Epsilon* (Negoescu et al. 2023) of the model being trained, from its per-example losses.

    Members are the training data in a fixed order — ``member_dataloader`` if given, else the
    datamodule's ``member_dataloader()``, else the dataset behind the train loader (never the DP-SGD
    Poisson loader itself); non-members are ``population_dataloader``, else the validation data. Under
    DDP each rank scores every ``world_size``-th example and the losses are gathered by the
    :class:`~lightning_privacy.metrics.epsilon_star.EpsilonStar` metric (collective: every rank
    computes). Rank 0 writes through ``trainer.loggers`` at ``trainer.global_step``:

    - ``audit/epsilon_star`` (parametric) and ``audit/epsilon_star_empirical``;
    - ``audit/mia_epsilon_lower``: the ``MembershipEpsilon`` lower bound (Bayesian interval, holdout
      threshold selection) of the same losses used as a threshold attack (score = -loss);
    - on TensorBoard: histograms of both loss sets, a figure of the transformed losses with their Normal
      fits, and a text summary with the fits, the maximising threshold and the KS p-values.

    Works with or without DP-SGD. To audit a saved checkpoint use
    ``lightning-privacy audit epsilon-star --checkpoint ...``.

    Args:
        delta: delta of Epsilon*, in ``(0, 0.5)``; ``None`` = ``1 / (n ln n)`` with ``n`` the number of
            member examples.
        member_dataloader: member data (default: the training data, see above).
        population_dataloader: non-member data (default: the validation data).
        every_n_epochs: also audit after every ``n``-th training epoch; ``None`` = only at fit end.
        forward_fn: ``forward_fn(pl_module, batch) -> (logits, target)``; default ``pl_module(batch[0]),
            batch[1]``.
        log_histograms, log_figure: write the loss histograms / the figure to TensorBoard loggers.
        mia_alpha: significance of the ``MembershipEpsilon`` interval.

    Attributes:
        results: the last values written, by key (same on every rank).
        details: the last parametric and empirical
            :class:`~lightning_privacy.analysis.epsilon_star.EpsilonStarDetails`, by method.

    Raises:
        MisconfigurationException: for ``delta`` outside ``(0, 0.5)``, ``every_n_epochs`` not a positive
            int, or no member / non-member data.

    Example::

        >>> audit = EpsilonStarAudit(every_n_epochs=5)
        >>> trainer = pl.Trainer(callbacks=[audit])  # doctest: +SKIP
        >>> EpsilonStarAudit(delta=0.5)
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: `delta` must be in the open interval (0, 0.5), got 0.5
    """

    def __init__(
        self,
        *,
        delta: Optional[float] = None,
        member_dataloader: Optional[Iterable] = None,
        population_dataloader: Optional[Iterable] = None,
        every_n_epochs: Optional[int] = None,
        forward_fn: Optional[Callable[[Any, Any], tuple]] = None,
        log_histograms: bool = True,
        log_figure: bool = True,
        mia_alpha: float = 0.05,
    ) -> None:
        if delta is not None and (
            isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < delta < 0.5
        ):
            raise MisconfigurationException(f"`delta` must be in the open interval (0, 0.5), got {delta!r}")
        if every_n_epochs is not None and (
            isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1
        ):
            raise MisconfigurationException(f"`every_n_epochs` must be a positive int or None, got {every_n_epochs!r}")
        if not 0.0 < mia_alpha < 1.0:
            raise MisconfigurationException(f"`mia_alpha` must be in (0, 1), got {mia_alpha!r}")
        self.delta = None if delta is None else float(delta)
        self.member_dataloader = member_dataloader
        self.population_dataloader = population_dataloader
        self.every_n_epochs = every_n_epochs
        self.forward_fn = forward_fn
        self.log_histograms = log_histograms
        self.log_figure = log_figure
        self.mia_alpha = mia_alpha
        self.results: Dict[str, float] = {}
        self.details: Dict[str, EpsilonStarDetails] = {}

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.audit(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.audit(trainer, pl_module)

    def audit(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Dict[str, float]:
        """Score both sets, compute Epsilon* (collective: call on every rank), write from rank 0."""
        members_in = audit.member_loader(trainer, self.member_dataloader)
        population_in = audit.population_loader(trainer, self.population_dataloader)
        member_losses = membership_losses_from_loader(pl_module, members_in, forward_fn=self.forward_fn)
        nonmember_losses = membership_losses_from_loader(pl_module, population_in, forward_fn=self.forward_fn)
        local = torch.cat([member_losses, nonmember_losses]).double()
        is_member = torch.cat(
            [torch.ones_like(member_losses, dtype=torch.bool), torch.zeros_like(nonmember_losses, dtype=torch.bool)]
        )

        metric = EpsilonStar(delta=self.delta)
        metric.update(local, is_member)  # every rank updates, even with an empty shard
        members, nonmembers = metric.gathered_losses()
        if members.numel() == 0 or nonmembers.numel() == 0:
            raise MisconfigurationException(
                f"Epsilon* needs member and non-member examples, got {members.numel()} and {nonmembers.numel()}"
            )
        delta = self.delta if self.delta is not None else default_delta(int(members.numel()))
        results: Dict[str, float] = {}
        self.details = {}
        for method, key in (("parametric", names.EPSILON_STAR), ("empirical", names.EPSILON_STAR_EMPIRICAL)):
            try:
                self.details[method] = epsilon_star_details(
                    members.numpy(), nonmembers.numpy(), delta=delta, method=method
                )
            except ValueError as err:  # e.g. a constant model: no Normal can be fitted
                rank_zero_warn(f"EpsilonStarAudit: {key} not computed: {err}")
                continue
            results[key] = self.details[method].epsilon_star

        membership_epsilon = _membership_epsilon_class()
        if membership_epsilon is not None:
            mia = membership_epsilon(delta=delta, alpha=self.mia_alpha)
            mia.update(-local, is_member)  # score: higher = more likely a member
            results[names.MIA_EPSILON_LOWER] = float(mia.compute()["epsilon_lower"])
        self.results = results
        self._write(trainer, members.numpy(), nonmembers.numpy())
        return results

    def _write(self, trainer: pl.Trainer, members: np.ndarray, nonmembers: np.ndarray) -> None:
        if not trainer.is_global_zero:
            return
        audit.log_scalars(trainer, self.results)
        if self.log_histograms:
            audit.log_histogram(trainer, MEMBER_LOSSES_TAG, members)
            audit.log_histogram(trainer, NONMEMBER_LOSSES_TAG, nonmembers)
        parametric = self.details.get("parametric")
        if self.log_figure and parametric is not None and audit.tensorboard_experiments(trainer):
            audit.log_figure(trainer, FIGURE_TAG, transformed_fit_figure(parametric, members, nonmembers))
        text = self.summary()
        audit.log_text(trainer, SUMMARY_TAG, text)
        rank_zero_info(text)

    def summary(self) -> str:
        """A markdown table of the last audit."""
        lines = ["| quantity | value |", "|---|---|"]
        lines += [f"| `{key}` | {value:.4f} |" for key, value in self.results.items()]
        for method, d in self.details.items():
            lines.append(
                f"| {method}: members / non-members / delta | {d.num_members} / {d.num_nonmembers} / {d.delta:.3g} |"
            )
            if d.ratio is not None:
                lines.append(
                    f"| {method}: threshold (loss) / FPR / FNR / ratio | {d.threshold:.4g} / {d.fpr:.3g} / {d.fnr:.3g} / "
                    f"{RATIO_NAMES[d.ratio - 1]} |"
                )
        d = self.details.get("parametric")
        if d is not None:
            lines.append(
                f"| Normal fits of φ: members / non-members | N({d.member_mean:.4f}, {d.member_std:.4f}²) / "
                f"N({d.nonmember_mean:.4f}, {d.nonmember_std:.4f}²) |"
            )
            lines.append(
                f"| KS p-values of the fits: members / non-members | {d.ks_pvalue_member:.3g} / {d.ks_pvalue_nonmember:.3g} |"
            )
        return "Epsilon* audit\n\n" + "\n".join(lines)

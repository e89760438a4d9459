"""Reference-model membership attacks from signals: LOSS, LiRA (Carlini et al. 2022), RMIA (Zarifzadeh et al. 2024).

Pure numpy/scipy: every function takes the models' *signals* (one number per model and example) and returns
one score per audited example, higher = more likely a member. The signal is the membership loss
``L = logsumexp_{j≠y} z_j − z_y`` of :func:`~lightning_privacy.functional.membership_loss.membership_loss`, from
which both attacks' quantities follow exactly:

- LiRA's logit-scaled confidence ``φ = log(p / (1 − p)) = −L`` (``p`` = softmax probability of the true label);
- RMIA's ``Pr(x | θ) = p = 1 / (1 + e^L)``, kept in log space (``log p = −log(1 + e^L)``).

For examples that are sequences (language models) the signal is instead ``signal="nll"``: the negative
log-likelihood ``N = −log Pr(x | θ)`` of the whole sequence, the sum of its next-token losses (``mean token loss ×
tokens``). Then RMIA's ``Pr(x | θ) = e^{−N}``, the product of the sequence's next-token probabilities, the likelihood
of the example the model was trained on (the RMIA paper, Zarifzadeh et al. 2024, evaluates image and tabular data; we
found no choice for text in it). LiRA's ``φ = −N = log p``: for a sequence ``p ≪ 1`` and ``log(p / (1 − p)) =
log p + O(p)``, while ``log p`` stays finite for a memorised sequence (``N → 0``), where the logit diverges.

Reference models are described by boolean matrices ``inside[k, i]``: whether reference ``k`` trained on
example ``i``. An example with no IN reference is audited *offline*.

RMIA (the paper's Eq. 3–4): ``Pr(x) = ½ (Pr_IN(x) + Pr_OUT(x))`` over the references; where no reference
trained on ``x`` the paper's offline approximation stands in for the IN half, ``Pr_IN ≈ a·Pr_OUT + (1 − a)``,
giving ``Pr(x) = ½ [(1 + a) Pr_OUT(x) + (1 − a)]``. ``score(x) = fraction of population points z with
[Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)] ≥ γ``. The paper tunes ``a`` by a grid search on a reference model's AUC;
:func:`fit_offline_a` fits the same linear relation directly, ``a = E[1 − Pr_IN] / E[1 − Pr_OUT]`` over
the references' own IN and OUT rows (only reference models are used, so the audit stays valid).

LiRA: online, Gaussians over the IN and OUT references' ``φ`` and ``score = log N(φ; μ_in, σ_in²) −
log N(φ; μ_out, σ_out²)``; offline, ``score = (φ − μ_out) / σ_out`` — a monotone transform of the paper's
one-sided ``P[N(μ_out, σ_out²) < φ]`` that keeps resolution where the tail probability rounds to 1. With
fewer than 64 references the variances are global (the paper's "fixed variance").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np
from scipy import special

from lightning_privacy.analysis._checks import expect_real
from lightning_privacy.analysis.estimation import rate_interval, roc_counts, score_orientation

__all__ = [
    "FIXED_VARIANCE_BELOW",
    "SIGNALS",
    "TIE_BREAK",
    "TprAtFpr",
    "auc",
    "fit_offline_a",
    "lira_scores",
    "log_probability",
    "loss_scores",
    "rmia_scores",
    "roc_curve",
    "tpr_at_fpr",
]

TIE_BREAK = 1e-9
"""RMIA's scores carry ``TIE_BREAK · sigmoid(log ratio_x)`` on top of the fraction: it orders examples that
dominate the same population points by their ratio, never changes the fraction's order, and is far below
``1 / m`` for any population of ``m < 10⁸`` points."""

FIXED_VARIANCE_BELOW = 64
"""LiRA uses one global variance per side below this many references (Carlini et al. 2022, Sec. IV-C)."""


SIGNALS = ("membership_loss", "nll")
"""What the attacks' input numbers are: a classification membership loss ``L`` (``Pr(x | θ) = 1 / (1 + e^L)``,
the default) or a negative log-likelihood ``N`` (``Pr(x | θ) = e^{−N}``, e.g. a sequence's summed token loss)."""


def _check_signal(signal: Any) -> str:
    if signal not in SIGNALS:
        raise ValueError(f"Expected argument `signal` to be one of {SIGNALS}, but got {signal!r}.")
    return signal


def _signals(name: str, value: Any, ndim: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"Expected argument `{name}` to have {ndim} dimension(s), but got shape {arr.shape}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"Expected argument `{name}` to be finite, but it holds NaN or inf.")
    return arr


def _inside(name: str, value: Any, shape: Tuple[int, int]) -> np.ndarray:
    if value is None:
        return np.zeros(shape, dtype=bool)
    arr = np.asarray(value)
    if arr.shape != shape:
        raise ValueError(f"Expected argument `{name}` of shape {shape} (references × examples), but got {arr.shape}.")
    return arr.astype(bool)


def log_probability(losses: Any, *, signal: str = "membership_loss") -> np.ndarray:
    """``log Pr(x | θ)``: of the true label from membership losses ``L`` (``p = 1 / (1 + e^L)``, stable at both
    ends), or ``−N`` from negative log-likelihoods (``signal="nll"``).

    Example::

        >>> log_probability([0.0, -50.0, 50.0]).round(6).tolist()
        [-0.693147, -0.0, -50.0]
        >>> log_probability([0.0, 12.5], signal="nll").tolist()  # a sequence of 5 tokens at loss 2.5 each: e^{-12.5}
        [-0.0, -12.5]
    """
    values = np.asarray(losses, dtype=np.float64)
    if _check_signal(signal) == "nll":
        return -values
    return -np.logaddexp(0.0, values)


def loss_scores(target_losses: Any) -> np.ndarray:
    """The reference-free LOSS attack (Yeom et al. 2018): ``score = −L`` (a lower loss looks like a member)."""
    return -_signals("target_losses", target_losses, 1)


def fit_offline_a(reference_losses: Any, inside: Any, *, signal: str = "membership_loss") -> float:
    """RMIA's offline ``a`` from the references' own rows: ``a = E[1 − Pr_IN] / E[1 − Pr_OUT]``, in [0, 1].

    The offline approximation assumes ``Pr_IN(x) ≈ a·Pr_OUT(x) + (1 − a)``, i.e. ``1 − Pr_IN = a (1 − Pr_OUT)``;
    averaging both sides over each reference's training rows (IN) and its other rows (OUT) gives the ratio. It
    is near 1 for a model that generalises (IN and OUT alike) and near 0 for one that memorises (``Pr_IN ≈ 1``).

    Not for sequence likelihoods: with ``signal="nll"`` the ratio is computed, but the correction it feeds is
    additive on the probability scale. A language model's sequences have ``Pr = e^{−N}`` of e^{−30} or less while the
    heaviest IN rows (short, memorised) put ``1 − a`` near 1e-12, so ``a·Pr_OUT + (1 − a) ≈ 1 − a`` for every
    example, ``Pr(x)`` is one constant and RMIA falls back to thresholding ``N`` (measured: AUC 0.64 instead of 0.96
    on a fine-tuned GPT-2). :func:`~lightning_privacy.audits.membership.audit_membership` uses ``a = 1`` there: an
    IN likelihood that is the OUT one times a common factor, ``Pr_IN = c·Pr_OUT``, multiplies ``Pr(x)`` and
    ``Pr(z)`` alike and cancels in RMIA's ratios, so no correction is lost.

    Args:
        reference_losses: ``(k, n)`` membership losses of ``k`` reference models on ``n`` rows.
        inside: ``(k, n)`` booleans, whether reference ``k`` trained on row ``i``.
        signal: ``"membership_loss"`` or ``"nll"`` (:data:`SIGNALS`).

    Raises:
        ValueError: when no reference has both IN and OUT rows.

    Example::

        >>> losses = np.array([[-5.0, -5.0, 0.0, 0.0]])  # IN rows fit well (p ≈ 0.993), OUT rows p = 0.5
        >>> round(fit_offline_a(losses, [[True, True, False, False]]), 4)
        0.0134
    """
    ref = _signals("reference_losses", reference_losses, 2)
    ins = _inside("inside", inside, ref.shape)
    miss = -np.expm1(log_probability(ref, signal=signal))  # 1 − p, accurate near p = 1
    usable = ins.any(axis=1) & (~ins).any(axis=1)
    if not usable.any():
        raise ValueError("Expected at least one reference model with both IN and OUT rows to fit `a`, but got none.")
    num = np.mean([miss[k][ins[k]].mean() for k in np.flatnonzero(usable)])
    den = np.mean([miss[k][~ins[k]].mean() for k in np.flatnonzero(usable)])
    return float(np.clip(num / den, 0.0, 1.0)) if den > 0 else 1.0


def _log_marginal(ref: np.ndarray, ins: np.ndarray, a: float, signal: str) -> np.ndarray:
    """``log Pr(x)`` per example: ½(mean IN + mean OUT), the offline approximation for the IN half if no IN."""
    logp = log_probability(ref, signal=signal)
    k = ref.shape[0]

    def log_mean(mask: np.ndarray) -> np.ndarray:
        count = mask.sum(axis=0)
        with np.errstate(divide="ignore"):
            return special.logsumexp(np.where(mask, logp, -np.inf), axis=0) - np.log(np.maximum(count, 1))

    log_in, log_out = log_mean(ins), log_mean(~ins)
    has_in, has_out = ins.any(axis=0), (~ins).any(axis=0)
    if not np.all(has_out):
        raise ValueError(
            f"RMIA needs an OUT reference for every example; {int((~has_out).sum())} example(s) were in all {k} "
            "reference models' training sets."
        )
    # offline IN half: a·Pr_OUT + (1 − a), in log space
    with np.errstate(divide="ignore"):
        log_in_offline = np.logaddexp(np.log(a) + log_out, np.log1p(-a) if a < 1 else -np.inf)
    log_in = np.where(has_in, log_in, log_in_offline)
    return np.logaddexp(log_in, log_out) - np.log(2.0)


def rmia_scores(
    target_losses: Any,
    reference_losses: Any,
    population_target_losses: Any,
    population_reference_losses: Any,
    *,
    inside: Any = None,
    population_inside: Any = None,
    gamma: float = 2.0,
    offline_a: float = 1.0,
    signal: str = "membership_loss",
) -> np.ndarray:
    """RMIA scores: the fraction of population points ``z`` that ``x`` dominates by a likelihood ratio ≥ γ.

    Args:
        target_losses: ``(n,)`` membership losses of the audited model on the audited examples.
        reference_losses: ``(k, n)`` the same for ``k`` reference models.
        population_target_losses: ``(m,)`` the audited model on the population points ``z``.
        population_reference_losses: ``(k, m)`` the references on them.
        inside, population_inside: ``(k, n)`` / ``(k, m)`` booleans, whether reference ``k`` trained on the
            example (``None``: on none of them — offline). Every audited example needs an OUT reference; population
            points that every reference trained on (e.g. half of them with one reference) are left out of ``z``.
        gamma: γ ≥ 1 (the paper uses values near 1–2).
        offline_a: ``a`` in [0, 1] of the offline approximation (see :func:`fit_offline_a`); ``1`` = no correction.
        signal: what the losses are (:data:`SIGNALS`): ``"membership_loss"`` (classification) or ``"nll"``
            (``−log Pr(x | θ)``, e.g. a sequence's summed token loss).

    Returns:
        ``(n,)`` scores: the fraction in [0, 1], plus less than :data:`TIE_BREAK` to order ties.

    Example: with one reference model that never saw the examples and ``a = 1``, ``Pr(x)`` is that reference's
    probability; ``x`` with ratio 0.9 / 0.3 = 3 dominates ``z`` with ratio 0.5 / 0.5 = 1 at γ = 2::

        >>> L = lambda p: np.log((1 - np.asarray(p)) / np.asarray(p))  # the loss of a true-label probability p
        >>> rmia_scores(L([0.9, 0.3]), L([[0.3, 0.3]]), L([0.5, 0.6]), L([[0.5, 0.2]]), gamma=2.0).round(6).tolist()
        [0.5, 0.0]
    """
    tgt = _signals("target_losses", target_losses, 1)
    ref = _signals("reference_losses", reference_losses, 2)
    ptgt = _signals("population_target_losses", population_target_losses, 1)
    pref = _signals("population_reference_losses", population_reference_losses, 2)
    if ref.shape[1] != tgt.size or pref.shape[1] != ptgt.size or ref.shape[0] != pref.shape[0]:
        raise ValueError(
            f"Expected `reference_losses` of shape (k, {tgt.size}) and `population_reference_losses` of shape "
            f"(k, {ptgt.size}) with the same k, but got {ref.shape} and {pref.shape}."
        )
    if ref.shape[0] == 0 or ptgt.size == 0:
        raise ValueError(
            f"RMIA needs at least one reference model and one population point, got {ref.shape[0]} and {ptgt.size}."
        )
    gamma = expect_real("gamma", gamma, low=1.0)
    a = expect_real("offline_a", offline_a, low=0.0, high=1.0)
    signal = _check_signal(signal)
    log_ratio_x = log_probability(tgt, signal=signal) - _log_marginal(
        ref, _inside("inside", inside, ref.shape), a, signal
    )
    pinside = _inside("population_inside", population_inside, pref.shape)
    usable = (~pinside).any(axis=0)  # a z in every reference's training set has no OUT estimate: not used
    if not usable.any():
        raise ValueError("RMIA needs population points outside some reference's training set, but every one is IN all.")
    log_ratio_z = log_probability(ptgt[usable], signal=signal) - _log_marginal(
        pref[:, usable], pinside[:, usable], a, signal
    )
    # LR(x, z) ≥ γ  ⇔  log ratio_z ≤ log ratio_x − log γ
    sorted_z = np.sort(log_ratio_z)
    fraction = np.searchsorted(sorted_z, log_ratio_x - np.log(gamma), side="right") / sorted_z.size
    # The fraction is a step function of ratio_x; examples on one step (e.g. all that dominate every z) are
    # ordered by ratio_x itself — their order under an ever larger population — shifted by < 1e-9.
    return fraction + TIE_BREAK * special.expit(log_ratio_x)


def lira_scores(
    target_losses: Any,
    reference_losses: Any,
    *,
    inside: Any = None,
    fixed_variance: Optional[bool] = None,
    signal: str = "membership_loss",
) -> np.ndarray:
    """LiRA scores: online (a likelihood ratio of IN and OUT Gaussians) when ``inside`` has IN references for
    every example, offline (the standardised distance above the OUT Gaussian) when it has none.

    Args:
        target_losses: ``(n,)`` membership losses of the audited model.
        reference_losses: ``(k, n)`` the references'.
        inside: ``(k, n)`` booleans, whether reference ``k`` trained on example ``i``; ``None`` = offline.
        fixed_variance: one global variance per side (``None``: when ``k`` < :data:`FIXED_VARIANCE_BELOW`).
        signal: ``"membership_loss"`` (``φ = −L``) or ``"nll"`` (``φ = log Pr(x | θ) = −N``) (:data:`SIGNALS`); both
            give ``φ = −loss``.

    Raises:
        ValueError: when some but not all examples have IN references, or an example has no OUT reference.

    Example::

        >>> phi = lambda v: -np.asarray(v, dtype=float)  # losses from φ = −L
        >>> lira_scores(phi([2.0, 0.0]), phi([[0.0, 0.0], [1.0, 1.0]])).round(4).tolist()  # offline: (φ − μ) / σ
        [3.0, -1.0]
    """
    tgt = _signals("target_losses", target_losses, 1)
    ref = _signals("reference_losses", reference_losses, 2)
    if ref.shape[1] != tgt.size or ref.shape[0] == 0:
        raise ValueError(f"Expected `reference_losses` of shape (k ≥ 1, {tgt.size}), but got {ref.shape}.")
    ins = _inside("inside", inside, ref.shape)
    k = ref.shape[0]
    fixed = k < FIXED_VARIANCE_BELOW if fixed_variance is None else bool(fixed_variance)
    _check_signal(signal)  # φ = −L (the logit of the true-label probability) or −N (the log-likelihood): both −loss
    phi, phi_ref = -tgt, -ref
    if not np.all((~ins).any(axis=0)):
        raise ValueError("LiRA needs an OUT reference for every example; some were in every reference's training set.")
    has_in = ins.any(axis=0)
    if has_in.any() and not has_in.all():
        raise ValueError(
            f"LiRA online needs an IN reference for every example, but {int((~has_in).sum())} of {has_in.size} have "
            "none: train references with the audited examples in balanced halves (`train_references(targets=...)`)."
        )

    def fit(mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        values = np.where(mask, phi_ref, np.nan)
        mean = np.nanmedian(values, axis=0)
        if fixed or mask.sum(axis=0).min() < 2:
            std = np.full(tgt.size, np.nanstd(values))
        else:
            std = np.nanstd(values, axis=0)
        return mean, np.maximum(std, 1e-30)

    mu_out, sd_out = fit(~ins)
    if not has_in.any():
        return (phi - mu_out) / sd_out
    mu_in, sd_in = fit(ins)

    def log_normal(x, mu, sd):
        return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd)

    return log_normal(phi, mu_in, sd_in) - log_normal(phi, mu_out, sd_out)


# --------------------------------------------------------------------------------------------------- ROC summaries
def roc_curve(scores: Any, is_member: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fpr, tpr, thresholds)`` of the rule "member iff score ≥ t" at every distinct score (from (0, 0)).

    Example::

        >>> fpr, tpr, _ = roc_curve([0.9, 0.2, 0.7, 0.2], [1, 0, 1, 1])
        >>> fpr.tolist(), tpr.round(3).tolist()
        ([0.0, 0.0, 0.0, 1.0], [0.0, 0.333, 0.667, 1.0])
    """
    thresholds, tp, fp, tn, fn = roc_counts(scores, is_member)
    pos, neg = int(tp[-1] + fn[-1]), int(fp[-1] + tn[-1])
    if pos == 0 or neg == 0:
        raise ValueError(f"Expected members and non-members, but got {pos} members and {neg} non-members.")
    return fp / neg, tp / pos, thresholds


def auc(scores: Any, is_member: Any) -> float:
    """Area under the ROC curve: P(member score > non-member score) + ½ P(tie).

    Example::

        >>> auc([0.9, 0.2, 0.7, 0.2], [1, 0, 1, 1])
        0.8333333333333334
    """
    return float(score_orientation(scores, is_member).auc)


@dataclass(frozen=True)
class TprAtFpr:
    """The best TPR of "member iff score ≥ t" over thresholds whose observed FPR is at most ``fpr``.

    Attributes:
        fpr: the FPR budget; ``achieved_fpr`` what the chosen threshold reached (``fp / num_nonmembers``).
        tpr, tpr_low, tpr_high: the TPR with its Clopper–Pearson interval at ``1 − alpha`` (``tp`` of ``num_members``).
        fpr_high: the Clopper–Pearson upper limit of the FPR (``fp`` of ``num_nonmembers``).
        threshold: the rule's threshold (``inf``: nobody is called a member).
        tp, fp, num_members, num_nonmembers, alpha: the counts and the level.
    """

    fpr: float
    achieved_fpr: float
    fpr_high: float
    tpr: float
    tpr_low: float
    tpr_high: float
    threshold: float
    tp: int
    fp: int
    num_members: int
    num_nonmembers: int
    alpha: float


def tpr_at_fpr(scores: Any, is_member: Any, fpr: Sequence[float], *, alpha: float = 0.05) -> Tuple[TprAtFpr, ...]:
    """TPR at each FPR budget with Clopper–Pearson intervals (the threshold is read off the same data: an
    optimistic choice; the intervals cover the TPR of the chosen threshold, not the best possible one).

    Example::

        >>> rng = np.random.default_rng(0)
        >>> member = np.r_[np.ones(1000, bool), np.zeros(1000, bool)]
        >>> (r,) = tpr_at_fpr(rng.normal(2.0 * member), member, [0.01])
        >>> r.fp <= 10, round(r.tpr, 3), r.tpr_low < r.tpr < r.tpr_high  # exact: Φ(2 − Φ⁻¹(0.99)) = 0.372
        (True, 0.38, True)
    """
    alpha = expect_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)
    thresholds, tp, fp, tn, fn = roc_counts(scores, is_member)
    pos, neg = int(tp[-1] + fn[-1]), int(fp[-1] + tn[-1])
    if pos == 0 or neg == 0:
        raise ValueError(f"Expected members and non-members, but got {pos} members and {neg} non-members.")
    out = []
    for budget in fpr:
        budget = expect_real("fpr", budget, low=0.0, high=1.0)
        ok = np.flatnonzero(fp <= np.floor(budget * neg + 1e-9))
        j = ok[np.argmax(tp[ok])]
        low, high = rate_interval(int(tp[j]), pos, alpha=alpha, method="clopper_pearson")
        _, fpr_high = rate_interval(int(fp[j]), neg, alpha=alpha, method="clopper_pearson")
        out.append(
            TprAtFpr(
                fpr=budget,
                achieved_fpr=float(fp[j] / neg),
                fpr_high=float(fpr_high),
                tpr=float(tp[j] / pos),
                tpr_low=float(low),
                tpr_high=float(high),
                threshold=float(thresholds[j]),
                tp=int(tp[j]),
                fp=int(fp[j]),
                num_members=pos,
                num_nonmembers=neg,
                alpha=alpha,
            )
        )
    return tuple(out)

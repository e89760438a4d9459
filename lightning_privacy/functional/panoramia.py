"""The PANORAMIA audit pipeline (Kazmi et al., NeurIPS 2024, Algorithm 1): no retraining of the target.

Phase 1 splits the auditor's member rows ``D_f`` into ``D_G`` (fits the generator), ``D_in^tr`` and
``D_in^te`` (``|D_in^te| = m``), fits the generator on ``D_G`` and draws ``D_out^tr`` / ``D_out^te``
of the same sizes, plus a separate synthetic set that trains the helper model.

Phase 2 trains two classifiers of "member vs generated" on ``D_in^tr ∪ D_out^tr``:

- the baseline ``b`` sees ``x`` and the loss of a **helper** ``h`` — a fresh copy of the target's
  architecture trained on synthetic data (the strongest baseline in every modality, Table 3);
- the MIA sees ``x`` and the **target's** loss.

Then the audit game (Definition 2): ``s ~ Bernoulli(1/2)^m``, ``x_i = D_in^te[i]`` if ``s_i = 1`` else
``D_out^te[i]``; both classifiers score the ``m`` points and
:func:`lightning_privacy.analysis.panoramia.panoramia_bounds` turns the scores into ``c_lb``,
``{c + eps}_lb`` and ``eps_tilde`` (see its docstring for what ``eps_tilde`` does and does not mean).

Classifiers: scikit-learn's ``HistGradientBoostingClassifier`` with a small grid search (the paper's
tabular choice, gradient boosting with a search) or, for images, a small torch CNN that concatenates
the loss before its last layers (the paper's image design). ``classifier="auto"`` picks gradient
boosting for flat features and the CNN for image-shaped inputs.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.model_selection import GridSearchCV, PredefinedSplit
from threadpoolctl import threadpool_limits
from torch import nn
from torch.nn import functional as F

from lightning_privacy._validation import check_int
from lightning_privacy.analysis.panoramia import MEANING, PanoramiaBounds, information_warnings, panoramia_bounds
from lightning_privacy.functional._precision import at_least_float32
from lightning_privacy.generators import DigitsGenerator, FilteredGenerator, TabularGenerator, _data

__all__ = [
    "PHASES",
    "PanoramiaResult",
    "describe_row",
    "fresh_copy",
    "panoramia_audit",
    "per_example_loss",
    "summary_text",
    "train_classifier_model",
]

MIN_TRAIN = 20
MIN_AUDIT = 20
MIN_GENERATOR = 20

HGB_GRID = {"learning_rate": [0.1, 0.2], "max_leaf_nodes": [15, 31]}
PHASES = ("fit generator", "train helper", "baseline classifier", "MIA classifier", "bounds")
"""The phases :func:`panoramia_audit` reports to its ``progress`` callable, in order."""


@dataclass
class PanoramiaResult:
    """What :func:`panoramia_audit` measured.

    Attributes:
        bounds: the :class:`~lightning_privacy.analysis.panoramia.PanoramiaBounds` of the game.
        labels: ``(m,)`` membership ``s`` of the audit points.
        baseline_scores, mia_scores: ``(m,)`` classifier scores (P(member)).
        audit_rows: the ``m`` audit points (same kind as the members).
        top_real: indices into the audit set of the points the baseline finds most obviously real,
            best first (the paper's failure mode C.4: rare real values raise ``c_lb``).
        sizes: row counts of every phase.
        seconds: wall time of every phase.
        baseline_params, mia_params: the classifier settings the search chose.
        acceptance_rate: share of generated rows the filter kept (``nan`` without filtering).
        mia_features: the MIA's features (``"target_loss"`` or ``"calibrated"``).
        column_names: ``(numeric names, categorical names)`` of table rows for the report (``None``:
            ``num0, ...`` / ``cat0, ...``).
        warnings: why the result carries no information, if it does not
            (:func:`~lightning_privacy.analysis.panoramia.information_warnings`: ``{c+eps}_lb = 0``, too
            few correct guesses at every recall level, so ``eps_tilde = 0`` is not evidence of privacy).
    """

    bounds: PanoramiaBounds
    labels: np.ndarray
    baseline_scores: np.ndarray
    mia_scores: np.ndarray
    audit_rows: Any
    top_real: np.ndarray
    sizes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    baseline_params: dict = field(default_factory=dict)
    mia_params: dict = field(default_factory=dict)
    acceptance_rate: float = float("nan")
    mia_features: str = "target_loss"

    @property
    def c_lb(self) -> float:
        return self.bounds.c_lb

    @property
    def c_plus_epsilon_lb(self) -> float:
        return self.bounds.c_plus_epsilon_lb

    @property
    def epsilon(self) -> float:
        return self.bounds.epsilon

    meaning: str = MEANING
    column_names: Optional[tuple] = None
    warnings: tuple = ()


# ----------------------------------------------------------------------------- torch helpers
def _device(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def per_example_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 4096) -> np.ndarray:
    """Per-example cross-entropy of ``model`` on ``(x, y)`` in eval mode (mode restored afterwards).

    Example::

        >>> model = nn.Linear(2, 2)
        >>> per_example_loss(model, torch.zeros(3, 2), torch.tensor([0, 1, 1])).shape
        (3,)
    """
    was_training = model.training
    model.eval()
    device = _device(model)
    out = []
    try:
        for i in range(0, len(y), batch_size):
            logits = model(x[i : i + batch_size].to(device))
            out.append(
                F.cross_entropy(at_least_float32(logits), y[i : i + batch_size].to(device), reduction="none").cpu()
            )
    finally:
        model.train(was_training)
    return torch.cat(out).numpy().astype(np.float64) if out else np.zeros(0)


def fresh_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s architecture with re-initialised parameters and no hooks attached.

    Every submodule with ``reset_parameters`` is reset (uses torch's global RNG: seed it, or call
    inside ``torch.random.fork_rng``). Forward/backward hooks (e.g. Opacus' per-sample gradient hooks)
    are dropped from the copy.

    Example::

        >>> a = nn.Linear(3, 2)
        >>> b = fresh_copy(a)
        >>> b.weight.shape == a.weight.shape, bool(torch.equal(a.weight, b.weight))
        (True, False)
    """
    from lightning_privacy._compat import remove_module_hooks  # lazily: _compat imports Lightning

    clone = copy.deepcopy(model)
    for module in clone.modules():
        remove_module_hooks(module)
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()
    for p in clone.parameters():
        p.requires_grad_(True)
        p.grad = None
    return clone.cpu()


def _train_helper(
    helper: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, batch_size: int, seed: int
) -> nn.Module:
    """Adam on cross-entropy; keep the epoch with the lowest loss on a 10% synthetic validation split."""
    gen = torch.Generator().manual_seed(seed)
    n = len(y)
    perm = torch.randperm(n, generator=gen)
    n_val = max(1, n // 10)
    val, tr = perm[:n_val], perm[n_val:]
    opt = torch.optim.Adam(helper.parameters(), lr=lr)
    best, best_state = float("inf"), copy.deepcopy(helper.state_dict())
    for _ in range(epochs):
        helper.train()
        order = tr[torch.randperm(len(tr), generator=gen)]
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            opt.zero_grad()
            F.cross_entropy(helper(x[idx]), y[idx]).backward()
            opt.step()
        val_loss = float(per_example_loss(helper, x[val], y[val]).mean())
        if val_loss < best:
            best, best_state = val_loss, copy.deepcopy(helper.state_dict())
    helper.load_state_dict(best_state)
    helper.eval()
    return helper


class _LossCNN(nn.Module):
    """Small CNN over an image; the standardised loss features are concatenated before the last layers."""

    def __init__(self, channels: int, side: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(32 * 4 + side, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.features(x), side], dim=1)).squeeze(1)


class _TorchClassifier:
    """Fit/predict_proba wrapper for :class:`_LossCNN`; picks the best of a few seeds on validation loss."""

    def __init__(self, *, epochs: int = 60, lr: float = 1e-3, batch_size: int = 64, seeds: int = 2, seed: int = 0):
        self.epochs, self.lr, self.batch_size, self.seeds, self.seed = epochs, lr, batch_size, seeds, seed

    def fit(self, images: np.ndarray, side: np.ndarray, y: np.ndarray) -> _TorchClassifier:
        x = torch.as_tensor(images, dtype=torch.float32)
        if x.ndim == 3:
            x = x[:, None]
        self._mu, self._sd = side.mean(axis=0), side.std(axis=0) + 1e-8
        z = torch.as_tensor((side - self._mu) / self._sd, dtype=torch.float32)
        t = torch.as_tensor(y, dtype=torch.float32)
        gen = torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(len(t), generator=gen)
        n_val = max(1, len(t) // 5)
        val, tr = perm[:n_val], perm[n_val:]
        best = (float("inf"), None)
        for k in range(self.seeds):
            with torch.random.fork_rng():
                torch.manual_seed(self.seed * 1000 + k)
                net = _LossCNN(x.shape[1], z.shape[1])
            opt = torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=1e-4)
            for _ in range(self.epochs):
                net.train()
                order = tr[torch.randperm(len(tr), generator=gen)]
                for i in range(0, len(order), self.batch_size):
                    idx = order[i : i + self.batch_size]
                    opt.zero_grad()
                    F.binary_cross_entropy_with_logits(net(x[idx], z[idx]), t[idx]).backward()
                    opt.step()
                net.eval()
                with torch.no_grad():
                    v = float(F.binary_cross_entropy_with_logits(net(x[val], z[val]), t[val]))
                if v < best[0]:
                    best = (v, copy.deepcopy(net))
        self.net = best[1]
        self.params_ = {"kind": "torch_cnn", "val_log_loss": round(best[0], 4)}
        return self

    @torch.no_grad()
    def predict_proba(self, images: np.ndarray, side: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(images, dtype=torch.float32)
        if x.ndim == 3:
            x = x[:, None]
        z = torch.as_tensor((side - self._mu) / self._sd, dtype=torch.float32)
        return torch.sigmoid(self.net(x, z)).numpy().astype(np.float64)


def train_classifier_model(
    features: np.ndarray,
    side: np.ndarray,
    y: np.ndarray,
    *,
    kind: str,
    seed: int,
    categorical_mask: Optional[np.ndarray] = None,
):
    """Fit the baseline/MIA classifier; returns ``score(features, side) -> P(member)`` and its settings.

    ``side`` holds the model-derived features, ``(n, k)`` (log-losses), appended to ``features``.

    ``kind="hgb"``: ``HistGradientBoostingClassifier`` (early stopping; ``categorical_mask`` marks
    categorical feature columns) with a grid search over :data:`HGB_GRID` on a fixed 80/20 split,
    scored by log-loss, refit on all rows. ``kind="torch"``: the small CNN (image-shaped features).
    """
    if kind == "hgb":
        flat = np.concatenate([features.reshape(len(y), -1), side], axis=1)
        fold = np.full(len(y), -1)
        fold[np.random.default_rng(seed).permutation(len(y))[: len(y) // 5]] = 0
        mask = None if categorical_mask is None else np.r_[categorical_mask, np.zeros(side.shape[1], dtype=bool)]
        search = GridSearchCV(
            HistGradientBoostingClassifier(
                max_iter=200, early_stopping=True, random_state=seed, categorical_features=mask
            ),
            HGB_GRID,
            scoring="neg_log_loss",
            cv=PredefinedSplit(fold),
            refit=True,
            n_jobs=1,
        ).fit(flat, y)
        model = search.best_estimator_

        def score(f: np.ndarray, z: np.ndarray) -> np.ndarray:
            return model.predict_proba(np.concatenate([f.reshape(len(z), -1), z], axis=1))[:, 1]

        return score, {"kind": "hist_gradient_boosting", **search.best_params_}
    clf = _TorchClassifier(seed=seed).fit(features, side, y)
    return clf.predict_proba, clf.params_


# ----------------------------------------------------------------------------- the audit
@contextlib.contextmanager
def _threads(num_threads: Optional[int]):
    """Limit OpenMP/BLAS (scikit-learn) and torch intra-op threads; restore them afterwards."""
    if num_threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with threadpool_limits(num_threads):
            yield
    finally:
        torch.set_num_threads(before)


def _check_int(name: str, value: Any, minimum: int) -> int:
    return check_int(name, value, minimum=minimum)


def _default_encode(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` arrays as the model's tensors: integer ``x`` (token ids from a user's generator) as int64, else float32."""
    x = np.asarray(data[0])
    x_dtype = torch.long if x.dtype.kind in "iub" else torch.float32
    return torch.as_tensor(x, dtype=x_dtype), torch.as_tensor(np.asarray(data[1]), dtype=torch.long)


def panoramia_audit(
    target: nn.Module,
    members: Any,
    *,
    encode: Optional[Callable[[Any], tuple]] = None,
    generator: Any = None,
    audit_size: Optional[int] = None,
    generator_size: Optional[int] = None,
    beta: float = 0.05,
    num_thresholds: int = 100,
    classifier: str = "auto",
    helper: Optional[nn.Module] = None,
    helper_epochs: int = 10,
    helper_lr: float = 1e-3,
    helper_batch_size: int = 256,
    helper_size: Optional[int] = None,
    top_rows: int = 10,
    seed: int = 0,
    num_threads: Optional[int] = 1,
    mia_features: str = "target_loss",
    column_names: Optional[tuple] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> PanoramiaResult:
    """Audit ``target`` with PANORAMIA (Algorithm 1), using only members and generated non-members.

    Args:
        target: the trained classifier ``f`` (logits over classes); never modified or retrained.
        members: a subset of ``target``'s training data the auditor holds — a table (e.g.
            :class:`~lightning_privacy.data.AdultTable`) or ``(x, y)`` arrays.
        encode: maps rows of ``members``' kind to the target's input ``(x float tensor, y long
            tensor)``; required for tables (e.g. ``AdultDataModule.to_dataset(t).tensors``); for
            arrays the default is ``x`` as float32 and ``y`` as int64.
        generator: ``fit(data)``/``sample(n)`` (:mod:`lightning_privacy.generators`). Default: for
            tables ``FilteredGenerator(TabularGenerator())``, for arrays ``DigitsGenerator()``.
            ``HeldOutRows(real_nonmembers)`` gives the paper's real-non-member comparison.
        audit_size: ``m = |D_in^te|`` (default: a third of the members).
        generator_size: ``|D_G|`` (default: a third of the members); the rest is ``D_in^tr``.
        beta: overall confidence level of ``(c_lb, {c + eps}_lb)`` (paper: 0.05).
        num_thresholds: recall levels tried (each test at ``beta / (2 * num_thresholds)``).
        classifier: ``"hgb"``, ``"torch"`` or ``"auto"`` (``"torch"`` for float image inputs ``(N, H, W)``
            or ``(N, C, H, W)``, ``"hgb"`` on flattened inputs otherwise).
        helper: the helper's architecture; default :func:`fresh_copy` of ``target``.
        helper_epochs, helper_lr, helper_batch_size: Adam training of the helper on synthetic rows
            (the epoch with the lowest synthetic validation loss is kept, as in the paper).
        helper_size: generated rows that train the helper (default ``|D_in^tr|``).
        top_rows: how many most-obviously-real audit points to report.
        seed: seeds the split, the generator draws (through the default generator), the game, the
            helper and the classifiers: the same seed gives the same numbers.
        mia_features: ``"target_loss"`` (the paper: ``x`` and the target's loss) or ``"calibrated"``
            (``x``, the target's and the helper's log-losses and their difference — the helper acting
            as a reference model; still a valid MIA for Proposition 2, since the helper never saw
            the audit rows).
        num_threads: threads for scikit-learn/OpenMP and torch during the audit (restored after);
            ``None`` leaves them alone. One thread is the default because boosted trees and small
            MLPs slow down several-fold from OpenMP spin-waiting on a busy shared CPU (measured: 1.1 s
            vs 5.4 s per gradient-boosting fit on Adult with another job running).
        column_names: ``(numeric names, categorical names)`` of table members, for the report's rows.
        progress: called with the name of each phase as it starts (:data:`PHASES`), e.g. to drive a
            progress bar (:func:`lightning_privacy.audits.audit_panoramia` does).

    Returns:
        A :class:`PanoramiaResult` (``.c_lb``, ``.c_plus_epsilon_lb``, ``.epsilon``, curves, rows).

    Raises:
        TypeError: for unsupported ``members`` (neither a table nor ``(x, y)``) or ``target``.
        ValueError: for too little member data, mismatched shapes between members and generated
            rows or between ``x`` and ``y``, or a bad setting (named with its value).

    Example::

        >>> from sklearn.datasets import load_digits
        >>> digits = load_digits()
        >>> x, y = digits.images[:600] / 16.0, digits.target[:600]
        >>> target = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> res = panoramia_audit(target, (x, y), classifier="hgb", seed=0)  # doctest: +SKIP
        >>> res.epsilon >= 0.0  # doctest: +SKIP
        True
    """
    if num_threads is not None:
        _check_int("num_threads", num_threads, 1)
    with _threads(num_threads):
        return _audit(
            target,
            members,
            encode=encode,
            generator=generator,
            audit_size=audit_size,
            generator_size=generator_size,
            beta=beta,
            num_thresholds=num_thresholds,
            classifier=classifier,
            helper=helper,
            helper_epochs=helper_epochs,
            helper_lr=helper_lr,
            helper_batch_size=helper_batch_size,
            helper_size=helper_size,
            top_rows=top_rows,
            seed=seed,
            mia_features=mia_features,
            column_names=column_names,
            progress=progress or (lambda phase: None),
        )


def _audit(
    target,
    members,
    *,
    encode,
    generator,
    audit_size,
    generator_size,
    beta,
    num_thresholds,
    classifier,
    helper,
    helper_epochs,
    helper_lr,
    helper_batch_size,
    helper_size,
    top_rows,
    seed,
    mia_features,
    column_names,
    progress,
) -> PanoramiaResult:
    if not isinstance(target, nn.Module):
        raise TypeError(f"`target` must be a torch.nn.Module, got {type(target).__name__}")
    data_kind = _data.kind(members, "members")
    n = _data.length(members)
    if classifier not in ("auto", "hgb", "torch"):
        raise ValueError(f"`classifier` must be 'auto', 'hgb' or 'torch', got {classifier!r}")
    if mia_features not in ("target_loss", "calibrated"):
        raise ValueError(f"`mia_features` must be 'target_loss' or 'calibrated', got {mia_features!r}")
    if encode is None:
        if data_kind == _data.TABLE:
            raise ValueError("`encode` is required for table members (e.g. AdultDataModule.to_dataset(t).tensors)")
        encode = _default_encode
    m = _check_int("audit_size", n // 3 if audit_size is None else audit_size, MIN_AUDIT)
    g = _check_int("generator_size", n // 3 if generator_size is None else generator_size, MIN_GENERATOR)
    _check_int("top_rows", top_rows, 0)
    _check_int("helper_epochs", helper_epochs, 1)
    if helper_size is not None:
        _check_int("helper_size", helper_size, 10)
    n_train = n - m - g
    if n_train < MIN_TRAIN:
        raise ValueError(
            f"too little member data: `members` has {n} rows but PANORAMIA needs generator_size ({g}) + "
            f"audit_size ({m}) + at least {MIN_TRAIN} rows to train the baseline and the MIA"
        )
    seconds: dict = {}
    clock = time.perf_counter()
    progress(PHASES[0])

    # Phase 1: split D_f, fit G on D_G, generate non-members (and the helper's training data).
    perm = np.random.default_rng(seed).permutation(n)
    d_g = _data.subset(members, perm[:g])
    d_in_te = _data.subset(members, perm[g : g + m])
    d_in_tr = _data.subset(members, perm[g + m :])
    if generator is None:
        generator = (
            FilteredGenerator(TabularGenerator(seed=seed), seed=seed)
            if data_kind == _data.TABLE
            else DigitsGenerator(seed=seed)
        )
    generator.fit(d_g)
    d_out_tr = generator.sample(n_train)
    d_out_te = generator.sample(m)
    d_helper = generator.sample(n_train if helper_size is None else helper_size)
    for name, rows, size in (("D_out^tr", d_out_tr, n_train), ("D_out^te", d_out_te, m)):
        _data.same_schema(members, rows, "members", f"generated {name}")
        if _data.length(rows) != size:
            raise ValueError(f"the generator returned {_data.length(rows)} rows for {name}, expected {size}")
    seconds["generator"] = time.perf_counter() - clock

    # Phase 2a: encode, helper model h trained on synthetic data, losses of f and h.
    clock = time.perf_counter()
    s = np.random.default_rng([seed, 1]).integers(0, 2, m)
    both_te = _data.concat(d_in_te, d_out_te)
    audit_rows = _data.subset(both_te, np.where(s == 1, np.arange(m), m + np.arange(m)))
    train_rows = _data.concat(d_in_tr, d_out_tr)
    y_train = np.r_[np.ones(n_train), np.zeros(n_train)].astype(np.int64)
    x_tr, t_tr = encode(train_rows)
    x_au, t_au = encode(audit_rows)
    for name, (xx, tt), rows in (("training", (x_tr, t_tr), train_rows), ("audit", (x_au, t_au), audit_rows)):
        if len(xx) != _data.length(rows) or len(tt) != _data.length(rows):
            raise ValueError(
                f"`encode` returned {len(xx)} inputs / {len(tt)} labels for {_data.length(rows)} {name} rows"
            )
    x_h, t_h = encode(d_helper)
    progress(PHASES[1])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        h = fresh_copy(target if helper is None else helper)
        h = _train_helper(h, x_h, t_h, epochs=helper_epochs, lr=helper_lr, batch_size=helper_batch_size, seed=seed)
    try:
        f_tr, f_au = per_example_loss(target, x_tr, t_tr), per_example_loss(target, x_au, t_au)
    except Exception as err:  # a clearer message for inputs the target cannot take
        raise ValueError(f"the target model cannot score the encoded rows of shape {tuple(x_tr.shape)}: {err}") from err
    h_tr, h_au = per_example_loss(h, x_tr, t_tr), per_example_loss(h, x_au, t_au)
    seconds["helper_and_losses"] = time.perf_counter() - clock

    # Phase 2b: baseline b (x + helper loss) and MIA (x + target loss), the same classifier family.
    clock = time.perf_counter()
    kind = classifier
    if kind == "auto":  # the CNN for images; trees for anything else (flattened)
        kind = "torch" if (data_kind == _data.ARRAYS and x_tr.ndim in (3, 4) and x_tr.is_floating_point()) else "hgb"
    if kind == "torch" and x_tr.ndim not in (3, 4):
        raise ValueError(f"`classifier`='torch' needs image inputs (N, H, W) or (N, C, H, W), got {tuple(x_tr.shape)}")
    mask = None
    if data_kind == _data.TABLE:  # raw columns (numeric + categorical codes + label): compact for trees
        coder = _data.FeatureCoder().fit(train_rows)
        feats_tr, feats_au, mask = coder.transform(train_rows), coder.transform(audit_rows), coder.categorical_mask
    else:
        feats_tr, feats_au = x_tr.cpu().numpy(), x_au.cpu().numpy()
    log = lambda v: np.log(v + 1e-12)[:, None]  # noqa: E731
    b_tr, b_au = log(h_tr), log(h_au)
    if mia_features == "target_loss":
        a_tr, a_au = log(f_tr), log(f_au)
    else:  # the target's loss calibrated by the helper's (a reference model trained on synthetic data)
        a_tr = np.concatenate([log(f_tr), log(h_tr), log(f_tr) - log(h_tr)], axis=1)
        a_au = np.concatenate([log(f_au), log(h_au), log(f_au) - log(h_au)], axis=1)
    progress(PHASES[2])
    base_score, base_params = train_classifier_model(
        feats_tr, b_tr, y_train, kind=kind, seed=seed, categorical_mask=mask
    )
    progress(PHASES[3])
    mia_score, mia_params = train_classifier_model(feats_tr, a_tr, y_train, kind=kind, seed=seed, categorical_mask=mask)
    t_b, t_a = base_score(feats_au, b_au), mia_score(feats_au, a_au)
    seconds["classifiers"] = time.perf_counter() - clock

    progress(PHASES[4])
    bounds = panoramia_bounds(s, t_b, t_a, beta=beta, num_thresholds=num_thresholds)
    top = np.argsort(-t_b, kind="stable")[:top_rows]
    return PanoramiaResult(
        bounds=bounds,
        labels=s,
        baseline_scores=t_b,
        mia_scores=t_a,
        audit_rows=audit_rows,
        top_real=top,
        sizes={
            "members": n,
            "generator": g,
            "train_members": n_train,
            "train_generated": n_train,
            "audit": m,
            "audit_members": int(s.sum()),
            "helper_train": _data.length(d_helper),
        },
        seconds=seconds,
        baseline_params=base_params,
        mia_params=mia_params,
        acceptance_rate=float(getattr(generator, "acceptance_rate", float("nan"))),
        mia_features=mia_features,
        column_names=column_names,
        warnings=information_warnings(bounds),
    )


# ----------------------------------------------------------------------------- reporting
def describe_row(rows: Any, index: int, column_names: Optional[tuple] = None) -> str:
    """One audit row as text: ``name=value`` pairs for tables.

    ``column_names`` is ``(numeric names, categorical names)``; names that do not fit the table's
    columns (or ``None``) give ``num0, ...`` and ``cat0, ...``. This module knows no data set's columns:
    the caller names them (:func:`lightning_privacy.audits.audit_panoramia` does for Adult tables).

    Example::

        >>> from types import SimpleNamespace
        >>> rows = SimpleNamespace(numeric=np.array([[39.0]]), categorical=np.array([["x"]]), labels=np.array([1]))
        >>> describe_row(rows, 0, (["age"], ["job"])), describe_row(rows, 0)
        ('age=39, job=x, label=1', 'num0=39, cat0=x, label=1')
    """
    if _data.kind(rows) == _data.TABLE:
        numeric, categorical = np.asarray(rows.numeric)[index], np.asarray(rows.categorical)[index]
        given_num, given_cat = column_names if column_names is not None else ((), ())
        num_names = list(given_num) if len(given_num) == len(numeric) else [f"num{j}" for j in range(len(numeric))]
        cat_names = (
            list(given_cat) if len(given_cat) == len(categorical) else [f"cat{j}" for j in range(len(categorical))]
        )
        parts = [f"{k}={v:g}" for k, v in zip(num_names, numeric)] + [
            f"{k}={v}" for k, v in zip(cat_names, categorical)
        ]
        return ", ".join(parts + [f"label={int(np.asarray(rows.labels)[index])}"])
    x = np.asarray(rows[0])[index]
    return f"array of shape {x.shape}, mean {x.mean():.3g}, label={int(np.asarray(rows[1])[index])}"


def summary_text(result: PanoramiaResult) -> str:
    """Markdown report: the three numbers, what ``eps_tilde`` means, and the most obviously real rows.

    Example::

        >>> from lightning_privacy.analysis.panoramia import panoramia_bounds
        >>> s = np.array([1, 0] * 50)
        >>> b = panoramia_bounds(s, np.zeros(100), s.astype(float), num_thresholds=5)
        >>> r = PanoramiaResult(b, s, np.zeros(100), s.astype(float), (np.zeros((100, 2)), s), np.arange(2))
        >>> print(summary_text(r).splitlines()[0])
        ### PANORAMIA audit: eps_tilde = 2.191 (c_lb = 0.000, {c+eps}_lb = 2.191, confidence 95%)
    """
    b = result.bounds

    def best(bound: float, true_positives: np.ndarray, guesses: np.ndarray, index: int, what: str) -> str:
        if bound <= 0:  # every level gave 0: argmax is the first, "best at 1/1" would mislead
            return f"no recall level rejects {what} = 0"
        return f"best at {true_positives[index]}/{guesses[index]} correct guesses"

    lines = [
        f"### PANORAMIA audit: eps_tilde = {b.epsilon:.3f} (c_lb = {b.c_lb:.3f}, "
        f"{{c+eps}}_lb = {b.c_plus_epsilon_lb:.3f}, confidence {100 * (1 - b.beta):.0f}%)",
        "",
    ]
    for warning in result.warnings:  # as lightning_privacy.audits._common.warnings_markdown writes them
        lines += [f"> **Warning:** {warning}", ""]
    lines += [
        f"**What this means.** {MEANING}",
        "",
        f"Audit game: m = {len(result.labels)} points, {b.members} real members; "
        f"{len(b.counts)} recall levels, each test at beta' = {b.per_threshold_beta:.2e}. "
        f"Baseline {best(b.c_lb, b.baseline_true_positives, b.baseline_guesses, b.baseline_best, 'c')}, "
        f"MIA {best(b.c_plus_epsilon_lb, b.mia_true_positives, b.mia_guesses, b.mia_best, 'c+eps')}.",
    ]
    if result.sizes:
        lines += ["", "Sizes: " + ", ".join(f"{k}={v}" for k, v in result.sizes.items())]
    if len(result.top_real):
        lines += [
            "",
            "**Rows the baseline finds most obviously real** (Appendix C.4: rare or extreme real values that the "
            "generator does not reproduce raise c_lb and can hide leakage):",
            "",
        ]
        for rank, i in enumerate(result.top_real, 1):
            kind = "member" if result.labels[i] == 1 else "generated"
            lines.append(
                f"{rank}. score {result.baseline_scores[i]:.3f} ({kind}): {describe_row(result.audit_rows, int(i), result.column_names)}"
            )
    return "\n".join(lines)

"""Reference models for membership attacks, trained by a Lightning Trainer on random halves of a population.

:func:`train_references` and :class:`ReferenceModels` live here, above the callbacks layer: training a reference
drives Lightning and, with ``dp_sgd=``, :class:`~lightning_privacy.DPSGD`, while the audits only need the models'
outputs (:func:`lightning_privacy.audits.audit_membership`). ``lightning_privacy.callbacks.references`` re-exports
them. (Until 0.2.0 they were also ``lightning_privacy.audits.train_references``; the audits layer no longer reaches
up to Lightning training, so import them from here.)
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from lightning_privacy.audits.membership import _fingerprint

__all__ = ["CACHE_VERSION", "ReferenceModels", "recipe_like", "train_references"]

CACHE_VERSION = 1
_META = "references.json"


def _dataset(name: str, loader: Any):
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        raise TypeError(
            f"Expected argument `{name}` to be a DataLoader over a map-style dataset (reference models train on "
            f"subsets of it), but got {type(loader).__name__}."
        )
    return dataset


def _balanced_inside(rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(k, rows)``: each row is in exactly ⌊k/2⌋ references (one more with probability ½ for odd k)."""
    size = np.full(rows, k // 2) + (rng.random(rows) < 0.5 if k % 2 else 0)
    ranks = rng.random((rows, k)).argsort(axis=1).argsort(axis=1)
    return (ranks < size[:, None]).T


def _recipe(trainer_kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """What the cache compares of the training recipe: plain Trainer arguments and each callback's ``state_key``
    (e.g. DPSGD's σ and C); other values by type name."""
    out: Dict[str, Any] = {}
    for key, value in sorted(trainer_kwargs.items()):
        if key == "callbacks":
            callbacks = value if isinstance(value, (list, tuple)) else [value]
            out[key] = [getattr(cb, "state_key", type(cb).__qualname__) for cb in callbacks]
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = type(value).__qualname__
    return out


def _check_trainer_kwargs(trainer_kwargs: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if trainer_kwargs is None or not isinstance(trainer_kwargs, Mapping):
        raise ValueError(
            "Expected argument `trainer_kwargs` to be a dict with `max_epochs` or `max_steps` (reference models are "
            f"trained like the audited model), but got {trainer_kwargs!r}."
        )
    if "max_epochs" not in trainer_kwargs and "max_steps" not in trainer_kwargs:
        raise ValueError(
            "Expected `trainer_kwargs` to set `max_epochs` or `max_steps` (reference models are trained like the "
            f"audited model), but got keys {sorted(trainer_kwargs)}."
        )
    kwargs = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        devices=1,
        num_sanity_val_steps=0,
    )
    kwargs.update(trainer_kwargs)
    return kwargs


def _seed_dpsgd(callbacks: Any, seed: int, j: int) -> None:
    """Give reference j's DPSGD masks and noise of its own, from (seed, j), where the recipe leaves them to the OS.

    A reference is the auditor's model, not a release: nothing in it needs to stay secret, and seeding it makes the
    references (and the audit) the same on every run of the same seed, each reference with independent masks and noise.
    """
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]:
        # a DPSGD, or any callback with its two seeds (read as DPSGD's: None = drawn from the OS at every fit)
        seeded = all(hasattr(callback, name) for name in ("sampling_seed", "noise_seed"))
        if seeded and not getattr(callback, "secure_mode", False):
            sampling, noise = (int(v) for v in np.random.SeedSequence([seed, j, 3]).generate_state(2))
            if callback.sampling_seed is None:
                callback.sampling_seed = sampling
            if callback.noise_seed is None:
                callback.noise_seed = noise


def recipe_like(
    trainer: Any,
    pl_module: Any,
    *,
    model_factory: Optional[Callable[[], Any]] = None,
    trainer_kwargs: Optional[Mapping[str, Any]] = None,
) -> Tuple[Callable[[], Any], Dict[str, Any]]:
    """``(model_factory, trainer_kwargs)`` for :func:`train_references` that train references like the model that
    ``trainer`` trains (what :class:`~lightning_privacy.MembershipAudit` passes).

    ``model_factory``, else the module's class built from its saved hyper-parameters. ``trainer_kwargs``, else this
    run's ``max_steps`` (when set) or ``max_epochs``, on CPU, and, when a :class:`~lightning_privacy.DPSGD` with a
    noise multiplier trains the model, a DPSGD with the same σ, C, δ, loss reduction, gradient mode and
    ``fix_modules`` (no other callback of the Trainer).

    Raises:
        ValueError: without ``model_factory``, for a module that saved no hyper-parameters.

    Example::

        >>> import lightning.pytorch as pl
        >>> from lightning_privacy import DPSGD
        >>> from lightning_privacy.models import TabularMLP
        >>> trainer = pl.Trainer(max_epochs=3, callbacks=[DPSGD(noise_multiplier=1.3)], logger=False)
        >>> factory, kwargs = recipe_like(trainer, TabularMLP(4, hidden=(8,)))
        >>> type(factory()).__name__, kwargs["max_epochs"], kwargs["callbacks"][0].noise_multiplier
        ('TabularMLP', 3, 1.3)
    """
    if model_factory is None:
        if not pl_module.hparams:
            raise ValueError(
                f"reference models are built as {type(pl_module).__name__}(**hparams), but the module saved no "
                "hyper-parameters: call `self.save_hyperparameters()` in its __init__ or pass `model_factory`"
            )
        cls, hparams = type(pl_module), dict(pl_module.hparams)
        model_factory = lambda: cls(**hparams)  # noqa: E731
    if trainer_kwargs is not None:
        return model_factory, dict(trainer_kwargs)
    kwargs: Dict[str, Any] = {"accelerator": "cpu"}
    if trainer.max_steps is not None and trainer.max_steps > 0:
        kwargs["max_steps"] = trainer.max_steps
    else:
        kwargs["max_epochs"] = trainer.max_epochs
    from lightning_privacy.callbacks.dpsgd import DPSGD

    for cb in trainer.callbacks:
        if isinstance(cb, DPSGD) and cb.noise_multiplier is not None:  # the target's recipe: DP-SGD like it
            rule = getattr(cb, "clipping", None)
            clipping = {} if rule is None or rule.rule == "fixed" else {"clipping": rule.rule}
            if rule is not None and rule.automatic:
                clipping["stability"] = rule.stability
            elif rule is not None and rule.quantile:
                clipping.update(target_quantile=rule.target_quantile, clipping_learning_rate=rule.learning_rate,
                                count_noise_multiplier=rule.count_noise_multiplier)  # fmt: skip
            kwargs["callbacks"] = [
                DPSGD(
                    noise_multiplier=cb.noise_multiplier,
                    max_grad_norm=None if rule is not None and rule.automatic else cb.max_grad_norm,
                    delta=cb.delta,
                    loss_reduction=cb.loss_reduction,
                    grad_sample_mode=cb.grad_sample_mode,
                    fix_modules=cb.fix_modules,
                    **clipping,
                )
            ]
    return model_factory, kwargs


@contextlib.contextmanager
def _quiet_lightning(quiet: bool) -> Iterator[None]:
    """Lightning's info lines (accelerator banners, tips, "`Trainer.fit` stopped") at WARNING level while ``quiet``."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in loggers]
    if quiet:
        for log in loggers:
            log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


@dataclass
class ReferenceModels:
    """Reference models and which rows each trained on.

    Attributes:
        models: the trained modules (eval mode), ``k`` of them.
        inside_population: ``(k, n_population)`` booleans, reference ``k`` trained on population row ``i``.
        inside_targets: ``(k, n_targets)`` for the audited examples (members first) when they were mixed into the
            halves (online attacks), else ``None`` (offline: no reference saw them).
        population_fingerprint, targets_fingerprint: SHA-256 of the data (an audit checks it is given the same).
        seed: the seed of the halves and of training.
        trained: how many models this call trained (0: all from the cache).
        seconds: training time of each model trained by this call.
        cache_dir: where they are stored, if anywhere.
    """

    models: List[Any]
    inside_population: np.ndarray
    inside_targets: Optional[np.ndarray]
    population_fingerprint: str
    targets_fingerprint: Optional[str]
    seed: int
    trained: int = 0
    seconds: List[float] = field(default_factory=list)
    cache_dir: Optional[str] = None

    def __len__(self) -> int:
        return len(self.models)

    @property
    def online(self) -> bool:
        """Whether the audited examples are in some references' training sets."""
        return self.inside_targets is not None


def train_references(
    model_factory: Callable[[], Any],
    population_loader: Any,
    *,
    num_references: int,
    trainer_kwargs: Optional[Mapping[str, Any]] = None,
    cache_dir: Optional[str] = None,
    seed: int = 0,
    targets: Optional[Sequence[Any]] = None,
    dp_sgd: Optional[Mapping[str, Any]] = None,
    progress: Optional[bool] = None,
    verbose: bool = False,
) -> ReferenceModels:
    """Train ``num_references`` reference models with a Lightning Trainer on random halves of a population.

    Every population row is in exactly half of the references (⌊k/2⌋, plus one with probability ½ for odd
    ``k``), so each reference trains on about half the population. With ``targets`` (the audited member and
    non-member loaders, as given to :func:`audit_membership`) the audited examples are mixed into the halves the
    same way: the attacks then run *online* (IN and OUT references for every example); without them, *offline*.

    Each reference is ``model_factory()`` trained by ``lightning.pytorch.Trainer(**trainer_kwargs)`` on a
    shuffled loader with the population loader's batch size and collate function; the global torch RNG is
    seeded per reference inside :func:`torch.random.fork_rng` for its initial weights and its training (the
    caller's stream is left untouched, and the same ``seed`` gives the same references). Callbacks
    in ``trainer_kwargs`` are deep-copied for each reference.

    Args:
        model_factory: returns a fresh, untrained LightningModule of the audited model's architecture.
        population_loader: a DataLoader over a map-style dataset of rows neither member nor non-member.
        num_references: ``k ≥ 1`` (online attacks need ``k ≥ 2``).
        trainer_kwargs: ``Trainer`` arguments; must set ``max_epochs`` or ``max_steps`` (train the references
            like the audited model). Defaults added: no logger, no checkpoints, no progress bar, one device.
        cache_dir: a folder to store the models and their halves in; a second call with the same data, seed,
            ``num_references`` and recipe (plain ``trainer_kwargs`` values, each callback's ``state_key``) loads them
            and trains none (a missing model file is trained again).
        seed: seeds the halves (``SeedSequence(seed)``) and each reference's training.
        targets: ``(member_loader, nonmember_loader)`` to mix the audited examples into the halves (online).
        dp_sgd: train each reference with ``DPSGD(**dp_sgd)`` (e.g. the audited run's ``noise_multiplier``,
            ``max_grad_norm``, ``delta``): the recipe of a DP-SGD target, added to ``trainer_kwargs``' callbacks.
            Reference j's Poisson masks and noise are seeded from ``(seed, j)`` unless the recipe fixes them (a
            reference is the auditor's model, not a release): the same seed gives the same references on every run.
        progress: a bar over the references on stderr (``None``: only when stderr is a terminal).
        verbose: show what each reference's ``Trainer`` logs and warns (its banners, "`Trainer.fit` stopped", the
            callbacks' warnings). By default they are silenced: the references repeat the audited run's recipe, whose
            messages the user has seen, K times.

    Returns:
        :class:`ReferenceModels`.

    Raises:
        ValueError: for a bad ``num_references``, ``trainer_kwargs`` without a training length, or a
            ``cache_dir`` that holds references of other data or settings.
        TypeError: when a loader is not a DataLoader over a map-style dataset.
    """

    import torch
    from torch.utils.data import ConcatDataset, DataLoader, Subset

    from lightning_privacy.analysis._checks import expect_count
    from lightning_privacy.audits._common import progress_stages

    k = expect_count("num_references", num_references)
    if k < 1:
        raise ValueError(f"Expected argument `num_references` to be at least 1, but got {num_references!r}.")
    seed = expect_count("seed", seed)
    kwargs = _check_trainer_kwargs(trainer_kwargs)
    if dp_sgd is not None:
        from lightning_privacy.callbacks.dpsgd import DPSGD

        if not isinstance(dp_sgd, Mapping):
            raise TypeError(f"Expected argument `dp_sgd` to be a dict of DPSGD arguments, but got {dp_sgd!r}.")
        given = kwargs.get("callbacks") or []
        kwargs["callbacks"] = [*(given if isinstance(given, (list, tuple)) else [given]), DPSGD(**dict(dp_sgd))]
    datasets = [_dataset("population_loader", population_loader)]
    if targets is not None:
        if len(targets) != 2:
            raise ValueError(f"Expected `targets` = (member_loader, nonmember_loader), got {len(targets)} item(s).")
        datasets += [_dataset("targets[0]", targets[0]), _dataset("targets[1]", targets[1])]
    n_pop = len(datasets[0])
    rows = sum(len(d) for d in datasets)
    population_fp = _fingerprint(population_loader)
    targets_fp = _fingerprint(*targets) if targets is not None else None
    inside = _balanced_inside(rows, k, np.random.default_rng(np.random.SeedSequence(seed)))
    meta = {
        "version": CACHE_VERSION,
        "num_references": k,
        "seed": seed,
        "population_fingerprint": population_fp,
        "targets_fingerprint": targets_fp,
        "population_rows": n_pop,
        "rows": rows,
        "recipe": _recipe(kwargs),
    }
    folder = Path(cache_dir) if cache_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        stored_path = folder / _META
        if stored_path.is_file():
            stored = json.loads(stored_path.read_text())
            stored.pop("model_class", None)
            if stored != meta:
                diff = sorted(key for key in meta if stored.get(key) != meta[key])
                raise ValueError(
                    f"`cache_dir` {str(folder)!r} holds references trained with other {', '.join(diff)}; pass another "
                    "`cache_dir` or delete it."
                )
    data = ConcatDataset(datasets) if len(datasets) > 1 else datasets[0]
    models, seconds, trained = [], [], 0
    stages = [f"reference {j + 1}/{k}" for j in range(k)]
    with progress_stages("reference models", stages, enabled=progress) as advance:
        for j in range(k):
            advance(stages[j])
            path = folder / f"reference_{j}.pt" if folder is not None else None
            with torch.random.fork_rng(devices=[]):  # the initial weights, too, from this reference's seed
                torch.manual_seed(int(np.random.SeedSequence([seed, j, 2]).generate_state(1)[0]))
                model = model_factory()
            if path is not None and path.is_file():
                model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            else:
                import lightning.pytorch as pl

                rows_j = np.flatnonzero(inside[j]).tolist()
                generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, j]).generate_state(1)[0]))
                loader = DataLoader(
                    Subset(data, rows_j),
                    batch_size=population_loader.batch_size or 256,
                    shuffle=True,
                    generator=generator,
                    collate_fn=population_loader.collate_fn,
                )
                run_kwargs = dict(kwargs)
                if "callbacks" in run_kwargs:
                    run_kwargs["callbacks"] = copy.deepcopy(run_kwargs["callbacks"])
                    _seed_dpsgd(run_kwargs["callbacks"], seed, j)
                start = time.perf_counter()
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(np.random.SeedSequence([seed, j, 1]).generate_state(1)[0]))
                    with warnings.catch_warnings(), _quiet_lightning(not verbose):
                        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
                        warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # Lightning's, about torch's API
                        if not verbose:
                            warnings.simplefilter("ignore")
                        pl.Trainer(**run_kwargs).fit(model, train_dataloaders=loader)
                seconds.append(time.perf_counter() - start)
                trained += 1
                if path is not None:
                    torch.save(model.state_dict(), path)
            models.append(model.eval())
    if folder is not None:
        (folder / _META).write_text(json.dumps({**meta, "model_class": type(models[0]).__qualname__}, indent=1))
    return ReferenceModels(
        models=models,
        inside_population=inside[:, :n_pop],
        inside_targets=inside[:, n_pop:] if targets is not None else None,
        population_fingerprint=population_fp,
        targets_fingerprint=targets_fp,
        seed=seed,
        trained=trained,
        seconds=seconds,
        cache_dir=None if folder is None else str(folder),
    )

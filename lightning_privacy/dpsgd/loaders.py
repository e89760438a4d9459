"""Poisson sampling for Lightning's train loader, on every strategy.

Lightning has no public hook to replace the train dataloader whichever way it is supplied, so the swap
itself goes through :func:`lightning_privacy._compat.install_train_loader_transform` (the private-API
module, with the test that guards it); here the user's loader becomes a
:class:`~lightning_privacy.dpsgd.sampling.PoissonDataLoader` over the whole training set, of which this rank takes its
share (:mod:`lightning_privacy.dpsgd.sampling` holds the sampling itself and its guarantees).
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, RandomSampler

from lightning_privacy import _compat
from lightning_privacy.dpsgd import users
from lightning_privacy.dpsgd.sampling import (
    PoissonBatchSampler,
    PoissonDataLoader,
    replaced_sampler_name,
)

#: where q came from when the train loader drops its last, incomplete batch (q = 1/⌊N/batch size⌋, not 1/⌈N/batch size⌉)
DROP_LAST_ORIGIN = "1/len(train loader), drop_last=True: 1/⌊N/batch size⌋"


def users_of(callback: Any, dataset: Any) -> users.People:
    """The train dataset's people (:class:`~lightning_privacy.dpsgd.users.People`): ``user_ids`` as given, or read
    from each row's field of that name. The contribution bound's choice is keyed by the fit's sampling seed (the
    same on every rank; under ``secure_mode`` OS entropy in one process, and a fixed key under DDP, where the ranks
    must agree without a seed). A choice that changes between fits (a resume with a fresh seed) keeps the guarantee:
    every step still sees at most k rows of a person."""
    ids = callback.user_ids
    if isinstance(ids, str):
        ids = [_field(dataset[i], ids, i) for i in range(len(dataset))]
    if len(ids) != len(dataset):
        raise MisconfigurationException(
            f"DPSGD(user_ids=...) has {len(ids)} ids for a train dataset of {len(dataset)} rows: give one person per "
            "row, in the dataset's row order."
        )
    sampling = callback.sampling
    seed = sampling.seed if sampling.seed is not None else (None if sampling.world_size == 1 else 0)
    try:
        return users.People(ids, max_examples_per_user=callback.max_examples_per_user, seed=seed)
    except ValueError as error:
        raise MisconfigurationException(f"DPSGD(user_ids=...): {error}") from None


def _field(row: Any, name: str, index: int) -> Any:
    if isinstance(row, dict) and name in row:
        return row[name]
    if hasattr(row, name):
        return getattr(row, name)
    raise MisconfigurationException(
        f"DPSGD(user_ids={name!r}): row {index} of the train dataset ({type(row).__name__}) has no field {name!r}; "
        "give the person of each row as a sequence, or the name of a key every row carries."
    )


def install_poisson_sampling(trainer: pl.Trainer, callback: Any) -> None:
    """Make ``trainer`` draw its train batches by Poisson sampling (see module docstring)."""
    _compat.install_train_loader_transform(trainer, functools.partial(make_poisson_loader, trainer, callback))


def make_poisson_loader(trainer: pl.Trainer, callback: Any, loader: Any, *, warn: bool = True) -> PoissonDataLoader:
    """Convert one train loader; records (and checks) ``callback.sample_rate``, and records ``callback.dataset_size``.

    The sample rate is ``DPSGD(sample_rate=...)`` where given, else ``1 / len(loader)`` (the expected batch is the
    loader's batch size, as Opacus' ``make_private``) or an Opacus ``DPDataLoader``'s own rate; an epoch has
    ``len(loader)`` steps. ``1 / len(loader)`` makes the number of batches public: a neighbour with one row fewer
    has another q where ``N`` crosses a multiple of the batch size. The loader's ``batch_size`` is recorded as
    ``callback.loader_batch_size``, the default divisor of the noised sum (:func:`~lightning_privacy.dpsgd.settings.dp_divisor`).
    """
    if isinstance(loader, PoissonDataLoader):
        return loader
    if not isinstance(loader, DataLoader):
        raise MisconfigurationException(
            f"DPSGD needs a single torch DataLoader for training, got {type(loader).__name__}. Several train "
            "loaders (lists/dicts/CombinedLoader) cannot be Poisson-sampled as one dataset."
        )
    try:
        steps = len(loader)
    except TypeError as err:
        raise MisconfigurationException(
            f"DPSGD needs a train loader with a length (a map-style dataset), got one over "
            f"{type(loader.dataset).__name__}: {err}"
        ) from err
    if isinstance(loader, DPDataLoader):
        sample_rate, replaced = float(loader.sample_rate), "Opacus' DPDataLoader sampler"
        origin = "DPDataLoader.sample_rate"
    else:
        sample_rate, replaced = 1.0 / steps, replaced_sampler_name(loader)
        origin = DROP_LAST_ORIGIN if loader.drop_last else "1/len(train loader)"
    given = getattr(callback, "sample_rate_argument", None)
    if given is not None:  # DPSGD(sample_rate=q): q fixed without the dataset size (strict add/remove)
        if isinstance(loader, DPDataLoader) and abs(given - sample_rate) > 1e-12:
            raise MisconfigurationException(
                f"DPSGD(sample_rate={given!r}) and the train loader, an Opacus DPDataLoader of sample_rate "
                f"{sample_rate!r}, disagree: give one of them."
            )
        sample_rate, origin = given, "argument"
    if warn and origin == DROP_LAST_ORIGIN:
        size = len(loader.dataset)
        rank_zero_warn(
            f"DPSGD replaces the train loader's batches (drop_last=True"
            f"{', shuffle=True' if isinstance(loader.sampler, RandomSampler) else ''}) by Poisson sampling at q = "
            f"1/len(train loader) = 1/⌊N/batch size⌋ = 1/{steps} ({size} rows, batch_size={loader.batch_size}): "
            f"every row can join every step, none is dropped, and drop_last only lowered the step count per epoch "
            f"from {-(-size // loader.batch_size)} to {steps}. The report and the statement say where q came from; "
            "give DPSGD(sample_rate=...) to fix q yourself, or drop_last=False for q = 1/⌈N/batch size⌉."
        )
    if warn and replaced is not None:
        rank_zero_warn(
            f"DPSGD replaces the train loader's {replaced} by its own Poisson sampling (each row of the whole "
            f"training set joins each step's batch independently with probability {sample_rate:.4g}), which the "
            "privacy accounting assumes; the custom sampler is not used."
        )
    if callback.sample_rate is not None and abs(sample_rate - callback.sample_rate) > 1e-12:
        raise MisconfigurationException(
            f"The train loader changed its length between reloads (sample rate {callback.sample_rate:.6g} -> "
            f"{sample_rate:.6g}); DPSGD keeps one sample rate per run."
        )
    callback.sample_rate, callback.sample_rate_origin = sample_rate, origin
    callback.loader_batch_size = None if isinstance(loader, DPDataLoader) else loader.batch_size  # (the divisor)
    callback.dataset_size = len(loader.dataset)  # the whole training set (every rank's share), saved for audits
    units, num_units = None, len(loader.dataset)
    if getattr(callback, "privacy_unit", "example") == "user":  # people, or the rows kept under their bound
        people = callback.people = users_of(callback, loader.dataset)
        uls = callback.user_sampling
        units, num_units = (people.rows_of_people, people.num_people) if uls else (people.kept_rows, people.num_kept)
    sampler = PoissonBatchSampler(
        num_samples=num_units,
        units=units,
        sample_rate=sample_rate,
        steps=steps,
        seed=callback.sampling.seed,
        rank=callback.sampling.rank,
        world_size=callback.sampling.world_size,
        start_step=lambda: callback.ledger.steps,
        secure=callback.secure_mode,
    )
    try:
        return PoissonDataLoader(loader, sampler)
    except ValueError as err:
        raise MisconfigurationException(f"DPSGD cannot Poisson-sample this train loader: {err}") from err

"""Optional adapter to the Synthetic Data Vault's single-table synthesizers (``pip install sdv``).

:class:`SDVGenerator` wraps SDV's ``GaussianCopulaSynthesizer``, ``CTGANSynthesizer`` or
``TVAESynthesizer`` behind PANORAMIA's generator protocol (``fit(table)`` then ``sample(n)``), on the
same mixed numeric/categorical tables as :class:`~lightning_privacy.generators.TabularGenerator`
(e.g. :class:`~lightning_privacy.data.AdultTable`). The label is modelled as one more categorical
column, so it is generated jointly with the features.

SDV is imported only when an :class:`SDVGenerator` is built; ``import lightning_privacy.generators``
never imports it. SDV 2.0 installs beside this project's pinned torch / opacus / lightning / numpy /
scipy, but it needs ``pandas<3`` (it downgrades a pandas 3 install); the ``sdv`` extra
(``pip install "lightning-privacy[sdv]"``) pulls it in. smartnoise-synth (the paper's MST) is not
offered because it requires ``opacus<1``.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from lightning_privacy.generators import _data
from lightning_privacy.generators.base import check_sample_size

SYNTHESIZERS = {
    "gaussian_copula": "GaussianCopulaSynthesizer",
    "ctgan": "CTGANSynthesizer",
    "tvae": "TVAESynthesizer",
}
INSTALL_HINT = (
    'SDVGenerator needs the optional `sdv` package: `pip install sdv` (or `pip install "lightning-privacy[sdv]"`)'
)
_LABEL = "label"


def _import_sdv() -> tuple:
    """``(sdv.metadata, sdv.single_table)``, or an ``ImportError`` that says how to install SDV."""
    try:
        metadata = importlib.import_module("sdv.metadata")
        single_table = importlib.import_module("sdv.single_table")
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT}; importing it failed with: {err}") from err
    return metadata, single_table


class SDVGenerator:
    """An SDV single-table synthesizer as a PANORAMIA generator for tables.

    Args:
        synthesizer: ``"gaussian_copula"`` (default; fast), ``"ctgan"`` or ``"tvae"`` (neural; slow on
            CPU at SDV's default 300 epochs — pass e.g. ``epochs=10``).
        seed: seed of fitting (numpy and torch global RNGs, restored afterwards) and of sampling.
        **synthesizer_kwargs: passed to the SDV synthesizer (``epochs``, ``batch_size``,
            ``enable_gpu``, ``default_distribution``, ...).

    Raises:
        ImportError: when SDV is not installed (the message says ``pip install sdv``).
        ValueError: an unknown ``synthesizer``; :meth:`fit` on fewer than 2 rows; :meth:`sample`
            before :meth:`fit`.
        TypeError: :meth:`fit` on data that is not a table.

    Example (skipped when SDV is missing)::

        >>> from lightning_privacy.data import load_adult
        >>> table = load_adult("train").subset(range(500))
        >>> gen = SDVGenerator("gaussian_copula", seed=0).fit(table)  # doctest: +SKIP
        >>> fake = gen.sample(5)  # doctest: +SKIP
        >>> fake.numeric.shape, fake.categorical.shape, fake.labels.dtype  # doctest: +SKIP
        ((5, 6), (5, 8), dtype('int64'))
    """

    def __init__(self, synthesizer: str = "gaussian_copula", *, seed: int = 0, **synthesizer_kwargs: Any) -> None:
        if synthesizer not in SYNTHESIZERS:
            raise ValueError(f"`synthesizer` must be one of {sorted(SYNTHESIZERS)}, got {synthesizer!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"`seed` must be an int, got {seed!r}")
        self._metadata_mod, self._single_table = _import_sdv()
        version = getattr(importlib.import_module("sdv"), "__version__", "2")
        self._takes_dict = int(str(version).split(".")[0]) >= 2  # SDV 2 fits and samples {table_name: frame}
        self.synthesizer = synthesizer
        self.seed = int(seed)
        self.synthesizer_kwargs = dict(synthesizer_kwargs)
        self.model: Any = None  # the fitted SDV synthesizer

    def _frame(self, numeric: np.ndarray, categorical: np.ndarray, labels: np.ndarray) -> Any:
        import pandas as pd

        columns = {f"num_{j}": numeric[:, j] for j in range(numeric.shape[1])}
        columns.update({f"cat_{j}": categorical[:, j].astype(str) for j in range(categorical.shape[1])})
        columns[_LABEL] = labels.astype(str)
        return pd.DataFrame(columns)

    def fit(self, data: Any) -> SDVGenerator:
        numeric, categorical, labels = _data.table_arrays(data, "SDVGenerator")
        self._table_type, self._cat_dtype, self._label_dtype = type(data), categorical.dtype, labels.dtype
        self._d, self._k = numeric.shape[1], categorical.shape[1]
        frame = self._frame(numeric, categorical, labels)
        columns = {f"num_{j}": {"sdtype": "numerical"} for j in range(self._d)}
        columns.update({f"cat_{j}": {"sdtype": "categorical"} for j in range(self._k)})
        columns[_LABEL] = {"sdtype": "categorical"}
        metadata = self._metadata_mod.Metadata.load_from_dict(
            {"tables": {"table": {"columns": columns}}, "METADATA_SPEC_VERSION": "V1"}
        )
        cls = getattr(self._single_table, SYNTHESIZERS[self.synthesizer])
        model = cls(metadata, **self.synthesizer_kwargs)
        import torch  # SDV's neural synthesizers (ctgan) depend on torch

        np_state = np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                np.random.seed(self.seed)
                torch.manual_seed(self.seed)
                model.fit({"table": frame} if self._takes_dict else frame)
        finally:
            np.random.set_state(np_state)
        # SDV seeds its first sample() with a fixed constant; use ours (a private hook in SDV 1.x-2.x).
        from lightning_privacy._compat import seed_sdv_synthesizer  # lazily: _compat imports Lightning

        seed_sdv_synthesizer(model, self.seed)
        self.model = model
        return self

    def sample(self, n: int) -> Any:
        n = check_sample_size(n)
        if self.model is None:
            raise ValueError("SDVGenerator.sample called before fit")
        if n == 0:
            return self._table_type(
                numeric=np.zeros((0, self._d)),
                categorical=np.empty((0, self._k), dtype=self._cat_dtype),
                labels=np.zeros(0, dtype=np.int64),
            )
        frame = self.model.sample(num_rows=n)
        if isinstance(frame, dict):
            frame = next(iter(frame.values()))
        if len(frame) != n:  # SDV drops rows only under constraints, which we do not set
            raise RuntimeError(f"SDV returned {len(frame)} rows for num_rows={n}")
        numeric = frame[[f"num_{j}" for j in range(self._d)]].to_numpy(dtype=np.float64)
        categorical = frame[[f"cat_{j}" for j in range(self._k)]].to_numpy(dtype=str).astype(self._cat_dtype)
        labels = frame[_LABEL].to_numpy(dtype=str).astype(np.int64)
        return self._table_type(numeric=numeric, categorical=categorical.reshape(n, self._k), labels=labels)

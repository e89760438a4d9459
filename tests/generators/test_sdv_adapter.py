"""SDVGenerator: the optional SDV adapter (GaussianCopula / CTGAN / TVAE behind fit/sample).

The tests that fit SDV models skip when SDV is not installed (it is an optional extra); the
import-error and lazy-import tests always run.
"""

import subprocess
import sys

import numpy as np
import pytest

from lightning_privacy.data import load_adult
from lightning_privacy.generators import Generator


def _block_sdv(monkeypatch):
    for name in ("sdv", "sdv.metadata", "sdv.single_table"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import sdv...` raise ImportError


def test_missing_sdv_gives_clear_error(monkeypatch):
    _block_sdv(monkeypatch)
    from lightning_privacy.generators import SDVGenerator

    with pytest.raises(ImportError, match=r"pip install sdv"):
        SDVGenerator("gaussian_copula")


def test_unknown_synthesizer_rejected_without_sdv(monkeypatch):
    _block_sdv(monkeypatch)
    from lightning_privacy.generators import SDVGenerator

    with pytest.raises(ValueError, match="synthesizer"):
        SDVGenerator("mst")


def test_importing_generators_does_not_import_sdv():
    code = (
        "import sys, lightning_privacy.generators as g; "
        "from lightning_privacy.generators import *; "
        "assert 'sdv' not in sys.modules, 'sdv imported'; "
        "assert 'lightning_privacy.generators.sdv_adapter' in sys.modules"  # star-import resolved it lazily
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------- with SDV
@pytest.fixture(scope="module")
def adult():
    return load_adult("train").subset(np.arange(800))


@pytest.fixture(scope="module")
def sdv_generator():
    pytest.importorskip("sdv")
    from lightning_privacy.generators import SDVGenerator

    return SDVGenerator


SMALL = {"gaussian_copula": {}, "ctgan": {"epochs": 2, "batch_size": 200}, "tvae": {"epochs": 2, "batch_size": 200}}


@pytest.mark.parametrize("synthesizer", sorted(SMALL))
def test_schema_types_and_categories(adult, sdv_generator, synthesizer):
    gen = sdv_generator(synthesizer, seed=0, **SMALL[synthesizer])
    assert isinstance(gen, Generator)
    fake = gen.fit(adult).sample(50)
    assert type(fake) is type(adult)
    assert fake.numeric.shape == (50, adult.numeric.shape[1]) and fake.numeric.dtype == np.float64
    assert fake.categorical.shape == (50, adult.categorical.shape[1])
    assert fake.categorical.dtype == adult.categorical.dtype
    assert fake.labels.shape == (50,) and fake.labels.dtype == np.int64
    assert set(np.unique(fake.labels)) <= {0, 1}
    for j in range(adult.categorical.shape[1]):  # only categories the data has
        assert np.isin(fake.categorical[:, j], adult.categorical[:, j]).all()
    assert np.isfinite(fake.numeric).all()
    lo, hi = adult.numeric.min(axis=0), adult.numeric.max(axis=0)  # SDV enforces min/max by default
    assert ((fake.numeric >= lo) & (fake.numeric <= hi)).all()
    assert len(gen.sample(0).labels) == 0


@pytest.mark.parametrize("synthesizer", ["gaussian_copula", "ctgan"])
def test_reproducible_from_seed(adult, sdv_generator, synthesizer):
    def draw(seed):
        fake = sdv_generator(synthesizer, seed=seed, **SMALL[synthesizer]).fit(adult).sample(30)
        return fake.numeric, fake.categorical, fake.labels

    a, b, c = draw(3), draw(3), draw(4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_fit_leaves_global_rngs_alone(adult, sdv_generator):
    import torch

    np.random.seed(123)
    torch.manual_seed(123)
    expected = np.random.random(), float(torch.rand(1))
    np.random.seed(123)
    torch.manual_seed(123)
    sdv_generator("ctgan", seed=0, **SMALL["ctgan"]).fit(adult)
    assert (np.random.random(), float(torch.rand(1))) == expected


def test_errors(adult, sdv_generator):
    gen = sdv_generator("gaussian_copula")
    with pytest.raises(ValueError, match="before fit"):
        gen.sample(3)
    with pytest.raises(TypeError, match="tables"):
        gen.fit((np.zeros((4, 2)), np.zeros(4, dtype=int)))
    with pytest.raises(ValueError, match="at least 2 rows"):
        gen.fit(adult.subset([0]))
    with pytest.raises(ValueError, match="non-negative"):
        gen.fit(adult).sample(-1)

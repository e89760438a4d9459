import gzip
import shutil

import numpy as np
import pytest

from lightning_privacy.data import AdultDataModule, AdultEncoder, load_adult
from lightning_privacy.data.adult import CATEGORICAL, NUMERIC, split_indices


def test_cleaning_matches_the_provenance_counts():
    train, test = load_adult("train"), load_adult("test")
    assert len(train) == 30_162 and len(test) == 15_060  # rows with "?" dropped
    assert set(np.unique(test.labels)) == {0, 1}  # "<=50K." / ">50K." parsed: trailing period stripped
    assert not (train.categorical == "?").any() and not (test.categorical == "?").any()
    assert train.numeric.shape == (30_162, len(NUMERIC)) and train.categorical.shape[1] == len(CATEGORICAL)


def test_user_path_with_plain_files_gives_the_same_rows(tmp_path):
    from importlib import resources

    for name in ("adult.data", "adult.test"):
        src = resources.files("lightning_privacy.data") / "adult" / f"{name}.gz"
        with gzip.open(src, "rb") as fin, open(tmp_path / name, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    bundled, user = load_adult("test"), load_adult("test", tmp_path)
    np.testing.assert_array_equal(bundled.numeric, user.numeric)
    np.testing.assert_array_equal(bundled.labels, user.labels)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`split` must be one of"):
        load_adult("validation")
    with pytest.raises(FileNotFoundError, match="`path`="):
        load_adult("train", "/nonexistent")
    with pytest.raises(ValueError, match="`val_fraction` must be in"):
        AdultDataModule(val_fraction=1.0)
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        AdultDataModule(batch_size=0)


def test_encoder_metadata_describes_every_column():
    table = load_adult("train")
    enc = AdultEncoder().fit(table)
    x = enc.transform(table)
    age = enc.numeric_columns["age"]
    assert age.column == 0 and age.values[0] == 17 and age.values[-1] == 90 and len(age.values) == 72
    np.testing.assert_allclose(age.decode(x[:, 0]), table.numeric[:, 0], atol=1e-3)  # float32 round trip
    np.testing.assert_allclose(x[:, :6].mean(axis=0), 0, atol=1e-4)
    for group in enc.one_hot_groups.values():
        np.testing.assert_array_equal(x[:, list(group.columns)].sum(axis=1), 1)  # exactly one hot per group
    covered = sorted(c for g in enc.groups.values() for c in (g.columns if hasattr(g, "columns") else (g.column,)))
    assert covered == list(range(enc.num_features))


def test_datamodule_split_is_deterministic_and_disjoint():
    train_idx, val_idx = split_indices(30_162, 0.1, 0)
    assert len(val_idx) == 3_016 and not set(train_idx) & set(val_idx)
    np.testing.assert_array_equal(split_indices(30_162, 0.1, 0)[1], val_idx)
    dm = AdultDataModule(batch_size=128)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    assert x.shape == (27_146, 104) and y.dtype.is_floating_point is False
    assert len(dm.member_dataloader()) == -(-27_146 // 128)


def test_datamodule_saves_its_hyperparameters_in_checkpoints(tmp_path):
    import lightning.pytorch as pl
    import torch

    from lightning_privacy.models import TabularMLP

    dm = AdultDataModule(batch_size=512, seed=3, val_fraction=0.05)
    assert dict(dm.hparams) == dict(path=None, batch_size=512, val_fraction=0.05, seed=3, num_workers=0)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(TabularMLP(104, hidden=(8,)), datamodule=dm)
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    saved = torch.load(tmp_path / "model.ckpt", weights_only=True)["datamodule_hyper_parameters"]
    assert saved["batch_size"] == 512 and saved["seed"] == 3
    again = AdultDataModule.load_from_checkpoint(tmp_path / "model.ckpt")
    assert (again.batch_size, again.seed, again.val_fraction) == (512, 3, 0.05)

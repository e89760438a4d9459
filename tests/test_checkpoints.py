"""lightning_privacy.checkpoints: a DPSGD(fix_modules=True) checkpoint loads into the user's own class, per layer type."""

import warnings

import lightning
import pytest
import torch
from opacus.layers import DPGRU, DPLSTM, DPMultiheadAttention
from torch import nn

from lightning_privacy.audits import audit_epsilon_star, load_checkpoint
from lightning_privacy.checkpoints import fixed_modules, replay_fixes, training_set_size
from tests._fixed_checkpoints import N_TRAIN, train_fixed, without_record
from tests._user_models import KINDS, Net

REPLACED = {
    "attention": ("block.self_attn", "MultiheadAttention", DPMultiheadAttention),
    "lstm": ("rnn", "LSTM", DPLSTM),
    "gru": ("rnn", "GRU", DPGRU),
    "batchnorm": ("body.1", "BatchNorm1d", nn.GroupNorm),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fixed")
    return {kind: train_fixed(kind, folder) for kind in KINDS}


def _outputs(model, dm):
    with torch.no_grad():
        return model.eval()(dm.val_set.tensors[0])


@pytest.mark.parametrize("kind", KINDS)
def test_dpsgd_records_what_it_replaced_and_the_training_set_size(trained, kind):
    _, _, path = trained[kind]
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # plain strings and ints only
    name, old, new = REPLACED[kind]
    groups = {"num_groups": 1} if kind == "batchnorm" else {}  # (DPSGD's GroupNorm(1, C) for a BatchNorm1d)
    assert fixed_modules(checkpoint) == [{"name": name, "old": old, "new": new.__name__, **groups}]
    assert training_set_size(checkpoint) == N_TRAIN
    assert checkpoint["datamodule_hyper_parameters"]["n_train"] == N_TRAIN


@pytest.mark.parametrize("kind", KINDS)
def test_load_checkpoint_replaces_the_same_layer_and_computes_what_was_trained(trained, kind):
    model, dm, path = trained[kind]
    with pytest.raises(RuntimeError, match="state_dict"):  # the user's class as it builds itself refuses the weights
        Net.load_from_checkpoint(path, weights_only=True)
    name, old, new = REPLACED[kind]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loaded = load_checkpoint(Net, path)
    messages = [str(w.message) for w in record if "DPSGD(fix_modules=True)" in str(w.message)]
    assert len(messages) == 1 and f"{name} ({old} → {new.__name__})" in messages[0]
    assert type(loaded) is Net and loaded.hparams.kind == kind
    assert isinstance(loaded.get_submodule(name), new)
    assert torch.allclose(_outputs(loaded, dm), _outputs(model, dm), atol=1e-6)
    result = audit_epsilon_star(loaded, dm.train_dataloader(), dm.val_dataloader(), warn=False)
    assert result.to_dict()["num_members"] == N_TRAIN


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_without_the_record_names_dpsgd_fix_modules_and_the_fix(trained, kind, tmp_path):
    model, dm, path = trained[kind]
    old = without_record(path, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match=r"DPSGD\(fix_modules=True\).*`load_checkpoint\(\.\.\., fix_modules=True\)`"):
        load_checkpoint(Net, old)
    with pytest.warns(UserWarning, match=REPLACED[kind][0]):
        loaded = load_checkpoint(Net, old, fix_modules=True)
    assert torch.allclose(_outputs(loaded, dm), _outputs(model, dm), atol=1e-6)


def test_a_bare_state_dict_loads_with_fix_modules(trained, tmp_path):
    model, dm, _ = trained["attention"]
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=r"block\.self_attn\.qlinear\.weight.*DPSGD\(fix_modules=True\)"):
        load_checkpoint(Net, tmp_path / "weights.pt")
    with pytest.warns(UserWarning, match="block.self_attn"):
        loaded = load_checkpoint(Net, tmp_path / "weights.pt", fix_modules=True)
    assert torch.allclose(_outputs(loaded, dm), _outputs(model, dm), atol=1e-6)


def test_a_record_that_does_not_fit_the_class_is_refused_naming_the_module(trained):
    with pytest.raises(ValueError, match=r"block\.self_attn \(MultiheadAttention → DPMultiheadAttention\).*no module"):
        load_checkpoint(Net, trained["attention"][2], kind="lstm")
    with pytest.raises(ValueError, match=r"rnn \(LSTM → DPLSTM\).*Net\.rnn is a GRU"):
        load_checkpoint(Net, trained["lstm"][2], kind="gru")


def test_replay_leaves_a_module_already_of_the_new_class():
    model = nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(4, 4))
    kept = model[1]
    assert replay_fixes(model, [{"name": "1", "old": "BatchNorm1d", "new": "GroupNorm"}]) == []
    assert model[1] is kept


def test_without_dpsgd_nothing_is_recorded_and_nothing_replaced(tmp_path):
    model = Net(kind="lstm")
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}
    torch.save({**checkpoint, "pytorch-lightning_version": lightning.__version__}, tmp_path / "plain.ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing replaced
        loaded = load_checkpoint(Net, tmp_path / "plain.ckpt")
    assert type(loaded.rnn) is nn.LSTM
    checkpoint = torch.load(tmp_path / "plain.ckpt", weights_only=True)
    assert fixed_modules(checkpoint) is None and training_set_size(checkpoint) is None

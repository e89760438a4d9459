"""`lightning-privacy audit membership --model DIR` on a folder `save_pretrained` wrote, read offline: a tiny random
GPT-2 (full weights) and LoRA adapters over a tiny Llama are saved, then audited from their folders exactly as a hub
model's downloaded files would be (``from_pretrained(DIR, local_files_only=True)``); a folder that holds neither
``config.json`` nor ``adapter_config.json`` is refused in one line naming it."""

from __future__ import annotations

import json
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from lightning_privacy import cli
from tests.callbacks._language_models import hugging_face_model

pytest.importorskip("transformers")

DATA_MODULE = '''
"""The sequences the saved model is audited on: members from train_dataloader(), non-members from val_dataloader()."""
import lightning.pytorch as pl
from torch.utils.data import DataLoader

from tests.callbacks._language_models import PaddedSequences


class Sequences(pl.LightningDataModule):
    def __init__(self, n: int = 16):
        super().__init__()
        self.train_set, self.val_set = PaddedSequences(n, seed=1), PaddedSequences(n, seed=2)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)
'''

DATA = ("--datamodule", "lm_lp_folder:Sequences")
SIGNAL = "lightning_privacy.functional.sequence_loss:causal_lm_signal"


@pytest.fixture
def audit(tmp_path, monkeypatch, capsys):
    """``audit(*args)``: ``lightning-privacy audit membership ...`` through ``cli.main`` from ``tmp_path`` (with the
    datamodule's file there), as a process's ``(returncode, stdout, stderr)``."""
    (tmp_path / "lm_lp_folder.py").write_text(textwrap.dedent(DATA_MODULE), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(*args):
        code = cli.main(["audit", "membership", *map(str, args)])
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    yield run
    sys.modules.pop("lm_lp_folder", None)


def _saved(kind: str, folder, seed: int = 0):
    torch.manual_seed(seed)
    model = hugging_face_model(kind)
    model.save_pretrained(folder)
    return model


def test_a_save_pretrained_folder_is_audited_offline_with_loss_and_ezmia_against_a_base_folder(tmp_path, audit):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    _saved("gpt2", base, seed=0)
    _saved("gpt2", tuned, seed=1)  # stands for the fine-tuned weights: another model of the same shape

    loss = audit("--model", tuned, *DATA, "--attack", "loss", "--signal", SIGNAL, "--json")
    assert loss.returncode == 0, loss.stderr
    out = json.loads(loss.stdout)
    assert out["num_members"] == 16 and out["model"] == str(tuned) and out["checkpoint"] is None
    assert "save_pretrained folder, read offline" in loss.stderr

    ezmia = audit("--model", tuned, *DATA, "--attack", "ezmia", "--base-model", base, "--json")
    assert ezmia.returncode == 0, ezmia.stderr
    out = json.loads(ezmia.stdout)
    assert out["num_members"] == 16 and out["base_model"] == str(base) and 0.0 <= out["audit/ezmia_auc"] <= 1.0


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_a_peft_adapter_folder_is_scored_against_its_base_with_the_adapters_disabled(tmp_path, audit):
    peft = pytest.importorskip("peft")
    base, adapters = tmp_path / "base", tmp_path / "adapters"
    model = _saved("llama", base)
    model = type(model).from_pretrained(base, local_files_only=True)  # the adapters record this folder as their base
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # LoRA's B starts at zero: "fine-tune" it so the adapters change the logits
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    lora.save_pretrained(adapters)

    done = audit("--model", adapters, *DATA, "--attack", "ezmia", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["num_members"] == 16 and out["base_model"] == "the checkpoint's model with its adapters disabled"


def test_a_folder_that_save_pretrained_did_not_write_is_refused_naming_it(tmp_path, audit):
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    done = audit("--model", empty, *DATA, "--attack", "loss", "--signal", SIGNAL)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"lightning-privacy audit membership: error: `--model` {str(empty)!r} is a folder without config.json or "
        "adapter_config.json, so not one `save_pretrained` wrote"
    )
    rmia = audit("--model", empty, *DATA, "--attack", "rmia")  # no reference models from a folder: before loading
    assert rmia.returncode == 2 and "`--attack rmia` trains reference models" in rmia.stderr
    no_weights = audit(*DATA, "--attack", "loss", "--signal", SIGNAL)
    assert no_weights.returncode == 2 and "`--checkpoint` is required" in no_weights.stderr


@pytest.mark.filterwarnings("ignore:.*fan_in_fan_out.*")
def test_the_language_model_example_loads_its_model_from_a_save_pretrained_folder(tmp_path):
    """``examples/dp_lora_language_model.py --model DIR``: the folder's weights, read offline, under the LoRA adapters."""
    pytest.importorskip("peft")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "dp_lora_language_model.py"
    spec = importlib.util.spec_from_file_location("dp_lora_language_model_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    saved = example.base_model()  # the example's tiny GPT-2, written as a hub download would be
    saved.save_pretrained(tmp_path / "gpt2")
    loaded = example.base_model(str(tmp_path / "gpt2"))
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()))
    lm = example.CausalLM(str(tmp_path / "gpt2"), lora_rank=4)
    batch = example.MarkovSequences(2, seed=0)[:2]
    assert lm(**batch).shape == (2, example.LENGTH, example.VOCAB)


def test_audit_epsilon_star_scores_a_save_pretrained_folder_offline(tmp_path, audit, capsys):
    """``audit epsilon-star --model DIR``: the folder's sequence losses, the same Epsilon* as the library's on them."""
    from lightning_privacy.audits import audit_epsilon_star
    from lightning_privacy.functional.sequence_loss import causal_lm_signal

    saved = _saved("gpt2", tmp_path / "tuned").eval()

    def run(*args):
        code = cli.main(["audit", "epsilon-star", *map(str, args)])
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    done = run("--model", tmp_path / "tuned", *DATA, "--signal", SIGNAL, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["num_members"] == 16 and out["model"] == str(tmp_path / "tuned") and out["checkpoint"] is None
    import lm_lp_folder  # the datamodule the `audit` fixture wrote and put on sys.path

    dm = lm_lp_folder.Sequences()
    want = audit_epsilon_star(saved, dm.train_dataloader(), dm.val_dataloader(), signal_fn=causal_lm_signal, warn=False)
    assert out["audit/epsilon_star"] == want.to_dict()["audit/epsilon_star"]
    for args, message in (
        (("--checkpoint", "x.ckpt"), "it holds the weights, so drop `--checkpoint`"),
        (("--member-losses", "m.npy", "--nonmember-losses", "n.npy"), "give it or loss files, not both"),
    ):
        refused = run("--model", tmp_path / "tuned", *DATA, "--signal", SIGNAL, *args)
        assert refused.returncode == 2 and message in refused.stderr and refused.stderr.count("\n") == 1
    refused = run("--model", tmp_path / "tuned", "--signal", SIGNAL)
    assert refused.returncode == 2 and "name the sequences it is audited on with `--datamodule" in refused.stderr
    no_signal = run("--model", tmp_path / "tuned", *DATA)
    assert no_signal.returncode == 2 and "causal_lm_signal" in no_signal.stderr

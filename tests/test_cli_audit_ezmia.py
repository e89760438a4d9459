"""`lightning-privacy audit membership --attack ezmia` on a language model's checkpoint: a LoRA fine-tune is scored
against itself with the adapters disabled (no `--base-model`, no reference model), a full fine-tune is refused in one
line naming `--base-model`, and scored with `--base-model PATH` or `--base-model init` (a constructor that gives the
same weights every time; a random one is refused)."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from types import SimpleNamespace

import pytest
import torch

from lightning_privacy import cli

pytest.importorskip("peft")

LM_MODULE = '''
"""A user's tiny Llama, LoRA or full fine-tuning, on random right-padded sequences (mappings)."""
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_privacy.functional.sequence_loss import causal_lm_signal

V, T = 32, 12


class Rows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.mask = (torch.arange(T)[None, :] < torch.randint(4, T + 1, (n, 1), generator=g)).long()
        self.ids = torch.randint(1, V, (n, T), generator=g) * self.mask

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}


class TinyLlama(pl.LightningModule):
    def __init__(self, lora: bool = True, pretrained: bool = True):
        super().__init__()
        self.save_hyperparameters()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T, pad_token_id=0)
        if pretrained:  # stands for from_pretrained: the same weights at every build
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = LlamaForCausalLM(config)
        else:
            model = LlamaForCausalLM(config)
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch, batch_idx):
        losses = causal_lm_signal(self, batch)
        return {"loss": losses.mean(), "per_example_loss": losses}

    def configure_optimizers(self):
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=0.05 if self.hparams.lora else 0.01)


class Sequences(pl.LightningDataModule):
    def __init__(self, n: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.train_set, self.val_set = Rows(n, seed=1), Rows(n, seed=2)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)
'''

MODEL = ("--model", "ezmia_lp_cli:TinyLlama", "--datamodule", "ezmia_lp_cli:Sequences")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The module in a folder, and checkpoints of an over-fitted LoRA and full fine-tune (and the full one's base)."""
    import lightning.pytorch as pl

    folder = tmp_path_factory.mktemp("ezmia")
    (folder / "ezmia_lp_cli.py").write_text(textwrap.dedent(LM_MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        import ezmia_lp_cli as module

        out = {}
        for name, kwargs, epochs in (("lora", {}, 250), ("full", {"lora": False}, 150)):
            torch.manual_seed(0)
            model = module.TinyLlama(**kwargs)
            if name == "full":
                torch.save(model.state_dict(), folder / "base.pt")  # the weights fine-tuning starts from
            trainer = pl.Trainer(
                max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, limit_val_batches=0,
            )  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(model, datamodule=module.Sequences())
            out[name] = folder / f"{name}.ckpt"
            trainer.save_checkpoint(out[name])
        random_init = module.TinyLlama(lora=False, pretrained=False)
        trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(random_init, datamodule=module.Sequences())
        out["random"] = folder / "random.ckpt"
        trainer.save_checkpoint(out["random"])
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("ezmia_lp_cli", None)
    return folder, out


@pytest.fixture
def run(monkeypatch, capsys):
    def call(folder, *args):
        monkeypatch.chdir(folder)
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, "ezmia_lp_cli", raising=False)
        code = cli.main(["audit", "membership", *map(str, args)])
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    yield call
    sys.modules.pop("ezmia_lp_cli", None)


def test_a_lora_checkpoint_is_scored_against_itself_with_adapters_disabled(checkpoints, run):
    folder, ckpt = checkpoints
    done = run(folder, "--checkpoint", ckpt["lora"], *MODEL, "--attack", "ezmia", "--claim-epsilon", "0.05",
               "--claim-delta", "0", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["attack"] == "ezmia" and out["variant"] == "base: adapters disabled" and out["references"] is None
    assert out["num_members"] == 16 and out["audit/ezmia_auc"] >= 0.85
    assert out["base_model"] == "the checkpoint's model with its adapters disabled"
    assert "base model: adapters disabled (PEFT)" in done.stderr and "references: training" not in done.stderr


def test_a_full_fine_tune_needs_base_model_given_as_a_file_or_a_deterministic_constructor(checkpoints, run):
    folder, ckpt = checkpoints
    common = ("--checkpoint", ckpt["full"], *MODEL, "--attack", "ezmia", "--json")
    refused = run(folder, *common)
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = [x for x in refused.stderr.splitlines() if ": error: " in x]
    assert "holds no PEFT adapters (full fine-tuning)" in line and "`--base-model PATH` or `--base-model init`" in line

    from_file = run(
        folder, *common, "--base-model", folder / "base.pt", "--claim-epsilon", "0.05", "--claim-delta", "0"
    )
    assert from_file.returncode == 0, from_file.stderr
    out = json.loads(from_file.stdout)
    assert out["variant"] == "base: base_model" and out["audit/ezmia_auc"] >= 0.95 and out["verdict"] == "contradicted"
    init = run(folder, *common, "--base-model", "init")
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["audit/ezmia_auc"] == out["audit/ezmia_auc"]  # the same base: the same scores

    random_init = run(folder, "--checkpoint", ckpt["random"], *MODEL, "--attack", "ezmia", "--base-model", "init")
    assert random_init.returncode == 2
    assert "`--base-model init`: two builds of `--model` ezmia_lp_cli:TinyLlama have different weights" in (
        random_init.stderr
    )
    for extra, message in (
        (
            ("--attack", "loss", "--base-model", "init"),
            "`--base-model` is EZ-MIA's reference: it needs `--attack ezmia`",
        ),
        (("--attack", "ezmia", "--signal", "x:y"), "`--attack ezmia` scores sequences with its own signal"),
        (("--attack", "ezmia", "--num-references", "2"), "`--attack ezmia` uses no reference models"),
    ):
        bad = run(folder, "--checkpoint", ckpt["full"], *MODEL, *extra)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1

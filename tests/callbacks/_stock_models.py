"""Stock models as a user writes them, for the default ``DPSGD()`` (issue 57 item 8): Hugging Face BERT, GPT-2 (tied
head), Llama and T5 from small configs, a ViT, a ResNet with BatchNorm, an LSTM classifier, a torchtext-style
EmbeddingBag classifier, and an MLP that updates a torchmetrics metric and keeps its outputs for epoch end.

Each ``training_step`` returns what the model's own API gives (Hugging Face's ``.loss``, ``F.cross_entropy``'s mean):
no per-example losses, no position ids, nothing written for DP-SGD. Dropout is off so that a per-example reference
replays the training forward pass exactly; weights are random (no download). Used by ``tests/callbacks/
test_stock_models.py`` and ``benchmarks/clipping_exactness.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_privacy.functional.sequence_loss import causal_lm_losses

V, T, CLASSES = 24, 8, 3


class _Stock(pl.LightningModule):
    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)


def _tokens(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randint(1, V, (n, T), generator=g), torch.randint(0, CLASSES, (n,), generator=g))


class Bert(_Stock):
    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=T, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=CLASSES,
        )  # fmt: skip
        self.model = BertForSequenceClassification(config)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return self.model(input_ids=ids, labels=y).loss


class GPT2(_Stock):
    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=V, n_positions=T, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )  # fmt: skip
        self.model = GPT2LMHeadModel(config)  # (lm_head.weight is transformer.wte.weight)

    def training_step(self, batch, batch_idx):
        ids, _ = batch
        return self.model(input_ids=ids, labels=ids).loss


class Llama(_Stock):
    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=T, pad_token_id=0,
        )  # fmt: skip
        self.model = LlamaForCausalLM(config)

    def training_step(self, batch, batch_idx):
        ids, _ = batch
        return self.model(input_ids=ids, labels=ids).loss


class T5(_Stock):
    def __init__(self) -> None:
        super().__init__()
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(
            vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0,
        )  # fmt: skip
        self.model = T5ForConditionalGeneration(config)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return self.model(input_ids=ids, labels=ids[:, : T // 2].flip(1)).loss


class ViT(_Stock):
    def __init__(self) -> None:
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(
            image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=CLASSES,
        )  # fmt: skip
        self.model = ViTForImageClassification(config)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.model(pixel_values=x, labels=y).loss


def _images(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(_Stock):
    """torchvision's ResNet pattern in small: a stem, two residual blocks with BatchNorm, pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(_Block(8), _Block(8))
        self.head = nn.Linear(8, CLASSES)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(self.blocks(self.stem(x)).mean((2, 3))), y)


class LSTMClassifier(_Stock):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        _, (h, _) = self.lstm(self.embed(ids))
        return F.cross_entropy(self.head(h[-1]), y)


class _Texts(Dataset):
    """torchtext's tutorial data: (label, token ids of a varying length)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 9, (n,), generator=g)
        self.items = [
            (int(torch.randint(0, CLASSES, (), generator=g)), torch.randint(1, V, (int(k),), generator=g))
            for k in lengths
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Tuple[int, torch.Tensor]:
        return self.items[i]


def collate_batch(batch: List[Tuple[int, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchtext's ``collate_batch``: labels, the texts concatenated, each text's offset."""
    labels = torch.tensor([label for label, _ in batch], dtype=torch.int64)
    texts = [text for _, text in batch]
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]], dtype=torch.int64).cumsum(0)
    return labels, torch.cat(texts) if texts else torch.zeros(0, dtype=torch.int64), offsets


class TextBag(_Stock):
    """torchtext's text-classification tutorial model: an EmbeddingBag over (text, offsets), a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(V, 16, mode="mean")
        self.fc = nn.Linear(16, CLASSES)

    def training_step(self, batch, batch_idx):
        label, text, offsets = batch
        return F.cross_entropy(self.fc(self.embedding(text, offsets)), label)


class WithMetric(_Stock):
    """An MLP that updates a torchmetrics accuracy in ``training_step``, logs it, and keeps its logits for epoch end."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.embed, self.head = nn.EmbeddingBag(V, 16), nn.Linear(16, CLASSES)
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES)
        self.outputs: List[torch.Tensor] = []
        self.epoch_rows: List[int] = []  # the kept outputs' rows, per epoch
        self.batch_rows: List[int] = []  # the batches' rows, per epoch (what they must equal)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        logits = self.head(self.embed(ids))
        self.accuracy(logits, y)
        self.log("train_acc", self.accuracy, on_step=False, on_epoch=True)
        self.outputs.append(logits.detach())
        return F.cross_entropy(logits, y)

    def on_train_epoch_start(self):
        self.batch_rows.append(0)

    def on_train_batch_start(self, batch, batch_idx):
        self.batch_rows[-1] += int(batch[0].shape[0])

    def on_train_epoch_end(self):
        self.epoch_rows.append(sum(int(o.shape[0]) for o in self.outputs))
        self.outputs.clear()


def _rows(batch: Any) -> List[Any]:
    """A batch of tensors split into batches of one row (the per-example reference's examples)."""
    rows = int(batch[0].shape[0])
    return [tuple(t[i : i + 1] for t in batch) for i in range(rows)]


def _bags(batch: Any) -> List[Any]:
    """torchtext's batch split into its examples, each collated alone."""
    label, text, offsets = batch
    ends = [*offsets[1:].tolist(), len(text)]
    return [collate_batch([(int(label[i]), text[int(offsets[i]) : ends[i]])]) for i in range(len(label))]


#: name -> (the module's class, a loader of n rows, DPSGD's arguments beyond the defaults, the examples of a batch)
STOCK: Dict[str, Tuple[Callable[[], pl.LightningModule], Callable[[int], DataLoader], Dict[str, Any], Callable]] = {
    "bert": (Bert, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
    "gpt2": (GPT2, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
    "llama": (Llama, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
    "t5": (T5, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
    "vit": (ViT, lambda n: DataLoader(_images(n), batch_size=8), {}, _rows),
    "resnet": (ResNet, lambda n: DataLoader(_images(n), batch_size=8), {"fix_modules": True}, _rows),
    "lstm": (LSTMClassifier, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
    "textbag": (TextBag, lambda n: DataLoader(_Texts(n), batch_size=8, collate_fn=collate_batch), {}, _bags),
    "metric": (WithMetric, lambda n: DataLoader(_tokens(n), batch_size=8), {}, _rows),
}


class _Padded:
    """A causal LM's ``training_step`` with an ``attention_mask``: each row right-padded to its own length, T − 1 − y
    tokens (SDPA attention, the default; Hugging Face's mask code reads the mask's values); each sequence's mean
    next-token loss over its own tokens (Hugging Face's ``.loss`` is a token mean over the batch, which DPSGD refuses
    as a reduced loss where the lengths differ: not the mean of the examples' losses)."""

    def training_step(self, batch, batch_idx):
        ids, y = batch
        mask = (torch.arange(ids.shape[1], device=ids.device) < ids.shape[1] - 1 - y[:, None]).long()
        losses = causal_lm_losses(self.model(input_ids=ids, attention_mask=mask).logits, ids, mask)  # (float64 stays)
        return {"loss": losses.mean(), "per_example_loss": losses}  # (a plain Trainer minimises the mean)


class GPT2Padded(_Padded, GPT2):
    pass


class LlamaPadded(_Padded, Llama):
    pass


#: stock causal LMs given a padding mask (issue 60 item 2), apart from STOCK (whose rows the benchmarks publish)
PADDED = {
    "gpt2_padded": (GPT2Padded, *STOCK["gpt2"][1:]),
    "llama_padded": (LlamaPadded, *STOCK["llama"][1:]),
}

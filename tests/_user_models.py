"""A user's own models and data, for the checkpoint tests and the end-to-end test of issue 21's four user models.

``Net(kind=...)`` is an Embedding + ``nn.TransformerEncoderLayer`` classifier (``"attention"``), an Embedding +
``nn.LSTM`` or ``nn.GRU`` (``"lstm"``, ``"gru"``), an MLP with ``nn.BatchNorm1d`` on float rows (``"batchnorm"``),
a ResNet-style CNN with ``nn.BatchNorm2d`` and a residual block on small float images (``"resnet"``), or a frozen
Linear backbone with a trainable low-rank (LoRA-style) update and head on float rows (``"lora"``). ``KINDS`` are
the kinds with layers ``DPSGD(fix_modules=True)`` replaces. ``Data`` calls ``self.save_hyperparameters()``, so a
checkpoint holds its ``n_train``. The CLI tests copy this file to a temporary folder as ``my_models.py``, as a
user's own module.
"""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB, LENGTH, FEATURES = 12, 6, 6
CHANNELS, SIDE, RANK = 3, 6, 2
KINDS = ("attention", "lstm", "gru", "batchnorm")  # layers DPSGD(fix_modules=True) replaces
INPUTS = {
    "attention": "tokens",
    "lstm": "tokens",
    "gru": "tokens",
    "batchnorm": "rows",
    "resnet": "images",
    "lora": "rows",
}


class Residual(nn.Module):
    """``relu(x + bn(conv(x)))``: a ResNet basic block cut to one convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn(self.conv(x)))


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``x A B`` (``B`` starts at 0, as in LoRA)."""

    def __init__(self, inputs: int, outputs: int, rank: int):
        super().__init__()
        self.base = nn.Linear(inputs, outputs).requires_grad_(False)
        self.down = nn.Linear(inputs, rank, bias=False)
        self.up = nn.Linear(rank, outputs, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


class Net(pl.LightningModule):
    def __init__(self, kind: str = "attention", width: int = 8, lr: float = 0.2):
        super().__init__()
        self.save_hyperparameters()
        if kind == "batchnorm":
            self.body = nn.Sequential(nn.Linear(FEATURES, width), nn.BatchNorm1d(width), nn.ReLU())
        elif kind == "resnet":
            self.body = nn.Sequential(
                nn.Conv2d(CHANNELS, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                Residual(width),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
        elif kind == "lora":
            self.body = nn.Sequential(LoRALinear(FEATURES, width, RANK), nn.ReLU())
        else:
            self.embed = nn.Embedding(VOCAB, width)
            if kind == "attention":
                self.block = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True)
            else:
                self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](width, width, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        if INPUTS[self.hparams.kind] != "tokens":
            return self.head(self.body(x))
        h = self.embed(x)
        h = self.block(h).mean(dim=1) if self.hparams.kind == "attention" else self.rnn(h)[0][:, -1]
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)


class Data(pl.LightningDataModule):
    """Token sequences (or float rows, or float images): the first ``n_train`` train, the next ``n_val`` validate."""

    def __init__(
        self,
        n_train: int = 64,
        n_val: int = 48,
        tokens: bool = True,
        seed: int = 0,
        batch_size: int = 16,
        images: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(seed)
        n = n_train + n_val
        if images:
            x = torch.randn(n, CHANNELS, SIDE, SIDE, generator=g)
            y = (x[:, 0].mean((1, 2)) > 0).long()
        elif tokens:
            x = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
            y = ((x == 1).sum(1) > (x == 2).sum(1)).long()
        else:
            x = torch.randn(n, FEATURES, generator=g)
            y = (x[:, 0] > 0).long()
        self.train_set = TensorDataset(x[:n_train], y[:n_train])
        self.val_set = TensorDataset(x[n_train:], y[n_train:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

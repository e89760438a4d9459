"""A user's own model and data with the layers ``DPSGD(fix_modules=True)`` replaces, for the checkpoint tests.

``Net(kind=...)`` is an Embedding + ``nn.TransformerEncoderLayer`` classifier (``"attention"``), an Embedding +
``nn.LSTM`` or ``nn.GRU`` (``"lstm"``, ``"gru"``), or an MLP with ``nn.BatchNorm1d`` on float rows
(``"batchnorm"``). ``Data`` calls ``self.save_hyperparameters()``, so a checkpoint holds its ``n_train``. The CLI
tests copy this file to a temporary folder as ``my_models.py``, as a user's own module.
"""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB, LENGTH, FEATURES = 12, 6, 6
KINDS = ("attention", "lstm", "gru", "batchnorm")


class Net(pl.LightningModule):
    def __init__(self, kind: str = "attention", width: int = 8, lr: float = 0.2):
        super().__init__()
        self.save_hyperparameters()
        if kind == "batchnorm":
            self.body = nn.Sequential(nn.Linear(FEATURES, width), nn.BatchNorm1d(width), nn.ReLU())
        else:
            self.embed = nn.Embedding(VOCAB, width)
            if kind == "attention":
                self.block = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True)
            else:
                self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](width, width, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        if self.hparams.kind == "batchnorm":
            return self.head(self.body(x))
        h = self.embed(x)
        h = self.block(h).mean(dim=1) if self.hparams.kind == "attention" else self.rnn(h)[0][:, -1]
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(pl.LightningDataModule):
    """Token sequences (or float rows): the first ``n_train`` rows train, the next ``n_val`` validate."""

    def __init__(self, n_train: int = 64, n_val: int = 48, tokens: bool = True, seed: int = 0, batch_size: int = 16):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(seed)
        n = n_train + n_val
        if tokens:
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

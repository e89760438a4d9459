"""PANORAMIA refuses data its default generators cannot imitate (token ids, unsupported shapes) in one line, before
any work, naming what is supported and the generator option; with the user's generator, token ids are audited."""

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_privacy import PanoramiaAudit
from lightning_privacy.audits import audit_panoramia
from lightning_privacy.audits.panoramia import SUPPORTED


def _trainer(tmp_path, callback):
    return pl.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False, default_root_dir=tmp_path)


class _Embedder(torch.nn.Module):
    def __init__(self, vocabulary=50, classes=2):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(vocabulary, 8)
        self.head = torch.nn.Linear(8, classes)

    def forward(self, ids):
        return self.head(self.embedding(ids))


def _tokens(n=150, length=12, vocabulary=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocabulary, (n, length), generator=g)
    return ids, (ids[:, 0] < vocabulary // 2).long()


def _one_batch_then_fail(x, y):
    """Batches of (x, y): the first, then an error — a refusal must come before the second is read."""
    yield x[:50], y[:50]
    raise AssertionError("the audit read past the first batch")


@pytest.mark.parametrize(
    "x, what",
    [
        (_tokens()[0], "x holds integers (int64) of shape (12,) per example (token ids?)"),
        (torch.zeros(150, 2, 3, 8, 8), "x has shape (2, 3, 8, 8) per example (5-d inputs)"),
        (torch.zeros(150, 3, 1, 8), "x has shape (3, 1, 8) per example (an image side below 2 pixels)"),
    ],
)
def test_panoramia_refuses_data_it_cannot_generate_before_any_work(x, what):
    y = torch.zeros(len(x), dtype=torch.long)
    for members in (_one_batch_then_fail(x, y), (x.numpy(), y.numpy())):
        with pytest.raises(ValueError) as info:
            audit_panoramia(_Embedder(), members, progress=False)
        message = str(info.value)
        assert "\n" not in message and message.startswith("PANORAMIA cannot generate non-members like these")
        assert what in message and SUPPORTED in message and "`--generator pkg.module:Class`" in message


def test_panoramia_callback_refusal_is_a_misconfiguration(tmp_path):
    ids, y = _tokens()
    audit = PanoramiaAudit(members=(ids.numpy(), y.numpy()), helper_epochs=1)
    with pytest.raises(MisconfigurationException, match="PanoramiaAudit: PANORAMIA cannot generate .*token ids"):
        audit.on_fit_end(_trainer(tmp_path, audit), _Embedder())


class TokenGenerator:
    """The user's own generator for token ids: each position drawn from its marginal, labels from theirs."""

    def fit(self, data):
        self.x, self.y = np.asarray(data[0]), np.asarray(data[1])
        self.rng = np.random.default_rng(0)
        return self

    def sample(self, n):
        rows = self.rng.integers(0, len(self.x), (n, self.x.shape[1]))
        return np.take_along_axis(self.x, rows, axis=0), self.y[self.rng.integers(0, len(self.y), n)]


def test_panoramia_on_token_ids_with_the_users_generator():
    ids, y = _tokens()
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(ids, y), batch_size=50)
    result = audit_panoramia(_Embedder(), loader, generator=TokenGenerator(), helper_epochs=1, progress=False)
    assert result.epsilon >= 0.0 and result.audit_rows[0].dtype.kind == "i"  # ids stay ids for the embedding

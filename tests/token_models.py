"""Token-id inputs as a user would write them: a data function whose inputs are integer ids and models that start
with an ``nn.Embedding`` (plain PyTorch, nothing from fedsim)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

VOCAB = 30


def token_windows(num_clients: int, seed: int, length: int = 6, per_client: int = 10, vocab: int = VOCAB):
    """Windows of ``length`` token ids (int64, ids in [1, vocab); 0 is padding, used at the start of short
    windows) labelled by whether the window holds more ids above ``vocab / 2`` than below (2 classes), with ragged
    clients whose id distributions differ."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(per_client // 2, per_client * 2, size=num_clients)
    xs, ys = [], []
    for c, n in enumerate(counts):
        skew = (c % 3 - 1) * 0.3
        p = np.exp(skew * np.arange(1, vocab) / vocab)
        x = rng.choice(np.arange(1, vocab), size=(int(n), length), p=p / p.sum())
        x[rng.random(int(n)) < 0.3, 0] = 0  # some windows start with padding
        xs.append(x)
        ys.append(((x > vocab // 2).sum(1) > (x.clip(1) <= vocab // 2).sum(1)).astype(np.int64))
    x = np.concatenate(xs).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    clients = [np.arange(offsets[i], offsets[i + 1]) for i in range(num_clients)]
    return {"x": x, "y": np.concatenate(ys), "clients": clients, "num_classes": 2}


class BagOfTokens(nn.Module):
    def __init__(self, vocab: int, dim: int, classes: int, padding_idx: int | None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(x)).mean(1))


def bag_of_tokens(input_shape, num_classes, dim: int = 8, vocab: int = VOCAB, padding: bool = True):
    """Embedding (padding id 0) -> tanh -> mean over the window -> Linear."""
    return BagOfTokens(vocab, dim, num_classes, 0 if padding else None)


class TokenGRU(nn.Module):
    """A recurrent token model: the per-layer rules know no GRU, so it trains on vmap or the loop."""

    def __init__(self, vocab: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.out = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(x))
        return self.out(h[:, -1])


def token_gru(input_shape, num_classes, vocab: int = VOCAB):
    return TokenGRU(vocab, num_classes)

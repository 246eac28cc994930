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
    """A recurrent token model: Embedding -> GRU -> Linear on the last step (per-layer rules for all three)."""

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


def token_sequences(num_clients: int, seed: int, length: int = 6, per_client: int = 10, vocab: int = VOCAB):
    """A sequence task: windows of ``length`` ids and, at every position, the next id as the target (``[n,
    length]``); ragged clients, and short sequences padded at the end (id 0 in the inputs, target -100, PyTorch's
    ignore index, where no token follows)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(per_client // 2, per_client * 2, size=num_clients)
    n = int(counts.sum())
    text = rng.integers(1, vocab, size=(n, length + 1))
    text[:, 1:] = np.where(
        rng.random((n, length)) < 0.5, (text[:, :-1] * 7 + 3) % (vocab - 1) + 1, text[:, 1:]
    )
    x, y = text[:, :-1].copy(), text[:, 1:].copy()
    short = rng.random(n) < 0.3
    cut = rng.integers(1, length, size=n)
    for i in np.flatnonzero(short):
        x[i, cut[i] :] = 0
        y[i, cut[i] - 1 :] = -100  # the last real input has no next token in the window
    offsets = np.concatenate([[0], np.cumsum(counts)])
    clients = [np.arange(offsets[i], offsets[i + 1]) for i in range(num_clients)]
    return {"x": x.astype(np.int64), "y": y.astype(np.int64), "clients": clients, "num_classes": vocab}


class TokenTagger(nn.Module):
    """Logits at every position, ``[n, T, classes]``: Embedding -> tanh -> Linear, position by position."""

    def __init__(self, vocab: int, classes: int, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(x)))


def token_tagger(input_shape, num_classes, vocab: int = VOCAB, classes: int | None = None):
    """``classes`` (default ``num_classes``): fewer than the data's, to test the refusal."""
    return TokenTagger(vocab, num_classes if classes is None else classes)


def last_token_only(input_shape, num_classes, vocab: int = VOCAB):
    """A classifier's output ``[n, classes]``, wrong for sequence targets ``[n, T]``."""
    return BagOfTokens(vocab, 8, num_classes, None)


def sum_over_tokens(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss of the wrong shape for a sequence task: one value per token, not per example."""
    return torch.nn.functional.cross_entropy(outputs.transpose(1, 2), targets, reduction="none")


def exact_match(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A user metric, one value per example: 1 when every scored token is predicted right."""
    right = (outputs.argmax(-1) == targets) | (targets == -100)
    return right.all(1).to(outputs.dtype)


# --------------------------------------------------------------------------- language models as people write them
class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one Linear for q, k, v, ``F.scaled_dot_product_attention`` with ``is_causal``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, norm: str) -> None:
        super().__init__()
        make = nn.RMSNorm if norm == "rms" else nn.LayerNorm
        self.ln1, self.ln2 = make(dim), make(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A nanoGPT-style language model: token and position embeddings, pre-LN blocks, logits at every position.
    ``positions``: ``"embedding"`` (``self.pos(torch.arange(T))``, as nanoGPT), ``"parameter"`` (a ``[T, dim]`` table
    held by the model itself, added in forward) or ``"parameter-1xT"`` (``[1, 2T, dim]``, sliced to the input's
    length); ``norm``: ``"layer"`` or ``"rms"`` (``nn.RMSNorm``)."""

    def __init__(
        self,
        vocab: int,
        length: int,
        dim: int,
        heads: int,
        layers: int,
        positions: str,
        norm: str,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.positions = positions
        if positions == "embedding":
            self.pos = nn.Embedding(length, dim)
        elif positions == "parameter":
            self.pos = nn.Parameter(0.02 * torch.randn(length, dim))
        else:  # "parameter-1xT": room for longer windows, sliced to the input's
            self.pos = nn.Parameter(0.02 * torch.randn(1, 2 * length, dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, norm) for _ in range(layers))
        self.ln_f = nn.RMSNorm(dim) if norm == "rms" else nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if self.positions == "embedding":
            pos = self.pos(torch.arange(t, device=idx.device))
        elif self.positions == "parameter":
            pos = self.pos
        else:
            pos = self.pos[:, :t]
        x = self.drop(self.tok(idx) + pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def tiny_gpt(
    input_shape,
    num_classes,
    dim: int = 8,
    heads: int = 2,
    layers: int = 2,
    positions: str = "embedding",
    norm: str = "layer",
    dropout: float = 0.1,
):
    return TinyGPT(num_classes, input_shape[0], dim, heads, layers, positions, norm, dropout)


class GRULanguageModel(nn.Module):
    """Embedding -> a 2-layer GRU with dropout between its layers -> logits at every position."""

    def __init__(self, vocab: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, num_layers=2, dropout=dropout, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(x))
        return self.head(h)


def gru_lm(input_shape, num_classes, dim: int = 8, dropout: float = 0.2):
    return GRULanguageModel(num_classes, dim, dropout)


class EncoderLM(nn.Module):
    """A causal language model from torch's own layers, with a boolean causal mask (True: not attended), as
    ``torch.triu(torch.ones(T, T, dtype=torch.bool), 1)`` writes it. ``norm_first=False`` (post-LN) is torch's
    default; ``attention``: ``"encoder"`` (nn.TransformerEncoderLayer) or ``"mha"`` (nn.MultiheadAttention alone)."""

    def __init__(self, vocab: int, length: int, dim: int, norm_first: bool, attention: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(length, dim)
        self.attention = attention
        if attention == "mha":
            self.mha = nn.MultiheadAttention(dim, 2, batch_first=True)
        else:
            self.layer = nn.TransformerEncoderLayer(
                dim, 2, 2 * dim, dropout=0.0, batch_first=True, norm_first=norm_first
            )
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.embed(x) + self.pos(torch.arange(t, device=x.device))
        if self.attention == "mha":
            h = h + self.mha(h, h, h, attn_mask=mask, need_weights=False)[0]
        else:
            h = self.layer(h, src_mask=mask, is_causal=True)
        return self.head(h)


def encoder_lm(input_shape, num_classes, dim: int = 8, norm_first: bool = False, attention: str = "encoder"):
    return EncoderLM(num_classes, input_shape[0], dim, norm_first, attention)

"""Projection heads and masked pooling shared by the retrieval models (papers/METHODS.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.train import losses


class GLUHead(nn.Module):
    """S-MiT's MLP projection (4.1): two linear layers with a gated linear unit between them."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or out_dim
        self.fc1 = nn.Linear(in_dim, 2 * hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.glu(self.fc1(x), dim=-1))


class EmbedHead(nn.Module):
    """WAL's embedding module (2.2, Figure 2): FC, BatchNorm, ReLU (BatchNorm over every leading axis)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)
        self.bn = nn.BatchNorm1d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        shape = y.shape
        return F.relu(self.bn(y.reshape(-1, shape[-1])).reshape(shape))


class LinearHead(nn.Module):
    """A linear map (MIL-NCE's video side, Table 1: global average pool, then linear to 512)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class OrderHead(nn.Module):
    """Torabi et al.'s order embedding (appendix B.2): a linear map, made non-negative (absolute
    value) and L2-normalised."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return losses.order_embed(self.fc(x))


class MILTextHead(nn.Module):
    """MIL-NCE's text tower on word vectors (Table 1): Linear+ReLU to `hidden`, max-pool over
    words, linear to the joint space. `attention_dim` adds g_a, the Attn+NCE head that shares
    the tower up to the max-pool and has its own last Linear (appendix A)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 2048, attention_dim: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim)
        self.attention = nn.Linear(hidden, attention_dim) if attention_dim else None

    def pooled(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x)).masked_fill(~mask[..., None], float("-inf")).max(-2).values

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.pooled(x, mask))


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if x.ndim == 2:
        return x
    if mask is None:
        return x.mean(1)
    w = mask.to(x.dtype)[..., None]
    return (x * w).sum(1) / w.sum(1).clamp_min(1)


def masked_max(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if x.ndim == 2:
        return x
    if mask is not None:
        x = x.masked_fill(~mask[..., None], float("-inf"))
    return x.max(1).values


def pool(x: torch.Tensor, mask: torch.Tensor | None, how: str) -> torch.Tensor:
    if how == "mean":
        return masked_mean(x, mask)
    if how == "max":
        return masked_max(x, mask)
    raise ValueError(f"pooling must be 'mean' or 'max', got {how!r}")

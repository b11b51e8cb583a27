"""AsyNCE's cross-modal transformer (CMT, AsyNCE 3.3): visually guided word features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CrossModalTransformer(nn.Module):
    """One layer, `heads` heads (the paper: 1 layer, 4 heads, d = 512, 4.3); the query is the
    text, keys and values the regions of one frame:

        Z(Q|V_t)   = softmax(Q W_q (V_t W_k)ᵀ / √d_h) V_t W_v      (eq. 10, per head, heads concatenated)
        G_1        = LN(Z + Q W_q)
        f(Q|V_t)   = LN(g(G_1) + G_1)                               (eq. 11; g: Linear-ReLU-Linear)

    and the word-region similarity is s(v_t^n, q_k) = f(q_k|V_t)ᵀ v_t^n. The paper gives no
    feed-forward width; `ffn` defaults to 4d as in the Transformer it builds on. With one
    feature per frame (frame-level features, no region proposals) the softmax runs over one
    region and Z = V_t W_v: the block still mixes each word with the frame before scoring it.
    """

    def __init__(self, dim: int, heads: int = 4, ffn: int | None = None) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"the CMT width {dim} must be a multiple of its {heads} heads")
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.ln1 = nn.LayerNorm(dim)
        self.ln2 = nn.LayerNorm(dim)
        ffn = ffn or 4 * dim
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.ReLU(), nn.Linear(ffn, dim))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.heads, x.shape[-1] // self.heads)

    def forward(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """f(Q|V_t) [Nt, Nv, T, K, d] for words q [Nt, K, d] and regions v [Nv, T, N, d]."""
        qw = self.wq(q)
        qh = self._split(qw)  # [Nt, K, H, dh]
        kh, vh = self._split(self.wk(v)), self._split(self.wv(v))  # [Nv, T, N, H, dh]
        logits = torch.einsum("ikhd,jtnhd->ijtkhn", qh, kh) / qh.shape[-1] ** 0.5
        z = torch.einsum("ijtkhn,jtnhd->ijtkhd", logits.softmax(-1), vh).flatten(-2)
        g1 = self.ln1(z + qw[:, None, None])
        return self.ln2(self.ffn(g1) + g1)

    def word_sim(self, q: torch.Tensor, v: torch.Tensor, chunk: int = 8) -> torch.Tensor:
        """s [Nt, Nv, T, N, K]: cosine of f(q_k|V_t) and each region v_t^n, texts in chunks.
        Both sides are L2-normalised, the scale AsyNCE's τ = 0.07 (from MoCo) is set for."""
        vn = F.normalize(v, dim=-1)
        out = [torch.einsum("ijtkd,jtnd->ijtnk", F.normalize(self(q[i:i + chunk], v), dim=-1), vn)
               for i in range(0, len(q), chunk)]
        return torch.cat(out, 0)

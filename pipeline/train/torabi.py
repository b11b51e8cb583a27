"""Torabi et al.'s LSMDC models M2 and M3 (section 4, appendix B): a language LSTM, and for M3
a soft attention over frames driven by the LSTM's last hidden state."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from pipeline.train import losses

VARIANTS = ("m1", "m2", "m3")


class LSTMText(nn.Module):
    """M2/M3's sentence encoder: an LSTM over the word vectors; the sentence is h_N, the last
    hidden state of its real words (appendix B.1). `forward` gives h_N as it is (M3's attention
    reads it); `losses.order_embed` makes it the caption embedding |h_N|, unit L2 norm (5.1)."""

    def __init__(self, word_dim: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(word_dim, hidden, batch_first=True)

    def forward(self, words: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp_min(1).cpu()
        packed = pack_padded_sequence(words, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]


class AttendedVideo(nn.Module):
    """M3's video side: a_t = softmax_t(wᵀ tanh(W_h h_N + W_v v_t)) over the frame features
    (the attention matching space, 300 in the paper, is `att_dim`), v = W_video Σ_t a_t v_t,
    made non-negative and unit norm like every embedding of the model. h_N and the joint space
    share `embed_dim` (950 in the paper, 5.1)."""

    def __init__(self, embed_dim: int, visual_dim: int, att_dim: int = 300) -> None:
        super().__init__()
        self.wh = nn.Linear(embed_dim, att_dim, bias=False)
        self.wv = nn.Linear(visual_dim, att_dim)
        self.w = nn.Linear(att_dim, 1, bias=False)
        self.video = nn.Linear(visual_dim, embed_dim)

    def weights(self, h: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """a [N_text, N_video, T] of hidden states h [Nt, H] over frames [Nv, T, Dv]."""
        e = self.w(torch.tanh(self.wh(h)[:, None, None] + self.wv(frames)[None])).squeeze(-1)
        return e.masked_fill(~mask[None], float("-inf")).softmax(-1)

    def scores(self, h: torch.Tensor, frames: torch.Tensor, mask: torch.Tensor, chunk: int = 16) -> torch.Tensor:
        """Order-violation similarity S[i, j] = -‖max(0, c_i - v_ij)‖² of caption i and video j
        attended by caption i: [N_text, N_video]."""
        c = losses.order_embed(h)
        projected = self.video(frames)  # W_video is linear, so it can go before the weighted sum
        rows = []
        for i in range(0, len(h), chunk):
            a = self.weights(h[i:i + chunk], frames, mask)
            v = losses.order_embed(torch.einsum("ijt,jte->ije", a, projected))
            rows.append(-torch.relu(c[i:i + chunk, None] - v).pow(2).sum(-1))
        return torch.cat(rows, 0)

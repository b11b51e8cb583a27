"""`build_model`: one retrieval model per `train.model` family (papers/METHODS.md), from the
heads (`heads`), WAL's attention and discriminator (`wal`), AsyNCE's cross-modal transformer
(`cmt`) and Torabi et al.'s LSTM models (`torabi`).

Every model has `encode_video(v, mask)` and `encode_text(t, mask)`, each returning an
`Encoded` (emb [N, E] or [N, L, E] and its [N, L] mask), and `similarity(video, text)`
giving S[i, j] = score(text i, video j), [N_text, N_video] (the layout of `metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import TrainConfig
from pipeline.train import losses
from pipeline.train.cmt import CrossModalTransformer
from pipeline.train.heads import EmbedHead, GLUHead, LinearHead, MILTextHead, OrderHead, masked_mean, pool
from pipeline.train.torabi import VARIANTS, AttendedVideo, LSTMText
from pipeline.train.wal import FrameAttention, WALDiscriminator

SMIT = ("nce", "mms", "amm", "shn")


@dataclass
class Encoded:
    emb: torch.Tensor  # [N, E] (pooled) or [N, L, E] (frames / words)
    mask: torch.Tensor | None = None  # [N, L] for the [N, L, E] form

    def index(self, idx: Any) -> Encoded:
        return Encoded(self.emb[idx], None if self.mask is None else self.mask[idx])


def _full_mask(x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, L, D] and its [N, L] mask from [N, D] (L = 1) or [N, L, D] input."""
    if x.ndim == 2:
        x, mask = x[:, None], None
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    return x, mask


class RetrievalModel(nn.Module):
    """Two towers and a similarity, configured per family by `build_model`."""

    def __init__(self, family: str, visual_dim: int, text_dim: int, embed_dim: int, options: dict[str, Any],
                 temperature: float = 1.0) -> None:
        super().__init__()
        self.family = family
        self.options = dict(options)
        self.temperature = temperature
        o = self.options
        e = embed_dim
        self.video_pool = o.get("video_pool", "max" if family in SMIT else "mean")
        self.text_pool = o.get("text_pool", "mean")
        self.attention: FrameAttention | None = None
        self.discriminator: WALDiscriminator | None = None
        self.mil_text: MILTextHead | None = None
        self.video_attention: nn.Linear | None = None
        self.cmt: CrossModalTransformer | None = None
        self.lstm: LSTMText | None = None
        self.attended: AttendedVideo | None = None
        if family == "wal":
            self.video_head, self.text_head = EmbedHead(visual_dim, e), EmbedHead(text_dim, e)
            att = o.get("attention", "dot")
            if att not in (None, "none", "mean"):
                self.attention = FrameAttention(e, att)
            self.f_lvc = nn.Linear(1, 1)
            with torch.no_grad():
                self.f_lvc.weight.fill_(float(o.get("lvc_scale", 5.0)))
                self.f_lvc.bias.zero_()
            if o.get("adversarial", True):
                self.discriminator = WALDiscriminator(e, int(o.get("n_background", 4)), o.get("adv_input", "residual"),
                                                      bool(o.get("gumbel", True)), float(o.get("gumbel_tau", 1.0)))
        elif family in SMIT:
            hidden = o.get("hidden")
            self.video_head, self.text_head = GLUHead(visual_dim, e, hidden), GLUHead(text_dim, e, hidden)
        elif family == "milnce":
            self.video_head = LinearHead(visual_dim, e)
            attn = o.get("variant", "mil") == "attn"
            # Attn+NCE's f_a, g_a: the towers with a last Linear of their own (MIL-NCE appendix A)
            self.mil_text = MILTextHead(text_dim, e, int(o.get("text_hidden", 2048)), e if attn else None)
            self.video_attention = nn.Linear(visual_dim, e) if attn else None
            self.text_head = nn.Identity()
        elif family == "order":
            variant = o.get("variant", "m2")
            if variant not in VARIANTS:
                raise ValueError(f"order variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
            self.video_head = OrderHead(visual_dim, e)
            self.text_head = OrderHead(text_dim, e) if variant == "m1" else nn.Identity()
            if variant != "m1":
                self.lstm = LSTMText(text_dim, e)
            if variant == "m3":
                self.attended = AttendedVideo(e, visual_dim, int(o.get("att_dim", 300)))
        elif family in ("max_margin", "asynce"):
            self.video_head, self.text_head = LinearHead(visual_dim, e), LinearHead(text_dim, e)
            if family == "asynce" and o.get("cmt", False):
                self.cmt = CrossModalTransformer(e, int(o.get("cmt_heads", 4)), o.get("cmt_ffn"))
        else:
            raise ValueError(f"unknown model family {family!r}")
        self.normalize = family in ("wal", "max_margin", "asynce") or o.get("normalize", False)

    # -- towers --------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) if self.normalize else x

    def encode_video(self, v: torch.Tensor, mask: torch.Tensor | None = None) -> Encoded:
        """v [N, D] or [N, T, D] with mask [N, T] -> pooled [N, E], or frames [N, T, E] for the
        scores that look at frames (WAL attention, AsyNCE, Torabi's M3: raw frames)."""
        v, mask = _full_mask(v, mask)
        if self.family == "wal":
            if self.attention is not None:  # normalised after the attention (`FrameAttention`)
                return Encoded(self.video_head(v), mask)
            return Encoded(self._norm(masked_mean(self.video_head(v), mask)))
        if self.family == "asynce":
            return Encoded(self._norm(self.video_head(v)), mask)
        if self.attended is not None:
            return Encoded(v, mask)
        pooled = pool(v, mask, self.video_pool)  # S-MiT max-pools features over time first
        return Encoded(self._norm(self.video_head(pooled)))

    def encode_text(self, t: torch.Tensor, mask: torch.Tensor | None = None) -> Encoded:
        """t [N, D] or [N, K, D] word vectors with mask [N, K] -> [N, E] ([N, K, E] for AsyNCE;
        Torabi's M3: the LSTM's h_N as it is)."""
        t, mask = _full_mask(t, mask)
        if self.family == "asynce":
            return Encoded(self._norm(self.text_head(t)), mask)
        if self.mil_text is not None:
            return Encoded(self.mil_text(t, mask))
        if self.lstm is not None:
            h = self.lstm(t, mask)
            return Encoded(h if self.attended is not None else losses.order_embed(h))
        if self.family == "wal" and self.attention is not None:
            return Encoded(self.text_head(pool(t, mask, self.text_pool)))
        return Encoded(self._norm(self.text_head(pool(t, mask, self.text_pool))))

    def encode_candidates(self, c: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """MIL-NCE candidate bags of texts [B, C, K, D] with their word mask [B, C, K] -> [B, C, E],
        each candidate encoded like any text."""
        b, n, k, d = c.shape
        return self.encode_text(c.reshape(b * n, k, d), words.reshape(b * n, k)).emb.reshape(b, n, -1)

    def candidate_attention(self, v: torch.Tensor, vmask: torch.Tensor, c: torch.Tensor,
                            words: torch.Tensor) -> torch.Tensor:
        """Attn+NCE logits f_a(x_i)ᵀ g_a(y_ik) [B, C] of clips v and their candidate bags (MIL-NCE
        appendix A, eq. 7)."""
        assert self.mil_text is not None and self.mil_text.attention is not None and self.video_attention is not None
        v, vmask = _full_mask(v, vmask)
        f_a = self.video_attention(pool(v, vmask, self.video_pool))
        b, n, k, d = c.shape
        g_a = self.mil_text.attention(self.mil_text.pooled(c.reshape(b * n, k, d), words.reshape(b * n, k)))
        return torch.einsum("be,bce->bc", f_a, g_a.reshape(b, n, -1))

    # -- scores --------------------------------------------------------------------------------
    def similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """S[i, j] = score(text i, video j), [N_text, N_video]."""
        if self.family == "wal" and self.attention is not None:
            return self.attention.scores(text.emb, video.emb, video.mask)
        if self.attended is not None:
            return self.attended.scores(text.emb, video.emb, video.mask)
        if self.family == "order":
            return losses.order_violation(video.emb, text.emb)
        if self.family == "asynce":
            return self.asynce_similarity(video, text)
        return text.emb @ video.emb.T

    def paired_scores(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """score(text i, video i) for aligned rows: [N]."""
        if self.family == "wal" and self.attention is not None:
            return self.attention.paired(text.emb, video.emb, video.mask)
        return (text.emb * video.emb).sum(-1)

    def word_sim(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """AsyNCE's s(v_t, q_k) [N_text, N_video, T, W]; padding is left to the masks: the dot
        product of the projected vectors, or, with the cross-modal transformer, the cosine of
        each visually guided word f(q_k|V_t) with the frame."""
        if self.cmt is not None:
            return self.cmt.word_sim(text.emb, video.emb[:, :, None]).squeeze(3)
        return torch.einsum("ikd,jtd->ijtk", text.emb, video.emb)

    def asynce_similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """AsyNCE's retrieval score: S_p of every (sentence, video) pair, aggregated as in training."""
        o = self.options
        scores = losses.asynce_frame_scores(self.word_sim(video, text), text.mask, video.mask, self.temperature,
                                            o.get("entity", "soft"))
        return losses.asynce_positive(scores, video.mask, o.get("frame", "soft"))


def build_model(train_cfg: TrainConfig, visual_dim: int, text_dim: int) -> RetrievalModel:
    """The model of `train_cfg.model` for the given input dimensions;
    `train_cfg.options` carries family settings (attention, adversarial, adv_input, gumbel,
    n_background, hidden, text_hidden, variant, cmt, entity, frame, video_pool, text_pool, ...)."""
    return RetrievalModel(train_cfg.model, visual_dim, text_dim, train_cfg.embed_dim, train_cfg.options,
                          train_cfg.temperature)

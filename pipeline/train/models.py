"""Projection heads, frame pooling and the WAL discriminator (papers/METHODS.md), and
`build_model`, which assembles one retrieval model per `train.model` family.

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

from pipeline.train import losses


@dataclass
class Encoded:
    emb: torch.Tensor  # [N, E] (pooled) or [N, L, E] (frames / words)
    mask: torch.Tensor | None = None  # [N, L] for the [N, L, E] form

    def index(self, idx: Any) -> Encoded:
        return Encoded(self.emb[idx], None if self.mask is None else self.mask[idx])


# ---------------------------------------------------------------- heads


class GLUHead(nn.Module):
    """S-MiT's MLP projection: two linear layers with a gated linear unit between them."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or out_dim
        self.fc1 = nn.Linear(in_dim, 2 * hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.glu(self.fc1(x), dim=-1))


class EmbedHead(nn.Module):
    """WAL's embedding module: FC, BatchNorm, ReLU (BatchNorm over every leading axis)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)
        self.bn = nn.BatchNorm1d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        shape = y.shape
        return F.relu(self.bn(y.reshape(-1, shape[-1])).reshape(shape))


class LinearHead(nn.Module):
    """A linear map (MIL-NCE's video side: global average pool, then linear to 512)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class OrderHead(nn.Module):
    """Torabi et al.'s order embedding: a linear map, made non-negative (absolute value) and
    L2-normalised."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return losses.order_embed(self.fc(x))


class MILTextHead(nn.Module):
    """MIL-NCE's text tower on word vectors: Linear+ReLU to `hidden`, max-pool over words,
    linear to the joint space."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 2048) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x)).masked_fill(~mask[..., None], float("-inf")).max(-2).values
        return self.fc2(h)


# ---------------------------------------------------------------- pooling


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


class FrameAttention(nn.Module):
    """WAL's frame attention driven by the sentence vector s: weights a_t = softmax_t(e_t) with

        dot:            e_t = sᵀ v_t
        multiplicative: e_t = sᵀ W v_t
        additive:       e_t = wᵀ tanh(W_s s + W_v v_t)   (Bahdanau)

    `scores(s, v, mask)` returns, for every sentence i and video j, the attended score
    sᵢᵀ (Σ_t a_ijt v_jt) as [N_text, N_video] (the attended video vector is never built)."""

    def __init__(self, dim: int, kind: str = "dot", hidden: int | None = None) -> None:
        super().__init__()
        if kind not in ("dot", "multiplicative", "additive"):
            raise ValueError(f"attention must be 'dot', 'multiplicative' or 'additive', got {kind!r}")
        self.kind = kind
        if kind == "multiplicative":
            self.w = nn.Linear(dim, dim, bias=False)
            nn.init.eye_(self.w.weight)
        elif kind == "additive":
            hidden = hidden or dim
            self.ws = nn.Linear(dim, hidden, bias=False)
            self.wv = nn.Linear(dim, hidden)
            self.w = nn.Linear(hidden, 1, bias=False)

    def logits(self, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """e [N_text, N_video, T] of sentences s [Nt, E] and frames v [Nv, T, E]."""
        if self.kind == "dot":
            return torch.einsum("ie,jte->ijt", s, v)
        if self.kind == "multiplicative":
            return torch.einsum("ie,jte->ijt", s, self.w(v))  # sᵀ W v_t, W acting on v
        hs, hv = self.ws(s), self.wv(v)
        out = []
        for chunk in range(0, len(hs), 32):  # [chunk, Nv, T, H] at a time
            h = torch.tanh(hs[chunk:chunk + 32, None, None, :] + hv[None])
            out.append(self.w(h).squeeze(-1))
        return torch.cat(out, 0)

    def scores(self, s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        e = self.logits(s, v)
        if mask is not None:
            e = e.masked_fill(~mask[None], float("-inf"))
        a = e.softmax(-1)
        return (a * torch.einsum("ie,jte->ijt", s, v)).sum(-1)

    def paired(self, s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The attended score of pair i only (sentence i, video i): [N]."""
        if self.kind == "dot":
            e = torch.einsum("ie,ite->it", s, v)
        elif self.kind == "multiplicative":
            e = torch.einsum("ie,ite->it", s, self.w(v))
        else:
            e = self.w(torch.tanh(self.ws(s)[:, None] + self.wv(v))).squeeze(-1)
        if mask is not None:
            e = e.masked_fill(~mask, float("-inf"))
        return (e.softmax(-1) * torch.einsum("ie,ite->it", s, v)).sum(-1)


# ---------------------------------------------------------------- WAL discriminator


class WALDiscriminator(nn.Module):
    """WAL-att-adv: B learned background visual vectors v_b, p_ADV = max_b sᵀv_b next to
    p_LVC = sᵀv; F_ADV (the adversarial classifier) reads `input_mode`: "concat" [p_ADV, p_LVC]
    (default, best), "residual" p_ADV − p_LVC, or "adv" p_ADV alone. Its logit a is both the
    input of L_ADV = BCE(a, y=0) and the logit of the routing draw: z ∈ {0, 1} per pair is a
    hard straight-through Gumbel-softmax sample over the logits [0, a], so P(z=1) = σ(a)
    (gumbel=False: the straight-through argmax, z = [a > 0], the ablation). Tying z to F_ADV is
    what makes the fixed label 0 pull pairs back to L_LVC over training (METHODS.md): a pair
    stays with L_ADV only while L_LVC costs more than −log P(z=0) = BCE(a, 0), i.e. the pairs
    L_LVC cannot fit. With z drawn from logits of their own, F_ADV's bias alone drove L_ADV to 0
    and every pair to z=1."""

    def __init__(self, dim: int, n_background: int = 4, input_mode: str = "concat", gumbel: bool = True,
                 tau: float = 1.0) -> None:
        super().__init__()
        if input_mode not in ("concat", "residual", "adv"):
            raise ValueError(f"adv_input must be 'concat', 'residual' or 'adv', got {input_mode!r}")
        self.input_mode = input_mode
        self.gumbel = gumbel
        self.tau = tau
        self.background = nn.Parameter(F.normalize(torch.randn(n_background, dim), dim=-1))
        n_in = 2 if input_mode == "concat" else 1
        self.f_adv = nn.Linear(n_in, 1)

    @torch.no_grad()
    def init_background(self, video: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """v_b = mean of a random group of the L2-normalised training video vectors [N, E]."""
        video = F.normalize(video.float(), dim=-1)
        perm = torch.randperm(len(video), generator=generator)
        for b, group in enumerate(perm.tensor_split(len(self.background))):
            if len(group):
                self.background[b] = video[group].mean(0).to(self.background.dtype)

    def features(self, s: torch.Tensor, p_lvc: torch.Tensor) -> torch.Tensor:
        p_adv = (s @ self.background.T).max(-1).values
        if self.input_mode == "concat":
            return torch.stack([p_adv, p_lvc], -1)
        if self.input_mode == "residual":
            return (p_adv - p_lvc)[:, None]
        return p_adv[:, None]

    def forward(self, s: torch.Tensor, p_lvc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(F_ADV logits a [N], hard z [N] drawn with P(z=1) = σ(a), straight-through gradient)."""
        a = self.f_adv(self.features(s, p_lvc)).squeeze(-1)
        logits = torch.stack([torch.zeros_like(a), a], -1)
        if self.gumbel:
            z = F.gumbel_softmax(logits, tau=self.tau, hard=True)[:, 1]
        else:
            soft = logits.softmax(-1)
            hard = F.one_hot(soft.argmax(-1), 2).to(soft.dtype)
            z = (hard - soft.detach() + soft)[:, 1]
        return a, z

    @torch.no_grad()
    def noise_prob(self, s: torch.Tensor, p_lvc: torch.Tensor) -> torch.Tensor:
        """P(z=1) = σ(F_ADV) per pair [N]: how likely the pair is sent to L_ADV (flagged as noise)."""
        return torch.sigmoid(self.f_adv(self.features(s, p_lvc)).squeeze(-1))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Checkpoints written before z was tied to F_ADV carry the separate z-logits layer; it has
        # no counterpart now, so it is dropped (evaluation never used it; a resumed run continues
        # with the tied draw).
        for key in [k for k in state_dict if k.startswith(prefix + "z_logits.")]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ---------------------------------------------------------------- models


class RetrievalModel(nn.Module):
    """Two towers and a similarity, configured per family by `build_model`."""

    def __init__(self, family: str, visual_dim: int, text_dim: int, embed_dim: int, options: dict[str, Any]) -> None:
        super().__init__()
        self.family = family
        self.options = dict(options)
        o = self.options
        e = embed_dim
        self.video_pool = o.get("video_pool", "max" if family in ("nce", "mms", "amm", "shn") else "mean")
        self.text_pool = o.get("text_pool", "mean")
        self.attention: FrameAttention | None = None
        self.discriminator: WALDiscriminator | None = None
        self.mil_text: MILTextHead | None = None
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
                self.discriminator = WALDiscriminator(e, int(o.get("n_background", 4)), o.get("adv_input", "concat"),
                                                      bool(o.get("gumbel", True)), float(o.get("gumbel_tau", 1.0)))
        elif family in ("nce", "mms", "amm", "shn"):
            hidden = o.get("hidden")
            self.video_head, self.text_head = GLUHead(visual_dim, e, hidden), GLUHead(text_dim, e, hidden)
        elif family == "milnce":
            self.video_head = LinearHead(visual_dim, e)
            self.mil_text = MILTextHead(text_dim, e, int(o.get("text_hidden", 2048)))
            self.text_head = nn.Identity()
        elif family == "order":
            self.video_head, self.text_head = OrderHead(visual_dim, e), OrderHead(text_dim, e)
        elif family in ("max_margin", "asynce"):
            self.video_head, self.text_head = LinearHead(visual_dim, e), LinearHead(text_dim, e)
        else:
            raise ValueError(f"unknown model family {family!r}")
        self.normalize = family in ("wal", "max_margin", "asynce") or o.get("normalize", False)

    # -- towers --------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) if self.normalize else x

    def encode_video(self, v: torch.Tensor, mask: torch.Tensor | None = None) -> Encoded:
        """v [N, D] or [N, T, D] with mask [N, T] -> pooled [N, E], or frames [N, T, E] for the
        families whose score looks at frames (WAL attention, AsyNCE)."""
        if v.ndim == 2:
            v, mask = v[:, None], None
        if mask is None:
            mask = torch.ones(v.shape[:2], dtype=torch.bool, device=v.device)
        if self.family == "wal":
            if self.attention is not None:
                return Encoded(self._norm(self.video_head(v)), mask)
            return Encoded(self._norm(masked_mean(self.video_head(v), mask)))
        if self.family == "asynce":
            return Encoded(self._norm(self.video_head(v)), mask)
        pooled = pool(v, mask, self.video_pool)  # S-MiT max-pools features over time first
        return Encoded(self._norm(self.video_head(pooled)))

    def encode_text(self, t: torch.Tensor, mask: torch.Tensor | None = None) -> Encoded:
        """t [N, D] or [N, K, D] word vectors with mask [N, K] -> [N, E] ([N, K, E] for AsyNCE)."""
        if t.ndim == 2:
            t, mask = t[:, None], None
        if mask is None:
            mask = torch.ones(t.shape[:2], dtype=torch.bool, device=t.device)
        if self.family == "asynce":
            return Encoded(self._norm(self.text_head(t)), mask)
        if self.mil_text is not None:
            return Encoded(self.mil_text(t, mask))
        return Encoded(self._norm(self.text_head(pool(t, mask, self.text_pool))))

    def encode_candidates(self, c: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """MIL-NCE candidate bags of texts [B, C, K, D] with their word mask [B, C, K] -> [B, C, E],
        each candidate encoded like any text."""
        b, n, k, d = c.shape
        return self.encode_text(c.reshape(b * n, k, d), words.reshape(b * n, k)).emb.reshape(b, n, -1)

    # -- scores --------------------------------------------------------------------------------
    def similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """S[i, j] = score(text i, video j), [N_text, N_video]."""
        if self.family == "wal" and self.attention is not None:
            return self.attention.scores(text.emb, video.emb, video.mask)
        if self.family == "order":
            return losses.order_violation(video.emb, text.emb)
        if self.family == "asynce":
            return asynce_similarity(self.word_sim(video, text), text.mask)
        return text.emb @ video.emb.T

    def paired_scores(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """score(text i, video i) for aligned rows: [N]."""
        if self.family == "wal" and self.attention is not None:
            return self.attention.paired(text.emb, video.emb, video.mask)
        return (text.emb * video.emb).sum(-1)

    def word_sim(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """AsyNCE word_sim [N_text, N_video, T, W] (padded frames score -inf-like low)."""
        s = torch.einsum("ikd,jtd->ijtk", text.emb, video.emb)
        if video.mask is not None:
            s = s.masked_fill(~video.mask[None, :, :, None], -1e4)
        return s


def asynce_similarity(word_sim: torch.Tensor, word_mask: torch.Tensor | None) -> torch.Tensor:
    """AsyNCE's retrieval score: the soft-frame S_p of every (sentence, video) pair."""
    if word_mask is None:
        frame = word_sim.mean(-1)
    else:
        wm = word_mask.to(word_sim.dtype)[:, None, None, :]
        frame = (word_sim * wm).sum(-1) / wm.sum(-1)
    return (frame.softmax(-1) * frame.clamp_min(-1e3)).sum(-1)


def build_model(train_cfg: Any, visual_dim: int, text_dim: int) -> RetrievalModel:
    """The model of `train_cfg.model` (a `TrainConfig`) for the given input dimensions;
    `train_cfg.options` carries family settings (attention, adversarial, adv_input, gumbel,
    n_background, hidden, text_hidden, video_pool, text_pool, normalize, ...)."""
    return RetrievalModel(train_cfg.model, visual_dim, text_dim, train_cfg.embed_dim, train_cfg.options)

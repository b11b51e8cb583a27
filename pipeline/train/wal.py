"""Watch and Learn (WAL): the sentence-driven frame attention and the adversarial discriminator."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ATTENTIONS = ("dot", "multiplicative", "additive")


class FrameAttention(nn.Module):
    """WAL's frame attention (2.2): the sentence vector s attends over the frame vectors v_t of
    the embedding module (FC-BN-ReLU), and the video vector is v = Σ_t a_t v_t with
    a_t = softmax_t(e_t) and, as the cited papers define them,

        dot:            e_t = sᵀ v_t                       (Luong et al. [17])
        multiplicative: e_t = sᵀ W v_t                     (Luong et al. [17], "general")
        additive:       e_t = wᵀ tanh(W_s s + W_v v_t)     (Bahdanau et al. [1])

    No scaling and no temperature, as in those papers; the logits are taken on the embedding
    module's outputs as they are. L2 normalisation comes after the pooling: the score is the
    cosine of s and v, the scale on which the discriminator's background vectors live (they
    start from L2-normalised video vectors, appendix 5.1). Normalising the frames before the
    attention caps the logits in [0, 1] (ReLU'd unit vectors), so the softmax cannot focus.
    """

    def __init__(self, dim: int, kind: str = "dot", hidden: int | None = None) -> None:
        super().__init__()
        if kind not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {kind!r}")
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
            return torch.einsum("ie,jte->ijt", s, self.w(v))
        hs, hv = self.ws(s), self.wv(v)
        out = []
        for chunk in range(0, len(hs), 32):  # [chunk, Nv, T, H] at a time
            h = torch.tanh(hs[chunk:chunk + 32, None, None, :] + hv[None])
            out.append(self.w(h).squeeze(-1))
        return torch.cat(out, 0)

    def weights(self, s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """a [N_text, N_video, T]: each sentence's attention over each video's real frames."""
        e = self.logits(s, v)
        if mask is not None:
            e = e.masked_fill(~mask[None], float("-inf"))
        return e.softmax(-1)

    def scores(self, s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """cos(s_i, Σ_t a_ijt v_jt) for every sentence i and video j: [N_text, N_video]. The
        attended vectors are never built: their norms come from each video's frame Gram matrix."""
        a = self.weights(s, v, mask)
        dots = (a * torch.einsum("ie,jte->ijt", s, v)).sum(-1)
        gram = torch.einsum("jte,jue->jtu", v, v)
        norm_sq = torch.einsum("ijt,jtu,iju->ij", a, gram, a)
        return dots / (s.norm(dim=-1)[:, None] * norm_sq.clamp_min(1e-12).sqrt()).clamp_min(1e-8)

    def paired(self, s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The score of pair i only (sentence i, video i): [N]."""
        if self.kind == "dot":
            e = torch.einsum("ie,ite->it", s, v)
        elif self.kind == "multiplicative":
            e = torch.einsum("ie,ite->it", s, self.w(v))
        else:
            e = self.w(torch.tanh(self.ws(s)[:, None] + self.wv(v))).squeeze(-1)
        if mask is not None:
            e = e.masked_fill(~mask, float("-inf"))
        video = (e.softmax(-1)[..., None] * v).sum(1)
        return F.cosine_similarity(s, video, dim=-1, eps=1e-8)


class WALDiscriminator(nn.Module):
    """WAL-att-adv's discriminator (2.2-2.3, appendix 5.1): B learned background visual vectors
    v_b, p_ADV = max_b sᵀv_b next to p_LVC = sᵀv, and the classifier F_ADV on `input_mode`:
    "residual" p_ADV − p_LVC (default: the paper's model, eq. under (1) and Table 1), "concat"
    [p_ADV, p_LVC] (Table 2 "In.=Con.") or "adv" p_ADV alone (Table 2 "In.=p_ADV"). s must be
    the L2-normalised sentence vector, as v is.

    Its logit a is both the input of L_ADV = BCE(a, y=0) and the logit of the routing draw:
    z ∈ {0, 1} per pair is a hard straight-through Gumbel-softmax sample over the logits [0, a],
    so P(z=1) = σ(a) (gumbel=False: the straight-through argmax, z = [a > 0], Table 2's softmax
    ablation). Tying z to F_ADV is what makes the fixed label 0 pull pairs back to L_LVC over
    training (appendix 5.1): a pair stays with L_ADV only while L_LVC costs more than
    −log P(z=0) = BCE(a, 0), i.e. the pairs L_LVC cannot fit."""

    def __init__(self, dim: int, n_background: int = 4, input_mode: str = "residual", gumbel: bool = True,
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

"""The five papers' training losses (papers/METHODS.md), as pure torch functions.

Layout: a similarity matrix is ``S[i, j] = score(text i, video j)``, shape [N_text, N_video]
(the layout `pipeline.train.metrics` ranks), with the positive pairs on the diagonal. A row
is a text query ranking videos ("t2v"), a column a video query ranking texts ("v2t"). The
symmetric losses do not depend on which side is which. Every loss is a mean over the batch's
queries unless its docstring says otherwise.

`LOSSES` maps the config's `train.model` names to these functions; their inputs differ
(a similarity matrix, embeddings, candidate sets, or frame-word similarities), as each
docstring says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Direction = Literal["both", "t2v", "v2t"]


def _square(sim: torch.Tensor) -> int:
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1] or sim.shape[0] < 2:
        raise ValueError(f"expected a square [B, B] similarity matrix with B >= 2, got {tuple(sim.shape)}")
    return sim.shape[0]


def _margin_ce(sim: torch.Tensor, row_margin: torch.Tensor, col_margin: torch.Tensor,
               temperature: float) -> torch.Tensor:
    """Symmetric softmax cross-entropy with the diagonal logit lowered by a per-query margin:
    rows use S_ii - row_margin[i], columns S_jj - col_margin[j]; the two directions averaged."""
    b = sim.shape[0]
    eye = torch.eye(b, dtype=torch.bool, device=sim.device)
    target = torch.arange(b, device=sim.device)
    rows = torch.where(eye, sim - row_margin[:, None], sim) / temperature
    cols = torch.where(eye, sim - col_margin[None, :], sim) / temperature
    return 0.5 * (F.cross_entropy(rows, target) + F.cross_entropy(cols.T, target))


# ---------------------------------------------------------------- S-MiT: NCE, MMS, AMM, SHN


def nce(sim: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Symmetric InfoNCE over a [B, B] similarity matrix, diagonal positives (S-MiT 2.3.1 "NCE", eq. 1):

        L = 1/2 [ 1/B Σ_i -log( e^{S_ii/τ} / Σ_j e^{S_ij/τ} )
                + 1/B Σ_j -log( e^{S_jj/τ} / Σ_i e^{S_ij/τ} ) ]

    S-MiT gives no temperature; τ=1 (the config default) is the plain softmax it describes.
    """
    b = _square(sim)
    zero = sim.new_zeros(b)
    return _margin_ce(sim, zero, zero, temperature)


def mms(sim: torch.Tensor, margin: float, temperature: float = 1.0) -> torch.Tensor:
    """Max-margin softmax (S-MiT "MMS", eq. 2): NCE with the positive logit S_ii replaced by S_ii - m,

        L = 1/2 [ 1/B Σ_i -log( e^{(S_ii-m)/τ} / (e^{(S_ii-m)/τ} + Σ_{j≠i} e^{S_ij/τ}) ) + (columns) ]

    `m` comes from `MarginSchedule` during training.
    """
    b = _square(sim)
    m = sim.new_full((b,), float(margin))
    return _margin_ce(sim, m, m, temperature)


@dataclass(frozen=True)
class MarginSchedule:
    """The MMS margin of S-MiT: m starts at 0.001 and is multiplied by 1.002 every 1000 steps,

        m(step) = initial · factor^⌊step / every⌋
    """

    initial: float = 0.001
    factor: float = 1.002
    every: int = 1000

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.initial * self.factor ** (step // self.every)


def amm(sim: torch.Tensor, alpha: float = 0.5, temperature: float = 1.0, detach: bool = True) -> torch.Tensor:
    """Adaptive mean margin (S-MiT 4.3 "AMM", eq. 3): MMS with a per-query margin

        rows (text i):     m_i = α · mean_{j≠i}(S_ii - S_ij)
        columns (video j): m_j = α · mean_{i≠j}(S_jj - S_ij)

    so the positive logit is S_ii - m_i = (1-α)·S_ii + α·mean_{j≠i} S_ij. With α=1 it is the mean
    of the negatives and S_ii drops out of the value (and, with detach=False, of the gradient).
    α=0.5 was best in the paper. The paper does not say whether gradient flows through m:
    `detach=True` (default) treats m as a constant.
    """
    b = _square(sim)
    diag = sim.diagonal()
    off = ~torch.eye(b, dtype=torch.bool, device=sim.device)
    zero = sim.new_zeros(())
    row_neg_mean = torch.where(off, sim, zero).sum(1) / (b - 1)
    col_neg_mean = torch.where(off, sim, zero).sum(0) / (b - 1)
    row_margin = alpha * (diag - row_neg_mean)
    col_margin = alpha * (diag - col_neg_mean)
    if detach:
        row_margin, col_margin = row_margin.detach(), col_margin.detach()
    return _margin_ce(sim, row_margin, col_margin, temperature)


def _semi_hard(pos: torch.Tensor, neg: torch.Tensor, neg_ok: torch.Tensor, margin: float) -> torch.Tensor:
    """Per query: hinge on the hardest negative still scored below the positive (FaceNet's
    semi-hard choice); when every negative scores >= the positive, the easiest one (as
    TensorFlow's triplet_semihard_loss). pos [B], neg [B, B] with neg_ok marking negatives."""
    with torch.no_grad():
        inf = torch.tensor(float("inf"), device=neg.device, dtype=neg.dtype)
        below = neg_ok & (neg < pos[:, None])
        hardest_below = torch.where(below, neg, -inf).argmax(1)
        easiest = torch.where(neg_ok, neg, inf).argmin(1)
        pick = torch.where(below.any(1), hardest_below, easiest)
    chosen = neg.gather(1, pick[:, None]).squeeze(1)
    return F.relu(margin - pos + chosen).mean()


def shn(sim: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """Semi-hard negative triplet loss (S-MiT baseline "SHN"), both directions averaged:

        L_rows = 1/B Σ_i max(0, m - S_ii + S_in(i)),   n(i) = argmax_{j≠i, S_ij < S_ii} S_ij

    (the easiest negative when no negative scores below the positive); columns likewise.
    METHODS.md gives no SHN margin; the default is the config's 0.2.
    """
    b = _square(sim)
    off = ~torch.eye(b, dtype=torch.bool, device=sim.device)
    diag = sim.diagonal()
    return 0.5 * (_semi_hard(diag, sim, off, margin) + _semi_hard(diag, sim.T, off, margin))


# ---------------------------------------------------------------- ranking (Torabi, WAL ablation)


def max_margin(sim: torch.Tensor, margin: float = 0.05, reduction: Literal["sum", "max"] = "sum",
               direction: Direction = "both") -> torch.Tensor:
    """Pairwise hinge ranking loss over the batch's contrastive items:

        t2v (contrastive videos):   h_ij = max(0, α - S_ii + S_ij),  j ≠ i   (row i)
        v2t (contrastive captions): h_ji = max(0, α - S_ii + S_ji),  j ≠ i   (column i)
        L = 1/B Σ_i [ R_j h_ij + R_j h_ji ]

    R is Σ (reduction="sum", Torabi et al.: "Σ over contrastive captions and contrastive videos",
    α=0.05) or max (reduction="max": the hardest negative, WAL's triplet ablation with α=0.2).
    `direction` keeps one term: "v2t" is Torabi's annotation ranking (the caption term only).
    """
    b = _square(sim)
    off = ~torch.eye(b, dtype=torch.bool, device=sim.device)
    diag = sim.diagonal()
    zero = sim.new_zeros(())
    terms = []
    if direction in ("both", "t2v"):
        terms.append(torch.where(off, F.relu(margin - diag[:, None] + sim), zero))
    if direction in ("both", "v2t"):
        terms.append(torch.where(off, F.relu(margin - diag[:, None] + sim.T), zero))
    if not terms:
        raise ValueError(f"direction must be 'both', 't2v' or 'v2t', got {direction!r}")
    if reduction == "sum":
        per_query = sum(t.sum(1) for t in terms)
    elif reduction == "max":
        per_query = sum(t.max(1).values for t in terms)
    else:
        raise ValueError(f"reduction must be 'sum' or 'max', got {reduction!r}")
    return per_query.mean()


def order_embed(x: torch.Tensor) -> torch.Tensor:
    """Torabi et al.: embeddings made non-negative (absolute value), then L2-normalised."""
    return F.normalize(x.abs(), dim=-1)


def order_violation(video: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """Order-violation similarity of Torabi et al. (appendix B.2, eq. 3), on `order_embed`-ed inputs:

        S(c, v) = -‖max(0, c - v)‖²

    video [N_video, D], text [N_text, D] -> S [N_text, N_video] with S[i, j] = S(c_i, v_j).
    """
    c = order_embed(text)[:, None, :]
    v = order_embed(video)[None, :, :]
    return -F.relu(c - v).pow(2).sum(-1)


def order_ranking(video: torch.Tensor, text: torch.Tensor, margin: float = 0.05,
                  direction: Direction = "v2t") -> torch.Tensor:
    """Torabi et al.'s ranking loss on the order-violation similarity (appendix B.2: eq. 5, annotation
    ranking; eq. 4, pairwise), Σ over contrastive items:

        L = 1/B Σ_i Σ_{j≠i} max(0, α - S(c_i, v_i) + S(c_j, v_i))          (direction="v2t")

    The default is their annotation ranking (the caption term only: each video ranks the
    batch's captions); direction="both" adds the contrastive-video term (pairwise ranking).
    """
    return max_margin(order_violation(video, text), margin, reduction="sum", direction=direction)


# ---------------------------------------------------------------- MIL-NCE and its baselines


def _candidate_mask(video: torch.Tensor, text: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The [B, K] validity mask of video [B, D] and text [B, K, D], shapes checked."""
    if video.ndim != 2 or text.ndim != 3 or text.shape[0] != video.shape[0] or text.shape[2] != video.shape[1]:
        raise ValueError(f"expected video [B, D] and text [B, K, D], got {tuple(video.shape)} and "
                         f"{tuple(text.shape)}")
    if mask is None:
        mask = torch.ones(text.shape[:2], dtype=torch.bool, device=text.device)
    mask = mask.bool()
    if mask.shape != text.shape[:2]:
        raise ValueError(f"mask must be [B, K] = {tuple(text.shape[:2])}, got {tuple(mask.shape)}")
    if not mask.any(1).all():
        raise ValueError("every clip needs at least one valid text candidate")
    return mask


def _candidate_scores(video: torch.Tensor, text: torch.Tensor, mask: torch.Tensor | None,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x[i, j, k] = f(video_i)ᵀ g(text_{j,k}) / τ  ([B, B, K]) and the [B, K] validity mask."""
    mask = _candidate_mask(video, text, mask)
    return torch.einsum("id,jkd->ijk", video, text) / temperature, mask


def _mil_nce(x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """1/B Σ_i -[pos_i - log(e^{pos_i} + Σ_{N_i} e^{x})] for a positive logit pos_i, where N_i
    holds video i with every valid candidate of the other clips (x[i, j≠i, k]) and every other
    video with clip i's valid candidates (x[j≠i, i, k]): negatives in both directions (MIL-NCE)."""
    b = x.shape[0]
    neg_inf = x.new_tensor(float("-inf"))
    other = ~torch.eye(b, dtype=torch.bool, device=x.device)[:, :, None]
    narration_neg = torch.where(other & mask[None, :, :], x, neg_inf)  # [i, j, k]: video i, text j,k
    video_neg = torch.where(other & mask[:, None, :], x.transpose(0, 1), neg_inf)  # [i, j, k]: video j, text i,k
    parts = [pos[:, None], narration_neg.reshape(b, -1), video_neg.reshape(b, -1)]
    return (torch.logsumexp(torch.cat(parts, 1), 1) - pos).mean()


def milnce(video: torch.Tensor, text: torch.Tensor, mask: torch.Tensor | None = None,
           temperature: float = 1.0) -> torch.Tensor:
    """MIL-NCE (Miech et al., eq. 1; P_i as in 4.1): the K candidate narrations of a clip are all positives,

        L = 1/B Σ_i -log( Σ_{k∈P_i} e^{x_iik} / (Σ_{k∈P_i} e^{x_iik} + Σ_{(x',y')∈N_i} e^{f(x')ᵀg(y')}) )

    video [B, D], text [B, K, D] (clip i's candidates, its own narration included), mask [B, K]
    (True = a real candidate; padding is neither positive nor negative). N_i holds every other
    pair in the batch in both directions: clip i with the other clips' candidates and the
    other clips with clip i's candidates. Each positive counts once in the denominator, as
    the paper's formula (the released code adds the positives twice). τ=1: the paper has none.
    """
    x, mask = _candidate_scores(video, text, mask, temperature)
    own = x.diagonal().T  # [B, K]: x[i, i, k]
    pos = torch.logsumexp(own.masked_fill(~mask, float("-inf")), 1)
    return _mil_nce(x, mask, pos)


def max_nce(video: torch.Tensor, text: torch.Tensor, mask: torch.Tensor | None = None,
            temperature: float = 1.0) -> torch.Tensor:
    """Max+NCE baseline of MIL-NCE (appendix A, eqs. 5-6): only the best-scoring valid candidate is the positive,

        pos_i = max_{k∈P_i} x_iik,   L = 1/B Σ_i -log( e^{pos_i} / (e^{pos_i} + Σ_{N_i} e^{·}) )

    with MIL-NCE's negative set N_i (the other candidates of clip i are ignored).
    """
    x, mask = _candidate_scores(video, text, mask, temperature)
    pos = x.diagonal().T.masked_fill(~mask, float("-inf")).max(1).values
    return _mil_nce(x, mask, pos)


def attn_nce(video: torch.Tensor, text: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor | None = None,
             temperature: float = 1.0) -> torch.Tensor:
    """Attn+NCE baseline of MIL-NCE (appendix A, eqs. 7-8): the positive is the sum of the
    candidates' exponentiated scores weighted by a cross-modal attention,

        a_ik = e^{f_a(x_i)ᵀ g_a(y_ik)} / Σ_{k'∈P_i} e^{f_a(x_i)ᵀ g_a(y_ik')}           (7)
        L = 1/B Σ_i -log( Σ_k a_ik e^{x_iik} / (Σ_k a_ik e^{x_iik} + Σ_{N_i} e^{·}) )     (8)

    i.e. pos_i = log Σ_{k∈P_i} a_ik e^{x_iik} (the extracted text garbles eq. 8; read next to
    eq. 6 it is Σ a·e^x, not e^{Σ a·x}), with MIL-NCE's negative set. `attention` [B, K] holds
    the logits f_a(x_i)ᵀ g_a(y_ik) of the model's own attention heads (`models`), which share
    the towers except their last Linear.
    """
    x, mask = _candidate_scores(video, text, mask, temperature)
    own = x.diagonal().T
    if attention.shape != own.shape:
        raise ValueError(f"attention must be [B, K] = {tuple(own.shape)}, got {tuple(attention.shape)}")
    log_a = attention.masked_fill(~mask, float("-inf")).log_softmax(1)
    pos = torch.logsumexp((log_a + own).masked_fill(~mask, float("-inf")), 1)
    return _mil_nce(x, mask, pos)


# ---------------------------------------------------------------- WAL


def wal_lvc_bce(scores: torch.Tensor, labels: torch.Tensor,
                reduction: Literal["mean", "none"] = "mean") -> torch.Tensor:
    """WAL's LVC loss (2.3, eq. 1): binary cross-entropy on the classifier output F_LVC(sᵀv) (logits),

        L = -[ y log σ(F) + (1 - y) log(1 - σ(F)) ]

    labels: 1 for time-aligned pairs, 0 for the sentence drawn from another video (WAL
    batches hold as many of each). reduction="none" gives the per-pair loss `wal_adv_pair` needs.
    """
    return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype), reduction=reduction)


def wal_adv_pair(lvc_scores: torch.Tensor, adv_scores: torch.Tensor, labels: torch.Tensor,
                 z: torch.Tensor) -> torch.Tensor:
    """WAL-att-adv per-pair loss (2.3), averaged: (1 - z)·L_LVC + z·L_ADV with L_ADV = BCE(F_ADV, y=0).

    z [B] is the discriminator's draw (a hard straight-through Gumbel sample, 1 = sent to the
    background vectors) with P(z=1) = σ(adv_scores) (`models.WALDiscriminator`): L_ADV is then
    −log P(z=0), so the fixed label 0 pushes pairs back to L_LVC over training (WAL) and a pair
    stays at z=1 only while its L_LVC is the larger cost. adv_scores must be the logits z was
    drawn from; a free F_ADV lets its bias drive L_ADV to 0 and every pair to z=1.
    """
    lvc = wal_lvc_bce(lvc_scores, labels, reduction="none")
    adv = F.binary_cross_entropy_with_logits(adv_scores, torch.zeros_like(adv_scores), reduction="none")
    return ((1 - z) * lvc + z * adv).mean()


# ---------------------------------------------------------------- AsyNCE


Aggregate = Literal["mean", "soft"]


def _masked_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax over the True entries of `mask` along `dim` (0 elsewhere); values at masked-out
    entries never reach the result, so padding may hold anything finite or not."""
    return x.masked_fill(~mask, float("-inf")).softmax(dim).masked_fill(~mask, 0.0)


def asynce_frame_scores(word_sim: torch.Tensor, word_mask: torch.Tensor, frame_mask: torch.Tensor,
                        temperature: float, entity: Aggregate) -> torch.Tensor:
    """The frame-sentence similarity F[i, j, t] of sentence i and frame t of video j (AsyNCE
    3.1-3.2), from word_sim [B_t, B_v, T, W] (max over regions already taken):

        entity="mean":  S(V_t, Q)  = 1/K Σ_k s(v_t, q_k)                                 (eq. 1)
        entity="soft":  S̄(V_t, Q) = Σ_k softmax_t(s(v_t, q_k)/τ) · s(v_t, q_k)          (eq. 7)

    k runs over sentence i's real words (word_mask [B_t, W]) and the softmax of eq. 7 over video
    j's real frames (frame_mask [B_v, T]). Eq. 7 is followed as printed: a sum over words, each
    weighted by a softmax over frames (no 1/K). Padded frames come out as 0.
    """
    words = word_mask[:, None, None, :]
    frames = frame_mask[None, :, :, None]
    both = words & frames
    sim = word_sim.masked_fill(~both, 0.0)
    if entity == "mean":
        return sim.sum(-1) / word_mask.sum(-1).clamp_min(1).to(sim.dtype)[:, None, None]
    if entity == "soft":
        weights = _masked_softmax(sim / temperature, frames.expand_as(sim), 2)
        return (weights * sim).sum(-1)
    raise ValueError(f"entity must be 'mean' or 'soft', got {entity!r}")


def asynce_positive(frame_scores: torch.Tensor, frame_mask: torch.Tensor, frame: Aggregate) -> torch.Tensor:
    """S_p of every (sentence i, video j): frame_scores [B_t, B_v, T] aggregated over video j's
    real frames,

        frame="mean":  S_p = 1/T Σ_t F_t                          (AsyNCE eq. 4)
        frame="soft":  S_p = Σ_t softmax_t(F_t) · F_t             (eq. 5)
    """
    frames = frame_mask[None].expand_as(frame_scores)
    if frame == "mean":
        return frame_scores.masked_fill(~frames, 0.0).sum(-1) / frames.sum(-1).clamp_min(1)
    if frame == "soft":
        return (_masked_softmax(frame_scores, frames, -1) * frame_scores.masked_fill(~frames, 0.0)).sum(-1)
    raise ValueError(f"frame must be 'mean' or 'soft', got {frame!r}")


def asynce(word_sim: torch.Tensor, word_mask: torch.Tensor | None = None, frame_mask: torch.Tensor | None = None,
           delta: float = 0.05, temperature: float = 0.07, entity: Aggregate = "soft", frame: Aggregate = "soft",
           scale_negatives: bool = True) -> torch.Tensor:
    """AsyNCE, the asymmetric frame-level MIL loss for weakly supervised grounding (AsyNCE 3.2,
    eq. 8; eq. 6 is its entity="mean" form):

        L = 1/B Σ_i -log( e^{(S_p(V_i,Q_i)-Δ)/τ} / (e^{(S_p-Δ)/τ} + Σ_{V'≠V_i} Σ_t e^{F(V'_t,Q_i)/τ}
                                                                  + Σ_{Q'≠Q_i} Σ_t e^{F(V_i,t,Q')/τ}) )

    word_sim[i, j, t, k] = s(v_t, q_k) between sentence i's word k and video j's frame t,
    [B, B, T, W]; with regions, [B, B, T, N, W] and the max over regions n is taken (eq. 1).
    F is `asynce_frame_scores` (entity: "mean" eq. 1, "soft" eq. 7) and S_p `asynce_positive`
    (frame: "mean" eq. 4, "soft" eq. 5); the paper's model (its Table 1) uses soft/soft. The
    positive is aggregated over frames, the negatives keep one term per real frame.

    word_mask [B, W] and frame_mask [B, T] (True = real word / frame) default to all real;
    padding never enters a softmax, a mean or the negatives, so the loss does not depend on
    how far a batch is padded. The paper's eq. 8 writes the negative exponents without τ (and
    its positive inside Σ_t, a typo); scale_negatives=True (default) divides them by τ as
    well, which keeps both terms on one scale (False: the exponents as printed).
    """
    if word_sim.ndim == 5:
        word_sim = word_sim.max(3).values
    if word_sim.ndim != 4 or word_sim.shape[0] != word_sim.shape[1] or word_sim.shape[0] < 2:
        raise ValueError(f"expected word_sim [B, B, T, W] or [B, B, T, N, W], got {tuple(word_sim.shape)}")
    b, _, t, w = word_sim.shape
    if word_mask is None:
        word_mask = torch.ones(b, w, dtype=torch.bool, device=word_sim.device)
    if frame_mask is None:
        frame_mask = torch.ones(b, t, dtype=torch.bool, device=word_sim.device)
    word_mask, frame_mask = word_mask.bool(), frame_mask.bool()
    if word_mask.shape != (b, w) or frame_mask.shape != (b, t):
        raise ValueError(f"word_mask must be {(b, w)} and frame_mask {(b, t)}, got "
                         f"{tuple(word_mask.shape)} and {tuple(frame_mask.shape)}")
    scores = asynce_frame_scores(word_sim, word_mask, frame_mask, temperature, entity)  # [B, B, T]
    s_p = asynce_positive(scores, frame_mask, frame).diagonal()
    neg = scores / temperature if scale_negatives else scores
    other = ~torch.eye(b, dtype=torch.bool, device=word_sim.device)[:, :, None]
    neg_inf = neg.new_tensor(float("-inf"))
    # sentence i against the other videos' real frames; video i's real frames against the other sentences
    video_neg = torch.where(other & frame_mask[None, :, :], neg, neg_inf).reshape(b, -1)
    sentence_neg = torch.where(other & frame_mask[:, None, :], neg.transpose(0, 1), neg_inf).reshape(b, -1)
    pos = (s_p - delta) / temperature
    return (torch.logsumexp(torch.cat([pos[:, None], video_neg, sentence_neg], 1), 1) - pos).mean()


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "wal": wal_lvc_bce,
    "nce": nce,
    "mms": mms,
    "amm": amm,
    "shn": shn,
    "milnce": milnce,
    "max_margin": max_margin,
    "order": order_ranking,
    "asynce": asynce,
}

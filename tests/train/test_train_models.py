"""The models' building blocks against formulas written out by hand: WAL's frame attention,
AsyNCE's cross-modal transformer, Torabi et al.'s LSTM and frame attention, MIL-NCE's
attention heads and Cat+NCE's narration."""

from math import exp

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.config import TrainConfig
from pipeline.train.cmt import CrossModalTransformer
from pipeline.train.batches import concat_candidates
from pipeline.train.heads import EmbedHead
from pipeline.train.models import build_model
from pipeline.train.torabi import AttendedVideo, LSTMText
from pipeline.train.wal import FrameAttention


def test_wal_dot_attention_by_hand():
    """Luong's dot attention on the embedding vectors as they are: logits sᵀv_t, no scaling;
    the score is the cosine of s and Σ a_t v_t."""
    s = torch.tensor([[2.0, 0.0, 0.0]])
    v = torch.tensor([[[2.0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 1], [1, 0, 0]]])
    logits = np.array([4.0, 0, 0, 0, 2])
    a = np.exp(logits) / np.exp(logits).sum()
    att = FrameAttention(3)
    assert att.weights(s, v, None)[0, 0].tolist() == pytest.approx(a.tolist())
    assert a[0] == pytest.approx(exp(4) / (exp(4) + 3 + exp(2)))  # 0.86 on the matching frame
    video = a @ v[0].numpy()
    cosine = video[0] / np.linalg.norm(video)  # s points along the first axis
    assert att.scores(s, v, None).item() == pytest.approx(cosine, rel=1e-5)
    assert att.paired(s, v, None).item() == pytest.approx(cosine, rel=1e-5)
    mask = torch.tensor([[False, True, True, True, True]])
    assert att.weights(s, v, mask)[0, 0, 0] == 0.0


def test_wal_attention_can_focus_at_init():
    """Regression: over ReLU'd, L2-normalised frames the logits lay in [0, 1] and the largest of
    5 weights averaged about 0.2; on the embedding module's outputs the attention is peaked."""
    torch.manual_seed(0)
    video_head, text_head = EmbedHead(128, 64), EmbedHead(96, 64)
    v, s = video_head(torch.randn(60, 5, 128)), text_head(torch.randn(60, 96))
    att = FrameAttention(64)
    own = att.weights(s, v, None)[torch.arange(60), torch.arange(60)]
    assert own.max(-1).values.mean() > 0.6
    capped = att.weights(F.normalize(s, dim=-1), F.normalize(v, dim=-1), None)[torch.arange(60), torch.arange(60)]
    assert capped.max(-1).values.mean() < 0.3


@pytest.mark.parametrize("kind", ["dot", "multiplicative", "additive"])
def test_wal_attention_scores_match_the_attended_vectors(kind):
    torch.manual_seed(1)
    att = FrameAttention(6, kind)
    s, v = torch.randn(3, 6), torch.randn(4, 5, 6)
    mask = torch.rand(4, 5) > 0.3
    mask[:, 0] = True
    a = att.weights(s, v, mask)
    assert torch.allclose(a.sum(-1), torch.ones(3, 4)) and (a[:, ~mask] == 0).all()
    attended = torch.einsum("ijt,jte->ije", a, v)
    expected = F.cosine_similarity(s[:, None], attended, dim=-1)
    assert torch.allclose(att.scores(s, v, mask), expected, atol=1e-5)
    assert torch.allclose(att.paired(s[:3], v[:3], mask[:3]), expected.diagonal()[:3], atol=1e-5)


def _layer_norm(x, ln):
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def test_cmt_by_hand():
    """AsyNCE eqs. 10-11 for one word and one frame, written out: per head softmax over the
    frame's regions of (q W_q)(v W_k)ᵀ/√d_h, heads concatenated, two LayerNorms and the FFN."""
    torch.manual_seed(0)
    d, heads = 8, 4
    cmt = CrossModalTransformer(d, heads, ffn=16)
    q, v = torch.randn(2, 3, d), torch.randn(2, 4, 2, d)  # 2 sentences x 3 words; 2 videos x 4 frames x 2 regions
    out = cmt(q, v)
    assert out.shape == (2, 2, 4, 3, d)
    i, j, t, k = 1, 0, 2, 1
    qw, kv, vv = q[i, k] @ cmt.wq.weight.T, v[j, t] @ cmt.wk.weight.T, v[j, t] @ cmt.wv.weight.T
    dh = d // heads
    z = []
    for h in range(heads):
        part = slice(h * dh, (h + 1) * dh)
        a = torch.softmax(kv[:, part] @ qw[part] / dh ** 0.5, 0)
        z.append(a @ vv[:, part])
    g1 = _layer_norm(torch.cat(z) + qw, cmt.ln1)
    f = _layer_norm(cmt.ffn(g1) + g1, cmt.ln2)
    assert torch.allclose(out[i, j, t, k], f, atol=1e-5)
    sim = cmt.word_sim(q, v)  # [Nt, Nv, T, N, K]: cosine of f(q_k|V_t) with each region
    assert sim[i, j, t, 1, k].item() == pytest.approx(F.cosine_similarity(f, v[j, t, 1], dim=0).item(), abs=1e-5)
    # One region per frame (frame features): the softmax is 1 and Z = v W_v whatever W_q, W_k are.
    one = cmt(q, v[:, :, :1])
    g1 = _layer_norm(v[j, t, 0] @ cmt.wv.weight.T + qw, cmt.ln1)
    assert torch.allclose(one[i, j, t, k], _layer_norm(cmt.ffn(g1) + g1, cmt.ln2), atol=1e-5)


def test_lstm_sentence_is_the_last_real_hidden_state():
    torch.manual_seed(0)
    enc = LSTMText(5, 7)
    words = torch.randn(1, 3, 5)
    _, (h, _) = enc.lstm(words)
    padded = torch.cat([words, torch.full((1, 4, 5), 9.0)], 1)
    mask = torch.tensor([[True] * 3 + [False] * 4])
    assert torch.allclose(enc(padded, mask), h[-1], atol=1e-6)
    assert torch.allclose(enc(words, torch.ones(1, 3, dtype=torch.bool)), h[-1], atol=1e-6)


def test_m3_scores_by_hand():
    torch.manual_seed(0)
    m3 = AttendedVideo(embed_dim=5, visual_dim=4, att_dim=3)
    h, frames = torch.randn(2, 5), torch.randn(3, 4, 4)
    mask = torch.tensor([[True, True, False, False], [True] * 4, [True, False, False, False]])
    got = m3.scores(h, frames, mask, chunk=1)
    i, j = 1, 0
    e = torch.stack([m3.w(torch.tanh(m3.wh(h[i]) + m3.wv(frames[j, t]))).squeeze() for t in range(2)])
    a = torch.softmax(e, 0)
    v = m3.video((a[:, None] * frames[j, :2]).sum(0))  # weighted frame average, then W_video
    c, v = F.normalize(h[i].abs(), dim=0), F.normalize(v.abs(), dim=0)
    assert got[i, j].item() == pytest.approx(-(torch.relu(c - v) ** 2).sum().item(), abs=1e-6)


def test_milnce_attention_heads_share_the_towers_but_the_last_linear():
    cfg = TrainConfig(model="milnce", visual="v", text="t", embed_dim=4, options={"variant": "attn", "text_hidden": 6})
    model = build_model(cfg, 3, 5)
    assert model.mil_text.attention is not None and model.video_attention is not None
    torch.manual_seed(0)
    v, c = torch.randn(2, 3), torch.randn(2, 2, 4, 5)
    words = torch.tensor([[[1, 1, 0, 0], [1, 1, 1, 1]], [[1, 0, 0, 0], [1, 1, 1, 0]]], dtype=torch.bool)
    got = model.candidate_attention(v, None, c, words)
    b, k = 1, 1
    hidden = torch.relu(model.mil_text.fc1(c[b, k, :3])).max(0).values  # the tower's shared max-pool
    expected = model.video_attention(v[b]) @ model.mil_text.attention(hidden)
    assert got[b, k].item() == pytest.approx(expected.item(), abs=1e-6)


def test_cat_concatenates_the_candidates_words():
    cand = torch.arange(2 * 2 * 3 * 1, dtype=torch.float).reshape(2, 2, 3, 1)
    words = torch.tensor([[[1, 1, 0], [1, 0, 0]], [[1, 1, 1], [1, 0, 0]]], dtype=torch.bool)
    mask = torch.tensor([[True, True], [True, False]])  # clip 1's second slot is padding
    seq, seq_mask = concat_candidates(cand, words, mask)
    assert seq[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert seq_mask.tolist() == [[True, True, False, True, False, False], [True, True, True, False, False, False]]
    assert seq[0, seq_mask[0], 0].tolist() == [0.0, 1.0, 3.0]  # words of narration 1, then of narration 2

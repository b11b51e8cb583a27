"""The training losses against values worked out by hand on 2x2 / 3x3 cases, and their gradients."""

from math import exp, log
from typing import get_args

import pytest
import torch

from pipeline.config import TrainModel
from pipeline.train import losses as L


def softplus(x: float) -> float:
    return log(1 + exp(x))


def nll(pos: float, others: list[float]) -> float:
    """-log(e^pos / (e^pos + Σ e^others))."""
    return -pos + log(exp(pos) + sum(exp(o) for o in others))


def grad_of(fn, sim: torch.Tensor) -> torch.Tensor:
    s = sim.clone().requires_grad_(True)
    fn(s).backward()
    return s.grad


def assert_step_helps(fn, sim: torch.Tensor, lr: float = 0.1) -> None:
    """One gradient step lowers the loss, raises every positive, lowers every negative it moves."""
    g = grad_of(fn, sim)
    stepped = sim - lr * g
    assert fn(stepped) < fn(sim)
    assert (stepped.diagonal() > sim.diagonal()).all()
    off = ~torch.eye(len(sim), dtype=torch.bool)
    assert (g[off] >= 0).all()  # negatives never pushed up


S2 = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
S3 = torch.tensor([[3.0, 1.0, 0.0], [2.0, 4.0, 1.0], [0.0, 1.0, 2.0]])


# ---------------------------------------------------------------- NCE / MMS / AMM


def test_nce_2x2_by_hand():
    t = 0.5
    rows = softplus((0 - 2) / t) + softplus((1 - 3) / t)  # row i: log(1 + e^{(S_ij - S_ii)/τ})
    cols = softplus((1 - 2) / t) + softplus((0 - 3) / t)
    assert L.nce(S2, t).item() == pytest.approx(0.5 * (rows / 2 + cols / 2))
    assert_step_helps(lambda s: L.nce(s, t), S2)


def test_mms_2x2_by_hand_and_schedule():
    m = 0.3
    rows = softplus(0 - (2 - m)) + softplus(1 - (3 - m))
    cols = softplus(1 - (2 - m)) + softplus(0 - (3 - m))
    assert L.mms(S2, m).item() == pytest.approx(0.5 * (rows / 2 + cols / 2))
    assert L.mms(S2, 0.0).item() == pytest.approx(L.nce(S2).item())
    assert L.mms(S2, m) > L.nce(S2)
    assert_step_helps(lambda s: L.mms(s, m), S2)

    sched = L.MarginSchedule()
    assert sched(0) == sched(999) == pytest.approx(0.001)
    assert sched(1000) == pytest.approx(0.001 * 1.002)
    assert sched(2500) == pytest.approx(0.001 * 1.002**2)


def test_amm_3x3_by_hand():
    a = 0.5
    # Rows: m_i = α(S_ii - mean_{j≠i} S_ij); the positive logit is S_ii - m_i.
    # row 0: 3 - .5(3 - .5) = 1.75; row 1: 4 - .5(4 - 1.5) = 2.75; row 2: 2 - .5(2 - .5) = 1.25
    rows = nll(1.75, [1, 0]) + nll(2.75, [2, 1]) + nll(1.25, [0, 1])
    # Columns: col 0 negatives 2, 0 -> 3 - .5(3 - 1) = 2; col 1 negatives 1, 1 -> 4 - .5(4 - 1) = 2.5;
    # col 2 negatives 0, 1 -> 2 - .5(2 - .5) = 1.25
    cols = nll(2.0, [2, 0]) + nll(2.5, [1, 1]) + nll(1.25, [0, 1])
    expected = 0.5 * (rows / 3 + cols / 3)
    assert L.amm(S3, a).item() == pytest.approx(expected)
    assert L.amm(S3, a, detach=False).item() == pytest.approx(expected)  # detach changes gradients only
    assert L.amm(S3, 0.0).item() == pytest.approx(L.nce(S3).item())
    assert_step_helps(lambda s: L.amm(s, a), S3)


def test_amm_alpha_one_has_no_positive_term():
    # α=1: positive logit = mean of the negatives, so S_ii drops out of the value.
    other = S3.clone()
    other.diagonal().copy_(torch.tensor([-5.0, 10.0, 0.3]))
    for detach in (True, False):
        assert L.amm(S3, 1.0, detach=detach).item() == pytest.approx(L.amm(other, 1.0, detach=detach).item())
    rows = nll(0.5, [1, 0]) + nll(1.5, [2, 1]) + nll(0.5, [0, 1])
    cols = nll(1.0, [2, 0]) + nll(1.0, [1, 1]) + nll(0.5, [0, 1])
    assert L.amm(S3, 1.0).item() == pytest.approx(0.5 * (rows / 3 + cols / 3))
    # With gradient through m, nothing reaches the diagonal; detached, the positive is still pushed up.
    assert torch.count_nonzero(grad_of(lambda s: L.amm(s, 1.0, detach=False), S3).diagonal()) == 0
    assert (grad_of(lambda s: L.amm(s, 1.0, detach=True), S3).diagonal() < 0).all()


# ---------------------------------------------------------------- SHN / ranking


def test_shn_3x3_by_hand():
    s = torch.tensor([[3.0, 2.9, 0.0], [1.8, 2.0, 2.5], [2.5, 3.0, 2.0]])
    m = 0.5
    # rows: 0 -> hardest below 3 is 2.9: .4; 1 -> hardest below 2 is 1.8: .3;
    #       2 -> none below 2, easiest negative 2.5: 1.0
    # cols: 0 -> hardest below 3 is 2.5: 0; 1 -> none below 2, easiest 2.9: 1.4; 2 -> 0 below 2: 0
    expected = 0.5 * ((0.4 + 0.3 + 1.0) / 3 + (0 + 1.4 + 0) / 3)
    assert L.shn(s, m).item() == pytest.approx(expected)
    g = grad_of(lambda x: L.shn(x, m), s)
    assert g[0, 0] < 0 and g[0, 1] > 0  # positive up, the chosen semi-hard negative down
    assert g[0, 2] == 0  # not chosen in row 0 nor column 2
    assert g[0, 1].item() == pytest.approx(0.5 / 3 + 0.5 / 3)  # chosen in row 0 and column 1


def test_max_margin_sum_max_and_directions():
    s = torch.tensor([[0.5, 0.48], [0.1, 0.3]])
    # t2v: row 0 max(0, .05 - .5 + .48) = .03, row 1: 0; v2t: column 0: 0, column 1: .05 - .3 + .48 = .23
    assert L.max_margin(s, 0.05).item() == pytest.approx((0.03 + 0.23) / 2)
    assert L.max_margin(s, 0.05, direction="t2v").item() == pytest.approx(0.03 / 2)
    assert L.max_margin(s, 0.05, direction="v2t").item() == pytest.approx(0.23 / 2)

    s3 = torch.tensor([[1.0, 0.9, 0.95], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # row 0 hinges .1 and .15; column 1 hinge .1 (S_01), column 2 hinge .15 (S_02), the rest 0
    assert L.max_margin(s3, 0.2).item() == pytest.approx((0.25 + 0.1 + 0.15) / 3)
    assert L.max_margin(s3, 0.2, reduction="max").item() == pytest.approx((0.15 + 0.1 + 0.15) / 3)
    assert_step_helps(lambda x: L.max_margin(x, 0.2), s3)


def test_order_violation_and_annotation_ranking():
    video = torch.tensor([[3.0, 4.0], [0.0, -1.0]])  # |.|, normalised: [.6, .8], [0, 1]
    text = torch.tensor([[-1.0, 0.0], [0.8, 0.6]])  # [1, 0], [.8, .6]
    # S(c, v) = -|max(0, c - v)|^2, rows texts, columns videos
    expected = torch.tensor([[-(0.4**2), -1.0], [-(0.2**2), -(0.8**2)]])
    torch.testing.assert_close(L.order_violation(video, text), expected)
    # annotation ranking: video 0 vs caption 1: .05 + .16 - .04 = .17; video 1 vs caption 0: .05 + .64 - 1 < 0
    assert L.order_ranking(video, text, 0.05).item() == pytest.approx(0.17 / 2)
    assert L.order_ranking(video, text, 0.05, direction="both").item() == pytest.approx(
        L.max_margin(expected, 0.05).item())

    v = video.clone().requires_grad_(True)
    c = text.clone().requires_grad_(True)
    before = L.order_violation(v, c)
    L.order_ranking(v, c, 0.05).backward()
    after = L.order_violation(video - 0.05 * v.grad, text - 0.05 * c.grad)
    assert after[0, 0] > before[0, 0]  # positive raised
    assert after[1, 0] < before[1, 0]  # the violating contrastive caption lowered


# ---------------------------------------------------------------- MIL-NCE


VIDEO = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
TEXT = torch.tensor([[[1.0, 0.0], [0.5, 0.0]], [[0.0, 1.0], [9.0, 9.0]]])  # clip 1's second is padding
MASK = torch.tensor([[True, True], [True, False]])
T = 0.5


def test_milnce_by_hand():
    # x = v·t / τ. Clip 0: positives 1, .5; negatives v0·t10 = 0 and v1·t00 = v1·t01 = 0.
    # Clip 1: positive 1; negatives v1·t00 = v1·t01 = 0 and v0·t10 = 0. The padding counts nowhere.
    clip0 = -log((exp(1 / T) + exp(0.5 / T)) / (exp(1 / T) + exp(0.5 / T) + 3))
    clip1 = nll(1 / T, [0, 0, 0])
    assert L.milnce(VIDEO, TEXT, MASK, T).item() == pytest.approx((clip0 + clip1) / 2)
    with pytest.raises(ValueError, match="at least one valid"):
        L.milnce(VIDEO, TEXT, torch.tensor([[True, True], [False, False]]))


def test_milnce_baselines_by_hand():
    assert L.max_nce(VIDEO, TEXT, MASK, T).item() == pytest.approx(nll(1 / T, [0, 0, 0]))

    # Attn+NCE (MIL-NCE appendix A, eq. 8): pos = log Σ_k a_k e^{x_k} with a = softmax of the
    # attention heads' logits over the real candidates (clip 1's padding gets no weight).
    logits = torch.tensor([[log(3.0), 0.0], [5.0, -7.0]])  # clip 0: a = (.75, .25)
    pos0 = log(0.75 * exp(1 / T) + 0.25 * exp(0.5 / T))
    expected = (nll(pos0, [0, 0, 0]) + nll(1 / T, [0, 0, 0])) / 2
    assert L.attn_nce(VIDEO, TEXT, logits, MASK, T).item() == pytest.approx(expected)
    # e^{Σ a x} (the garbled reading) would give pos0 = .75·2 + .25·1 = 1.75, not log(.75e² + .25e)
    assert pos0 != pytest.approx(1.75)
    # Equal attention on K candidates: MIL-NCE's positive minus log K.
    flat = torch.zeros(2, 2)
    pos0 = log((exp(1 / T) + exp(0.5 / T)) / 2)
    expected = (nll(pos0, [0, 0, 0]) + nll(1 / T, [0, 0, 0])) / 2
    assert L.attn_nce(VIDEO, TEXT, flat, MASK, T).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="attention must be"):
        L.attn_nce(VIDEO, TEXT, torch.zeros(2, 3), MASK, T)


def _attn_fixed(video, text, mask):
    return L.attn_nce(video, text, torch.arange(text.shape[1], dtype=torch.float).expand(text.shape[:2]), mask)


@pytest.mark.parametrize("fn", [L.milnce, L.max_nce, _attn_fixed])
def test_milnce_step_raises_positives(fn):
    torch.manual_seed(0)
    video = torch.randn(4, 8)
    text = torch.randn(4, 3, 8)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    v, t = video.clone().requires_grad_(True), text.clone().requires_grad_(True)
    loss = fn(v, t, mask)
    loss.backward()
    v2, t2 = video - 0.05 * v.grad, text - 0.05 * t.grad

    def own_scores(vv, tt):
        return torch.einsum("id,ikd->ik", vv, tt)[mask]

    assert fn(v2, t2, mask) < loss
    assert own_scores(v2, t2).mean() > own_scores(video, text).mean()
    assert t.grad[~mask].abs().sum() == 0  # padding gets no gradient


# ---------------------------------------------------------------- WAL


def test_wal_lvc_bce_and_adv_by_hand():
    scores = torch.tensor([2.0, -1.0], requires_grad=True)
    labels = torch.tensor([1, 0])
    loss = L.wal_lvc_bce(scores, labels)
    assert loss.item() == pytest.approx((softplus(-2) + softplus(-1)) / 2)
    loss.backward()
    assert scores.grad[0] < 0 < scores.grad[1]  # aligned pair scored up, mismatched pair down

    adv = torch.tensor([0.5, 1.0])
    z = torch.tensor([0.0, 1.0])  # pair 0 -> L_LVC, pair 1 -> L_ADV = BCE(F_ADV, 0)
    got = L.wal_adv_pair(scores.detach(), adv, labels, z)
    assert got.item() == pytest.approx((softplus(-2) + softplus(1.0)) / 2)


def test_wal_adv_routing_keeps_clean_pairs_on_lvc_and_flags_noisy_ones():
    """Training the discriminator on its own per-pair loss: z is drawn from F_ADV's logit, so
    BCE(F_ADV, y=0) pulls pairs back to L_LVC (WAL: the z=0 share rises to ~95%) and only the
    pairs L_LVC cannot fit stay at z=1. Regression: with z drawn from logits of its own, F_ADV's
    bias drove L_ADV to 0 and sent every pair, clean ones included, to z=1 (97% here)."""
    from torch.nn.functional import normalize

    from pipeline.train.wal import WALDiscriminator

    torch.manual_seed(0)
    n = 200
    disc = WALDiscriminator(16)
    s = normalize(torch.randn(n, 16), dim=-1)
    noisy = torch.arange(n) % 4 == 0  # aligned label, but the clip does not show the sentence
    p_lvc = torch.where(noisy, -0.2, 0.8)
    lvc_logit, labels = 5 * p_lvc, torch.ones(n)  # L_LVC: 0.018 clean, 1.31 noisy
    opt = torch.optim.SGD(disc.parameters(), lr=0.1, momentum=0.9)
    for _ in range(300):
        adv, z = disc(s, p_lvc)
        loss = L.wal_adv_pair(lvc_logit, adv, labels, z)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z1 = torch.stack([disc(s, p_lvc)[1] for _ in range(20)]).mean(0)  # share of draws with z=1
    assert z1[~noisy].mean() < 0.15
    assert z1[noisy].mean() > 0.2 and z1[noisy].mean() > 4 * z1[~noisy].mean()
    p1 = disc.noise_prob(s, p_lvc)
    assert p1[noisy].min() > p1[~noisy].max()  # P(z=1) ranks every noisy pair above every clean one


def test_wal_discriminator_draws_z_from_f_adv():
    from pipeline.train.wal import WALDiscriminator

    torch.manual_seed(0)
    s, p_lvc = torch.randn(4000, 8), torch.zeros(4000)
    for gumbel in (True, False):
        disc = WALDiscriminator(8, gumbel=gumbel)
        with torch.no_grad():
            disc.f_adv.weight.zero_()
            disc.f_adv.bias.fill_(1.0)
        a, z = disc(s, p_lvc)
        assert torch.equal(a, torch.ones(4000))
        share = z.mean().item()
        if gumbel:
            assert share == pytest.approx(1 / (1 + exp(-1.0)), abs=0.03)  # P(z=1) = σ(a)
        else:
            assert share == 1.0  # argmax: z = [a > 0]
        assert disc.noise_prob(s, p_lvc)[0].item() == pytest.approx(1 / (1 + exp(-1.0)))


def test_wal_discriminator_loads_checkpoints_with_the_old_z_logits_layer():
    from pipeline.train.wal import WALDiscriminator

    disc = WALDiscriminator(8)
    old = {**disc.state_dict(), "z_logits.weight": torch.zeros(2, 2), "z_logits.bias": torch.zeros(2)}
    disc.load_state_dict(old)  # strict: only the stale layer is dropped
    with pytest.raises(RuntimeError):
        disc.load_state_dict({**old, "other.weight": torch.zeros(1)})


# ---------------------------------------------------------------- AsyNCE


def _asynce_case() -> torch.Tensor:
    """word_sim [2, 2, T=2, W=2] whose frame-sentence means are F below; words F ± .1."""
    f = torch.tensor([[[1.0, 0.0], [0.2, 0.4]], [[0.1, 0.3], [0.5, 0.5]]])  # F[i, j, t]
    return torch.stack([f + 0.1, f - 0.1], -1)


def asynce_reference(ws, word_mask, frame_mask, delta, tau, entity, frame, scale_negatives=True) -> float:
    """AsyNCE eqs. 1, 4, 5, 7, 8 with Python loops over the real words and frames only."""
    b = len(ws)

    def frame_scores(i, j):
        frames = [t for t in range(len(frame_mask[j])) if frame_mask[j][t]]
        words = [k for k in range(len(word_mask[i])) if word_mask[i][k]]
        if entity == "mean":  # eq. 1
            return [sum(float(ws[i][j][t][k]) for k in words) / len(words) for t in frames]
        out = []  # eq. 7: Σ_k softmax over frames of s/τ, times s
        for t in frames:
            total = 0.0
            for k in words:
                z = sum(exp(float(ws[i][j][u][k]) / tau) for u in frames)
                total += exp(float(ws[i][j][t][k]) / tau) / z * float(ws[i][j][t][k])
            out.append(total)
        return out

    def positive(values):
        if frame == "mean":  # eq. 4
            return sum(values) / len(values)
        z = sum(exp(v) for v in values)  # eq. 5
        return sum(exp(v) / z * v for v in values)

    scale = tau if scale_negatives else 1.0
    total = 0.0
    for i in range(b):
        pos = (positive(frame_scores(i, i)) - delta) / tau
        negs = [v / scale for j in range(b) if j != i for v in frame_scores(i, j)]
        negs += [v / scale for j in range(b) if j != i for v in frame_scores(j, i)]
        total += nll(pos, negs)
    return total / b


def test_asynce_mean_entity_by_hand():
    ws, d, t = _asynce_case(), 0.05, 0.5
    sp0 = exp(1) / (exp(1) + 1)  # soft frame (eq. 5): softmax([1, 0]) · [1, 0]
    sp1 = 0.5
    negs = [0.2 / t, 0.4 / t, 0.1 / t, 0.3 / t]  # the same four frame scores for both pairs
    expected = (nll((sp0 - d) / t, negs) + nll((sp1 - d) / t, negs)) / 2
    assert L.asynce(ws, delta=d, temperature=t, entity="mean").item() == pytest.approx(expected)

    raw = [n * t for n in negs]  # eq. 8 as printed: negatives without τ
    expected = (nll((sp0 - d) / t, raw) + nll((sp1 - d) / t, raw)) / 2
    got = L.asynce(ws, delta=d, temperature=t, entity="mean", scale_negatives=False)
    assert got.item() == pytest.approx(expected)

    expected = (nll((0.5 - d) / t, negs) + nll((0.5 - d) / t, negs)) / 2  # mean frame (eq. 4)
    assert L.asynce(ws, delta=d, temperature=t, entity="mean", frame="mean").item() == pytest.approx(expected)


def test_asynce_soft_entity_follows_eq_7():
    # Pair (0, 0): s[t, k] = [[1.1, .9], [.1, -.1]], τ = .5. Each word puts softmax weight
    # σ(2) on frame 0 and σ(-2) on frame 1, so S̄_0 = σ(2)(1.1 + .9) = 2σ(2), S̄_1 = σ(-2)(.1 - .1) = 0.
    ws, t = _asynce_case(), 0.5
    sigma2 = 1 / (1 + exp(-2))
    scores = L.asynce_frame_scores(ws, torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool),
                                   t, "soft")
    assert scores[0, 0].tolist() == pytest.approx([2 * sigma2, 0.0])
    # Pair (1, 1): both frames equal for each word: weights 1/2, S̄_t = (.6 + .4)/2 = .5 each.
    assert scores[1, 1].tolist() == pytest.approx([0.5, 0.5])
    # soft/soft (the paper's model): S_p = Σ softmax(S̄) S̄, negatives per frame from eq. 7 too.
    s_p = L.asynce_positive(scores, torch.ones(2, 2, dtype=torch.bool), "soft").diagonal()
    assert s_p[0].item() == pytest.approx(exp(2 * sigma2) * 2 * sigma2 / (exp(2 * sigma2) + 1))
    mask = torch.ones(2, 2, dtype=torch.bool)
    for entity in ("mean", "soft"):
        for frame in ("mean", "soft"):
            got = L.asynce(ws, delta=0.05, temperature=t, entity=entity, frame=frame).item()
            assert got == pytest.approx(asynce_reference(ws, mask, mask, 0.05, t, entity, frame)), (entity, frame)


@pytest.mark.parametrize("entity", ["mean", "soft"])
@pytest.mark.parametrize("frame", ["mean", "soft"])
def test_asynce_does_not_depend_on_padding(entity, frame):
    """The same 3 pairs padded to 4 and to 7 frames and 5 and 9 words (padding at -1e4, 1e4
    and NaN) give the same loss as the reference on the real entries alone. Regression: the
    frame-mean positive averaged padded frames at -1e4 (a loss of 23,816)."""
    torch.manual_seed(0)
    frames, words = [2, 4, 3], [5, 2, 4]
    real = torch.rand(3, 3, 4, 5) * 2 - 1
    losses_seen = []
    for t_len, w_len, fill in ((4, 5, -1e4), (7, 9, 1e4), (7, 9, float("nan"))):
        ws = torch.full((3, 3, t_len, w_len), fill)
        ws[:, :, :4, :5] = real
        fmask = torch.tensor([[t < n for t in range(t_len)] for n in frames])
        wmask = torch.tensor([[k < n for k in range(w_len)] for n in words])
        ws = torch.where(fmask[None, :, :, None] & wmask[:, None, None, :], ws, torch.full_like(ws, fill))
        loss = L.asynce(ws, wmask, fmask, delta=0.05, temperature=0.5, entity=entity, frame=frame)
        assert torch.isfinite(loss)
        losses_seen.append(loss.item())
    expected = asynce_reference(real, [[k < n for k in range(5)] for n in words],
                                [[t < n for t in range(4)] for n in frames], 0.05, 0.5, entity, frame)
    assert losses_seen == pytest.approx([expected] * 3)


def test_asynce_gradient_pushes_positives_up_and_negatives_down():
    ws = _asynce_case().clone().requires_grad_(True)
    L.asynce(ws, delta=0.05, temperature=0.5, entity="mean").backward()
    assert (ws.grad[0, 0] <= 0).all() and (ws.grad[1, 1] <= 0).all()  # positives pushed up
    assert (ws.grad[0, 1] > 0).all() and (ws.grad[1, 0] > 0).all()  # negatives pushed down
    # Soft entity (eq. 7) moves weight between frames, so single entries can go either way; a
    # shift of a whole positive pair keeps the weights and raises S̄: the loss falls.
    ws.grad = None
    L.asynce(ws, delta=0.05, temperature=0.5).backward()
    assert ws.grad[0, 0].sum() < 0 and ws.grad[1, 1].sum() < 0
    assert (ws.grad[0, 1] >= 0).all() and (ws.grad[1, 0] >= 0).all()


def test_registry_covers_every_config_model():
    assert set(L.LOSSES) == set(get_args(TrainModel))
    assert L.LOSSES["amm"] is L.amm and L.LOSSES["order"] is L.order_ranking

"""Retrieval metrics against rankings worked out by hand: pessimistic ties, several correct
items, medR, the S-MiT subset protocol and Torabi's multiple-choice test."""

import numpy as np
import pytest
import torch

from pipeline.train import metrics as M

# Rows are texts, columns videos. Each text's true video ties with a wrong one or is beaten.
def approx_nested(expected: dict) -> dict:
    """pytest.approx for the {direction: {metric: value}} dicts (approx takes one level)."""
    return {d: pytest.approx(row) for d, row in expected.items()}


TIES = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, 0.0, 1.0]])


def test_ties_rank_the_correct_item_below():
    assert [r.tolist() for r in M.correct_ranks(TIES)] == [[2], [2], [2]]
    # columns: video 0 -> text 2 (3) beats text 0 (1); video 1 -> text 1 (2) first;
    # video 2 -> text 1 (2) beats text 2 (1)
    assert [r.tolist() for r in M.correct_ranks(TIES, direction="v2t")] == [[2], [1], [2]]
    assert M.recall_at(TIES, 1) == 0.0
    assert M.recall_at(TIES, 1, direction="v2t") == pytest.approx(1 / 3)
    assert M.recall_at(TIES, 2) == 1.0
    assert M.mean_average_precision(TIES) == pytest.approx(0.5)
    assert M.mean_average_precision(TIES, direction="v2t") == pytest.approx((0.5 + 1 + 0.5) / 3)

    flat = np.zeros((4, 4))  # all tied: every true match ranks last
    assert M.median_rank(flat) == 4
    assert M.recall_at(flat, 3) == 0.0
    assert M.mean_average_precision(flat) == pytest.approx(0.25)


def test_several_correct_items():
    sim = np.array([[0.9, 0.8, 0.7, 0.1], [0.5, 0.5, 0.2, 0.5]])
    gt = [{0, 2}, {3}]
    # text 0: correct at ranks 1 and 3 -> AP (1/1 + 2/3) / 2; text 1: tied with two wrong -> rank 3
    assert [r.tolist() for r in M.correct_ranks(sim, gt)] == [[1, 3], [3]]
    assert M.mean_average_precision(sim, gt) == pytest.approx(((1 + 2 / 3) / 2 + 1 / 3) / 2)
    assert M.recall_at(sim, 1, gt) == 0.5
    assert M.median_rank(sim, gt) == 2.0
    # v2t: videos 0 and 2 belong to text 0, video 3 to text 1, video 1 to none (left out)
    assert [r.tolist() for r in M.correct_ranks(sim, gt, "v2t")] == [[1], [1], [1]]

    # correct items tied with each other and with a wrong one: the wrong one goes first
    tied = np.array([[1.0, 1.0, 1.0, 0.0]])
    assert M.correct_ranks(tied, [{0, 1}])[0].tolist() == [2, 3]
    assert M.mean_average_precision(tied, [{0, 1}]) == pytest.approx((1 / 2 + 2 / 3) / 2)

    with pytest.raises(ValueError, match="outside"):
        M.correct_ranks(sim, [{0}, {4}])
    with pytest.raises(ValueError, match="square"):
        M.correct_ranks(sim)


def test_median_rank_and_retrieval_metrics():
    # text i: its true video scores 0, i wrong videos score 1, the rest -1 -> ranks 1, 2, 3, 4
    sim = -np.ones((4, 4))
    np.fill_diagonal(sim, 0.0)
    for i in range(4):
        sim[i, [j for j in range(4) if j != i][:i]] = 1.0
    assert [r[0] for r in M.correct_ranks(sim)] == [1, 2, 3, 4]
    assert M.median_rank(sim) == 2.5
    out = M.retrieval_metrics(torch.tensor(sim))  # torch input works too
    assert set(out) == {"t2v", "v2t"}
    assert out["t2v"] == pytest.approx(
        {"R@1": 25.0, "R@5": 100.0, "R@10": 100.0, "medR": 2.5, "mAP": 100 * (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4})
    assert out["v2t"] == pytest.approx(M.retrieval_metrics(sim.T)["t2v"])


def test_subset_protocol_known_answers():
    n = 40
    # Each true pair scores below all else: in any subset of 10 it ranks 10th both ways.
    out = M.subset_protocol(-np.eye(n), n_subsets=5, size=10, seed=3)
    for d in ("t2v", "v2t"):
        assert out[d] == pytest.approx({"R@1": 0.0, "R@5": 0.0, "R@10": 100.0, "medR": 10.0, "mAP": 10.0})
    # Subsets keep pairs together: a perfect model is perfect on every subset.
    assert M.subset_protocol(np.eye(n), size=10)["t2v"]["R@1"] == 100.0
    # size == N: every subset is the whole set.
    rng = np.random.default_rng(0)
    sim = rng.normal(size=(n, n))
    assert M.subset_protocol(sim, size=n) == approx_nested(M.retrieval_metrics(sim))


def test_subset_protocol_embeddings_and_seeds():
    rng = np.random.default_rng(1)
    text, video = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    a = M.subset_protocol((text, video), n_subsets=3, size=20, seed=7)
    assert a == approx_nested(M.subset_protocol(text @ video.T, n_subsets=3, size=20, seed=7))
    assert a != M.subset_protocol((text, video), n_subsets=3, size=20, seed=8)
    # mean over subsets: with 1 subset it is that subset's metrics
    one = M.subset_protocol((text, video), n_subsets=1, size=20, seed=7)
    idx = np.random.default_rng(7).choice(50, 20, replace=False)
    assert one == approx_nested(M.retrieval_metrics(text[idx] @ video[idx].T))
    with pytest.raises(ValueError, match="larger"):
        M.subset_protocol((text, video), size=51)


def test_multiple_choice_distractors_from_other_videos():
    # 6 pairs from 3 source videos; each video's sibling caption (same source) outscores its own.
    ids = ["a", "a", "b", "b", "c", "c"]
    sim = np.zeros((6, 6))
    np.fill_diagonal(sim, 1.0)
    for j in range(6):
        sim[j ^ 1, j] = 2.0  # caption j^1 is from the same source video as video j
    # The 4 distractors must come from the 4 captions of other sources: never the sibling.
    assert M.multiple_choice(sim, 5, ids, seed=0) == 100.0
    # Without source ids any other caption may be drawn: with 5 distractors out of 5 the
    # sibling always is.
    assert M.multiple_choice(sim, 6, None, seed=0) == 0.0
    with pytest.raises(ValueError, match="distractors needed"):
        M.multiple_choice(sim, 6, ids)


def test_multiple_choice_fixed_questions_and_ties():
    sim = np.eye(4)
    sim[1, 0] = 1.0  # video 0: distractor ties the true caption -> wrong
    sim[0, 1] = 0.5  # video 1: right
    sim[3, 2] = 2.0  # video 2: distractor wins -> wrong
    # video 3: distractor caption 2 scores 0 -> right
    distractors = [[1], [0], [3], [2]]
    assert M.multiple_choice(sim, 2, distractors=distractors) == 50.0
    with pytest.raises(ValueError, match="other captions"):
        M.multiple_choice(sim, 2, distractors=[[0], [0], [3], [2]])


def test_activity_words_and_torabi_distractor_rule():
    from pipeline.train.choice import activity_words, distractors, phrase_words

    assert activity_words("SOMEONE opens the door and walks in.") == {"opens", "door", "walks"}
    assert phrase_words(["open door", "walk in"]) == {"open", "door", "walk", "in"}
    captions = ["he opens the door", "she closes the door", "they eat soup", "a dog runs",
                "someone reads a book", "birds sing", "the car stops"]
    words = [activity_words(c) for c in captions]
    picked = distractors(words, choices=5, seed=3)
    assert picked.shape == (7, 4)
    for j, row in enumerate(picked):
        assert j not in row and len(set(row.tolist())) == 4
        assert all(not (words[j] & words[i]) for i in row)  # no shared activity word
    assert 1 not in picked[0] and 0 not in picked[1]  # "door" rules them out for each other
    assert (distractors(words, seed=3) == picked).all()
    with pytest.raises(ValueError, match="caption 0: 2 captions share no activity word"):
        distractors(words[:4], choices=4)


def test_multiple_choice_records_its_rule():
    from pipeline.train.pairs import PairSet
    from pipeline.train.evaluation import multiple_choice

    n = 8
    sim = np.eye(n) + 0.01 * np.arange(n)[None, :]  # every video scores its own caption highest
    base = dict(pair_ids=[f"p{i}" for i in range(n)], groups=[f"g{i}" for i in range(n)], splits=["test"] * n,
                visual=[np.ones(2)] * n, text=[np.ones(2)] * n)
    captions = [f"word{i} thing{i}" for i in range(n)]
    assert multiple_choice(sim, PairSet(**base, captions=captions), 0) == {
        "mc_acc": 100.0, "mc_rule": "caption_content_words"}
    phrases = PairSet(**base, activities=[[f"make thing{i}"] for i in range(n)], captions=captions)
    assert multiple_choice(sim, phrases, 0)["mc_rule"].startswith("other_videos (activity_phrases")  # "make"
    phrases = PairSet(**base, activities=[[f"thing{i}"] for i in range(n)])
    assert multiple_choice(sim, phrases, 0) == {"mc_acc": 100.0, "mc_rule": "activity_phrases"}
    assert multiple_choice(sim, PairSet(**base), 0)["mc_rule"] == "other_videos"
    shared = PairSet(**base, captions=["open door"] * n)  # nothing is a valid distractor
    out = multiple_choice(sim, shared, 0)
    assert out["mc_rule"].startswith("other_videos (caption_content_words rule not met")

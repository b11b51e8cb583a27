"""PairSet loaders (corpus join, pairs file) and the batch samplers."""

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trainkit
from pipeline.config import StreamConfig
from pipeline.corpus.storage import Corpus
from pipeline.train.batches import BatchOptions, GroupBatchSampler, collate, sample_frames, sample_window, sample_words
from pipeline.train.pairs import PairSet, PairsError
from pipeline.train.stream import PairStream


def _clip(cid, vid, text, split="train", candidates=None):
    return {"clip_id": cid, "video_id": vid, "start_s": 0.0, "end_s": 1.0, "text": text, "source": "manual",
            "policy": "subtitle_span", "segment_index": 0, "candidates": candidates, "split": split}


def _feat(cid, name, arr):
    arr = np.asarray(arr, dtype=np.float16)
    return {"clip_id": cid, "extractor": name, "weights": "none", "fps": 2.0, "frames": int(arr.shape[0]),
            "shape": list(arr.shape), "values": arr.ravel().tolist()}


@pytest.fixture
def corpus():
    c = Corpus(f"memory://train-{uuid.uuid4().hex}")
    c.init_partitions(1)
    c.write_batch("clips", [
        _clip("a-0", "a", "hello there", candidates=["hello there", "general kenobi", "not a clip"]),
        _clip("a-1", "a", "general kenobi", candidates=["hello there"]),
        _clip("b-0", "b", "hello there", split="test"),
        _clip("c-0", "c", "no features"),
    ], "b1", "00000")
    c.write_batch("features/resnet34", [_feat(x, "resnet34", np.full((3, 4), i)) for i, x in
                                        enumerate(["a-0", "a-1", "b-0", "c-0"])], "f1", "00000")
    c.write_batch("features/text_bert", [_feat(x, "text:bert", np.full((6,), i)) for i, x in
                                         enumerate(["a-0", "a-1", "b-0"])], "t1", "00000")
    return c


def test_from_corpus_joins_and_maps_candidates(corpus):
    pairs = PairSet.from_corpus(corpus, "resnet34", "text:bert")
    assert pairs.pair_ids == ["a-0", "a-1", "b-0"]  # c-0 has no text features
    assert pairs.groups == ["a", "a", "b"] and pairs.splits == ["train", "train", "test"]
    assert pairs.visual[1].shape == (3, 4) and pairs.visual[1].dtype == np.float32
    assert pairs.text[2].shape == (6,) and float(pairs.text[2][0]) == 2.0
    # same video and text only: a-0's "hello there" is itself, b-0 is another video, "not a clip" unknown
    assert pairs.candidates == [[1], [0], []]
    assert (pairs.visual_dim, pairs.text_dim) == (4, 6)
    test = pairs.subset("test")
    assert test.pair_ids == ["b-0"] and test.candidates == [[]]


def test_from_corpus_missing_features_names_table(corpus):
    with pytest.raises(PairsError, match="features/s3d"):
        PairSet.from_corpus(corpus, "s3d", "text:bert")
    with pytest.raises(PairsError, match=r"features/s3d \(visual extractor 's3d'\)"):
        PairStream(corpus, ["resnet34", "s3d"], "text:bert", StreamConfig())


def _pairs(n=6, frames=True):
    rng = np.random.default_rng(0)
    vis = [rng.normal(size=(i % 3 + 1, 4)) if frames else rng.normal(size=4) for i in range(n)]
    return PairSet([f"p{i}" for i in range(n)], [f"g{i % 3}" for i in range(n)],
                   ["train"] * (n - 2) + ["test"] * 2, vis, [rng.normal(size=(i + 1, 5)) for i in range(n)],
                   [[(i + 3) % n] for i in range(n)])


def test_pairs_file_round_trip(tmp_path):
    pairs = _pairs()
    pairs.to_pairs_file(tmp_path / "p.parquet")
    back = PairSet.from_pairs_file(tmp_path / "p.parquet")
    assert back.pair_ids == pairs.pair_ids and back.groups == pairs.groups and back.splits == pairs.splits
    assert back.candidates == pairs.candidates
    for a, b in zip(back.visual + back.text, pairs.visual + pairs.text):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    flat = _pairs(frames=False)
    flat.to_pairs_file(tmp_path / "f.parquet")
    assert PairSet.from_pairs_file(tmp_path / "f.parquet").visual[0].shape == (4,)


def _write(path, **columns):
    base = {"pair_id": ["a", "b"], "group": ["g", "h"], "split": ["train", "test"],
            "visual": [[1.0, 2.0], [3.0, 4.0]], "text": [[1.0], [2.0]]}
    base.update(columns)
    pq.write_table(pa.table({k: v for k, v in base.items() if v is not None}), path)
    return path


@pytest.mark.parametrize("columns, message", [
    ({"visual": None}, "missing column.*visual"),
    ({"split": ["train", "dev"]}, "column 'split'.*'dev'"),
    ({"pair_id": ["a", "a"]}, "column 'pair_id' repeats 'a'"),
    ({"group": [1, 2]}, "column 'group' must be string"),
    ({"visual": ["x", "y"]}, "column 'visual' must be list<float32>"),
    ({"visual": [[1.0, 2.0], [3.0]]}, "column 'visual'.*dimension"),
    ({"text": [[[1.0], [2.0, 3.0]], [[1.0]]]}, "column 'text' row 0"),
    ({"text": [[], [1.0]]}, "column 'text' is null or empty in row 0"),
    ({"candidates": [["b"], ["zz"]]}, "column 'candidates' row 1 names unknown pair_id 'zz'"),
])
def test_pairs_file_errors_name_the_column(tmp_path, columns, message):
    with pytest.raises(PairsError, match=message):
        PairSet.from_pairs_file(_write(tmp_path / "p.parquet", **columns))


def test_pairs_file_unreadable(tmp_path):
    (tmp_path / "x.parquet").write_text("nope")
    with pytest.raises(PairsError, match="cannot read"):
        PairSet.from_pairs_file(tmp_path / "x.parquet")


def test_group_sampler_one_pair_per_video_where_possible():
    groups = [f"g{i % 10}" for i in range(100)]
    sampler = GroupBatchSampler(groups, 10, seed=3)
    batches = sampler.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(100))
    assert all(len({groups[i] for i in b}) == 10 for b in batches)
    assert sampler.batches(0) == batches and sampler.batches(1) != batches
    # 3 groups, batch 4: a repeat is unavoidable but every pair still appears once
    few = GroupBatchSampler(["a", "a", "b", "b", "c", "c", "c", "c"], 4, seed=0).batches(0)
    assert sorted(i for b in few for i in b) == list(range(8))
    assert len({["a", "a", "b", "b", "c", "c", "c", "c"][i] for i in few[0]}) == 3


def test_frame_and_word_sampling():
    rng = np.random.default_rng(0)
    assert len(sample_frames(20, 5, rng)) == 5 and len(set(sample_frames(20, 5, rng))) == 5
    short = sample_frames(3, 5, rng)
    assert len(short) == 5 and set(short) == {0, 1, 2} and list(short) == sorted(short)
    assert len(sample_words(30, 10, rng)) == 10
    assert len(sample_words(4, 10, rng)) == 10 and set(sample_words(4, 10, rng)) == {0, 1, 2, 3}
    assert list(sample_words(4, 10, rng, repeat=False)) == [0, 1, 2, 3]


def test_collate_shapes_wal_and_candidates():
    pairs = _pairs()
    rng = np.random.default_rng(0)
    batch = collate(pairs, [0, 1, 2], BatchOptions(n_frames=5, n_words=10), rng)
    assert batch["visual"].shape == (3, 5, 4) and batch["visual_mask"].all()
    assert batch["text"].shape == (3, 10, 5)
    wal = collate(pairs, [0, 1, 2], BatchOptions(wal=True), rng)
    assert wal["labels"].tolist() == [1, 1, 1, 0, 0, 0] and wal["visual"].shape[0] == 6
    assert wal["index"].tolist() == [0, 1, 2, 0, 1, 2]
    neg = wal["text_index"].tolist()[3:]
    assert len(neg) == 3 and all(pairs.groups[t] != pairs.groups[v] for v, t in zip([0, 1, 2], neg))  # another video
    full = collate(pairs, [0, 1, 2], BatchOptions(), rng)  # padded, masked
    assert full["visual"].shape == (3, 3, 4) and full["visual_mask"].sum(1).tolist() == [1, 2, 3]
    bags = collate(pairs, [0, 1], BatchOptions(candidates=5), rng)
    words = max(len(pairs.text[i]) for i in range(len(pairs)))
    assert bags["cand"].shape[:2] == (2, 2) and bags["cand"].shape[3] == 5 and bags["cand_mask"].all()
    # A candidate is its text's words, as a text is at test time (not their mean).
    n = len(pairs.text[3])
    np.testing.assert_array_equal(bags["cand"][0, 1, :n].numpy(), pairs.text[3])
    assert bags["cand_words"][0, 1].sum() == n and bags["cand"].shape[2] <= words
    assert GroupBatchSampler(pairs.groups, 2).batches(0)


def test_from_corpus_concatenates_max_pooled_visual_features(corpus):
    """S-MiT 4.1: ResNet-152 and TSM features, each max-pooled over time, side by side."""
    corpus.write_batch("features/tsm_r50", [_feat(x, "tsm_r50", np.arange(2) + 10 * i) for i, x in
                                            enumerate(["a-0", "b-0"])], "t2", "00000")
    pairs = PairSet.from_corpus(corpus, ["resnet34", "tsm_r50"], "text:bert")
    assert pairs.pair_ids == ["a-0", "b-0"]  # a-1 has no tsm_r50 features
    assert pairs.visual[1].tolist() == [2, 2, 2, 2, 10, 11]  # max over b-0's 3 frames of 2s, then tsm
    assert pairs.captions == ["hello there", "hello there"]


def test_window_sampling():
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(200):
        w = sample_window(10, 4, rng)
        assert len(w) == 4 and list(w) == list(range(w[0], w[0] + 4))
        starts.add(int(w[0]))
    assert starts == set(range(7))  # every window inside the span is drawn
    assert list(sample_window(3, 4, rng)) == [0, 1, 2]
    pairs = _pairs()
    batch = collate(pairs, [2], BatchOptions(window=2), rng)
    assert batch["visual"].shape == (1, 2, 4)
    assert any(np.array_equal(batch["visual"][0].numpy(), pairs.visual[2][s:s + 2]) for s in (0, 1))


def test_pairs_file_caption_and_activities_round_trip(tmp_path):
    pairs = _pairs()
    pairs.captions = [f"someone opens door {i}" for i in range(len(pairs))]
    pairs.activities = [["open door"]] * len(pairs)
    pairs.to_pairs_file(tmp_path / "p.parquet")
    back = PairSet.from_pairs_file(tmp_path / "p.parquet")
    assert back.captions == pairs.captions and back.activities == pairs.activities
    assert back.subset([1, 3]).captions == [pairs.captions[1], pairs.captions[3]]
    with pytest.raises(PairsError, match="column 'caption' has type"):
        PairSet.from_pairs_file(_write(tmp_path / "bad.parquet", caption=[1, 2]))


def test_listed_test_clips_are_the_only_test_pairs():
    from pipeline.train.run import listed_test_only

    pairs = PairSet(["a", "b", "c", "d"], ["v", "v", "w", "w"], ["test", "test", "train", "val"],
                    [np.ones(2)] * 4, [np.ones(3)] * 4, captions=["1", "2", "3", "4"])
    kept = listed_test_only(pairs, {"b", "c"})
    assert kept.pair_ids == ["b", "c", "d"] and kept.splits == ["test", "train", "val"]
    assert kept.captions == ["2", "3", "4"]


def _stream(corpus, **options):
    return PairStream(corpus, "resnet34", "text:x", StreamConfig(**options))


def test_a_stream_epoch_is_every_train_pair_once_shuffled_by_the_seed(tmp_path):
    """Chunks poured into a buffer smaller than the split: each pair once per epoch, one per
    video per batch, the same order for the same seed and another for another epoch."""
    corpus = Corpus(str(tmp_path))
    trainkit.synthetic_features(corpus, n=40)
    stream = _stream(corpus, buffer=12, chunk=5)

    def epoch(seed):
        return [pairs.pair_ids[i] for pairs, idx in stream.batches("train", 8, np.random.default_rng(seed))
                for i in idx]

    batches = list(stream.batches("train", 8, np.random.default_rng(0)))
    assert all(len({pairs.groups[i] for i in idx}) == len(idx) for pairs, idx in batches)
    first = epoch(0)
    assert sorted(first) == sorted(PairSet.from_corpus(corpus, "resnet34", "text:x").subset("train").pair_ids)
    assert first == epoch(0) and first != epoch(1)
    assert stream.counts == {"train": 30}


def test_a_streamed_batch_carries_its_candidates(corpus):
    """MIL-NCE: a clip's candidates (clips of its video) come along into any batch it is drawn
    in, and collate makes the same bags as from the pairs in memory."""
    corpus.write_batch("features/text_x", [_feat(x, "text:x", np.full((6,), i)) for i, x in
                                           enumerate(["a-0", "a-1", "b-0"])], "t1", "00000")
    ((pairs, idx),) = _stream(corpus).batches("train", 4, np.random.default_rng(0))
    bags = collate(pairs, idx, BatchOptions(candidates=5), np.random.default_rng(0))
    memory = PairSet.from_corpus(corpus, "resnet34", "text:x").subset("train")
    order = [memory.pair_ids.index(pairs.pair_ids[i]) for i in idx]
    expected = collate(memory, order, BatchOptions(candidates=5), np.random.default_rng(0))
    assert bags["cand"].equal(expected["cand"]) and bags["cand_mask"].equal(expected["cand_mask"])


def test_the_held_out_sample_is_bounded_and_the_same_whoever_asks(tmp_path):
    """At most `held_out` pairs per split, the same test pairs whether val is sampled with them
    (training) or not (evaluation); align.test_clip_ids leaves only the listed test pairs."""
    corpus = Corpus(str(tmp_path))
    trainkit.synthetic_features(corpus, n=80)
    stream = _stream(corpus, chunk=7)
    both = stream.sample(("train", "test"), 6, seed=3)
    assert both.splits.count("train") == 6 and both.splits.count("test") == 6
    assert both.subset("test").pair_ids == stream.sample(("test",), 6, seed=3).pair_ids
    assert stream.counts == {"train": 60, "test": 20}
    listed = PairStream(corpus, "resnet34", "text:x", StreamConfig(), frozenset({"syn-v000-0-3000", "syn-v001-0-3000"}))
    assert listed.sample(("test",), 6, seed=3).pair_ids == ["syn-v000-0-3000"]  # v001 is a train clip

"""A corpus to train on without building one: clips and features tables written directly."""

from __future__ import annotations

import numpy as np

from pipeline.corpus.storage import Corpus


def synthetic_features(corpus: Corpus, n: int = 120, test_every: int = 4) -> None:
    """`n` one-clip videos whose visual (resnet34, [2, 32]) and text (text:x, [24]) features
    share latent factors, so training can work; every `test_every`-th clip is in the test split,
    the rest in train (test_every=0: no test split)."""
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((n, 16))
    mix_v, mix_t = rng.standard_normal((16, 32)), rng.standard_normal((16, 24))
    clips, visual, text = [], [], []
    for i in range(n):
        cid, vid = f"syn-v{i:03d}-0-3000", f"syn-v{i:03d}"
        split = "test" if test_every and i % test_every == 0 else "train"
        clips.append({"clip_id": cid, "video_id": vid, "start_s": 0.0, "end_s": 3.0,
                      "text": f"s{i}", "source": "manual", "policy": "fixed", "split": split})
        v = latent[i] @ mix_v + 0.1 * rng.standard_normal(32)
        t = latent[i] @ mix_t + 0.1 * rng.standard_normal(24)
        visual.append({"clip_id": cid, "extractor": "resnet34", "weights": "none",
                       "shape": [2, 32], "values": np.stack([v, v]).reshape(-1).astype("float16")})
        text.append({"clip_id": cid, "extractor": "text:x", "weights": "none", "shape": [24],
                     "values": t.astype("float16")})
    corpus.init_partitions(2)
    corpus.write_partitioned("clips", clips, "syn", done=[c["video_id"] for c in clips])
    corpus.write_partitioned("features/resnet34", visual, "syn", done=[r["clip_id"] for r in visual])
    corpus.write_partitioned("features/text_x", text, "syn", done=[r["clip_id"] for r in text])


def noisy_pairs(videos: int = 24, clips: int = 5, swapped: float = 0.3, seed: int = 0):
    """A `PairSet` of `videos` videos of `clips` clips (every 4th video in the test split, kept
    clean) whose visual ([3, 16] frames) and text ([12]) features share a latent per clip, and a
    bool per pair: True where the training pair's sentence was swapped for a random sentence of
    another video (a `swapped` share of the training pairs)."""
    from pipeline.train.pairs import PairSet

    rng = np.random.default_rng(seed)
    mix_v, mix_t = rng.standard_normal((8, 16)), rng.standard_normal((8, 12))
    latent = rng.standard_normal((videos, clips, 8))
    sentences = latent @ mix_t + 0.3 * rng.standard_normal((videos, clips, 12))
    ids, groups, splits, visual, text = [], [], [], [], []
    for v in range(videos):
        for c in range(clips):
            ids.append(f"v{v:02d}c{c}")
            groups.append(f"v{v:02d}")
            splits.append("test" if v % 4 == 0 else "train")
            visual.append(latent[v, c] @ mix_v + 0.3 * rng.standard_normal((3, 16)))
            text.append(sentences[v, c])
    train = [i for i, s in enumerate(splits) if s == "train"]
    bad = np.zeros(len(ids), dtype=bool)
    for i in rng.choice(train, round(swapped * len(train)), replace=False):
        v = int(rng.choice([w for w in range(videos) if f"v{w:02d}" != groups[i]]))
        text[i] = sentences[v, int(rng.integers(clips))]
        bad[i] = True
    return PairSet(ids, groups, splits, visual, text, captions=[f"sentence {i}" for i in ids]), bad

"""Scoring clip–sentence pairs with a retrieval model: each clip's similarity with its own
sentence, the rank of that sentence among the sentences of the clip's video (1 = the best
match), and, for WAL-att-adv, the discriminator's probability that the pair is aligned.

Two kinds of model score: any model the trainer trained (`TrainedScorer`, from its
checkpoint; its own similarity, as retrieval ranks with it) and the published MIL-NCE S3D's two
towers (`MilNceScorer`: the s3d_howto100m video embeddings the featurize stage stored, and the
checkpoint's text tower run on the sentences; the dot product, as the paper scores). The score
stage (pipeline/score/stage.py) and bench/score_noisy.py both go through `score_clips`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.config import ExtractorConfig, FeaturesConfig, TrainConfig
from pipeline.train.batches import pad
from pipeline.train.checkpoint import load_checkpoint
from pipeline.train.evaluation import concat_encoded
from pipeline.train.models import Encoded, RetrievalModel, build_model


@dataclass
class PairScores:
    similarity: np.ndarray  # float32 [N]: the model's score of clip i and its own sentence
    rank: np.ndarray  # int32 [N]: 1 + the sentences of the video that score higher with clip i
    sentences: np.ndarray  # int32 [N]: how many sentences of the video were compared
    p_aligned: np.ndarray | None  # float32 [N], WAL-att-adv only: 1 - P(z=1)


class Scorer(abc.ABC):
    """A model that scores (clip, sentence) pairs: two towers and a similarity."""

    model: str  # the score model, as the scores table records it
    checkpoint: str  # the id of the weights file it scores with
    device: torch.device
    visual_names: list[str] = []  # the visual extractors whose features it takes
    text_name: str | None = None  # the text extractor whose features it takes; None: sentences

    @abc.abstractmethod
    def encode_video(self, visual: Sequence[Any]) -> Encoded: ...

    @abc.abstractmethod
    def encode_text(self, texts: Sequence[Any]) -> Encoded: ...

    @abc.abstractmethod
    def similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        """S[i, j] = score(text i, video j), [N_text, N_video]; higher is a better match."""

    def p_aligned(self, video: Encoded, text: Encoded, similarity: torch.Tensor) -> torch.Tensor | None:
        """P(pair i aligned) for aligned rows of video and text, or None when the model has no
        such output."""
        return None


class TrainedScorer(Scorer):
    """A model the trainer trained, scoring with its own similarity (the one retrieval ranks
    with). Inputs are the features it was trained on: visual [D] or [T, D], text [D] or [K, D]."""

    def __init__(self, model: RetrievalModel, name: str, checkpoint: str, discriminator_trained: bool,
                 device: torch.device | str = "cpu", visual_dim: int | None = None,
                 text_dim: int | None = None) -> None:
        self.net = model.eval().to(device)
        self.model = name
        self.checkpoint = checkpoint
        self.device = torch.device(device)
        # The WAL discriminator is frozen (untrained, its output meaningless) for freeze_epochs.
        self.discriminator_trained = model.discriminator is not None and discriminator_trained
        self.visual_dim, self.text_dim = visual_dim, text_dim  # the inputs it was trained on
        self.visual_names: list[str] = []
        self.text_name: str | None = None

    @classmethod
    def from_state(cls, state: dict[str, Any], name: str, checkpoint: str,
                   device: torch.device | str = "cpu") -> TrainedScorer:
        """From a checkpoint as the training loop saves it (model, config, dims, epoch)."""
        cfg = TrainConfig.model_validate(state["config"])
        model = build_model(cfg, state["visual_dim"], state["text_dim"])
        model.load_state_dict(state["model"])
        trained = state["epoch"] >= int(cfg.options.get("freeze_epochs", 50))
        scorer = cls(model, name, checkpoint, trained, device, int(state["visual_dim"]), int(state["text_dim"]))
        scorer.visual_names, scorer.text_name = cfg.visual_names, cfg.text
        return scorer

    @classmethod
    def load(cls, data: bytes, name: str, checkpoint: str, device: torch.device | str = "cpu") -> TrainedScorer:
        state = load_checkpoint(data, "cpu", checkpoint)
        return cls.from_state(state, name, checkpoint, device)

    def _padded(self, arrays: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        x, mask = pad([np.asarray(a, dtype=np.float32) for a in arrays])
        return x.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def encode_video(self, visual: Sequence[np.ndarray]) -> Encoded:
        return self.net.encode_video(*self._padded(visual))

    @torch.no_grad()
    def encode_text(self, texts: Sequence[np.ndarray]) -> Encoded:
        return self.net.encode_text(*self._padded(texts))

    @torch.no_grad()
    def similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        return self.net.similarity(video, text)

    @torch.no_grad()
    def p_aligned(self, video: Encoded, text: Encoded, similarity: torch.Tensor) -> torch.Tensor | None:
        """1 - P(z=1) = 1 - σ(F_ADV) of WAL's discriminator, on the pair score p_LVC and the
        L2-normalised sentence vector, as in training (`loop.compute_loss`)."""
        if not self.discriminator_trained:
            return None
        assert self.net.discriminator is not None
        return 1 - self.net.discriminator.noise_prob(F.normalize(text.emb, dim=-1), similarity)


class MilNceScorer(Scorer):
    """The MIL-NCE S3D checkpoint's two towers: video embeddings [512] as the s3d_howto100m
    extractor stored them (made with the same file), the text tower on the sentences, and the
    dot product (MIL-NCE 3.1: f(x)ᵀg(y)). The text tower loads exactly as the
    text:s3d_howto100m extractor does (pipeline/features/milnce.py)."""

    def __init__(self, weights: str, name: str, device: str = "auto") -> None:
        from pipeline.features.milnce import MilNceTextExtractor

        self.text_tower = MilNceTextExtractor(ExtractorConfig(name="text:s3d_howto100m", weights=weights),
                                              FeaturesConfig(device=device, precision="fp32"))
        self.model = name
        self.checkpoint = self.text_tower.weights_id
        self.device = self.text_tower.device
        self.visual_names = ["s3d_howto100m"]
        self.text_name = None

    @torch.no_grad()
    def encode_video(self, visual: Sequence[np.ndarray]) -> Encoded:
        stacked = np.stack([np.asarray(v, np.float32).reshape(-1) for v in visual])
        return Encoded(torch.from_numpy(stacked).to(self.device))

    @torch.no_grad()
    def encode_text(self, texts: Sequence[str]) -> Encoded:
        return Encoded(torch.from_numpy(np.stack(self.text_tower.encode([str(t) for t in texts]))).to(self.device))

    @torch.no_grad()
    def similarity(self, video: Encoded, text: Encoded) -> torch.Tensor:
        return text.emb @ video.emb.T


def _encode(fn: Any, inputs: Sequence[Any], chunk: int) -> Encoded:
    return concat_encoded([fn(inputs[i:i + chunk]) for i in range(0, len(inputs), chunk)])


@torch.no_grad()
def score_clips(scorer: Scorer, visual: Sequence[Any], texts: Sequence[Any], clip_group: Sequence[str],
                text_group: Sequence[str], own: Sequence[int], chunk: int = 256) -> PairScores:
    """Scores of clips i (input `visual[i]`, video `clip_group[i]`) with their own sentence
    `texts[own[i]]`; the rank compares it with every sentence j of the same video
    (`text_group[j] == clip_group[i]`), which must include the own one. Ties rank in the clip's
    favour (rank = 1 + the sentences that score strictly higher)."""
    n = len(visual)
    if not n:
        empty = np.zeros(0, np.float32)
        return PairScores(empty, np.zeros(0, np.int32), np.zeros(0, np.int32), None)
    for i, j in enumerate(own):
        if text_group[j] != clip_group[i]:
            raise ValueError(f"clip {i}: its sentence {j} is of video {text_group[j]!r}, not {clip_group[i]!r}")
    video = _encode(scorer.encode_video, visual, chunk)
    text = _encode(scorer.encode_text, texts, chunk)
    sentences_of: dict[str, list[int]] = {}
    for j, g in enumerate(text_group):
        sentences_of.setdefault(g, []).append(j)
    clips_of: dict[str, list[int]] = {}
    for i, g in enumerate(clip_group):
        clips_of.setdefault(g, []).append(i)
    similarity = torch.zeros(n)
    rank = np.zeros(n, np.int32)
    count = np.zeros(n, np.int32)
    for g, clips in clips_of.items():
        ti = sentences_of[g]
        where = {j: p for p, j in enumerate(ti)}
        ci_t = torch.tensor(clips, dtype=torch.long, device=video.emb.device)
        ti_t = torch.tensor(ti, dtype=torch.long, device=text.emb.device)
        s = scorer.similarity(video.index(ci_t), text.index(ti_t)).float().cpu()  # [len(ti), len(clips)]
        pos = torch.tensor([where[own[i]] for i in clips], dtype=torch.long)
        mine = s[pos, torch.arange(len(clips))]
        similarity[clips] = mine
        rank[clips] = (1 + (s > mine[None]).sum(0)).numpy().astype(np.int32)
        count[clips] = len(ti)
    own_t = torch.as_tensor(list(own), dtype=torch.long, device=text.emb.device)
    p = scorer.p_aligned(video, text.index(own_t), similarity.to(text.emb.device))
    return PairScores(similarity.numpy().astype(np.float32), rank, count,
                      None if p is None else p.float().cpu().numpy().astype(np.float32))

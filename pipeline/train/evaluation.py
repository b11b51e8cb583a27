"""Scoring a model on pairs: the test protocols of the papers (WAL's one fixed test set,
S-MiT's 5 x 1k subsets, Torabi et al.'s multiple choice) and the validation score that picks
the checkpoint."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.train import choice, metrics
from pipeline.train.batches import full_batches
from pipeline.train.models import Encoded, RetrievalModel
from pipeline.train.pairs import PairSet, PairsError

EvalOn = Literal["test", "all"]
SUBSET_SIZE = 1000


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def encode_all(model: RetrievalModel, pairs: PairSet, device: torch.device,
               batch_size: int = 256) -> tuple[Encoded, Encoded]:
    """Video and text encodings of every pair, padded to one length per side."""
    model.eval()
    vids, texts = [], []
    for batch in full_batches(pairs, batch_size):
        batch = to_device(batch, device)
        vids.append(model.encode_video(batch["visual"], batch["visual_mask"]))
        texts.append(model.encode_text(batch["text"], batch["text_mask"]))
    return concat_encoded(vids), concat_encoded(texts)


def concat_encoded(parts: list[Encoded]) -> Encoded:
    """Encodings of consecutive chunks as one, [N, L, E] forms padded to the longest L."""
    if parts[0].emb.ndim == 2:
        return Encoded(torch.cat([p.emb for p in parts]))
    length = max(p.emb.shape[1] for p in parts)
    emb = torch.cat([F.pad(p.emb, (0, 0, 0, length - p.emb.shape[1])) for p in parts])
    mask = torch.cat([F.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts])
    return Encoded(emb, mask)


@torch.no_grad()
def similarity_matrix(model: RetrievalModel, pairs: PairSet, device: torch.device, chunk: int = 64) -> np.ndarray:
    """S [N_text, N_video] of the pairs (text i belongs to video i), texts scored in chunks."""
    video, text = encode_all(model, pairs, device)
    rows = [model.similarity(video, text.index(slice(i, i + chunk))).float().cpu()
            for i in range(0, len(pairs), chunk)]
    return torch.cat(rows).numpy()


def mean_recall(scores: metrics.Metrics) -> float:
    """The mean of R@1, R@5 and R@10 over both directions: the validation score of val_recall."""
    return float(np.mean([scores[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10)]))


def evaluation_pairs(pairs: PairSet, eval_on: EvalOn) -> PairSet:
    """The pairs to score: the test split, or with eval_on="all" every pair (training pairs
    included, so the numbers are no test result; metrics.json says split: all)."""
    if eval_on == "all":
        return pairs
    if eval_on != "test":
        raise ValueError(f"eval_on must be 'test' or 'all', got {eval_on!r}")
    if "test" not in pairs.splits:
        source = pairs.meta.get("source", "the pairs")
        raise PairsError(f"{source}: no pair is in the test split, and scoring the training pairs would "
                         f"leak; give the corpus a test split (align.splits, align.test_clip_ids or the "
                         f"pairs file's split column), or pass --eval-on all to score every pair, "
                         f"training pairs included (recorded as split: all)")
    return pairs.subset("test")


def choice_words(pairs: PairSet) -> tuple[list[frozenset[str]] | None, str]:
    """Activity words per pair for the multiple-choice rule, and where they come from."""
    if pairs.activities is not None:
        return [choice.phrase_words(a) for a in pairs.activities], "activity_phrases"
    if pairs.captions is not None:
        return [choice.activity_words(c) for c in pairs.captions], "caption_content_words"
    return None, "other_videos"


def multiple_choice(sim: np.ndarray, pairs: PairSet, seed: int) -> dict[str, Any]:
    """Torabi et al.'s 5-choice accuracy with their distractor rule where the captions are known
    (`choice`), else with distractors drawn from other videos; `mc_rule` says which."""
    words, rule = choice_words(pairs)
    if words is not None:
        try:
            return {"mc_acc": metrics.multiple_choice(sim, distractors=choice.distractors(words, seed=seed)),
                    "mc_rule": rule}
        except ValueError as exc:
            rule = f"other_videos ({rule} rule not met: {exc})"
    try:
        return {"mc_acc": metrics.multiple_choice(sim, video_ids=pairs.groups, seed=seed), "mc_rule": rule}
    except ValueError as exc:
        return {"mc_acc": None, "mc_rule": f"none: {exc}"}


def evaluate_model(model: RetrievalModel, pairs: PairSet, device: torch.device, seed: int = 0,
                   protocol: str = "fixed", eval_on: EvalOn = "test") -> dict[str, Any]:
    """Retrieval metrics on the test split (`evaluation_pairs`): protocol "fixed" scores the
    whole set once (WAL's 100 pairs, Torabi's 1000); "subsets" averages 5 random sets of 1000
    (S-MiT) and, with fewer test pairs, scores the whole set and says so in protocol_note."""
    test = evaluation_pairs(pairs, eval_on)
    if len(test) < 2:
        raise PairsError(f"evaluation needs at least 2 test pairs, got {len(test)}")
    sim = similarity_matrix(model, test, device)
    out: dict[str, Any]
    if protocol == "subsets" and len(test) >= SUBSET_SIZE:
        out = dict(metrics.subset_protocol(sim, size=SUBSET_SIZE, seed=seed))
        out["protocol"] = f"subsets_5x{SUBSET_SIZE}"
    else:
        out = dict(metrics.retrieval_metrics(sim))
        out["protocol"] = f"fixed_{len(test)}"
        if protocol == "subsets":
            out["protocol_note"] = f"subsets_5x{SUBSET_SIZE} needs {SUBSET_SIZE} test pairs; scored all {len(test)}"
        elif protocol != "fixed":
            raise ValueError(f"protocol must be 'fixed' or 'subsets', got {protocol!r}")
    out.update(multiple_choice(sim, test, seed))
    out["n_test"] = len(test)
    out["split"] = eval_on
    return out

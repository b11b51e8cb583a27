"""The score stage: a score for every clip–sentence pair, ``scores/<model>`` rows out.

One row per clip: the score model's similarity of the clip and its sentence, the rank of that
sentence among the sentences of the clip's video (1 = it matches best), and for WAL-att-adv
the discriminator's probability that the pair is aligned. The model is a folder the trainer
wrote under ``ROOT/train/`` (``score.model``, default ``train.model``: the checkpoint training
selected) or ``milnce:<path>``, the MIL-NCE S3D checkpoint's two towers
(pipeline/train/scorer.py).

A partition stage like every other: items are the partition's clips in video order; a batch
reads the sentences of its clips' whole videos (the clips table and the text features, video by
video), so a video that two batches share is ranked the same as in one. Rows record the weights
file they were scored with: when the model is trained again, its checkpoint changes and the
rows of the old one are scored again (``redo``), so the table never mixes two models. A clip
without the model's features is an errors row (bad input: ``--retry-failed`` scores it once
featurize made them). Planning needs no torch; the model is loaded once per process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Sequence
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline import graph
from pipeline.config import Config, milnce_weights, score_key
from pipeline.errors import ErrorKind, SetupError
from pipeline.ids import feature_key
from pipeline.runner import Item, Outcome, Stage, StageContext, rows_of
from pipeline.setup import require_package
from pipeline.shards.samples import batch_features
from pipeline.corpus.storage import Corpus

TRAIN_DIR = "train"
_EPOCH = re.compile(r"epoch_\d+\.pt")


def checkpoint_file(corpus: Corpus, name: str) -> str | None:
    """The checkpoint training selected in ``ROOT/train/<name>`` (relative to the root), as
    `pipeline.train.loop.selected_checkpoint` picks it: best.pt beside the newest epoch when the
    run selected one on the val split, else the newest epoch; None when there is none."""
    directory = posixpath.join(TRAIN_DIR, name, "checkpoints")
    if not corpus.fs.exists(corpus.path(directory)):
        return None
    epochs = sorted(posixpath.basename(p) for p in corpus.fs.ls(corpus.path(directory), detail=False)
                    if _EPOCH.fullmatch(posixpath.basename(p)))
    if not epochs:
        return None
    best = posixpath.join(directory, "best.pt")
    return best if corpus.fs.exists(corpus.path(best)) else posixpath.join(directory, epochs[-1])


# (protocol, path, size and modification time) -> sha256 prefix: planning asks in every partition.
_DIGESTS: dict[tuple[str, str, str], str] = {}


def file_digest(fs: Any, path: str) -> str:
    """The first 12 hex of a file's sha256, computed once per version of the file (its size and
    modification time) in a process."""
    info = fs.info(path)
    signature = json.dumps({k: info.get(k) for k in ("size", "mtime", "LastModified", "ETag", "md5Hash",
                                                      "created")}, default=str, sort_keys=True)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    key = (protocol, path, signature)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with fs.open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()[:12]
    return _DIGESTS[key]


def checkpoint_id(corpus: Corpus, cfg: Config) -> str | None:
    """``file:<name>#<sha256 prefix>`` of the weights the score model scores with (the format of
    `pipeline.features.weights.file_id`, which the s3d_howto100m features record); None when
    they are not there yet."""
    model = cfg.score_model
    assert model is not None
    weights = milnce_weights(model)
    if weights is not None:
        if not os.path.isfile(weights):
            return None
        local = fsspec.filesystem("file")
        return f"file:{os.path.basename(weights)}#{file_digest(local, os.path.abspath(weights))}"
    return trained_checkpoint_id(corpus, model)


def trained_checkpoint_id(corpus: Corpus, name: str) -> str | None:
    """``file:<relpath>#<sha256 prefix>`` of the checkpoint training selected in
    ``ROOT/train/<name>``; None when there is none."""
    relpath = checkpoint_file(corpus, name)
    if relpath is None:
        return None
    return f"file:{relpath}#{file_digest(corpus.fs, corpus.path(relpath))}"


def unavailable(corpus: Corpus, cfg: Config) -> str | None:
    """Why the score model cannot score now (no trained checkpoint yet, no weights file), or
    None when it can."""
    model = cfg.score_model
    if model is None:
        return "the config has no score section"
    weights = milnce_weights(model)
    if weights is not None:
        return None if os.path.isfile(weights) else f"score.model: weight file {weights} does not exist"
    if checkpoint_file(corpus, model) is None:
        return (f"score.model {model!r}: no checkpoint under {corpus.path(TRAIN_DIR, model, 'checkpoints')}; "
                f"train it first (vlcorpus train CONFIG), or name another model")
    return None


@functools.lru_cache(maxsize=2)
def _scorer(url: str, model: str, checkpoint: str, device: str) -> Any:
    from pipeline.models.device import pick_device
    from pipeline.train.scorer import MilNceScorer, TrainedScorer

    weights = milnce_weights(model)
    if weights is not None:
        return MilNceScorer(weights, model, device)
    corpus = Corpus(url)
    relpath = checkpoint_file(corpus, model)
    assert relpath is not None
    return TrainedScorer.load(corpus.fs.cat(corpus.path(relpath)), model, checkpoint,
                              pick_device(device, "score.device"))


def load_scorer(corpus: Corpus, cfg: Config) -> Any:
    """The score model, loaded once per process and version of its weights."""
    why = unavailable(corpus, cfg)
    checkpoint = checkpoint_id(corpus, cfg)
    if why is not None or checkpoint is None:
        raise SetupError(why or "the score model's weights went away")
    assert cfg.score is not None and cfg.score_model is not None
    return _scorer(corpus.url, cfg.score_model, checkpoint, cfg.score.device)


def _inputs(ctx: StageContext, partition: str, keys: pa.Array) -> pa.Table:
    return rows_of(ctx, "clips", partition, "clip_id", keys, ["clip_id", "video_id"])


def _redo(ctx: StageContext, partition: str) -> pa.Array:
    """Clips scored with other weights than the model's now (it was trained again)."""
    table = ctx.config.score_table
    current = checkpoint_id(ctx.corpus, ctx.config)
    if table is None or current is None:
        return pa.array([], pa.string())
    rows = ctx.corpus.read(table, columns=["clip_id", "checkpoint"], partition=partition)
    return pc.filter(rows.column("clip_id"), pc.not_equal(rows.column("checkpoint"), current)).combine_chunks()


def _missing(table: str) -> str:
    return (f"no {table} row for this clip (its featurize failed or has not run): score it again with "
            f"--retry-failed once featurize made it")


def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
    """Score a batch of clips against every sentence of their videos."""
    from pipeline.train.pairs import concat_visual
    from pipeline.train.scorer import score_clips

    corpus, cfg = ctx.corpus, ctx.config
    scorer = load_scorer(corpus, cfg)
    partition = corpus.partition_of(items[0].rows[0]["video_id"])
    clip_ids = [item.key for item in items]
    videos = sorted({item.rows[0]["video_id"] for item in items})
    sentences = corpus.read("clips", columns=["clip_id", "video_id", "text"],
                            filter=ds.field("video_id").isin(videos), partition=partition).to_pylist()
    visual_tables = {feature_key(n): f"{graph.FEATURES}/{feature_key(n)}" for n in scorer.visual_names}
    visual = batch_features(corpus, partition, clip_ids, visual_tables)
    if scorer.text_name is None:  # the model's own text tower reads the sentences
        text_table = None
        text = {s["clip_id"]: s["text"] for s in sentences}
    else:
        text_key = feature_key(scorer.text_name)
        text_table = f"{graph.FEATURES}/{text_key}"
        text = batch_features(corpus, partition, [s["clip_id"] for s in sentences], {text_key: text_table})[text_key]
    wrong_weights = _other_weights(corpus, partition, clip_ids, scorer) if scorer.text_name is None else {}

    outcomes: dict[str, Outcome] = {}
    for item in items:
        lacking = [t for k, t in visual_tables.items() if item.key not in visual[k]]
        if not lacking and item.key not in text:
            lacking = [text_table or "clips"]
        if lacking:
            outcomes[item.key] = Outcome(item.key, kind=ErrorKind.BAD_INPUT, message=_missing(lacking[0]))
        elif item.key in wrong_weights:
            outcomes[item.key] = Outcome(item.key, kind=ErrorKind.BAD_INPUT, message=(
                f"its s3d_howto100m features were made with {wrong_weights[item.key]}, not with the score "
                f"model's {scorer.checkpoint}: featurize them again with that file"))
    usable = [item for item in items if item.key not in outcomes]
    if usable:
        order = [s for s in sentences if s["clip_id"] in text]
        index = {s["clip_id"]: j for j, s in enumerate(order)}
        arrays = concat_visual([{i.key: visual[k][i.key] for i in usable} for k in visual_tables])
        _check_dims(scorer, arrays[usable[0].key], text[usable[0].key])
        scores = score_clips(scorer, [arrays[i.key] for i in usable], [text[s["clip_id"]] for s in order],
                             [i.rows[0]["video_id"] for i in usable], [s["video_id"] for s in order],
                             [index[i.key] for i in usable], chunk=512)
        for n, item in enumerate(usable):
            p = None if scores.p_aligned is None else float(scores.p_aligned[n])
            outcomes[item.key] = Outcome(item.key, rows=[{
                "clip_id": item.key, "model": scorer.model, "checkpoint": scorer.checkpoint,
                "similarity": float(scores.similarity[n]), "rank": int(scores.rank[n]),
                "sentences": int(scores.sentences[n]), "p_aligned": p}])
    return [outcomes[item.key] for item in items]


def _other_weights(corpus: Corpus, partition: str, clip_ids: list[str], scorer: Any) -> dict[str, str]:
    """Clips whose s3d_howto100m features another weights file made (MIL-NCE scoring)."""
    table = f"{graph.FEATURES}/{feature_key(scorer.visual_names[0])}"
    rows = corpus.read(table, columns=["clip_id", "weights"], filter=ds.field("clip_id").isin(clip_ids),
                       partition=partition).to_pylist()
    return {r["clip_id"]: r["weights"] for r in rows if r["weights"] != scorer.checkpoint}


def _check_dims(scorer: Any, visual: Any, text: Any) -> None:
    expected = (getattr(scorer, "visual_dim", None), getattr(scorer, "text_dim", None))
    found = (int(visual.shape[-1]), None if isinstance(text, str) else int(text.shape[-1]))
    for side, want, got in zip(("visual", "text"), expected, found):
        if want is not None and got is not None and want != got:
            names = ", ".join(scorer.visual_names) if side == "visual" else scorer.text_name
            raise SetupError(f"score.model {scorer.model!r} was trained on {side} features of dimension "
                             f"{want}, the corpus's {names} have {got}")


def _check(cfg: Config) -> None:
    require_package("torch", "the score stage", extra="train")
    model = cfg.score_model
    weights = None if model is None else milnce_weights(model)
    if weights is not None:
        require_package("torchvision", "the MIL-NCE score model")
        from pipeline.features.milnce import load_s3dg, read_words

        read_words(weights)  # a missing word list or weight file stops the build before any work
        load_s3dg("score.model", weights)


def make_stage(cfg: Config) -> Stage:
    assert cfg.score is not None and cfg.score_model is not None
    key = score_key(cfg.score_model)
    return Stage(name=f"score:{key}", output=f"{graph.SCORES}/{key}", source="clips", inputs=_inputs,
                 process=process, key="clip_id", order=("video_id",), batch_size=cfg.score.batch_size,
                 redo=_redo, check=_check)


def stages(cfg: Config) -> list[Stage]:
    """The score stage of the config (none without a score section)."""
    return [] if cfg.score is None or cfg.score_model is None else [make_stage(cfg)]

"""The transcribe stage: downloads in, timed sentences (``segments``) out.

Text sources are tried in the order of ``transcribe.prefer``: manual subtitles, auto
subtitles (a track in YouTube's rolling layout counts as auto whatever it was labelled), ASR.
The first source that yields sentences wins; a source that fails is noted and the next is
tried, and only when every source failed does the video become an errors row.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.transcribe.asr import AsrBackend, get_backend, transcribe_media
from pipeline.config import AsrConfig, Config, QualityConfig, TranscribeConfig
from pipeline.models.device import pick_device
from pipeline.errors import BadInputError, StageError
from pipeline.progress import log
from pipeline.runner import Item, Stage, StageContext, per_item, table_inputs
from pipeline.transcribe.segment import Sentence, split_sentences
from pipeline.corpus.storage import Corpus
from pipeline.transcribe.subtitles import check_size, subtitle_sentences

SUBTITLE_SUFFIXES = (".vtt", ".srt")


@cache
def _backend(cfg_json: str) -> AsrBackend:
    # One model per worker process, loaded only when a video actually needs ASR.
    return get_backend(AsrConfig.model_validate_json(cfg_json))


def _subtitle_options(
    corpus: Corpus, subs: list[dict[str, str]], cfg: TranscribeConfig, langs: list[str]
) -> tuple[dict[str, list[tuple[str, list[Sentence]]]], list[str]]:
    """Sentences of each subtitle file, grouped by effective kind, in language preference."""
    order = {lang: i for i, lang in enumerate(langs)}
    by_kind: dict[str, list[tuple[str, list[Sentence]]]] = {"manual": [], "auto": []}
    problems = []
    for sub in sorted(subs, key=lambda s: (order.get(s["lang"], len(order)), s["lang"])):
        try:
            with corpus.local_file(sub["path"]) as path:
                check_size(Path(path).stat().st_size)  # before reading it all into memory
                data = Path(path).read_bytes()
            sentences, layout = subtitle_sentences(data, cfg.sentences, cfg.drop_sound_tags)
        except (StageError, OSError) as exc:
            problems.append(f"subtitles {sub['lang']} ({sub['kind']}): {exc}")
            continue
        kind = "auto" if layout == "rolling" or sub["kind"] == "auto" else "manual"
        by_kind[kind].append((sub["lang"], sentences))
    return by_kind, problems


def _normalised(text: str) -> str:
    return re.sub(r"[^\w\s]", "", text.lower()).strip()


def apply_quality(sentences: list[Sentence], quality: QualityConfig) -> list[Sentence]:
    """The S-MiT style checks: enough words, enough speech, no repeated text."""
    kept = [s for s in sentences if len(s.words) >= quality.min_words]
    if quality.unique_text:
        seen: set[str] = set()
        unique = []
        for sentence in kept:
            key = _normalised(sentence.text)
            if key not in seen:
                seen.add(key)
                unique.append(sentence)
        kept = unique
    speech = sum(s.end_s - s.start_s for s in kept)
    if speech < quality.min_speech_s:
        return []
    return kept


def choose_sentences(
    corpus: Corpus, download: dict[str, Any], cfg: Config
) -> tuple[list[Sentence], str | None, str | None]:
    """(sentences, source, lang) from the first source in preference order that has any.
    No sentences from sources that worked (e.g. captions of only [Music]) is a valid empty
    result; no source that worked at all is bad input."""
    tcfg = cfg.transcribe
    by_kind, problems = _subtitle_options(
        corpus, download.get("subtitles") or [], tcfg, cfg.download.subtitle_langs
    )
    worked = False
    for source in tcfg.prefer:
        if source in by_kind:
            for lang, sentences in by_kind[source]:
                worked = True
                kept = apply_quality(sentences, tcfg.quality)
                if kept:
                    return kept, source, lang
        elif not download.get("media_path") or download.get("has_audio") is False:
            problems.append("asr: no audio stream")
        else:
            backend = _backend(tcfg.asr.model_dump_json())
            with corpus.local_file(download["media_path"]) as media:
                words = transcribe_media(media, backend)
            worked = True
            kept = apply_quality(split_sentences(words, tcfg.sentences), tcfg.quality)
            if kept:
                return kept, f"asr:{backend.name}", tcfg.asr.language
    if problems and worked:
        log.warning("%s: %s", download["video_id"], "; ".join(problems))
    elif problems:
        raise BadInputError("; ".join(problems))
    elif not worked:
        raise BadInputError(f"no text source: no subtitles of the kinds in transcribe.prefer "
                            f"({', '.join(tcfg.prefer)})")
    return [], None, None


def segment_rows(video: str, sentences: list[Sentence], source: str,
                 lang: str | None) -> list[dict[str, Any]]:
    """Rows of the segments table; times rounded to the millisecond."""
    return [
        {
            "video_id": video,
            "index": i,
            "start_s": round(s.start_s, 3),
            "end_s": round(s.end_s, 3),
            "text": s.text,
            "source": source,
            "lang": lang,
            "confidence": s.confidence,
            "words": [{"text": w.text, "start_s": round(w.start_s, 3), "end_s": round(w.end_s, 3)}
                      for w in s.words],
        }
        for i, s in enumerate(sentences)
    ]


def transcribe_one(item: Item, ctx: StageContext) -> list[dict[str, Any]]:
    download = item.rows[0]
    sentences, source, lang = choose_sentences(ctx.corpus, download, ctx.config)
    return segment_rows(item.key, sentences, source or "", lang)


def transcript_file(path: str, asr: AsrConfig, cfg: TranscribeConfig) -> list[dict[str, Any]]:
    """``vlcorpus transcript``: sentences of a subtitle file, or of a media file's speech."""
    if path.lower().endswith(SUBTITLE_SUFFIXES):
        sentences, layout = subtitle_sentences(Path(path).read_bytes(), cfg.sentences,
                                               cfg.drop_sound_tags)
        source = "auto" if layout == "rolling" else "manual"
    else:
        backend = get_backend(asr)
        sentences = split_sentences(transcribe_media(path, backend), cfg.sentences)
        source = f"asr:{backend.name}"
    return [{"start": round(s.start_s, 3), "end": round(s.end_s, 3), "text": s.text,
             "source": source} for s in sentences]


def checked_on_cpu(asr: AsrConfig) -> AsrConfig:
    """The ASR settings a check loads its model with: a GPU asked for must be there (counted
    through NVML), and the model is loaded on the CPU, since the build's own process, where
    checks run, never initialises CUDA; the workers load it on their device."""
    if asr.backend != "faster-whisper":
        return asr
    pick_device(asr.device, "transcribe.asr.device")
    return asr.model_copy(update={"device": "cpu", "compute_type": None})


def check(cfg: Config) -> None:
    """ASR in ``transcribe.prefer``: its model or client set up once now, so a missing model
    or credentials stop the build before anything is downloaded."""
    if "asr" in cfg.transcribe.prefer:
        get_backend(checked_on_cpu(cfg.transcribe.asr))


STAGE = Stage(name="transcribe", output="segments", source="downloads", inputs=table_inputs("downloads"),
              process=per_item(transcribe_one), check=check)

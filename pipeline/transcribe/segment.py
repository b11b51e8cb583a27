"""Timed words into sentences: on punctuation when the text has it, else on pauses and length.

Subtitles and ASR both end here, so every source yields sentences the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.config import SentenceConfig

_FINAL = (".", "?", "!", "…", "。", "？", "！")
_CLOSERS = "\"'”’)]»"
# Abbreviations whose full stop does not end a sentence.
_ABBREVIATIONS = {"e.g.", "i.e.", "mr.", "mrs.", "ms.", "dr.", "vs.", "etc.", "st.", "no.", "jr."}


@dataclass(frozen=True)
class Word:
    text: str
    start_s: float
    end_s: float
    confidence: float | None = None


@dataclass
class Sentence:
    words: list[Word] = field(default_factory=list)

    @property
    def start_s(self) -> float:
        return self.words[0].start_s

    @property
    def end_s(self) -> float:
        return self.words[-1].end_s

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)

    @property
    def confidence(self) -> float | None:
        known = [w.confidence for w in self.words if w.confidence is not None]
        return sum(known) / len(known) if known else None


def ends_sentence(text: str) -> bool:
    """A word that closes a sentence: final punctuation, maybe inside quotes or brackets."""
    stripped = text.rstrip(_CLOSERS)
    if stripped.lower() in _ABBREVIATIONS:
        return False
    return stripped.endswith(_FINAL)


def is_punctuated(words: Sequence[Word]) -> bool:
    """Whether the text carries sentence punctuation worth splitting on."""
    if not words:
        return False
    ends = sum(1 for w in words if ends_sentence(w.text))
    # Long unpunctuated auto captions can still hold a stray "." (e.g. "mr."): ask for a
    # sentence end at least every 60 words on average.
    return ends > 0 and len(words) / ends <= 60


def split_sentences(words: Sequence[Word], cfg: SentenceConfig) -> list[Sentence]:
    """Sentences of ``words`` (in time order). Punctuated text splits at sentence ends;
    any text also splits at a pause of ``pause_s`` when unpunctuated, and whenever a sentence
    would exceed ``max_words`` or ``max_s`` (at the largest gap inside it)."""
    punctuated = is_punctuated(words)
    out: list[Sentence] = []
    current: list[Word] = []
    for word in words:
        if current:
            gap = word.start_s - current[-1].end_s
            if not punctuated and gap >= cfg.pause_s:
                out.append(Sentence(current))
                current = []
        current.append(word)
        if punctuated and ends_sentence(word.text):
            out.append(Sentence(current))
            current = []
    if current:
        out.append(Sentence(current))
    return [piece for s in out for piece in _bounded(s.words, cfg)]


def _bounded(words: list[Word], cfg: SentenceConfig) -> list[Sentence]:
    """Split an over-long sentence at its largest pause until every part fits."""
    too_long = len(words) > cfg.max_words or words[-1].end_s - words[0].start_s > cfg.max_s
    if len(words) < 2 or not too_long:
        return [Sentence(words)]
    gaps = [(words[i].start_s - words[i - 1].end_s, -abs(len(words) / 2 - i), i)
            for i in range(1, len(words))]
    cut = max(gaps)[2]  # largest gap; ties go to the middle
    return _bounded(words[:cut], cfg) + _bounded(words[cut:], cfg)

"""Cues into timed words and sentences, in one of two layouts.

- rolling: YouTube auto captions, where every cue repeats the line(s) shown before it and the
  new line carries inline word timestamps (``word<00:00:01.360><c> word</c>``), or the same
  captions converted to SRT (no word timestamps, the repeats kept). One word timeline is
  rebuilt from the lines that are new in each cue.
- cues: author captions; each cue's text is cleaned (tags, entities, speaker markers, sound
  descriptions) and its span spread over its words.
"""

from __future__ import annotations

import html
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pipeline.config import SentenceConfig
from pipeline.transcribe.segment import Sentence, Word, split_sentences
from pipeline.transcribe.subtitles.parse import INLINE_TIMESTAMP, Cue, Format, read_cues, timestamp_ms

Layout = Literal["rolling", "cues"]

# A word lasts at most this long: a longer gap before the next word (or a cue that stays on
# screen long after its words) is silence, and would otherwise make one word a whole sentence.
_MAX_WORD_S = 1.0
# A typical spoken word, to give a line that only shows up in a 10 ms cue some duration.
_WORD_S = 0.3
# Every sentence lasts more than this; a shorter one is extended to _EXTEND_TO_S.
_MIN_SENTENCE_S = 0.3
_EXTEND_TO_S = 0.35
# YouTube's auto captions time each word as <timestamp><c> word</c>.
_YOUTUBE_WORD = re.compile(r"<(?:\d+:)?\d{1,2}:\d{1,2}\.\d+><c>")

# Elements whose content is never shown: scripts, styles, comments (HTML pasted into captions).
_HIDDEN = re.compile(r"<(script|style)\b[^>]*>.*?(?:</\1\s*>|\Z)|<!--.*?(?:--(?:>|&gt;)|\Z)",
                     re.DOTALL | re.IGNORECASE)
_RUBY_TEXT = re.compile(r"<(rt|rp)\b[^>]*>.*?(?:</\1>|(?=</ruby>)|\Z)", re.DOTALL)
# Cue tags (<v Name>, <c.x>, </c>, <b>, <00:01.000>, <font ...>) and SRT/ASS overrides ({\an8}).
_TAG = re.compile(r"</?[A-Za-z][^<>]*>|</>|<\d[\d:.]*>|\{\\[^{}]*\}")
_ODD_SPACES = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_INVISIBLE = re.compile(r"[\u200b-\u200d\u2060\ufeff]")

_BRACKETED = re.compile(r"\[[^\[\]]*\]")
_PARENTHESISED = re.compile(r"\(([^()]*)\)")
_SOUND_WORD = re.compile(
    r"\b(?:music|applause|laugh\w*|cheer\w*|chuckl\w*|sigh\w*|gasp\w*|cough\w*|inaudible|"
    r"indistinct|silence|noise|static|beep\w*|sound\w*)\b",
    re.IGNORECASE,
)
_SONG = re.compile(r"[♪♫][^♪♫]*[♪♫]|[♪♫]")
_SPEAKER_CHANGE = re.compile(r">{2,}")
_DIALOGUE_DASH = re.compile(r"^\s*[-‐–—]+(?!\d)\s*")
# A speaker name: up to three words of capitals ("MIRA MURATI:"), not a whole line of an
# all-capitals caption ("WELL, HERE IS THE THING:").
_SPEAKER_NAME = re.compile(r"^\s*([^\W\d_][\w.'’-]*(?: [\w.'’-]+){0,2}):(?=\s|$)\s*")
# A token of only closing punctuation is glued to the word before it ("Stéphane ?").
_CLOSING_PUNCT = re.compile(r"^[?!.,;:…»)\]\"”’]+$")
# A token of only dashes or rules is filler ("---"), not a word.
_FILLER = re.compile(r"^[-‐–—_=~*#]+$")


# ---------------------------------------------------------------- text cleaning


def _untagged(raw: str) -> str:
    """Cue text without tags or entities, odd spaces made plain spaces."""
    text = _TAG.sub("", _HIDDEN.sub("", _RUBY_TEXT.sub("", raw)))
    # Some files escape twice ("&amp;#39;") or escape their tags ("&lt;i&gt;").
    text = _TAG.sub("", _HIDDEN.sub("", html.unescape(html.unescape(text))))
    return _INVISIBLE.sub("", _ODD_SPACES.sub(" ", text))


def _plain(raw: str) -> str:
    """A cue line as shown on screen, whitespace collapsed: what rolling lines compare on."""
    return " ".join(_untagged(raw).split())


def _is_sound(description: str) -> bool:
    # "(APPLAUSE)", "(laughs)": all capitals or a known sound word; "(and I mean it)" is speech.
    letters = [c for c in description if c.isalpha()]
    return bool(letters) and (all(c.isupper() for c in letters)
                              or _SOUND_WORD.search(description) is not None)


def _spoken(raw: str, drop_sound_tags: bool) -> list[str]:
    """The spoken words of a cue text: no tags, entities, speaker markers or (optionally) sound
    descriptions."""
    text = _untagged(raw)
    if drop_sound_tags:
        text = _BRACKETED.sub(" ", text)
        text = _PARENTHESISED.sub(lambda m: " " if _is_sound(m[1]) else m[0], text)
        text = _SONG.sub(" ", text)
    # ">>" marks a new speaker anywhere in a line; what follows it is read as a line start.
    text = _SPEAKER_CHANGE.sub("\n", text)
    tokens: list[str] = []
    for line in text.split("\n"):
        line = _DIALOGUE_DASH.sub("", line)
        name = _SPEAKER_NAME.match(line)
        if name and name[1].isupper():
            line = line[name.end():]
        for token in line.split():
            if _CLOSING_PUNCT.match(token) and tokens:
                tokens[-1] += token
            elif not _FILLER.match(token) and not _CLOSING_PUNCT.match(token):
                tokens.append(token)
    return tokens


def _spread(tokens: Sequence[str], start: float, end: float) -> list[Word]:
    """Words over [start, end] in proportion to their length, at most _MAX_WORD_S each on
    average."""
    end = min(max(end, start), start + _MAX_WORD_S * len(tokens))
    total = sum(len(t) for t in tokens)
    words, done = [], 0
    for token in tokens:
        w_start = start + (end - start) * done / total
        done += len(token)
        words.append(Word(token, w_start, start + (end - start) * done / total))
    return words


def _monotonic(words: Sequence[Word]) -> list[Word]:
    """Words with non-decreasing, non-overlapping times (cue timings can overlap or run
    backwards, e.g. an inline timestamp after its cue's end)."""
    out: list[Word] = []
    last = 0.0
    for word in words:
        start = max(word.start_s, last)
        end = max(word.end_s, start)
        out.append(word if (start, end) == (word.start_s, word.end_s)
                   else replace(word, start_s=start, end_s=end))
        last = end
    return out


# ---------------------------------------------------------------- rolling auto captions


def is_rolling(cues: Sequence[Cue]) -> bool:
    """Whether the cues are YouTube rolling auto captions: inline word timestamps
    (``<00:00:01.360><c> word</c>``), or (SRT conversions) most cues starting with the line
    the cue before ended on."""
    if any(_YOUTUBE_WORD.search(cue.text) for cue in cues):
        return True
    shown = [lines for cue in cues if (lines := _screen_lines(cue.text))]
    pairs = list(itertools.pairwise(shown))
    repeats = sum(1 for before, after in pairs if after[0] == before[-1])
    return repeats >= 2 and repeats * 2 >= len(pairs)


def _screen_lines(text: str) -> list[str]:
    return [plain for line in text.split("\n") if (plain := _plain(line))]


def rolling_words(cues: Sequence[Cue], drop_sound_tags: bool = True) -> list[Word]:
    """One word timeline from rolling auto captions, each spoken word once.

    A cue shows the line(s) of the cue before and then its new line; the new lines are what
    is left after the longest run of leading lines that repeats the end of the previous cue
    (a line with inline timestamps is always new, so a line really said twice stays). Every
    cue's new text is used, not only the 10 ms snapshot cues, so nothing is lost at a screen
    clear or at the end of the file. Words are timed by their inline timestamps (a word ends
    where the next starts, the last one at the cue end), or spread over the cue without them.
    """
    words: list[Word] = []
    shown: list[str] = []
    for cue in sorted(cues, key=lambda c: c.start_s):
        lines = [(raw, plain) for raw in cue.text.split("\n") if (plain := _plain(raw))]
        untimed = next((i for i, (raw, _) in enumerate(lines) if INLINE_TIMESTAMP.search(raw)),
                       len(lines))
        carried = next((k for k in range(min(untimed, len(shown)), 0, -1)
                        if shown[-k:] == [plain for _, plain in lines[:k]]), 0)
        shown = [plain for _, plain in lines]
        new = [raw for raw, _ in lines[carried:]]
        if new:
            words += _new_line_words(new, cue, words[-1].end_s if words else 0.0,
                                     drop_sound_tags)
    return _monotonic(words)


def _new_line_words(raw_lines: Sequence[str], cue: Cue, previous_end: float,
                    drop_sound_tags: bool) -> list[Word]:
    # Pieces of text, each with the time it starts at: the cue start, then inline timestamps.
    pieces: list[tuple[float, str]] = [(cue.start_s, "")]
    for raw in raw_lines:
        parts = INLINE_TIMESTAMP.split(raw)
        pieces[-1] = (pieces[-1][0], f"{pieces[-1][1]} {parts[0]}")
        for stamp, text in zip(parts[1::2], parts[2::2]):
            ms = timestamp_ms(stamp)
            pieces.append((pieces[-1][0] if ms is None else ms / 1000, text))
    words: list[Word] = []
    for i, (start, text) in enumerate(pieces):
        tokens = _spoken(text, drop_sound_tags)
        if not tokens:
            continue
        end = pieces[i + 1][0] if i + 1 < len(pieces) else cue.end_s
        if len(pieces) == 1 and end - start < _WORD_S * len(tokens):
            # An untimed line first seen in a 10 ms cue (SRT conversions) was said before it.
            start = max(previous_end, min(start, end - _WORD_S * len(tokens)))
        words += _spread(tokens, start, end)
    return words


# ---------------------------------------------------------------- author captions


def cue_words(cues: Sequence[Cue], drop_sound_tags: bool = True) -> list[Word]:
    """Words of author/manual captions: cleaned cue text, each cue's span spread over its
    words. Overlapping roll-up cues that repeat the end of the cue before lose the repeat; a
    cue is taken to be spoken until the next cue with words starts."""
    spoken = []
    for cue in sorted(cues, key=lambda c: c.start_s):
        body = cue.text.strip()
        if body.startswith("{") and body.endswith("}"):
            continue  # a metadata cue (JSON), not speech
        tokens = _spoken(cue.text, drop_sound_tags)
        if tokens:
            spoken.append((cue, tokens))
    words: list[Word] = []
    for i, (cue, tokens) in enumerate(spoken):
        next_start = spoken[i + 1][0].start_s if i + 1 < len(spoken) else math.inf
        end = min(cue.end_s, next_start) if next_start > cue.start_s else cue.end_s
        timed = _spread(tokens, cue.start_s, end)
        if i and cue.start_s < spoken[i - 1][0].end_s:
            timed = timed[_repeated(spoken[i - 1][1], tokens):]
        words += timed
    return _monotonic(words)


def _repeated(before: list[str], tokens: list[str]) -> int:
    """How many leading tokens repeat the end of the cue before: the longest such run, if it
    is at least two words or the whole cue before (one shared word is too often real)."""
    for k in range(min(len(before), len(tokens)), 0, -1):
        if before[-k:] == tokens[:k]:
            return k if k >= 2 or k == len(before) else 0
    return 0


# ---------------------------------------------------------------- sentences


def subtitle_sentences(
    source: str | Path | bytes,
    cfg: SentenceConfig,
    drop_sound_tags: bool = True,
    fmt: Format | None = None,
) -> tuple[list[Sentence], Layout]:
    """Timed sentences of a subtitle file and its layout: "rolling" (auto captions, whatever
    track they came as) or "cues". Sentences are in time order, do not overlap, have text and
    last more than 0.3 s."""
    cues = read_cues(source, fmt)
    layout: Layout = "rolling" if is_rolling(cues) else "cues"
    words = (rolling_words(cues, drop_sound_tags) if layout == "rolling"
             else cue_words(cues, drop_sound_tags))
    return _long_enough(split_sentences(words, cfg)), layout


def _long_enough(sentences: Sequence[Sentence]) -> list[Sentence]:
    """Sentences lasting more than _MIN_SENTENCE_S: a shorter one ends later, but never after
    the next one starts; one that still cannot last long enough joins the next."""
    out: list[Sentence] = []
    carry: list[Word] = []
    for i, sentence in enumerate(sentences):
        words = carry + sentence.words
        carry = []
        start = words[0].start_s
        if words[-1].end_s - start <= _MIN_SENTENCE_S:
            next_start = sentences[i + 1].start_s if i + 1 < len(sentences) else math.inf
            end = min(next_start, start + _EXTEND_TO_S)
            if end - start <= _MIN_SENTENCE_S:
                carry = words
                continue
            words[-1] = replace(words[-1], end_s=max(end, words[-1].end_s))
        out.append(Sentence(words))
    return out

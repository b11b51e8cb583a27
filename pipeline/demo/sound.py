"""The sounds a narration is laid out from: each synthesized sentence trimmed to its sound, with
the sample span of every word, and the intro music."""

from __future__ import annotations

import array
import math
import re
from dataclasses import dataclass

from pipeline.demo.speech import SAMPLE_RATE

SILENCE_THRESHOLD = 400  # int16 amplitude (about -38 dBFS) below which audio counts as silence
TRIM_MARGIN = SAMPLE_RATE // 100  # keep 10 ms around speech so no onset or release is cut
MUSIC_NOTES_HZ = [523.25, 659.25, 783.99, 1046.5]  # a C major arpeggio as intro "music"
MUSIC_NOTE_MS = 400


@dataclass
class Speech:
    """One synthesized sentence, trimmed of silence; word times are sample offsets."""

    text: str
    samples: array.array
    words: list[tuple[str, int, int]]


def _loud(samples: array.array, i: int) -> bool:
    return abs(samples[i]) > SILENCE_THRESHOLD


def _last_loud(samples: array.array, lo: int, hi: int) -> int:
    """One past the last loud sample in [lo, hi), or lo when all of it is silent."""
    for i in range(hi - 1, lo - 1, -1):
        if _loud(samples, i):
            return i + 1
    return lo


def _word_spans(text: str) -> list[tuple[int, str]]:
    """(character offset, word without punctuation) for each whitespace-separated token."""
    return [(m.start(), re.sub(r"[^\w']", "", m.group())) for m in re.finditer(r"\S+", text)]


def _event_groups(text: str, events: list[tuple[int, int]]) -> list[tuple[list[str], int]]:
    """Words of the text grouped by the word event that starts them: (words, sample offset).

    libespeak-ng gives some pairs ("in the", "of the") a single event, so a word without an
    event of its own joins the group before it."""
    spans = _word_spans(text)
    index = {offset: k for k, (offset, _) in enumerate(spans)}
    firsts = [index.get(pos, -1) for pos, _ in events]
    if not firsts or firsts[0] != 0 or firsts != sorted(set(firsts)):
        raise RuntimeError(f"libespeak-ng word events do not match the words of {text!r}")
    bounds = firsts[1:] + [len(spans)]
    return [
        ([word for _, word in spans[a:b]], sample)
        for a, b, (_, sample) in zip(firsts, bounds, events, strict=True)
    ]


def _split_group(words: list[str], start: int, stop: int) -> list[tuple[str, int, int]]:
    """Share a group's samples among its words in proportion to their letters (the pairs
    merged by libespeak-ng are short function words, so this is within a few centiseconds)."""
    total = sum(len(w) for w in words)
    cuts = [start + (stop - start) * sum(len(w) for w in words[:k]) // total for k in range(len(words) + 1)]
    return [(word, a, b) for word, a, b in zip(words, cuts[:-1], cuts[1:], strict=True)]


def timed_speech(text: str, raw: bytes, events: list[tuple[int, int]]) -> Speech:
    """Trim a synthesized sentence to its sound and time each word in samples."""
    samples = array.array("h", raw)
    first = next(i for i in range(len(samples)) if _loud(samples, i))
    begin = max(first - TRIM_MARGIN, 0)
    end = min(_last_loud(samples, first, len(samples)) + TRIM_MARGIN, len(samples))
    groups = _event_groups(text, events)
    starts = [max(sample, begin) for _, sample in groups]
    words = []
    for (group, _), start, next_start in zip(groups, starts, starts[1:] + [end], strict=True):
        # A group ends where its sound stops, which is before any pause (comma) that follows.
        stop = min(_last_loud(samples, start, next_start) + TRIM_MARGIN, next_start)
        words += _split_group(group, start - begin, max(stop, start + len(group)) - begin)
    return Speech(text, samples[begin:end], words)


def music(n_samples: int) -> array.array:
    """A soft arpeggio, each note faded in and out so there are no clicks."""
    note_len = SAMPLE_RATE * MUSIC_NOTE_MS // 1000
    fade = note_len // 8
    out = array.array("h")
    for i in range(n_samples):
        hz = MUSIC_NOTES_HZ[(i // note_len) % len(MUSIC_NOTES_HZ)]
        pos = i % note_len
        envelope = min(1.0, pos / fade, (note_len - pos) / fade)
        out.append(int(6000 * envelope * math.sin(2 * math.pi * hz * i / SAMPLE_RATE)))
    return out

"""The two caption tracks of a video: author captions (punctuated, about one sentence a cue)
and YouTube auto captions in the rolling layout yt-dlp saves (each line shown word by word)."""

from __future__ import annotations

import re

from pipeline.demo.model import DemoVideo, Word

AUTO_CLEAR_GAP_MS = 800  # a pause this long clears the auto-caption screen (scene changes)
SNAPSHOT_MS = 10  # YouTube's rolling layout shows each finished line in a 10 ms cue
VTT_HEADER = "WEBVTT\nKind: captions\nLanguage: en\n\n"


def _ts(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def author_vtt(video: DemoVideo, split_sentence: int) -> str:
    """Author captions: one cue per sentence, sentence number split_sentence in two cues."""
    cues: list[tuple[float, float, str]] = []
    if video.music_s:
        cues.append((0.0, video.music_s, "[Music]"))
    sentences = [s for scene in video.scenes for s in scene.sentences]
    for i, sentence in enumerate(sentences):
        tokens = sentence.text.split()
        # Captions stay up a little after the voice stops, but never over the next one.
        next_start = sentences[i + 1].start_s if i + 1 < len(sentences) else video.duration_s
        end = min(round(sentence.end_s + 0.3, 3), next_start)
        if i == split_sentence:
            mid = len(tokens) // 2
            cues.append((sentence.start_s, sentence.words[mid - 1].end_s, " ".join(tokens[:mid])))
            cues.append((sentence.words[mid].start_s, end, " ".join(tokens[mid:])))
        else:
            cues.append((sentence.start_s, end, sentence.text))
    return VTT_HEADER + "".join(f"{_ts(a)} --> {_ts(b)}\n{text}\n\n" for a, b, text in cues)


def _auto_word(text: str) -> str:
    return re.sub(r"[^\w']", "", text.lower())


def _auto_lines(words: list[Word], max_chars: list[int]) -> list[list[Word]]:
    """Break the word stream into caption lines: at a length limit, at a long pause, and
    around a sound tag such as [Music], which YouTube shows on a line of its own."""
    lines: list[list[Word]] = []
    for word in words:
        line = lines[-1] if lines else None
        if (
            line is None
            or word.text.startswith("[")
            or line[-1].text.startswith("[")
            or round((word.start_s - line[-1].end_s) * 1000) >= AUTO_CLEAR_GAP_MS
            or len(" ".join(w.text for w in line + [word])) > max_chars[len(lines) - 1]
        ):
            lines.append([word])
        else:
            line.append(word)
    return lines


def auto_vtt(words: list[Word], duration_s: float, max_chars: list[int]) -> str:
    """YouTube auto captions in yt-dlp's layout: each line is shown word by word below the
    previous one (inline word timestamps), then frozen for 10 ms; a long pause clears both."""
    lines = _auto_lines(words, max_chars)
    cues = []
    above = " "
    for k, line in enumerate(lines):
        start = line[0].start_s
        payload = line[0].text + "".join(f"<{_ts(w.start_s)}><c> {w.text}</c>" for w in line[1:])
        if k + 1 == len(lines):
            cues.append((start, min(round(line[-1].end_s + 0.5, 3), duration_s), above, payload))
            break
        nxt = lines[k + 1][0]
        end = round(nxt.start_s - SNAPSHOT_MS / 1000, 3)
        cues.append((start, end, above, payload))
        cleared = round((nxt.start_s - line[-1].end_s) * 1000) >= AUTO_CLEAR_GAP_MS
        above = " " if cleared else " ".join(w.text for w in line)
        cues.append((end, nxt.start_s, above, " "))
    body = "".join(f"{_ts(a)} --> {_ts(b)} align:start position:0%\n{l1}\n{l2}\n\n" for a, b, l1, l2 in cues)
    return VTT_HEADER + body


def auto_words(video: DemoVideo) -> list[Word]:
    """What the auto track says: [Music] over the intro, then every word in lower case without
    punctuation, as speech recognition would write it."""
    words = [Word("[Music]", 0.0, video.music_s)] if video.music_s else []
    for scene in video.scenes:
        for sentence in scene.sentences:
            words += [Word(_auto_word(w.text), w.start_s, w.end_s) for w in sentence.words]
    return words


"""Offline demo corpus: narrated "room tour" videos with captions, served over HTTP.

``make_demo_media(out_dir, n_videos, seed)`` writes, deterministically from ``seed``::

    media/tour-<i>.mp4         H.264 + AAC, 320x240, 25 fps, 15-30 s, 3-6 scenes
    media/broken.mp4           the first 30 % of a remuxed tour-0 (no moov atom: unreadable)
    subs/tour-<i>.en.vtt       author-style captions: punctuated, about one sentence a cue
    subs/tour-<i>.auto.en.vtt  YouTube auto-caption layout as yt-dlp saves it (rolling lines)
    pages/tour-<i>.html        one <video> with its <source> and two caption <track>s
    pages/broken.html          points at media/broken.mp4
    pages/gone.html            points at media/gone.mp4, which does not exist (HTTP 404)
    index.html                 links every page
    manifest.json              ground truth: scenes, objects, sentences and word timings

Each scene shows one object as a big coloured shape (a red sofa is a red rectangle, a blue
lamp a blue circle, ...) while a voice says one or two sentences about it, so pictures match
what is said. Speech comes from libespeak-ng (the library behind the espeak-ng command),
called through ctypes: one synthesis per sentence keeps natural prosody for ASR, and the
library's word events give each word's exact sample offset, so word timings in the captions
and the manifest are those of the audio (to the sample, then rounded to the millisecond).

Caption tracks: both tracks sit on the same page. yt-dlp's generic extractor keys subtitles by
``srclang``, so the author track is ``en`` and the auto-style track is ``en-auto``; asking
yt-dlp for ``subtitleslangs: ["en"]`` fetches only the author track, ``["en-auto"]`` only the
auto one. The generic extractor has no notion of automatic captions, so a consumer that wants
to treat ``en-auto`` as auto captions must do so by this key (or by the rolling layout).

``serve_demo(site_dir)`` serves the directory on 127.0.0.1 (a random free port by default)
and writes ``urls.txt`` with every page URL for that server, broken and gone pages included.
The server does not answer HTTP Range requests with 206; yt-dlp does not need it.

Command line: ``python -m pipeline.demo make DIR --videos N --seed S`` and
``python -m pipeline.demo serve DIR [--port P]``.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import ctypes.util
import functools
import html
import json
import math
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

INSTALL_HINT = "install it with `apt-get install -y ffmpeg espeak-ng` (or run `make demo`)"

WIDTH, HEIGHT, FPS = 320, 240, 25
FRAME_MS = 1000 // FPS
SAMPLE_RATE = 22050  # libespeak-ng's native rate; kept to avoid resampling
SPEECH_RATE_WPM = 145
MIN_SCENE_MS = 3000
MIN_VIDEO_MS, MAX_VIDEO_MS = 15000, 30000
SILENCE_THRESHOLD = 400  # int16 amplitude (about -38 dBFS) below which audio counts as silence
TRIM_MARGIN = SAMPLE_RATE // 100  # keep 10 ms around speech so no onset or release is cut
AUTO_CLEAR_GAP_MS = 800  # a pause this long clears the auto-caption screen (scene changes)
SNAPSHOT_MS = 10  # YouTube's rolling layout shows each finished line in a 10 ms cue

WALL_RGB = (206, 203, 196)
FLOOR_RGB = (150, 146, 140)
FLOOR_Y = 200

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "blue": (40, 80, 220),
    "green": (40, 170, 60),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "pink": (245, 120, 180),
}
# Every object has its own shape, so an object can be told from the picture alone.
OBJECT_SHAPES: dict[str, str] = {
    "sofa": "rectangle",
    "lamp": "circle",
    "plant": "triangle",
    "rug": "diamond",
    "clock": "ring",
    "table": "tee",
    "chair": "square",
    "bed": "cross",
}
ROOMS = ["living room", "kitchen", "bedroom", "hallway", "study", "dining room", "bathroom"]

ROOM_SENTENCES = [
    "Now we walk into the {room} of this apartment.",
    "Next, let me show you around the {room} here.",
    "This part of the tour takes us to the {room}.",
    "We are standing in the {room} right now.",
]
OBJECT_SENTENCES = [
    "Here you can see {a} {colour} {object} against the wall.",
    "In the middle of the room there is {a} {colour} {object}.",
    "Take a close look at this {colour} {object} over here.",
    "This {colour} {object} is one of my favorite things.",
    "The {object} in this room is painted bright {colour}.",
]
SCENE_SENTENCES = [
    "In the {room} we have {a} {colour} {object} next to the door.",
    "The {room} has {a} {colour} {object} in the corner.",
]
MUSIC_NOTES_HZ = [523.25, 659.25, 783.99, 1046.5]  # a C major arpeggio as intro "music"
MUSIC_NOTE_MS = 400


@dataclass
class Word:
    """A spoken word (without punctuation); all times are seconds from the video start."""

    text: str
    start_s: float
    end_s: float


@dataclass
class Sentence:
    text: str
    start_s: float
    end_s: float
    words: list[Word]


@dataclass
class Scene:
    """One shot: a single object drawn as a coloured shape while its sentences are said."""

    index: int
    start_s: float
    end_s: float
    room: str
    object: str
    colour: str
    shape: str
    sentences: list[Sentence]


@dataclass
class DemoVideo:
    """Ground truth of one video; paths are relative to the site directory."""

    id: str
    title: str
    page: str
    media: str
    subs: dict[str, str]
    duration_s: float
    music_s: float  # length of the intro music (0 when none), captioned "[Music]"
    scenes: list[Scene]


@dataclass
class BadPage:
    page: str
    media: str
    kind: str  # "truncated" (media is cut, unreadable) or "missing" (media URL 404s)


@dataclass
class DemoSite:
    """What make_demo_media wrote; manifest.json holds all of it but out_dir."""

    out_dir: Path
    seed: int
    videos: list[DemoVideo]
    bad_pages: list[BadPage] = field(default_factory=list)

    def page_urls(self, base_url: str) -> list[str]:
        """Every page URL under base_url: the good videos first, then the bad pages."""
        pages = [v.page for v in self.videos] + [b.page for b in self.bad_pages]
        return [urljoin(base_url, page) for page in pages]

    def manifest(self) -> dict:
        return {
            "seed": self.seed,
            "videos": [asdict(v) for v in self.videos],
            "bad_pages": [asdict(b) for b in self.bad_pages],
        }

    @classmethod
    def load(cls, site_dir: Path) -> DemoSite:
        """Read a site back from its manifest.json."""
        data = json.loads((Path(site_dir) / "manifest.json").read_text(encoding="utf-8"))
        return cls(
            out_dir=Path(site_dir),
            seed=data["seed"],
            videos=[_video_from_dict(v) for v in data["videos"]],
            bad_pages=[BadPage(**b) for b in data["bad_pages"]],
        )


def _sentence_from_dict(data: dict) -> Sentence:
    return Sentence(**{**data, "words": [Word(**w) for w in data["words"]]})


def _video_from_dict(data: dict) -> DemoVideo:
    scenes = [Scene(**{**s, "sentences": [_sentence_from_dict(t) for t in s["sentences"]]}) for s in data["scenes"]]
    return DemoVideo(**{**data, "scenes": scenes})


# ---------------------------------------------------------------- speech (libespeak-ng)


class _EspeakEvent(ctypes.Structure):
    # espeak_EVENT from speak_lib.h; the trailing union (int / char* / char[8]) is 8 bytes.
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)
_EVENT_LIST_TERMINATED, _EVENT_WORD = 0, 1
_AUDIO_OUTPUT_SYNCHRONOUS, _INITIALIZE_DONT_EXIT = 2, 0x8000
_POS_CHARACTER, _CHARS_UTF8, _PARAM_RATE = 1, 1, 1


class _Espeak:
    """libespeak-ng in synchronous mode: text in, samples and word start offsets out."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._samples = array.array("h")
        self._words: list[tuple[int, int]] = []  # (text position, sample offset)
        self._callback = _SYNTH_CALLBACK(self._on_audio)  # referenced so it is not collected
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INITIALIZE_DONT_EXIT)
        if rate != SAMPLE_RATE or lib.espeak_SetVoiceByName(b"en-us") != 0:
            raise RuntimeError(f"libespeak-ng failed to start with the en-us voice; {INSTALL_HINT}")
        lib.espeak_SetParameter(_PARAM_RATE, SPEECH_RATE_WPM, 0)
        lib.espeak_SetSynthCallback(self._callback)

    def _on_audio(self, wav, n_samples: int, events) -> int:
        if n_samples > 0:
            self._samples.extend(wav[:n_samples])
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            # Word events of length 0 (text position 0) come at some pauses and name no word.
            if events[i].type == _EVENT_WORD and events[i].length > 0:
                self._words.append((events[i].text_position - 1, events[i].sample))
            i += 1
        return 0

    def synth(self, text: str) -> tuple[bytes, list[tuple[int, int]]]:
        self._samples, self._words = array.array("h"), []
        data = text.encode("utf-8")
        self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        return self._samples.tobytes(), self._words


def _espeak_library() -> str:
    name = ctypes.util.find_library("espeak-ng")
    if name is None:
        raise RuntimeError(f"espeak-ng (libespeak-ng) is not installed; {INSTALL_HINT}")
    return name


def check_tools() -> None:
    """Fail early, naming the missing binary and how to install it."""
    for binary in ("ffmpeg", "ffprobe", "espeak-ng"):
        if shutil.which(binary) is None:
            raise RuntimeError(f"{binary} not found on PATH; {INSTALL_HINT}")
    _espeak_library()


def _synthesize(texts: list[str]) -> list[tuple[bytes, list[tuple[int, int]]]]:
    """Speak texts in order, in this process (see _synthesize_fresh)."""
    engine = _Espeak(ctypes.CDLL(_espeak_library()))
    return [engine.synth(text) for text in texts]


_SYNTHESIZE_CHILD = (
    "import pickle, sys; from pipeline.demo import _synthesize; "
    "sys.stdout.buffer.write(pickle.dumps(_synthesize(pickle.load(sys.stdin.buffer))))"
)


def _synthesize_fresh(texts: list[str]) -> list[tuple[bytes, list[tuple[int, int]]]]:
    """Speak texts in a new interpreter.

    libespeak-ng carries state from one synthesis to the next (the same text comes out a few
    milliseconds different later in a process) and cannot be restarted in-process, so each
    video's sentences are spoken by a fresh process: the audio then depends only on them.
    A plain subprocess (not multiprocessing) also works inside daemonic Dask workers."""
    proc = subprocess.run([sys.executable, "-c", _SYNTHESIZE_CHILD], input=pickle.dumps(texts), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"speech synthesis failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(proc.stdout)


@dataclass
class _Speech:
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


def _speech(text: str, raw: bytes, events: list[tuple[int, int]]) -> _Speech:
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
    return _Speech(text, samples[begin:end], words)


def _music(n_samples: int) -> array.array:
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


# ---------------------------------------------------------------- scene planning


@dataclass
class _ScenePlan:
    room: str
    object: str
    colour: str
    texts: list[str]
    lead_ms: int
    tail_ms: int
    pauses_ms: list[int]  # silence after each sentence but the last
    speeches: list[_Speech] = field(default_factory=list)  # filled in once synthesized


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plan_scene(rng: random.Random, room: str, obj: str, colour: str) -> _ScenePlan:
    slots = {"room": room, "object": obj, "colour": colour, "a": _article(colour)}
    if rng.random() < 0.5:
        texts = [rng.choice(ROOM_SENTENCES).format(**slots), rng.choice(OBJECT_SENTENCES).format(**slots)]
    else:
        texts = [rng.choice(SCENE_SENTENCES).format(**slots)]
    texts[0] = texts[0][0].upper() + texts[0][1:]
    return _ScenePlan(
        room=room,
        object=obj,
        colour=colour,
        texts=texts,
        lead_ms=rng.randrange(300, 520, 20),
        tail_ms=rng.randrange(500, 720, 20),
        pauses_ms=[rng.randrange(350, 470, 10) for _ in texts[1:]],
    )


def _scene_ms(plan: _ScenePlan, intro_ms: int) -> int:
    """Scene length: lead, speech and tail, at least MIN_SCENE_MS, rounded up to whole frames."""
    speech = sum(len(s.samples) for s in plan.speeches) * 1000 // SAMPLE_RATE
    total = max(intro_ms + plan.lead_ms + speech + sum(plan.pauses_ms) + plan.tail_ms, MIN_SCENE_MS)
    return -(-total // FRAME_MS) * FRAME_MS


def _candidate_scenes(rng: random.Random) -> list[_ScenePlan]:
    """Six scenes with distinct rooms and objects; the video uses the first 3 to 6."""
    rooms = rng.sample(ROOMS, 6)
    objects = rng.sample(sorted(OBJECT_SHAPES), 6)
    colours: list[str] = []
    for _ in range(6):
        colours.append(rng.choice([c for c in COLOURS if not colours or c != colours[-1]]))
    return [_plan_scene(rng, r, o, c) for r, o, c in zip(rooms, objects, colours, strict=True)]


def _scene_count(rng: random.Random, plans: list[_ScenePlan], music_ms: int) -> int:
    """A random 3 to 6, moved as little as needed to keep the video in 15-30 s."""
    lengths = [_scene_ms(p, music_ms if i == 0 else 0) for i, p in enumerate(plans)]
    n = rng.randint(3, 6)
    while n > 3 and sum(lengths[:n]) > MAX_VIDEO_MS:
        n -= 1
    while n < 6 and sum(lengths[:n]) < MIN_VIDEO_MS:
        n += 1
    if not MIN_VIDEO_MS <= sum(lengths[:n]) <= MAX_VIDEO_MS:
        raise RuntimeError(f"demo video length {sum(lengths[:n])} ms is outside 15-30 s")
    return n


def _samples_to_s(samples: int) -> float:
    return round(samples * 1000 / SAMPLE_RATE) / 1000


def _lay_out(plans: list[_ScenePlan], music_ms: int) -> tuple[list[Scene], array.array]:
    """Place every sentence on the video timeline; returns scenes and the narration track."""
    audio = array.array("h")
    scenes = []
    scene_start_ms = 0
    for index, plan in enumerate(plans):
        intro_ms = music_ms if index == 0 else 0
        length_ms = _scene_ms(plan, intro_ms)
        scene_start = scene_start_ms * SAMPLE_RATE // 1000
        if intro_ms:
            audio.extend(_music(intro_ms * SAMPLE_RATE // 1000))
        cursor = scene_start + (intro_ms + plan.lead_ms) * SAMPLE_RATE // 1000
        sentences = []
        for speech, pause_ms in zip(plan.speeches, plan.pauses_ms + [0], strict=True):
            audio.extend([0] * (cursor - len(audio)))
            audio.extend(speech.samples)
            words = [Word(w, _samples_to_s(cursor + a), _samples_to_s(cursor + b)) for w, a, b in speech.words]
            sentences.append(Sentence(speech.text, words[0].start_s, words[-1].end_s, words))
            cursor += len(speech.samples) + pause_ms * SAMPLE_RATE // 1000
        scene_end_ms = scene_start_ms + length_ms
        scene = Scene(
            index=index,
            start_s=scene_start_ms / 1000,
            end_s=scene_end_ms / 1000,
            room=plan.room,
            object=plan.object,
            colour=plan.colour,
            shape=OBJECT_SHAPES[plan.object],
            sentences=sentences,
        )
        scenes.append(scene)
        scene_start_ms = scene_end_ms
    audio.extend([0] * (scene_start_ms * SAMPLE_RATE // 1000 - len(audio)))
    return scenes, audio


# ---------------------------------------------------------------- pictures


def _shape_spans(shape: str, y: int) -> list[tuple[int, int]]:
    """Horizontal runs [x0, x1) of the shape on row y, centred in the frame."""
    cx, cy = WIDTH // 2, 125
    dy = y - cy

    def disc(r: int) -> tuple[int, int] | None:
        if abs(dy) >= r:
            return None
        half = int(math.sqrt(r * r - dy * dy))
        return (cx - half, cx + half)

    def box(x0: int, x1: int, y0: int, y1: int) -> list[tuple[int, int]]:
        return [(x0, x1)] if y0 <= y < y1 else []

    if shape == "rectangle":
        return box(60, 260, 80, 170)
    if shape == "square":
        return box(90, 230, 55, 195)
    if shape == "circle":
        return [s] if (s := disc(72)) else []
    if shape == "ring":
        outer, inner = disc(75), disc(40)
        if outer is None:
            return []
        return [outer] if inner is None else [(outer[0], inner[0]), (inner[1], outer[1])]
    if shape == "triangle":
        if not 50 <= y < 195:
            return []
        half = (y - 50) * 85 // 145
        return [(cx - half, cx + half + 1)]
    if shape == "diamond":
        half = 78 - abs(dy)
        return [(cx - half, cx + half)] if half > 0 else []
    if shape == "cross":
        return box(85, 235, 100, 150) or box(135, 185, 50, 200)
    if shape == "tee":
        return box(60, 260, 60, 100) or box(140, 180, 100, 200)
    raise ValueError(f"unknown shape {shape!r}")


def _frame_ppm(shape: str, rgb: tuple[int, int, int]) -> bytes:
    """One binary PPM frame: wall, floor and the shape; built row by row from runs."""
    fg = bytes(rgb)
    rows = []
    for y in range(HEIGHT):
        bg = bytes(FLOOR_RGB if y >= FLOOR_Y else WALL_RGB)
        row = bytearray(bg * WIDTH)
        for x0, x1 in _shape_spans(shape, y):
            row[3 * x0 : 3 * x1] = fg * (x1 - x0)
        rows.append(bytes(row))
    return f"P6\n{WIDTH} {HEIGHT}\n255\n".encode() + b"".join(rows)


# ---------------------------------------------------------------- captions


def _ts(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


VTT_HEADER = "WEBVTT\nKind: captions\nLanguage: en\n\n"


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


def _auto_words(video: DemoVideo) -> list[Word]:
    words = [Word("[Music]", 0.0, video.music_s)] if video.music_s else []
    for scene in video.scenes:
        for sentence in scene.sentences:
            words += [Word(_auto_word(w.text), w.start_s, w.end_s) for w in sentence.words]
    return words


# ---------------------------------------------------------------- pages


def _page_html(title: str, media: str, tracks: list[tuple[str, str, str]]) -> str:
    track_tags = "".join(
        f'    <track kind="captions" src="../{src}" srclang="{lang}" label="{label}">\n'
        for lang, src, label in tracks
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f'<video controls width="{WIDTH}" height="{HEIGHT}">\n'
        f'    <source src="../{media}" type="video/mp4">\n{track_tags}</video>\n</body>\n</html>\n'
    )


def _index_html(site: DemoSite) -> str:
    links = [(v.page, v.title) for v in site.videos] + [(b.page, b.page) for b in site.bad_pages]
    items = "".join(f'<li><a href="{page}">{html.escape(text)}</a></li>\n' for page, text in links)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>vlcorpus demo</title>\n</head>\n<body>\n<ul>\n{items}</ul>\n</body>\n</html>\n"
    )


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


# ---------------------------------------------------------------- media


def _run(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


# Bit-exact flags and a single encoder thread make the mp4 bytes depend only on the inputs.
_BITEXACT = ["-fflags", "+bitexact", "-flags:v", "+bitexact", "-flags:a", "+bitexact", "-map_metadata", "-1"]


def _encode(video: DemoVideo, audio: array.array, out: Path, work: Path) -> None:
    """Render each scene's still frame and mux them, scene after scene, with the narration."""
    inputs: list[str] = []
    for scene in video.scenes:
        frame = work / f"scene-{scene.index}.ppm"
        frame.write_bytes(_frame_ppm(scene.shape, COLOURS[scene.colour]))
        seconds = f"{scene.end_s - scene.start_s:.3f}"
        inputs += ["-loop", "1", "-framerate", str(FPS), "-t", seconds, "-i", str(frame)]
    wav = work / "narration.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(audio.tobytes())
    n = len(video.scenes)
    graph = "".join(f"[{i}:v]" for i in range(n)) + f"concat=n={n}:v=1:a=0,format=yuv420p[v]"
    _run([
        "ffmpeg", "-nostdin", "-y", "-v", "error", *inputs, "-i", str(wav),
        "-filter_complex", graph, "-map", "[v]", "-map", f"{n}:a",
        "-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-g", str(2 * FPS), "-threads", "1",
        "-c:a", "aac", "-b:a", "64k", "-movflags", "+faststart", *_BITEXACT, str(out),
    ])


def _write_broken(source: Path, out: Path, work: Path) -> None:
    """Remux with the moov atom at the end, then keep the first 30 %: no moov, unreadable."""
    remuxed = work / "moov-at-end.mp4"
    _run(["ffmpeg", "-nostdin", "-y", "-v", "error", "-i", str(source), "-c", "copy", *_BITEXACT, str(remuxed)])
    data = remuxed.read_bytes()
    out.write_bytes(data[: len(data) * 3 // 10])


# ---------------------------------------------------------------- the site


def _build_video(out_dir: Path, index: int, seed: int) -> DemoVideo:
    """Plan, narrate and write one video; its content depends only on (seed, index)."""
    rng = random.Random(f"vlcorpus-demo:{seed}:{index}")
    music_ms = len(MUSIC_NOTES_HZ) * MUSIC_NOTE_MS if index % 2 == 0 else 0
    plans = _candidate_scenes(rng)
    texts = [text for plan in plans for text in plan.texts]
    spoken = iter(_synthesize_fresh(texts))
    for plan in plans:
        plan.speeches = [_speech(text, *next(spoken)) for text in plan.texts]
    scenes, audio = _lay_out(plans[: _scene_count(rng, plans, music_ms)], music_ms)
    video_id = f"tour-{index}"
    rooms = [s.room for s in scenes]
    video = DemoVideo(
        id=video_id,
        title=f"Apartment tour {index + 1}: the {', '.join(rooms[:-1])} and {rooms[-1]}",
        page=f"pages/{video_id}.html",
        media=f"media/{video_id}.mp4",
        subs={"en": f"subs/{video_id}.en.vtt", "en-auto": f"subs/{video_id}.auto.en.vtt"},
        duration_s=scenes[-1].end_s,
        music_s=music_ms / 1000,
        scenes=scenes,
    )
    split_sentence = rng.randrange(sum(len(s.sentences) for s in scenes))
    auto_words = _auto_words(video)
    max_chars = [rng.randint(28, 40) for _ in auto_words]  # a length limit for each possible line
    _write_text(out_dir / video.subs["en"], author_vtt(video, split_sentence))
    _write_text(out_dir / video.subs["en-auto"], auto_vtt(auto_words, video.duration_s, max_chars))
    tracks = [("en", video.subs["en"], "English"), ("en-auto", video.subs["en-auto"], "English (auto-generated)")]
    _write_text(out_dir / video.page, _page_html(video.title, video.media, tracks))
    (out_dir / "media").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlcorpus-demo-") as work:
        _encode(video, audio, out_dir / video.media, Path(work))
    return video


def make_demo_media(out_dir: Path, n_videos: int = 4, seed: int = 0, quiet: bool = False) -> DemoSite:
    """Write the demo site (media, captions, pages, manifest) into out_dir; see the module doc."""
    check_tools()
    if n_videos < 1:
        raise ValueError("n_videos must be at least 1")
    out_dir = Path(out_dir)
    workers = min(n_videos, os.cpu_count() or 1)
    # Threads suffice: the work happens in child processes (speech, then ffmpeg).
    columns = [TextColumn("demo videos"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, disable=quiet) as progress, ThreadPoolExecutor(workers) as pool:
        task = progress.add_task("demo", total=n_videos)
        futures = [pool.submit(_build_video, out_dir, i, seed) for i in range(n_videos)]
        videos = []
        for future in futures:
            videos.append(future.result())
            progress.advance(task)
    site = DemoSite(
        out_dir=out_dir,
        seed=seed,
        videos=videos,
        bad_pages=[
            BadPage(page="pages/broken.html", media="media/broken.mp4", kind="truncated"),
            BadPage(page="pages/gone.html", media="media/gone.mp4", kind="missing"),
        ],
    )
    with tempfile.TemporaryDirectory(prefix="vlcorpus-demo-") as work:
        _write_broken(out_dir / site.videos[0].media, out_dir / "media/broken.mp4", Path(work))
    (out_dir / "media/gone.mp4").unlink(missing_ok=True)
    for bad in site.bad_pages:
        _write_text(out_dir / bad.page, _page_html(f"Demo page ({bad.kind} media)", bad.media, []))
    _write_text(out_dir / "index.html", _index_html(site))
    _write_text(out_dir / "manifest.json", json.dumps(site.manifest(), indent=2) + "\n")
    return site


# ---------------------------------------------------------------- serving


class _QuietHandler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".vtt": "text/vtt", ".mp4": "video/mp4"}

    def log_message(self, format: str, *args: object) -> None:
        """Requests are not logged: the demo server runs inside tests and pipelines."""


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """Clients that hang up early (yt-dlp probing, ffmpeg seeking) are not errors here."""


@contextlib.contextmanager
def serve_demo(site_dir: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve site_dir over HTTP in a daemon thread; yields the base URL, ending in '/'.
    Writes urls.txt (every page URL for this server, one a line) into site_dir."""
    site_dir = Path(site_dir)
    site = DemoSite.load(site_dir)
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = _QuietServer((host, port), handler)
    base_url = f"http://{host}:{server.server_address[1]}/"
    _write_text(site_dir / "urls.txt", "".join(f"{u}\n" for u in site.page_urls(base_url)))
    thread = threading.Thread(target=server.serve_forever, name="demo-http", daemon=True)
    thread.start()
    try:
        yield base_url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="generate the demo site into DIR")
    make.add_argument("dir", type=Path)
    make.add_argument("--videos", type=int, default=4)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--quiet", action="store_true")
    serve = commands.add_parser("serve", help="serve DIR over HTTP until interrupted")
    serve.add_argument("dir", type=Path)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "make":
        site = make_demo_media(args.dir, n_videos=args.videos, seed=args.seed, quiet=args.quiet)
        print(f"wrote {len(site.videos)} videos and {len(site.bad_pages)} bad pages to {site.out_dir}")
        return
    with serve_demo(args.dir, host=args.host, port=args.port) as base_url:
        print(base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()

"""Speech from libespeak-ng (the library behind the espeak-ng command) through ctypes: one
synthesis per sentence, in a fresh child process per video, giving the samples and the sample
offset where each word starts."""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import pickle
import subprocess
import sys

INSTALL_HINT = "install it with `apt-get install -y ffmpeg espeak-ng` (or run `make demo`)"

SAMPLE_RATE = 22050  # libespeak-ng's native rate; kept to avoid resampling
SPEECH_RATE_WPM = 145

# One sentence spoken: its int16 samples as bytes, and (text position, sample offset) per word.
Synthesis = tuple[bytes, list[tuple[int, int]]]


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

    def synth(self, text: str) -> Synthesis:
        self._samples, self._words = array.array("h"), []
        data = text.encode("utf-8")
        self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        return self._samples.tobytes(), self._words


def espeak_library() -> str:
    """The name ctypes loads libespeak-ng by; an error with the install hint when it is missing."""
    name = ctypes.util.find_library("espeak-ng")
    if name is None:
        raise RuntimeError(f"espeak-ng (libespeak-ng) is not installed; {INSTALL_HINT}")
    return name


def _synthesize(texts: list[str]) -> list[Synthesis]:
    """Speak texts in order, in this process (see synthesize_fresh)."""
    engine = _Espeak(ctypes.CDLL(espeak_library()))
    return [engine.synth(text) for text in texts]


_SYNTHESIZE_CHILD = (
    "import pickle, sys; from pipeline.demo.speech import _synthesize; "
    "sys.stdout.buffer.write(pickle.dumps(_synthesize(pickle.load(sys.stdin.buffer))))"
)


def synthesize_fresh(texts: list[str]) -> list[Synthesis]:
    """Speak texts in a new interpreter.

    libespeak-ng carries state from one synthesis to the next (the same text comes out a few
    milliseconds different later in a process) and cannot be restarted in-process, so each
    video's sentences are spoken by a fresh process: the audio then depends only on them.
    A plain subprocess (not multiprocessing) also works inside daemonic Dask workers."""
    proc = subprocess.run([sys.executable, "-c", _SYNTHESIZE_CHILD], input=pickle.dumps(texts), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"speech synthesis failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(proc.stdout)

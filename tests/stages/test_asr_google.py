"""The Google Cloud Speech backend against a local fake of the v1 gRPC API.

The fake server speaks the real wire protocol (the library's own request/response types over
grpc), so the real `SpeechClient` is exercised end to end: it "recognises" tone bursts in the
audio it receives, one word per burst named after its pitch, with times relative to the
request's audio, and checks the recognition config of every request.
"""

from __future__ import annotations

import json
import logging
import wave

import pytest

speech = pytest.importorskip("google.cloud.speech_v1")
pytest.importorskip("grpc")
from speechfake import RATE, confidence_of, fake_speech, write_tones  # noqa: E402
from pipeline.transcribe.asr import AsrSetupError, get_backend  # noqa: E402
from pipeline.transcribe.asr.google import GoogleBackend, _insecure_target  # noqa: E402
from pipeline.config import AsrConfig  # noqa: E402
from pipeline.errors import BadInputError, PermanentError, TransientError  # noqa: E402

# (start s, pitch Hz) of 0.5 s tone bursts in 130 s of silence; none straddles 55 s or 110 s.
BURSTS = [(10.0, 300), (40.0, 500), (60.0, 700), (100.0, 400), (120.0, 900)]
BURST_S = 0.5
SECRET = "SECRET-do-not-log-7f3a9c"


def write_wav(path, duration_s: float = 130.0, bursts=BURSTS) -> str:
    return write_tones(path, duration_s, bursts, BURST_S)


@pytest.fixture
def fake():
    with fake_speech() as service:
        yield service


def backend(fake, **google) -> GoogleBackend:
    cfg = AsrConfig(backend="google", google={"endpoint": fake.endpoint, **google})
    return GoogleBackend(cfg, retry_initial_s=0.01, retry_max_s=0.05, retry_timeout_s=5,
                         rpc_timeout_s=10, operation_timeout_s=10, poll_initial_s=0.01)


def expected_words() -> list[tuple[str, float, float, float | None]]:
    return [(f"f{p}", s, s + BURST_S, confidence_of(p) or None) for s, p in BURSTS]


def assert_words(words) -> None:
    assert [w.text for w in words] == [e[0] for e in expected_words()]
    for w, (_, start, end, conf) in zip(words, expected_words()):
        assert w.start_s == pytest.approx(start, abs=0.02)
        assert w.end_s == pytest.approx(end, abs=0.02)
        assert w.confidence == (pytest.approx(conf) if conf is not None else None)


def test_chunks_offsets_retry_and_mapping(fake, tmp_path, caplog):
    wav = write_wav(tmp_path / "tones.wav")
    b = backend(fake, chunk_s=55)
    with caplog.at_level(logging.WARNING, logger="pipeline.transcribe.asr.google"):
        words = b.transcribe(wav)
    assert_words(words)
    # 130 s in 55 s chunks: 55 + 55 + 20; the first call was answered UNAVAILABLE and retried.
    assert fake.chunks == [55 * RATE * 2, 55 * RATE * 2, 20 * RATE * 2]
    assert fake.calls == 4
    assert "UNAVAILABLE, retrying" in caplog.text
    cfg = fake.configs[0]
    assert cfg.encoding == speech.RecognitionConfig.AudioEncoding.LINEAR16
    assert (cfg.sample_rate_hertz, cfg.audio_channel_count) == (RATE, 1)
    assert cfg.enable_word_time_offsets and cfg.enable_automatic_punctuation
    assert cfg.language_code == "en-US" and cfg.model == ""


def test_model_and_punctuation_are_sent(fake, tmp_path):
    wav = write_wav(tmp_path / "short.wav", duration_s=12, bursts=[(10.0, 300)])
    b = backend(fake, model="video", automatic_punctuation=False)
    assert [w.text for w in b.transcribe(wav)] == ["f300"]
    assert fake.configs[0].model == "video"
    assert not fake.configs[0].enable_automatic_punctuation


def test_long_running(fake, tmp_path):
    wav = write_wav(tmp_path / "tones.wav")
    b = backend(fake, long_running=True, chunk_s=300)
    words = b.transcribe(wav)
    assert_words(words)
    assert fake.chunks == [130 * RATE * 2]  # one operation for the whole file
    assert fake.polls >= 1


def test_long_running_inline_limit(fake, tmp_path):
    wav = write_wav(tmp_path / "long.wav", duration_s=320, bursts=[])
    b = backend(fake, long_running=True, chunk_s=400)
    with pytest.raises(BadInputError, match="limit of inline audio"):
        b.transcribe(wav)
    assert fake.calls == 0
    # The same file in chunks under the limit goes through.
    fake.fail_first = 0
    assert backend(fake, long_running=True, chunk_s=300).transcribe(wav) == []
    assert len(fake.chunks) == 2


def test_invalid_argument_is_bad_input(fake, tmp_path):
    wav = write_wav(tmp_path / "short.wav", duration_s=5, bursts=[])
    with pytest.raises(BadInputError, match="INVALID_ARGUMENT.*language_code"):
        backend(fake, language_code="xx-XX").transcribe(wav)


def test_permission_denied_is_permanent(fake, tmp_path):
    wav = write_wav(tmp_path / "short.wav", duration_s=5, bursts=[])
    fake.deny = True
    with pytest.raises(PermanentError, match="PERMISSION_DENIED") as info:
        backend(fake).transcribe(wav)
    assert not isinstance(info.value, (TransientError, BadInputError))


def test_unavailable_for_good_is_transient(fake, tmp_path):
    wav = write_wav(tmp_path / "short.wav", duration_s=5, bursts=[])
    fake.fail_first = 10**6
    cfg = AsrConfig(backend="google", google={"endpoint": fake.endpoint})
    b = GoogleBackend(cfg, retry_initial_s=0.01, retry_max_s=0.02, retry_timeout_s=0.3)
    with pytest.raises(TransientError, match="UNAVAILABLE"):
        b.transcribe(wav)
    assert fake.calls > 2


def test_wrong_wav_format_is_bad_input(fake, tmp_path):
    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(44100)
        wav.writeframes(b"\0" * 400)
    with pytest.raises(BadInputError, match="mono 16-bit 16000 Hz"):
        backend(fake).transcribe(str(path))


def test_get_backend_and_endpoints(fake):
    b = get_backend(AsrConfig(backend="google", google={"endpoint": fake.endpoint}))
    assert b.name == "google"
    assert _insecure_target("127.0.0.1:8080") == "127.0.0.1:8080"
    assert _insecure_target("localhost:50051") == "localhost:50051"
    assert _insecure_target("[::1]:50051") == "[::1]:50051"
    assert _insecure_target("http://speech-fake:8080") == "speech-fake:8080"
    assert _insecure_target("eu-speech.googleapis.com") is None
    assert _insecure_target("https://127.0.0.1:443") is None


def test_no_secrets_in_logs_or_errors(fake, tmp_path, caplog, monkeypatch):
    key = {"type": "service_account", "project_id": "p", "private_key_id": SECRET,
           "private_key": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n",
           "client_email": "x@p.iam.gserviceaccount.com", "client_id": "1",
           "token_uri": "https://oauth2.googleapis.com/token"}
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(key))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    monkeypatch.setenv("GOOGLE_API_KEY", SECRET)
    wav = write_wav(tmp_path / "short.wav", duration_s=12, bursts=[(10.0, 300)])
    caplog.set_level(logging.DEBUG)
    # Through the local endpoint (with a retry logged) ...
    assert [w.text for w in backend(fake).transcribe(wav)] == ["f300"]
    assert all(SECRET not in str(m) for m in fake.metadata)
    # ... and the real endpoint path, whose credentials from the environment are unusable.
    with pytest.raises(AsrSetupError, match="GOOGLE_APPLICATION_CREDENTIALS") as info:
        GoogleBackend(AsrConfig(backend="google"))
    assert SECRET not in str(info.value)
    assert "retrying" in caplog.text
    assert SECRET not in caplog.text

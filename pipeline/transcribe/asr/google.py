"""Google Cloud Speech-to-Text (v1) backend, with the google-cloud-speech client.

Credentials come from the standard environment (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
application-default login, or the metadata server) and are never logged. With
`transcribe.asr.google.endpoint` set to a loopback address (or an `http://` URL), the client
talks plain gRPC to that server with anonymous credentials: that is how the tests run it
against a local fake. Any other endpoint (e.g. `eu-speech.googleapis.com`) is a TLS endpoint
used with the environment's credentials.

Audio goes up as raw LINEAR16 at 16 kHz, cut into chunks of `chunk_s` seconds:
- synchronous `recognize` (the default) accepts at most 60 s per request, which the config
  enforces (`chunk_s <= 60`);
- with `long_running: true`, each chunk is a `long_running_recognize` operation whose result is
  polled. The audio is sent inline: the API accepts at most 10 MB of inline content (about
  5 min 12 s at 16 kHz mono 16-bit); longer audio needs a gs:// URI, which this backend does
  not upload, so a chunk past the limit is a BadInputError (lower `chunk_s`).
Word times are relative to each chunk; the chunk's offset is added. A word cut by a chunk
boundary may be lost or split.

Calls are retried with exponential backoff on UNAVAILABLE, DEADLINE_EXCEEDED and
RESOURCE_EXHAUSTED; what still fails maps onto the errors table's kinds: those (and other
server-side failures) are transient, INVALID_ARGUMENT/OUT_OF_RANGE are bad input, and
PERMISSION_DENIED/UNAUTHENTICATED and the rest are permanent.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import logging
import wave
from typing import Any

import google.auth.exceptions
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.api_core.client_options import ClientOptions
from google.api_core.future import polling
from google.cloud import speech_v1 as speech

from pipeline.transcribe.asr import SAMPLE_RATE, AsrSetupError
from pipeline.config import AsrConfig, GoogleAsrConfig
from pipeline.errors import BadInputError, PermanentError, StageError, TransientError
from pipeline.transcribe.segment import Word

log = logging.getLogger(__name__)

INLINE_LIMIT_BYTES = 10 * 1000 * 1000  # the API's limit on inline audio content
SYNC_LIMIT_S = 60.0  # synchronous recognize rejects longer audio

RETRYABLE = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.ResourceExhausted)
_TRANSIENT = RETRYABLE + (gexc.InternalServerError, gexc.Aborted, gexc.Cancelled, gexc.Unknown)
_BAD_INPUT = (gexc.InvalidArgument, gexc.OutOfRange)


def _insecure_target(endpoint: str) -> str | None:
    """host:port for a plain-gRPC endpoint (loopback or http://), else None."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        scheme, rest = "", endpoint
    rest = rest.rstrip("/")
    if scheme == "http":
        return rest
    if scheme == "https":
        return None
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 or rest.startswith("[") else rest
    host = host.strip("[]")
    if host == "localhost":
        return rest
    try:
        return rest if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        return None


def make_client(endpoint: str | None) -> speech.SpeechClient:
    """A SpeechClient for `endpoint` (None: Google's default endpoint)."""
    target = _insecure_target(endpoint) if endpoint else None
    if target is not None:
        import grpc
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.speech_v1.services.speech.transports import SpeechGrpcTransport

        # Unlimited message sizes, as the library's own channels have.
        channel = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        transport = SpeechGrpcTransport(channel=channel, credentials=AnonymousCredentials())
        log.info("google speech: plain gRPC to %s, anonymous credentials", target)
        return speech.SpeechClient(transport=transport)
    options = None
    if endpoint:
        host = endpoint.partition("://")[2] if "://" in endpoint else endpoint
        options = ClientOptions(api_endpoint=host.rstrip("/"))
    try:
        client = speech.SpeechClient(client_options=options)
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise AsrSetupError(
            "google speech: no usable Google Cloud credentials in the environment "
            f"({_first_line(exc)}); set GOOGLE_APPLICATION_CREDENTIALS to a service-account "
            "key file or run `gcloud auth application-default login`"
        ) from None
    log.info("google speech: %s, credentials from the environment",
             endpoint or "default endpoint")
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _too_large(exc: BaseException) -> bool:
    # gRPC reports an over-size message as RESOURCE_EXHAUSTED: no retry fixes that.
    return isinstance(exc, gexc.ResourceExhausted) and "larger than max" in str(exc)


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, RETRYABLE) and not _too_large(exc)


def map_error(exc: BaseException) -> StageError:
    """The stage error for a failed call (after retries)."""
    if isinstance(exc, gexc.RetryError):
        cause = exc.cause
        if isinstance(cause, gexc.GoogleAPICallError):
            mapped = map_error(cause)
            return type(mapped)(f"{mapped} (gave up after retrying)")
        return TransientError(f"google speech: {_first_line(exc)}")
    if isinstance(exc, gexc.GoogleAPICallError):
        code = exc.grpc_status_code.name if exc.grpc_status_code is not None else exc.code
        message = f"google speech {code}: {exc.message}"
        if _too_large(exc):
            return BadInputError(message)
        if isinstance(exc, _TRANSIENT):
            return TransientError(message)
        if isinstance(exc, _BAD_INPUT):
            return BadInputError(message)
        return PermanentError(message)
    if isinstance(exc, concurrent.futures.TimeoutError):
        return TransientError(f"google speech: operation timed out ({_first_line(exc)})")
    if isinstance(exc, google.auth.exceptions.TransportError):
        return TransientError(
            f"google speech: cannot reach the token server ({type(exc).__name__})"
        )
    if isinstance(exc, google.auth.exceptions.GoogleAuthError):
        # Auth messages can quote token responses: name the kind only.
        return PermanentError(f"google speech: credentials rejected ({type(exc).__name__})")
    return PermanentError(f"google speech: unexpected {type(exc).__name__}: {_first_line(exc)}")


def _words(response: Any, offset_s: float) -> list[Word]:
    out: list[Word] = []
    for result in response.results:
        if not result.alternatives:
            continue
        best = result.alternatives[0]
        # 0.0 is the API's "not set" (only final results carry a confidence).
        confidence = float(best.confidence) or None
        for info in best.words:
            text = info.word.strip()
            if not text:
                continue
            start = offset_s + info.start_time.total_seconds()
            end = max(start, offset_s + info.end_time.total_seconds())
            out.append(Word(text, start, end, confidence))
    return out


class GoogleBackend:
    name = "google"

    def __init__(
        self,
        cfg: AsrConfig,
        *,
        client: speech.SpeechClient | None = None,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 32.0,
        retry_timeout_s: float = 300.0,
        rpc_timeout_s: float = 120.0,
        operation_timeout_s: float = 3600.0,
        poll_initial_s: float = 1.0,
    ) -> None:
        self.cfg: GoogleAsrConfig = cfg.google
        self.client = client if client is not None else make_client(self.cfg.endpoint)
        self.rpc_timeout_s = rpc_timeout_s
        self.operation_timeout_s = operation_timeout_s
        self.retry = gretry.Retry(
            predicate=retryable,
            initial=retry_initial_s,
            maximum=retry_max_s,
            multiplier=2.0,
            timeout=retry_timeout_s,
            on_error=self._on_retry,
        )
        self.polling = polling.DEFAULT_POLLING.with_delay(initial=poll_initial_s)
        config: dict[str, Any] = {
            "encoding": speech.RecognitionConfig.AudioEncoding.LINEAR16,
            "sample_rate_hertz": SAMPLE_RATE,
            "audio_channel_count": 1,
            "language_code": self.cfg.language_code,
            "enable_word_time_offsets": True,
            "enable_automatic_punctuation": self.cfg.automatic_punctuation,
        }
        if self.cfg.model:
            config["model"] = self.cfg.model
        self.config = speech.RecognitionConfig(**config)

    @staticmethod
    def _on_retry(exc: Exception) -> None:
        code = getattr(getattr(exc, "grpc_status_code", None), "name", type(exc).__name__)
        log.warning("google speech: %s, retrying with backoff", code)

    def transcribe(self, wav_path: str) -> list[Word]:
        words: list[Word] = []
        for offset_s, pcm in self._chunks(wav_path):
            try:
                response = self._recognize(pcm)
            except StageError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure maps onto a kind
                raise map_error(exc) from None
            words.extend(_words(response, offset_s))
        return words

    def _recognize(self, pcm: bytes) -> Any:
        audio = speech.RecognitionAudio(content=pcm)
        if not self.cfg.long_running:
            return self.client.recognize(config=self.config, audio=audio, retry=self.retry,
                                         timeout=self.rpc_timeout_s)
        operation = self.client.long_running_recognize(
            config=self.config, audio=audio, retry=self.retry, timeout=self.rpc_timeout_s
        )
        return operation.result(timeout=self.operation_timeout_s, retry=self.retry,
                                polling=self.polling)

    def _chunks(self, wav_path: str):
        """(offset in seconds, raw PCM) for each chunk of the WAV."""
        try:
            wav = wave.open(wav_path, "rb")  # noqa: SIM115 - closed by the with below
        except (OSError, EOFError, wave.Error) as exc:
            raise BadInputError(f"unreadable WAV: {exc}") from None
        with wav:
            rate, channels, width = wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
            if (rate, channels, width) != (SAMPLE_RATE, 1, 2):
                raise BadInputError(
                    f"expected mono 16-bit {SAMPLE_RATE} Hz WAV, got {channels} channel(s), "
                    f"{8 * width}-bit, {rate} Hz"
                )
            limit_s = None if self.cfg.long_running else SYNC_LIMIT_S
            chunk_s = min(self.cfg.chunk_s, limit_s) if limit_s else self.cfg.chunk_s
            frames = max(1, int(chunk_s * rate))
            start = 0
            while True:
                pcm = wav.readframes(frames)
                if not pcm:
                    return
                if len(pcm) > INLINE_LIMIT_BYTES:
                    raise BadInputError(
                        f"a {len(pcm) / (2 * rate):.0f} s chunk is {len(pcm)} bytes, over the "
                        f"{INLINE_LIMIT_BYTES} byte limit of inline audio (longer audio needs a "
                        "gs:// URI, which is not supported); lower transcribe.asr.google.chunk_s"
                    )
                yield start / rate, pcm
                start += len(pcm) // 2

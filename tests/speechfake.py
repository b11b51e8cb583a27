"""A local fake of Google Cloud Speech-to-Text's v1 gRPC API, for the Google ASR backend.

The fake server speaks the real wire protocol (the library's own request/response types over
grpc), so the real `SpeechClient` is exercised end to end: it "recognises" tone bursts in the
audio it receives, one word per burst named after its pitch ("f300"), with times relative to the
request's audio, and checks the recognition config of every request. ``fake_speech()`` serves it
on 127.0.0.1 (its ``endpoint`` is what `transcribe.asr.google.endpoint` takes); ``write_tones``
writes audio it recognises.
"""

from __future__ import annotations

import threading
import wave
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from datetime import timedelta

import grpc
import numpy as np
from google.cloud import speech_v1 as speech
from google.longrunning import operations_pb2
from google.protobuf import any_pb2

RATE = 16000


def confidence_of(pitch: int) -> float:
    # 900 Hz gets the API's "not set" confidence, 0.0.
    return 0.0 if pitch == 900 else round(0.5 + pitch / 2000, 3)


def write_tones(path, duration_s: float, bursts: list[tuple[float, int]], burst_s: float) -> str:
    """A 16 kHz mono wav of ``duration_s`` of silence with a tone burst of ``burst_s`` at each
    (start s, pitch Hz) of ``bursts``: what the fake recognises as one word each."""
    samples = np.zeros(int(duration_s * RATE), dtype=np.int16)
    for start, pitch in bursts:
        i = int(start * RATE)
        t = np.arange(int(burst_s * RATE)) / RATE
        samples[i:i + len(t)] = (8000 * np.sin(2 * np.pi * pitch * t)).astype(np.int16)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(samples.tobytes())
    return str(path)


def recognise(pcm: bytes) -> speech.RecognizeResponse:
    """One result per tone burst: its pitch as the word, times relative to this audio."""
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    frame = RATE // 100  # 10 ms
    n = len(x) // frame
    loud = np.sqrt((x[: n * frame].reshape(n, frame) ** 2).mean(axis=1)) > 1000
    results = []
    i = 0
    while i < n:
        if not loud[i]:
            i += 1
            continue
        j = i
        while j < n and loud[j]:
            j += 1
        seg = x[i * frame: j * frame]
        crossings = np.count_nonzero(np.diff(np.signbit(seg)))
        pitch = int(round(crossings / 2 / (len(seg) / RATE) / 100.0) * 100)
        word = speech.WordInfo(word=f" f{pitch} ", start_time=timedelta(seconds=i / 100),
                               end_time=timedelta(seconds=j / 100))
        alt = speech.SpeechRecognitionAlternative(transcript=f"f{pitch}",
                                                  confidence=confidence_of(pitch), words=[word])
        results.append(speech.SpeechRecognitionResult(alternatives=[alt]))
        i = j
    results.append(speech.SpeechRecognitionResult())  # a result without alternatives
    return speech.RecognizeResponse(results=results)


class FakeSpeech:
    """google.cloud.speech.v1.Speech (Recognize, LongRunningRecognize) and
    google.longrunning.Operations (GetOperation)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0  # every Recognize/LongRunningRecognize call, failed ones included
        self.chunks: list[int] = []  # audio bytes of each accepted request
        self.configs: list[speech.RecognitionConfig] = []
        self.metadata: list[dict] = []
        self.fail_first = 1  # answer UNAVAILABLE to this many calls first
        self.deny = False
        self.operations: dict[str, operations_pb2.Operation] = {}
        self.polls = 0
        self.endpoint = ""  # host:port, once served (fake_speech)

    def _accept(self, request, context) -> None:
        with self.lock:
            self.calls += 1
            calls = self.calls
            self.metadata.append(dict(context.invocation_metadata()))
        if calls <= self.fail_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if self.deny:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "speech API not enabled")
        cfg = request.config
        problems = []
        if cfg.encoding != speech.RecognitionConfig.AudioEncoding.LINEAR16:
            problems.append(f"encoding {cfg.encoding}")
        if cfg.sample_rate_hertz != RATE:
            problems.append(f"sample_rate_hertz {cfg.sample_rate_hertz}")
        if not cfg.enable_word_time_offsets:
            problems.append("word time offsets off")
        if cfg.language_code != "en-US":
            problems.append(f"unsupported language_code {cfg.language_code!r}")
        if len(request.audio.content) > 60 * RATE * 2 and not isinstance(
                request, speech.LongRunningRecognizeRequest):
            problems.append("sync input too long")
        if problems:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        with self.lock:
            self.chunks.append(len(request.audio.content))
            self.configs.append(cfg)

    def recognize(self, request, context):
        self._accept(request, context)
        return recognise(request.audio.content)

    def long_running_recognize(self, request, context):
        self._accept(request, context)
        response = speech.LongRunningRecognizeResponse(
            results=recognise(request.audio.content).results
        )
        packed = any_pb2.Any()
        packed.Pack(speech.LongRunningRecognizeResponse.pb(response))
        with self.lock:
            name = f"operations/op-{len(self.operations)}"
            self.operations[name] = operations_pb2.Operation(name=name, done=True, response=packed)
        return operations_pb2.Operation(name=name, done=False)

    def get_operation(self, request, context):
        with self.lock:
            self.polls += 1
            op = self.operations.get(request.name)
        if op is None:
            context.abort(grpc.StatusCode.NOT_FOUND, request.name)
        return op

    def handlers(self):
        unary = grpc.unary_unary_rpc_method_handler
        return [
            grpc.method_handlers_generic_handler("google.cloud.speech.v1.Speech", {
                "Recognize": unary(
                    self.recognize,
                    request_deserializer=speech.RecognizeRequest.deserialize,
                    response_serializer=speech.RecognizeResponse.serialize),
                "LongRunningRecognize": unary(
                    self.long_running_recognize,
                    request_deserializer=speech.LongRunningRecognizeRequest.deserialize,
                    response_serializer=operations_pb2.Operation.SerializeToString),
            }),
            grpc.method_handlers_generic_handler("google.longrunning.Operations", {
                "GetOperation": unary(
                    self.get_operation,
                    request_deserializer=operations_pb2.GetOperationRequest.FromString,
                    response_serializer=operations_pb2.Operation.SerializeToString),
            }),
        ]


@contextmanager
def fake_speech() -> Iterator[FakeSpeech]:
    """The fake, served on 127.0.0.1 until the block ends; its ``endpoint`` is host:port."""
    service = FakeSpeech()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 32 * 2**20)])
    server.add_generic_rpc_handlers(service.handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    service.endpoint = f"127.0.0.1:{port}"
    try:
        yield service
    finally:
        server.stop(grace=None)

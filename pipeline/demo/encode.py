"""A demo video's mp4 (its scenes' still frames and the narration, H.264 + AAC) and the broken
copy with no moov atom; both through media.process.run_ffmpeg."""

from __future__ import annotations

import array
import wave
from pathlib import Path

from pipeline.demo.model import DemoVideo
from pipeline.demo.pictures import COLOURS, FPS, frame_ppm
from pipeline.demo.speech import SAMPLE_RATE
from pipeline.media.process import run_ffmpeg

# An encode takes a second or two; the bound only stops a hung ffmpeg on a busy machine.
FFMPEG_TIMEOUT_S = 600

# Bit-exact flags and a single encoder thread make the mp4 bytes depend only on the inputs.
_BITEXACT = ["-fflags", "+bitexact", "-flags:v", "+bitexact", "-flags:a", "+bitexact", "-map_metadata", "-1"]


def _ffmpeg(args: list[str]) -> None:
    run = run_ffmpeg(args, FFMPEG_TIMEOUT_S)
    if run.failed:
        raise RuntimeError(f"ffmpeg failed: {run.reason}")


def encode_video(video: DemoVideo, audio: array.array, out: Path, work: Path) -> None:
    """Render each scene's still frame and mux them, scene after scene, with the narration."""
    inputs: list[str] = []
    for scene in video.scenes:
        frame = work / f"scene-{scene.index}.ppm"
        frame.write_bytes(frame_ppm(scene.shape, COLOURS[scene.colour]))
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
    _ffmpeg([
        *inputs, "-i", str(wav),
        "-filter_complex", graph, "-map", "[v]", "-map", f"{n}:a",
        "-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-g", str(2 * FPS), "-threads", "1",
        "-c:a", "aac", "-b:a", "64k", "-movflags", "+faststart", *_BITEXACT, str(out),
    ])


def write_broken(source: Path, out: Path, work: Path) -> None:
    """Remux with the moov atom at the end, then keep the first 30 %: no moov, unreadable."""
    remuxed = work / "moov-at-end.mp4"
    _ffmpeg(["-i", str(source), "-c", "copy", *_BITEXACT, str(remuxed)])
    data = remuxed.read_bytes()
    out.write_bytes(data[: len(data) * 3 // 10])

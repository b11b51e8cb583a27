"""Frame sampling (PyAV, one pass per video) and clip cutting (one ffmpeg process per video)."""

from __future__ import annotations

import os
import subprocess

import av
import numpy as np
import pytest
from conftest import require_binaries

from pipeline.media import clips as media_clips
from pipeline.media import frames as media_frames
from pipeline.errors import BadInputError
from pipeline.media import (ClipCut, FrameRequest, FrameSpec, cut_clips, cut_videos, frame_times, probe,
                            sample_frames)

# The colour video: 12 s, 320x240, 25 fps, a new colour every 2 s, a sine audio track.
COLOURS = {"red": (255, 0, 0), "blue": (0, 0, 255), "lime": (0, 255, 0),
           "white": (255, 255, 255), "black": (0, 0, 0), "yellow": (255, 255, 0)}
FPS = 25
WAL = FrameSpec(fps=2)  # short side 256, centre 224


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, str]:
    require_binaries("ffmpeg", "ffprobe")
    base = tmp_path_factory.mktemp("media")
    paths = {name: str(base / f"{name}.mp4") for name in ("colours", "truncated", "rotated", "counter", "vfr")}
    inputs = [a for c in COLOURS for a in ("-f", "lavfi", "-i", f"color=c={c}:s=320x240:r={FPS}:d=2")]
    concat = "".join(f"[{i}:v]" for i in range(len(COLOURS))) + f"concat=n={len(COLOURS)}:v=1:a=0[v]"
    _ffmpeg(*inputs, "-f", "lavfi", "-i", "sine=frequency=440:duration=12", "-filter_complex", concat,
            "-map", "[v]", "-map", f"{len(COLOURS)}:a", "-c:v", "libx264", "-g", "30", "-pix_fmt", "yuv420p",
            "-c:a", "aac", "-movflags", "+faststart", paths["colours"])
    data = open(paths["colours"], "rb").read()  # the index is at the front (faststart)
    open(paths["truncated"], "wb").write(data[: len(data) * 4 // 10])
    _ffmpeg("-i", paths["colours"], "-c", "copy", "-metadata:s:v:0", "rotate=90", paths["rotated"])
    # Frame n has luma 16 + 2n, losslessly: the frame shown at a time can be read back.
    counter = f"color=c=black:s=64x48:r={FPS}:d=4,geq=lum='16+2*N':cb=128:cr=128"
    _ffmpeg("-f", "lavfi", "-i", counter, "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p", paths["counter"])
    # Variable frame rate: from 1 s on, only every 10th frame is kept.
    _ffmpeg("-i", paths["counter"], "-vf", "select='lt(n,25)+not(mod(n,10))'", "-fps_mode", "vfr",
            "-c:v", "libx264", "-qp", "0", paths["vfr"])
    return paths


def _colour_at(time_s: float) -> np.ndarray:
    return np.array(list(COLOURS.values())[int(time_s // 2)], dtype=float)


def _assert_colours(frames: np.ndarray, times: list[float]) -> None:
    assert frames.dtype == np.uint8 and frames.shape[0] == len(times)
    for frame, time_s in zip(frames, times):
        mean = frame.reshape(-1, 3).mean(axis=0)
        assert np.abs(mean - _colour_at(time_s)).max() < 20, (time_s, mean)


def _frame_index(frame: np.ndarray) -> int:
    """The counter video's frame number from its grey level (RGB back to studio-range luma)."""
    return round(frame.mean() * 219 / 255 / 2)


def _collect(path: str, requests: list[FrameRequest]) -> dict[str, np.ndarray | BadInputError]:
    return dict(sample_frames(path, requests))


# --- frame_times --------------------------------------------------------------------------

def test_frame_times_fps_and_count():
    assert frame_times(FrameRequest("a", 1.0, 3.0, FrameSpec(fps=2))) == [1.25, 1.75, 2.25, 2.75]
    assert frame_times(FrameRequest("a", 1.0, 2.75, FrameSpec(fps=2))) == [1.25, 1.75, 2.25]
    assert frame_times(FrameRequest("a", 0.0, 0.2, FrameSpec(fps=2))) == [0.1]  # at least one
    assert frame_times(FrameRequest("a", 2.0, 4.0, FrameSpec(frames=4))) == [2.25, 2.75, 3.25, 3.75]
    assert len(frame_times(FrameRequest("a", 0.0, 3.2, FrameSpec(fps=10)))) == 32


@pytest.mark.parametrize("spec", [FrameSpec(), FrameSpec(fps=2, frames=8), FrameSpec(fps=0),
                                  FrameSpec(frames=0), FrameSpec(fps=1, short_side=128, crop=224)])
def test_frame_times_rejects_bad_specs(spec):
    with pytest.raises(ValueError):
        frame_times(FrameRequest("a", 0.0, 1.0, spec))


# --- sample_frames ------------------------------------------------------------------------

def test_shapes_and_colours(videos):
    requests = [FrameRequest("wal", 0.0, 3.0, WAL),
                FrameRequest("tsm", 1.0, 9.0, FrameSpec(frames=8, crop=None)),
                FrameRequest("small", 3.5, 4.5, FrameSpec(fps=4, short_side=64, crop=32))]
    got = _collect(videos["colours"], requests)
    assert got["wal"].shape == (6, 224, 224, 3)
    assert got["tsm"].shape == (8, 256, 341, 3)  # short side 256, aspect kept
    assert got["small"].shape == (4, 32, 32, 3)
    for request in requests:
        _assert_colours(got[request.key], frame_times(request))


def test_many_overlapping_requests_in_one_forward_pass(videos, monkeypatch):
    decoded: list[float] = []
    inner = media_frames._decoded

    def counting(*args):
        for time_s, frame in inner(*args):
            decoded.append(time_s)
            yield time_s, frame

    monkeypatch.setattr(media_frames, "_decoded", counting)
    specs = [WAL, FrameSpec(frames=8), FrameSpec(fps=10, crop=None), FrameSpec(frames=3, short_side=112, crop=112)]
    requests = [FrameRequest(f"clip{i}|{j}", start, start + 2.5, spec)
                for i, start in enumerate(np.arange(0.0, 9.0, 0.7)) for j, spec in enumerate(specs)]
    order = [key for key, _ in sample_frames(videos["colours"], requests[::-1])]
    got = _collect(videos["colours"], requests)
    assert set(got) == {r.key for r in requests}
    for request in requests:
        _assert_colours(got[request.key], frame_times(request))
    # Yielded as each completes (by last sample time), whatever the input order.
    last = {r.key: frame_times(r)[-1] for r in requests}
    assert [last[k] for k in order] == sorted(last[k] for k in order)
    # Each of the two runs decoded forward only, never a frame twice.
    runs = np.split(np.array(decoded), np.flatnonzero(np.diff(decoded) < 0) + 1)
    assert len(runs) == 2 and all(len(run) <= 12 * FPS for run in runs)


def test_each_time_takes_the_frame_shown_then(videos):
    times = [0.0, 0.039, 0.04, 0.5, 1.99, 3.98]
    got = _collect(videos["counter"], [FrameRequest("t", 0.0, 4.0, FrameSpec(frames=1, short_side=48, crop=None))])
    assert _frame_index(got["t"][0]) == 50  # the middle, 2.0 s
    for time_s in times:
        request = FrameRequest("t", time_s, time_s, FrameSpec(frames=1, short_side=48, crop=None))
        frames = _collect(videos["counter"], [request])["t"]
        assert _frame_index(frames[0]) == int(time_s * FPS + 1e-6), time_s


def test_variable_frame_rate(videos):
    # Kept frames: 0..24, then 30, 40, 50, ...: a time takes the last kept frame at or before it.
    requests = [FrameRequest(str(t), t, t, FrameSpec(frames=1, short_side=48, crop=None))
                for t in (0.5, 1.1, 1.25, 1.61, 3.99)]
    got = _collect(videos["vfr"], requests)
    assert [_frame_index(got[r.key][0]) for r in requests] == [12, 24, 30, 40, 90]


def test_beyond_the_end_fails_only_that_request(videos):
    requests = [FrameRequest("inside", 10.0, 12.0, WAL),
                FrameRequest("slack", 11.5, 12.4, WAL),  # last time 12.25: the last frame
                FrameRequest("beyond", 11.0, 14.0, WAL)]
    got = _collect(videos["colours"], requests)
    assert got["inside"].shape == (4, 224, 224, 3)
    _assert_colours(got["slack"], [11.75, 11.99])
    assert isinstance(got["beyond"], BadInputError) and "ends at 11.96" in str(got["beyond"])


def test_truncated_file_serves_what_it_has(videos):
    requests = [FrameRequest("early", 0.5, 3.0, WAL), FrameRequest("late", 9.0, 11.0, WAL)]
    got = _collect(videos["truncated"], requests)
    _assert_colours(got["early"], frame_times(requests[0]))
    assert isinstance(got["late"], BadInputError)


def test_corrupt_middle_is_an_error_not_a_crash(videos, tmp_path):
    data = bytearray(open(videos["colours"], "rb").read())
    rng = np.random.default_rng(0)
    for fraction in (0.3, 0.5, 0.7):
        at = int(len(data) * fraction)
        data[at:at + 3000] = rng.bytes(3000)
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(bytes(data))
    requests = [FrameRequest(f"r{i}", i, i + 1.5, WAL) for i in range(11)]
    got = _collect(str(corrupt), requests)
    assert set(got) == {r.key for r in requests}
    _assert_colours(got["r0"], frame_times(requests[0]))
    assert all(isinstance(v, (np.ndarray, BadInputError)) for v in got.values())


def test_unreadable_file_fails_every_request(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(np.random.default_rng(0).bytes(50_000))
    requests = [FrameRequest("a", 0.0, 1.0, WAL), FrameRequest("b", 1.0, 2.0, WAL)]
    for path in (str(junk), str(tmp_path / "missing.mp4")):
        got = _collect(path, requests)
        assert set(got) == {"a", "b"} and all(isinstance(v, BadInputError) for v in got.values())


def test_rotation_is_applied(videos):
    got = _collect(videos["rotated"], [FrameRequest("r", 0.0, 1.0, FrameSpec(frames=2, crop=None))])
    assert got["r"].shape == (2, 341, 256, 3)


def test_duplicate_keys_are_rejected(videos):
    with pytest.raises(ValueError):
        list(sample_frames(videos["colours"], [FrameRequest("a", 0, 1, WAL), FrameRequest("a", 1, 2, WAL)]))


# --- cut_clips ----------------------------------------------------------------------------

def _middle_colour_ok(path: str, start_s: float, end_s: float) -> bool:
    """The output's middle frame has the colour of the source's middle (the cut's timeline)."""
    [(_, frames)] = sample_frames(path, [FrameRequest("m", 0, end_s - start_s, FrameSpec(frames=1, crop=None))])
    mean = frames[0].reshape(-1, 3).mean(axis=0)
    return bool(np.abs(mean - _colour_at((start_s + end_s) / 2)).max() < 20)


@pytest.mark.parametrize("audio,per_process", [(False, 16), (True, 2)])
def test_exact_cuts_are_frame_accurate(videos, tmp_path, monkeypatch, audio, per_process):
    monkeypatch.setattr(media_clips, "EXACT_CLIPS_PER_PROCESS", per_process)
    spans = [(5.0, 9.6), (0.3, 2.5), (1.5, 2.5), (3.9, 4.2), (9.2, 12.0), (1.96, 2.6)]
    cuts = [ClipCut(f"c{i}", s, e, str(tmp_path / "clips" / f"c{i}.mp4")) for i, (s, e) in enumerate(spans)]
    got = cut_clips(videos["colours"], cuts, precision="exact", height=120, audio=audio)
    for cut in cuts:
        assert got[cut.key] == cut.out_path
        info = probe(cut.out_path)
        assert abs(info.duration_s - (cut.end_s - cut.start_s)) <= 1 / FPS + 1e-3
        assert (info.width, info.height, info.has_audio) == (160, 120, audio)
        assert _middle_colour_ok(cut.out_path, cut.start_s, cut.end_s)
    assert sorted(p.name for p in (tmp_path / "clips").iterdir()) == [f"c{i}.mp4" for i in range(len(cuts))]
    # To the frame: the clip from 1.96 s has one red frame, then blue.
    first = [FrameRequest(str(t), t, t, FrameSpec(frames=1, crop=None)) for t in (0.02, 0.06)]
    frames = _collect(cuts[-1].out_path, first)
    _assert_colours(frames["0.02"], [1.96])
    _assert_colours(frames["0.06"], [2.0])


def test_exact_cut_with_fps_and_a_silent_video(videos, tmp_path):
    cut = ClipCut("c", 1.0, 3.0, str(tmp_path / "c.mp4"))
    got = cut_clips(videos["counter"], [cut], fps=10, audio=True)  # no audio track: video only
    info = probe(got["c"])
    assert not info.has_audio and info.fps == 10 and abs(info.duration_s - 2.0) <= 0.1 + 1e-3


def test_copy_cuts_start_at_a_keyframe(videos, tmp_path):
    spans = [(0.5, 2.5), (3.0, 3.5), (5.1, 7.3), (10.5, 12.0)]
    cuts = [ClipCut(f"c{i}", s, e, str(tmp_path / f"c{i}.mp4")) for i, (s, e) in enumerate(spans)]
    got = cut_clips(videos["colours"], cuts, precision="copy", audio=True)
    for cut in cuts:
        info = probe(got[cut.key])
        assert info.duration_s >= cut.end_s - cut.start_s - 1 / FPS and info.has_audio
        with av.open(cut.out_path) as container:
            first = next(container.decode(video=0))
        assert first.key_frame
        # It starts at or before the requested start: the colour of the start is in it.
        [(_, frames)] = sample_frames(cut.out_path, [FrameRequest("f", 0, info.duration_s, FrameSpec(fps=25))])
        means = frames.reshape(len(frames), -1, 3).mean(axis=1)
        assert (np.abs(means - _colour_at(cut.start_s)).max(axis=1) < 20).any()


def test_cut_failures_are_per_key(videos, tmp_path):
    cuts = [ClipCut("early", 0.5, 2.0, str(tmp_path / "early.mp4")),
            ClipCut("late", 9.0, 11.0, str(tmp_path / "late.mp4")),
            ClipCut("after", 11.0, 13.0, str(tmp_path / "after.mp4"))]
    for precision in ("exact", "copy"):
        got = cut_clips(videos["truncated"], cuts, precision=precision)
        assert got["early"] == cuts[0].out_path
        assert isinstance(got["late"], BadInputError) and isinstance(got["after"], BadInputError)
        assert not (tmp_path / "late.mp4").exists()
        assert not list(tmp_path.glob("*.part.mp4"))


def test_corrupt_input_fails_every_key(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(np.random.default_rng(1).bytes(50_000))
    cuts = [ClipCut("a", 0.0, 1.0, str(tmp_path / "a.mp4")), ClipCut("b", 1.0, 2.0, str(tmp_path / "b.mp4"))]
    for precision in ("exact", "copy"):
        got = cut_clips(str(junk), cuts, precision=precision)
        assert all(isinstance(got[k], BadInputError) for k in ("a", "b"))


def test_bad_cut_arguments_raise(videos, tmp_path):
    with pytest.raises(ValueError):
        cut_clips(videos["colours"], [ClipCut("a", 2.0, 1.0, str(tmp_path / "a.mp4"))])
    with pytest.raises(ValueError):
        cut_clips(videos["colours"], [ClipCut("a", 0.0, 1.0, str(tmp_path / "a.mp4"))], height=121)


def test_seeking_ahead_with_b_frames_makes_progress(tmp_path):
    """An mp4's index lists every packet by decode time, and with B-frames a keyframe is shown
    a little after it is decoded: seeking to an index time lands on the keyframe before, which
    once made the sampler seek back to it forever. Keyframes every 2 s, as in the demo."""
    path = tmp_path / "gop50.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                    "testsrc=size=160x120:rate=25:duration=20", "-c:v", "libx264",
                    "-g", "50", "-bf", "2", "-pix_fmt", "yuv420p", str(path)], check=True)
    requests = [FrameRequest(f"c{i}", 2.0 + i * 4, 4.5 + i * 4, FrameSpec(frames=1, short_side=120,
                                                                      crop=None))
                for i in range(4)]
    out = dict(sample_frames(str(path), requests))
    assert sorted(out) == ["c0", "c1", "c2", "c3"]
    assert all(v.shape == (1, 120, 160, 3) for v in out.values())


def test_frames_equal_a_plain_full_decode(tmp_path):
    """Skipping unreferenced frames and seeking must not change which frame a time gets:
    every sampled frame equals the one a plain decode of every frame shows at that time."""
    path = tmp_path / "moving.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                    "testsrc2=size=160x120:rate=25:duration=24", "-c:v", "libx264",
                    "-g", "60", "-bf", "3", "-pix_fmt", "yuv420p", str(path)], check=True)
    spec = FrameSpec(fps=2, short_side=120, crop=None)
    requests = [FrameRequest(f"c{i}", start, start + 2.5, spec)
                for i, start in enumerate([0.3, 3.1, 9.7, 17.2, 21.0])]
    got = dict(sample_frames(str(path), requests))
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [(f.pts * float(stream.time_base), f.to_ndarray(format="rgb24"))
                  for f in container.decode(stream)]
    for request in requests:
        assert len(got[request.key]) == len(frame_times(request)), request.key
        for t, image in zip(frame_times(request), got[request.key]):
            shown = [img for pts, img in frames if pts <= t + 1e-6][-1]
            assert np.array_equal(image, shown), (request.key, t)


def test_videos_are_cut_side_by_side_in_balanced_runs(videos, tmp_path, monkeypatch):
    monkeypatch.setattr(media_clips, "EXACT_CLIPS_PER_PROCESS", 4)
    calls = []
    real = media_clips.run_ffmpeg

    def recording(args, timeout_s):
        calls.append(list(args))
        return real(args, timeout_s)

    monkeypatch.setattr(media_clips, "run_ffmpeg", recording)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video" * 100)
    colours = [ClipCut(f"c{i}", i * 1.5, i * 1.5 + 1.2, str(tmp_path / f"c{i}.mp4")) for i in range(6)]
    bad = [ClipCut("j", 0.0, 1.0, str(tmp_path / "j.mp4"))]
    counter = [ClipCut("n", 0.5, 2.0, str(tmp_path / "n.mp4"))]
    got = cut_videos([(videos["colours"], colours), (str(junk), bad), (videos["counter"], counter)],
                     precision="exact", height=120, processes=2)
    assert list(got) == [cut.key for cut in colours + bad + counter]
    for cut in colours + counter:
        assert got[cut.key] == cut.out_path
        assert abs(probe(cut.out_path).duration_s - (cut.end_s - cut.start_s)) <= 1 / FPS + 1e-3
    assert isinstance(got["j"], BadInputError) and not (tmp_path / "j.mp4").exists()
    # Six clips of one video in two runs of three (not four and two), the other video's alone.
    assert sorted(sum(a.endswith(".part.mp4") for a in args) for args in calls) == [1, 3, 3]
    # Two processes side by side share the cores: the decoder and each encoder get half each.
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    for args in calls:
        outputs = sum(a.endswith(".part.mp4") for a in args)
        assert [args[i + 1] for i, a in enumerate(args) if a == "-threads"] == [threads] * (1 + outputs)


def test_skipping_non_reference_frames_takes_the_nearest_decoded_frame(tmp_path):
    """skip_nonref decodes fewer frames; every sampled frame is a frame of the video, the one
    nearest its time among those decoded, at most one frame from the time's own with x264's
    default B-frame pyramid."""
    path = tmp_path / "bframes.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                    "testsrc2=size=160x120:rate=25:duration=12", "-c:v", "libx264", "-g", "50",
                    "-pix_fmt", "yuv420p", str(path)], check=True)
    spec = FrameSpec(fps=5, short_side=120, crop=None)
    requests = [FrameRequest(f"c{i}", start, start + 2.0, spec) for i, start in enumerate([0.0, 3.3, 8.1])]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        every = [(f.pts * float(stream.time_base), f.to_ndarray(format="rgb24")) for f in container.decode(stream)]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        kept = [f.pts * float(stream.time_base) for f in container.decode(stream)]
    assert len(kept) < 0.8 * len(every)
    got = dict(sample_frames(str(path), requests, skip_nonref=True))
    for request in requests:
        assert len(got[request.key]) == len(frame_times(request)), request.key
        for t, image in zip(frame_times(request), got[request.key]):
            distance = min(abs(k - t) for k in kept)
            nearest = min(k for k in kept if abs(k - t) <= distance + 1e-6)  # of two as near, the earlier
            assert distance <= 1 / FPS + 1e-6, (request.key, t, nearest)
            assert np.array_equal(image, next(img for pts, img in every if abs(pts - nearest) < 1e-6)), (request.key, t)


def test_an_ffmpeg_stopped_by_a_signal_is_the_machines_failure_not_the_medias():
    """A SLURM job ended by its walltime or preempted sends SIGTERM to every process of the job,
    ffmpeg's too: that item is retried by the next run, never a final bad_input."""
    import signal
    import threading
    import time

    import psutil

    from pipeline.errors import InternalError
    from pipeline.media.process import run_ffmpeg

    require_binaries("ffmpeg")
    raised: list[BaseException] = []

    def forever() -> None:
        try:
            run_ffmpeg(["-f", "lavfi", "-i", "sine=frequency=440", "-f", "null", "-"], timeout_s=300)
        except BaseException as exc:  # noqa: BLE001 - what the stage's item would get
            raised.append(exc)

    thread = threading.Thread(target=forever)
    thread.start()
    while not (ffmpeg := [p for p in psutil.Process().children() if p.name() == "ffmpeg"]):
        time.sleep(0.05)
    while not ffmpeg[0].cpu_times().user:  # running, its handler set: it stops itself, exit 255
        time.sleep(0.05)
    ffmpeg[0].send_signal(signal.SIGTERM)
    thread.join()
    assert [type(exc) for exc in raised] == [InternalError]
    # Killed as it started, or stopped on its own once its handler had the signal.
    assert str(raised[0]) in ("ffmpeg was stopped by SIGTERM", "ffmpeg was stopped by a signal (it exits 255 then)")

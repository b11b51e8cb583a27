"""Media files: what they hold (probe), their audio for ASR (audio), the frames each clip needs
(frames, PyAV, one decode per video) and clips cut out of them (clips, ffmpeg processes side by side).
Frame sampling also runs in worker processes (decode_pool), talking to them over pipes (pipes).
Every ffmpeg process goes through process.run_ffmpeg."""

from pipeline.media.audio import extract_audio, read_wav
from pipeline.media.clips import EXACT_CLIPS_PER_PROCESS, ClipCut, cut_clips, cut_videos
from pipeline.media.frames import FrameRequest, FrameSpec, frame_times, sample_frames
from pipeline.media.probe import MediaInfo, check_video, probe, video_end

__all__ = ["EXACT_CLIPS_PER_PROCESS", "ClipCut", "FrameRequest", "FrameSpec", "MediaInfo",
           "check_video", "cut_clips", "cut_videos", "extract_audio", "frame_times", "probe", "read_wav",
           "sample_frames", "video_end"]

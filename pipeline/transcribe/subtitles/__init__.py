"""Subtitle files (WebVTT, SRT) into clean timed words and sentences.

- parse.py: bytes to text, the format, and the cues, read with webvtt-py (a file it would
  refuse or misread is repaired first)
- words.py: cues to words, in the rolling layout of YouTube auto captions or as author
  captions, and words to sentences
"""

from pipeline.transcribe.subtitles.parse import (
    MAX_SUBTITLE_BYTES,
    Cue,
    Format,
    check_size,
    decode_subtitle_bytes,
    read_cues,
)
from pipeline.transcribe.subtitles.words import Layout, cue_words, is_rolling, rolling_words, subtitle_sentences

__all__ = ["MAX_SUBTITLE_BYTES", "Cue", "Format", "Layout", "check_size", "cue_words",
           "decode_subtitle_bytes", "is_rolling", "read_cues", "rolling_words",
           "subtitle_sentences"]

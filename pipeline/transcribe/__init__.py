"""Transcribe: downloads in, timed sentences (``segments``) out.

- stage.py: the stage: the text sources in the order of ``transcribe.prefer`` (manual
  subtitles, auto subtitles, ASR), the first that yields sentences winning
- subtitles/: subtitle files (WebVTT, SRT) into clean timed words
- asr/: speech recognition (faster-whisper, Google Cloud Speech-to-Text) into timed words
- segment.py: timed words into sentences, the one way every source ends
"""

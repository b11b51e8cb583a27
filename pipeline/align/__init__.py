"""Align: timed sentences in, clip–sentence pairs (``clips``) out.

- stage.py: the stage and its three policies (``subtitle_span``, ``fixed``, ``whole``), and the
  splits per video
"""

"""Featurize: clips and media in, ``features/<extractor>`` rows out.

- stage.py: one runner stage per configured extractor (``featurize:<key>``); planning needs
  no torch

The extractors themselves are in pipeline/features/: the score stage and training load them too.
"""

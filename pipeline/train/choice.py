"""Torabi et al.'s multiple-choice test (section 3): which 4 captions may stand next to a
video's own as distractors.

The paper tags every caption with activity phrases ("predicate + object", mined with
Knowlywood) and draws the distractors at random from the same subset among the captions whose
activity phrases share no word with the true caption's. Where the phrases are given (a pairs
file's `activities` column) their words are used. Knowlywood is not available here, so
otherwise a caption's activity words are all its content words (lowercased, stop words
removed): every predicate and object of the caption is among them, so distractors chosen
this way meet the paper's rule for any activity tagging of these captions (the rule is only
stricter, leaving fewer captions to choose from).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

# Function words: no activity phrase is made of these alone. LSMDC replaces names by SOMEONE.
STOP_WORDS = frozenset("""
a an the and or but nor so yet of to in on at by for with from into onto upon over under about
above below up down out off through across along around behind beside between near toward
towards as than then there here this that these those it its itself he him his she her hers
they them their theirs we us our you your i me my mine who whom whose which what when where
why how all any both each few more most other some such no not only own same too very can
will just do does did doing done is are was were be been being have has had having would
should could may might must shall also again further once while if because until after before
during against someone somebody something one ones s t
""".split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def activity_words(caption: str) -> frozenset[str]:
    """The content words of a caption: the words any of its activity phrases can use."""
    return frozenset(w for w in _WORD.findall(caption.lower()) if w not in STOP_WORDS)


def phrase_words(phrases: Sequence[str]) -> frozenset[str]:
    """The words of given activity phrases ("open door", "walk over")."""
    return frozenset(w for p in phrases for w in _WORD.findall(p.lower()))


def distractors(words: Sequence[frozenset[str]], choices: int = 5, seed: int = 0) -> np.ndarray:
    """[N, choices - 1] caption indices: for each caption j, `choices - 1` others drawn at random
    (numpy default_rng(seed), without replacement) among those whose activity words share none
    with caption j's. Raises when a caption has too few such captions in the set."""
    n = len(words)
    rng = np.random.default_rng(seed)
    rows = []
    for j, own in enumerate(words):
        pool = [i for i, other in enumerate(words) if i != j and not (own & other)]
        if len(pool) < choices - 1:
            raise ValueError(f"caption {j}: {len(pool)} captions share no activity word with it, "
                             f"{choices - 1} distractors needed")
        rows.append(rng.choice(pool, choices - 1, replace=False))
    return np.asarray(rows, dtype=np.int64).reshape(n, choices - 1)

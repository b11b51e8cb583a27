"""The report stage: ``report/stats.json`` and ``report/report.html`` from all tables, the
newest build's timing, the shard listings, the training runs and the score tables.

Gathering (``stats``, ``runs``, ``clips``, and ``pipeline.report.scores`` for the scores) reads
the corpus partition by partition; ``plots`` draws the figures; ``render`` fills the Jinja
template (``templates/report.html.j2``) with autoescaping, so every user-provided string
(titles, sentences, queries, error messages) is escaped. The page is self-contained: figures
and thumbnails are inlined as data: URIs, and it has no scripts and loads nothing.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.report.stats import compute_stats, message_class, message_classes
from pipeline.runner import StageContext

__all__ = ["compute_stats", "message_class", "message_classes", "write_report"]


def write_report(ctx: StageContext) -> dict[str, Any]:
    """The report stage: stats.json and report.html under ``report/``."""
    # Drawing and thumbnails import matplotlib (half a CPU-second): here, not with the
    # package, which every worker imports for the partition summaries' stats.
    from pipeline.report.clips import thumbnails
    from pipeline.report.render import render_html

    corpus = ctx.corpus
    stats = compute_stats(corpus, write=True)
    corpus.write_text("report/stats.json", json.dumps(stats, indent=1, sort_keys=True) + "\n")
    corpus.write_text("report/report.html", render_html(stats, thumbnails(corpus)))
    return {"stats": corpus.path("report/stats.json"), "html": corpus.path("report/report.html"),
            "clips": stats["tables"].get("clips", 0)}

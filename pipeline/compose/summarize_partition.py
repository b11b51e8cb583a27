"""What a build stores of a partition once its chain of stages is over: its summary with every
section (the summary's, the report's, status's), so that status, the summary, the report and the
next build's choice of partitions with work read it instead of the partition's files."""

from __future__ import annotations

from pipeline.compose import status
from pipeline.corpus import partsummary, summary
from pipeline.report import stats as report_stats
from pipeline.runner import StageContext


def store_summary(ctx: StageContext, partition: str) -> None:
    """Rescan one partition and store its summary."""
    sections = {summary.SECTION: summary.partition_figures,
                report_stats.SECTION: report_stats.partition_stats,
                status.SECTION: status.status_section(ctx)}
    partsummary.refresh(ctx.corpus, partition, sections,
                        keys={status.SECTION: status.status_key(ctx.corpus, ctx.config)})

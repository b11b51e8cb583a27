"""When a host is gone for good (its domain no longer exists): decided from evidence across runs,
never from one attempt. A download whose host's name does not resolve while the network is up
(another host was reached shortly before) stays transient, with its message marked as
evidence (``[HOST did not resolve while other hosts did]``). Once such rows of one host fall on
``download.gone_host_runs`` different days, at least ``download.gone_host_days`` apart from
first to last, that host counts as gone and its videos fail for good (permanent, the message
says why; ``--retry-failed`` tries them again).

The evidence is read from the errors table with a pushed-down filter and one column (the rows'
times), never the table into Python objects.
"""

from __future__ import annotations

from datetime import date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.errors import GONE_HOST_PREFIX, ErrorKind
from pipeline.corpus.storage import Corpus


def evidence(host: str) -> str:
    """What a transient row's message ends with when it counts against ``host``."""
    return f" [{host} did not resolve while other hosts did]"


def _days(corpus: Corpus, host: str) -> list[date]:
    """The days on which downloads from ``host`` failed to resolve while other hosts did."""
    times = corpus.read("errors", columns=["time"],
                        filter=(ds.field("stage") == "download")
                        & (ds.field("kind") == ErrorKind.TRANSIENT.value)
                        & pc.match_substring(ds.field("message"), evidence(host))).column("time")
    return pc.unique(pc.cast(times, pa.date32())).to_pylist()


def verdict(corpus: Corpus, host: str, now: datetime, runs: int, days: float) -> str | None:
    """The permanent message for a video of ``host``, failing to resolve now while other hosts
    do, when the errors table (with today) shows ``host`` gone; None while the evidence is
    short."""
    seen = sorted(set(_days(corpus, host)) | {now.date()})
    if len(seen) < runs or (seen[-1] - seen[0]).days < days:
        return None
    return (f"{GONE_HOST_PREFIX}{host} did not resolve on {len(seen)} days from {seen[0]} to "
            f"{seen[-1]} while other hosts did (download.gone_host_runs {runs}, gone_host_days "
            f"{days:g}): taken as a domain that no longer exists; --retry-failed tries again")

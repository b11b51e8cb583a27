"""Discover: config sources in, one ``videos`` row per candidate video out.

- sources.py: the queries each source expands to, and what each lists (yt-dlp searches and
  playlists, txt/csv/parquet list files, local folders)
- rows.py: a videos row of a yt-dlp entry, a URL or a file; a video's id from its URL
- filters.py: URL schemes that may be fetched, the config's filters on known metadata
- stage.py: the stage: list every query (searches and playlists through the network watch of
  pipeline/download/outage.py), dedup, filter, append the new videos by partition
"""

from pipeline.discover.filters import drop_reason, scheme_problem
from pipeline.discover.rows import BadRecord, id_for_url, row_from_entry, row_from_url
from pipeline.discover.sources import Query, list_query, queries, search_request
from pipeline.discover.stage import DiscoverReport, discover

__all__ = ["BadRecord", "DiscoverReport", "Query", "discover", "drop_reason", "id_for_url",
           "list_query", "queries", "row_from_entry", "row_from_url", "scheme_problem",
           "search_request"]

"""The corpus on storage: its tables and what reads or keeps them whole.

- storage.py: the corpus on any fsspec URL: partitioned tables, atomic commits, compaction
- localcopy.py: local copies of a remote root's files and folders, for tools that need paths
- tablefile.py: one committed Parquet file of a table, checked against its schema, and its
  footer (what it committed, its counters)
- partitions.py: every video's partition, by a stable hash of its id; the labels
- partsummary.py: the summary of one partition, kept under ``_summaries/`` and checked against
  its files (what a build stores once a partition's chain is over:
  pipeline/compose/summarize_partition.py)
- summary.py: the corpus's summary (`vlcorpus stats`): counts per table and errors, added up
  from the partitions' summaries
- validate.py: ``vlcorpus validate``: schemas, partitions, the lineage of keys, the shards
- retention.py: a partition's media deleted once nothing pending needs them
  (``storage.keep_media: false``)
- migrate.py: ``vlcorpus migrate``: a corpus of the flat layout moved into partitions
- rootlock.py: one build per corpus root at a time
"""

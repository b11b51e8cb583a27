"""The corpus on storage: its tables and what reads or keeps them whole.

- storage.py: the corpus root (local or object store), its tables, batch commits, the errors table
- tablefile.py: one table file and its footer (row counts, counters, the schema's version)
- partitions.py: partition labels of video ids, and listing the partitions of a table
- partsummary.py: per-partition summaries kept under ``_summaries/``, checked against the files
- summary.py: the corpus's counts per table and errors, added up from the partition summaries
- summarize_partition.py: what a build stores of a partition once its chain of stages is over
- status.py: what is done and left per stage (``vlcorpus status``)
- validate.py: the checks of ``vlcorpus validate`` (schemas, keys, lineage, files)
- retention.py: which media a later stage still needs, and deleting the rest
- migrate.py: moving a corpus's tables to the schemas' current versions
- rootlock.py: one build per corpus root at a time
"""

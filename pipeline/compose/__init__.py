"""Composing a build: which stages run, in what order, what a build would do and how it went.
The stages themselves are in their packages; flows/ runs what this composes.
What each stage needs before a build starts (its ``check``) is pipeline/setup.py, which the
stages use themselves.

- stages.py: every stage's runner ``Stage`` by name, and the steps of a partition's chain
- status.py: what is done and left per stage and partition, from the runner's planning
  (``vlcorpus status``), and so which partitions a build has work for
- plan.py: what ``vlcorpus check`` shows a build would do (stages, partitions, models, storage)
- health.py: whether a build was healthy, from its summary and its stages' reports (the
  verdict an unattended build ends with)
- summarize_partition.py: what a build stores of a partition once its chain of stages is over:
  its summary, each section from its owner (corpus/summary.py, status.py, report/stats.py)
"""

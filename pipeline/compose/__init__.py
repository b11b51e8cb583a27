"""Composing a build: which stages run, in what order, and what a build checks before and
while it runs. The stages themselves are in their packages; flows/ runs what this composes.

- stages.py: every stage's runner ``Stage`` by name, and the steps of a partition's chain
- plan.py: what ``vlcorpus check`` shows a build would do (stages, partitions, models, storage)
- setup.py: what a build needs besides its config (binaries, packages, models, credentials),
  checked before it does any work
- health.py: whether a build was healthy, from its summary and its stages' reports (the
  verdict an unattended build ends with)
- summarize_partition.py: what a build stores of a partition once its chain of stages is over:
  its summary, each section from its owner (corpus/summary.py, corpus/status.py, report/stats.py)
"""

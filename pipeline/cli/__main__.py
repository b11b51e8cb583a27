"""``python -m pipeline.cli``: the same app as the ``vlcorpus`` script."""

from pipeline.cli import app

app()

"""``python -m pipeline.cli``: the same as the ``vlcorpus`` script."""

from pipeline.launch import main

main()

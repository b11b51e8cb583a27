"""Installs tests/resolverkit.py's shared resolver in a Python process started with this folder
on PYTHONPATH and VLCORPUS_TEST_RESOLVER naming its state file (a build's Dask workers in a
test). Test-only: nothing outside tests/ puts this folder on a path."""

import os
import sys

if os.environ.get("VLCORPUS_TEST_RESOLVER"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import resolverkit

    resolverkit.install(os.environ["VLCORPUS_TEST_RESOLVER"])

"""Installs tests/resolverkit.py's shared resolver in a Python process started with this folder
on PYTHONPATH and VLCORPUS_TEST_RESOLVER naming its state file (a build's Dask workers in a
test), and the test CA's bundle that VLCORPUS_TEST_CA_BUNDLE names. Test-only: nothing outside
tests/ puts this folder on a path."""

import os
import sys

if os.environ.get("VLCORPUS_TEST_RESOLVER"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import resolverkit

    resolverkit.install(os.environ["VLCORPUS_TEST_RESOLVER"])
    if os.environ.get(resolverkit.TRUST_ENV):
        resolverkit.trust(os.environ[resolverkit.TRUST_ENV])

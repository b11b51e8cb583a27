# Two commands set everything up on a fresh machine: `make demo` and `make test`;
# `make docs` builds the documentation site into site/; `make lock` and `make lock-upgrade` keep
# the one tested set of versions (uv.lock, and constraints.txt made from it for pip).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ROOT ?= demo-corpus
PYTEST_ARGS ?=
# Every install takes its versions from the lock, through pip (which also finds wheels a machine
# keeps on disk, as these keep torch's).
PINS := constraints.txt
UV := $(VENV)/bin/uv
EXPORT := $(UV) export --quiet --frozen --all-extras --no-emit-project --no-hashes --no-annotate --format requirements.txt
# The newest Python the project supports runs the tests that need no torch, in a venv of its own.
PY312 ?= $(firstword $(shell for p in $$(command -v python3.12) $(HOME)/.pyenv/versions/3.12*/bin/python3.12; do "$$p" -c '' 2>/dev/null && echo "$$p"; done))
VENV312 := .venv-py312
TORCH_FREE_TESTS := tests/stages tests/storage
# The suite's runs after `make system`: a test that needs a binary it installs (ffmpeg, ffprobe,
# espeak-ng, chromium, PostgreSQL) fails where that binary is missing, instead of skipping as on
# a machine that never ran it (tests/conftest.py, missing_system).
INSTALLED := VLCORPUS_TESTS_SYSTEM_INSTALLED=1

.PHONY: secrets demo test test-gpu test-py312 lock lock-upgrade lock-check docs reference system venv schema clean

# Debian packages, only when a binary is missing (needs root or sudo); chromium checks the
# HTML report in the tests, PostgreSQL is the Prefect server's database in the production
# rehearsal (infra/stack.py), SLURM and munge run the one-node cluster the SLURM tests submit
# jobs to (tests/slurmkit.py).
system:
	@missing=""; \
	command -v ffmpeg >/dev/null || missing="$$missing ffmpeg"; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v slurmctld >/dev/null || missing="$$missing slurm-wlm"; \
	command -v munged >/dev/null || missing="$$missing munge"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# The cluster's secrets, once: infra/.env (the PostgreSQL password, the Prefect server's auth
# string) and infra/tls/ (Dask's certificates); what exists is kept. No virtualenv needed.
secrets:
	python3 infra/make_secrets.py

$(STAMP): pyproject.toml $(PINS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(PINS) -e '.[dev]'
	touch $(STAMP)

$(VENV312)/.installed: pyproject.toml $(PINS)
	test -x $(VENV312)/bin/python || $(PY312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q -c $(PINS) -e '.[asr,gcp,test]'
	touch $@

venv: system $(STAMP)

demo: venv
	$(VENV)/bin/vlcorpus demo --root $(DEMO_ROOT)

# CI fails when pyproject.toml and the lock disagree, or a dependency breaks on Python 3.12.
# The project's own bytecode first (half a CPU-second): where PYTHONDONTWRITEBYTECODE is set, as
# on CI, each of the suite's hundreds of Python processes compiled every module it imports again.
# pytest runs with it unset: it keeps its rewrite of each test module (for assert messages) only
# then; without it each worker process rewrote all of them again (collecting took each worker
# 7.5 CPU-s, 5.8 with them kept).
test: venv lock-check test-py312
	$(PY) -m compileall -q pipeline flows tests bench >/dev/null
	$(INSTALLED) PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(PYTEST_ARGS)

# The GPU layer (tests marked gpu: the copy stream, NVDEC against the CPU decoder, a build on
# the GPU worker), on a machine with CUDA; docs/contributing.md says how to run it offline.
test-gpu: venv
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# Without a Python 3.12 this is skipped, except in CI (CI=true), where it fails. Three workers:
# these tests wait on nothing, and a fourth cost its collection for no gain (29 s, not 32).
test-py312: system $(if $(PY312),$(VENV312)/.installed)
	@if [ -z "$(PY312)" ]; then \
	  echo "no python3.12 found: the Python 3.12 tests are skipped (set PY312=/path/to/python3.12)"; \
	  [ "$$CI" != true ]; \
	else \
	  $(INSTALLED) PYTHONDONTWRITEBYTECODE= $(VENV312)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" -n 3 $(TORCH_FREE_TESTS); \
	fi

# After editing the dependencies in pyproject.toml: the lock follows, changing no other version.
lock: venv
	$(UV) lock
	$(EXPORT) > $(PINS)

# The refresh: the newest versions pyproject.toml allows (then `make test`, and commit both files).
lock-upgrade: venv
	$(UV) lock --upgrade
	$(EXPORT) > $(PINS)

lock-check: venv
	$(UV) lock --check
	@$(EXPORT) | diff -u $(PINS) - || { echo "$(PINS) is not what uv.lock exports: run make lock"; exit 1; }

# --strict: a broken link or a missing page fails the build. Material's notice about its
# successor is not for the users of this site.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The committed reference pages (docs/reference/), from the schema and the command line.
reference: venv
	$(VENV)/bin/python docs/hooks/reference.py

schema: venv
	$(VENV)/bin/vlcorpus schema --write
	$(VENV)/bin/python docs/hooks/reference.py

clean:
	rm -rf $(VENV) $(VENV312) $(DEMO_ROOT) .pytest_cache site

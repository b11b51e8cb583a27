# Two commands set everything up on a fresh machine: `make demo` and `make test`;
# `make docs` builds the documentation site into site/.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ROOT ?= demo-corpus
PYTEST_ARGS ?=

.PHONY: demo test docs system venv schema clean

# Debian packages, only when a binary is missing (needs root or sudo); chromium checks the
# HTML report in the tests, PostgreSQL is the Prefect server's database in the production
# rehearsal (infra/stack.py).
system:
	@missing=""; \
	command -v ffmpeg >/dev/null || missing="$$missing ffmpeg"; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: system $(STAMP)

demo: venv
	$(VENV)/bin/vlcorpus demo --root $(DEMO_ROOT)

test: venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

# --strict: a broken link or a missing page fails the build. Material's notice about its
# successor is not for the users of this site.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

schema: venv
	$(VENV)/bin/vlcorpus schema --write

clean:
	rm -rf $(VENV) $(DEMO_ROOT) .pytest_cache site

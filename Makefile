# skh: `make demo` runs the whole pipeline on the built-in emulated cluster,
# `make test` runs every test. Both do their own set-up on a fresh Debian 12 machine (as root).
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.skh-setup

.PHONY: setup develop test test-host test-verbs demo bench bench-quick debug clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml setup.py tools/setup-debian.sh
	tools/setup-debian.sh $(VENV)
	touch $@

# Rebuild the extension after editing csrc/ or .pyx (editable installs do not rebuild on import).
develop: setup
	$(PY) -m pip install -q --no-build-isolation -e '.[test,bench]'

test: develop
	$(PY) -m pytest -q tests

demo: develop
	$(PY) -m skh demo

bench-quick: develop
	for b in bench/*.py; do $(PY) $$b --quick || exit 1; done

debug: setup
	SKH_DEBUG=1 $(PY) -m pip install -q --no-build-isolation -e '.[test,bench]'

clean:
	rm -rf build *.egg-info skh/*.so skh/_fastprobe.c $(VENV)

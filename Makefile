# skh: `make demo` runs the whole pipeline on the built-in emulated cluster,
# `make test` runs every test. Both do their own set-up on a fresh Debian 12 machine (as root).
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.skh-setup

.PHONY: setup develop lint test test-host test-verbs test-systemd demo demo-all bench bench-quick results debug clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml setup.py tools/setup-debian.sh
	tools/setup-debian.sh $(VENV)
	touch $@

# Rebuild the extension after editing csrc/ or .pyx (editable installs do not rebuild on import).
develop: setup
	$(PY) -m pip install -q --no-build-isolation -e '.[test,bench,ray]'

test: develop lint test-verbs test-systemd
	$(PY) -m pytest -q tests

# ruff (pinned in the test extra: formatting differs between releases) is configured in
# pyproject.toml; lint and format are part of the test command.
lint: develop
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The verbs transport on real soft-RoCE: a throw-away qemu VM (stock Debian kernel, rdma_rxe on a
# veth pair) runs the `verbs`-marked tests, which the host run above skips. The tree is read through
# the VM's cached read-only root (RXEVM_SHARE_CWD=0): imports are ~1/3 faster than over the rw share.
test-verbs: develop
	RXEVM_SHARE_CWD=0 tools/rxe-vm/run-in-rxe-vm.sh $(PY) -m pytest -q -p no:cacheprovider -m verbs tests/verbs

# The deploy/systemd units under a real systemd: a throw-away qemu VM whose PID 1 is systemd runs
# the `systemd`-marked tests against the skh wheel built from this tree, installed as a system
# package (tools/systemd-vm/stage-skh.sh).
test-systemd: develop
	tools/systemd-vm/stage-skh.sh $(PY) build/systemd-vm
	SYSVM_SHARE_CWD=0 tools/systemd-vm/run-in-systemd-vm.sh $(PY) -m pytest -q -p no:cacheprovider -p no:hypothesispytest -m systemd tests/deploy

demo: develop
	$(PY) -m skh demo

# every fault kind the testbed can inject, each scored (about 8 minutes; not part of make test)
demo-all: develop
	$(PY) -m skh demo --all-faults

# The full evaluation profile (hours of CPU: see docs/results.md for the last run's cost), then
# docs/results.md and the README's results section regenerated from its eval.json.
results: develop
	$(PY) bench/results.py

bench-quick: develop
	for b in bench/*.py; do $(PY) $$b --quick || exit 1; done

debug: setup
	SKH_DEBUG=1 $(PY) -m pip install -q --no-build-isolation -e '.[test,bench,ray]'

clean:
	rm -rf build *.egg-info skh/*.so skh/_fastprobe.c $(VENV)

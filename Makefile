# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when it is missing and install shardlab into it through
# constraints.txt (torch pinned to the CPU wheel on disk: never a CUDA download).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardlab-installed

.PHONY: demo test lint clean browser slurm slurm-test

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardlab demo

# The report tests load pages in a headless Chromium from Debian's packages (playwright, in
# the dev extra, drives it; it downloads no browser). Installed here when missing and
# possible (root with apt-get); when it cannot be, those tests skip and say why: this step
# never fails `make test`.
browser: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian package) for the report's browser tests ..."; \
	    { timeout 120 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 240 \
	      apt-get install -y -qq chromium; } >$(VENV)/chromium-install.log 2>&1 \
	      || echo "could not install chromium (see $(VENV)/chromium-install.log): the browser tests will be skipped"; \
	  else \
	    echo "chromium is missing (apt-get install chromium as root): the browser tests will be skipped"; \
	  fi; }

# The Slurm test submits `shardlab launch --emit slurm`'s script to a two-node Slurm on
# this host (Debian's slurm-wlm: slurmctld and two slurmd, started by the test): about 75 s
# with the install, more than `make test`'s 10-minute budget on 2 cores can spare, so it is
# its own target: `make slurm-test` installs slurm-wlm when missing and possible (about
# 30 s) and runs it; `make test` skips it and says so.
slurm:
	@command -v slurmctld >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing slurm-wlm (Debian package) for the launch test ..."; \
	    mkdir -p $(VENV); \
	    { timeout 120 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 240 \
	      apt-get install -y -qq slurm-wlm; } >$(VENV)/slurm-install.log 2>&1 \
	      || echo "could not install slurm-wlm (see $(VENV)/slurm-install.log): the Slurm test will be skipped"; \
	  else \
	    echo "slurm-wlm is missing (apt-get install slurm-wlm as root): the Slurm test will be skipped"; \
	  fi; }

# Two pytest-xdist workers, each test file on one of them (a module's fixtures, such as
# test_train_cli's real runs, are built once; session fixtures once per worker),
# one torch thread per worker (tests/conftest.py): the suite's real processes wait on one
# another and on start-up while the other worker checks pure-Python code. On the 2-core
# AMD EPYC (AVX2 only) of 2026-12-02: 407 to 533 s of tests in five fresh-clone runs
# (which multi-rank files overlap varies, and the machine slowed during the day),
# against 533 s serially (one run).
# (`--dist loadgroup` would keep tests/report's files together, but with pytest 9.2 and
# xdist 3.8 it groups nothing, even with explicit xdist_group marks.)
# `PYTEST_WORKERS=0 make test` runs it serially; `.venv/bin/pytest tests/...` any part.
PYTEST_WORKERS ?= 2

test: $(STAMP) browser
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

slurm-test: $(STAMP) slurm
	SHARDLAB_SLURM_TEST=1 $(PY) -m pytest tests/cli/test_launch_slurm.py

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache

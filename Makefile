# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when it is missing and install shardlab into it through
# constraints.txt (torch pinned to the CPU wheel on disk: never a CUDA download).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardlab-installed

.PHONY: demo test lint clean browser

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

test: $(STAMP) browser
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache

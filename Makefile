# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when it is missing and install shardlab into it through
# constraints.txt (torch pinned to the CPU wheel on disk: never a CUDA download).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardlab-installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardlab budget hypo-100b --gpus 1024 --tp 8 --pp 8 --zero 1 --recompute selective

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache

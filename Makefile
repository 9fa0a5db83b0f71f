# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: demo test test-loaded lint format bench venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip wheel setuptools

$(STAMP): $(PY) setup.cfg pyproject.toml
	# compat: a path entry, so pyspark finds the top-level pyspark_rmq module from any directory
	$(PY) -m pip install -e '.[test,bench]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

# ruff (rule set and format in pyproject.toml) and mypy --strict (its [tool.mypy]); part of test
LINTED := rmq_spark pyspark_rmq tests bench examples typings/generate.py
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy

# what `ruff format --check` above holds the tree to
format: $(STAMP)
	$(VENV)/bin/ruff format $(LINTED)

test: $(STAMP) lint
	$(PY) -m pytest -q -ra --durations=25 $(PYTEST_ARGS)

# `make test` on a loaded machine: beside two CPU hogs, stopped by pid when it ends (also on ^C).
# PYTEST_ARGS picks tests: make test-loaded PYTEST_ARGS='tests/remoting -k idle'
test-loaded: $(STAMP)
	@yes > /dev/null & h1=$$!; yes > /dev/null & h2=$$!; \
	trap 'kill $$h1 $$h2 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "CPU hogs: pids $$h1 $$h2"; $(MAKE) test

BENCHES := store_bench filter_bench delay_bench txn_bench broker_bench connections_bench remoting_bench remoting_hostile_bench arrow_stream_bench spark_bench cluster_bench cluster_write_bench

bench: $(STAMP)
	for b in $(BENCHES); do $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info

# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: demo test bench venv clean

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

test: $(STAMP)
	$(PY) -m pytest -q -ra

BENCHES := store_bench filter_bench delay_bench txn_bench broker_bench connections_bench remoting_bench remoting_hostile_bench arrow_stream_bench spark_bench cluster_bench cluster_write_bench

bench: $(STAMP)
	for b in $(BENCHES); do $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info

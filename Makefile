# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with the project installed (idempotent), then runs.
# `make test-matrix`: the suite on every other supported Python found (.ci/test-matrix).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-matrix bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

test-matrix:
	.ci/test-matrix

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py

clean:
	rm -rf $(VENV) .venv-3.* build *.egg-info

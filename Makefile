# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with the project installed (idempotent), then runs.
# `make test` runs the suite, then `make typecheck`: mypy --strict on aiodist/ and
# sim/ (settings in pyproject.toml) against every supported Python's library stubs.
# `make test-matrix`: the suite on every other supported Python found (.ci/test-matrix).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TYPECHECK_PYTHONS := 3.11 3.12 3.13  # requires-python's versions

.PHONY: demo test typecheck test-matrix bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	@status=0; for v in $(TYPECHECK_PYTHONS); do \
		echo "mypy --strict, Python $$v:"; $(PY) -m mypy --python-version $$v || status=1; \
	done; exit $$status

test-matrix:
	.ci/test-matrix

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py

clean:
	rm -rf $(VENV) .venv-3.* build *.egg-info .mypy_cache

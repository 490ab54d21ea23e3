# The README's two commands: `make demo` and `make test`. Both bootstrap .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-raw venv clean

venv: $(STAMP)

# torch is pinned for the test environment only (a CPU wheel that this machine keeps on disk);
# the package itself asks for a range in its `torch` extra.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/resume.py

clean:
	rm -rf $(VENV) demo-data benchmarks/out

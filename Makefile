# The README's two commands: `make demo` and `make test`. Both bootstrap .venv on a fresh machine;
# `make test` also builds .venv-clip, the venv of the OpenCLIP end-to-end test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# OpenCLIP's end-to-end test (tests/test_openclip.py) runs in a venv of its own: OpenCLIP needs
# torchvision, and the index's torchvision is built against the index's (CUDA) torch, not the CPU
# wheel of $(VENV). It runs on CPU all the same. pip's --isolated ignores this machine's pip config,
# whose find-links would otherwise pick the local CPU torch wheel.
CLIP_VENV ?= .venv-clip
CLIP_PY := $(CLIP_VENV)/bin/python
CLIP_STAMP := $(CLIP_VENV)/.installed
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
CLIP_PIP := $(CLIP_PY) -m pip install --quiet --isolated --disable-pip-version-check --timeout 120 \
	$(if $(wildcard $(CA_BUNDLE)),--cert $(CA_BUNDLE))

.PHONY: demo test test-pythons bench bench-raw venv clip-venv clean

venv: $(STAMP)

clip-venv: $(CLIP_STAMP)

# torch is pinned for the test environment only (a CPU wheel that this machine keeps on disk);
# the package itself asks for a range in its `torch` extra. tests/constraints.txt pins the versions
# the suite was last run with (pip freeze of a working .venv, torch excluded): without it pip's
# resolver backtracks for many minutes over ray, moto and the aiobotocore/botocore pins.
$(STAMP): pyproject.toml tests/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]" -c tests/constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

$(CLIP_STAMP): pyproject.toml
	$(PYTHON) -m venv $(CLIP_VENV)
	$(CLIP_PIP) "torch==2.13.0" "torchvision==0.28.*" "open-clip-torch==3.3.0" pandas
	$(CLIP_PIP) -e ".[image]"
	touch $(CLIP_STAMP)

# compileall: the suite starts many fresh interpreters (torchrun ranks, helper processes,
# fresh-process passes), and where PYTHONDONTWRITEBYTECODE is set (this machine sets it) each one
# compiled the package from source, 0.25 s apiece here; bytecode written once is read by them all.
test: $(STAMP) $(CLIP_STAMP)
	$(PY) -m compileall -q shardstream tests tools benchmarks > /dev/null
	$(PY) -m mypy
	OPENCLIP_PYTHON="$(abspath $(CLIP_PY))" $(PY) -m pytest -q -p no:cacheprovider tests
	# the fetchers again on asyncio's own loop (the suite above runs on uvloop, a `dev` extra)
	SHARDSTREAM_UVLOOP=0 $(PY) -m pytest -q -p no:cacheprovider tests/test_loop.py tests/test_fetch_http.py \
		tests/test_fetch_parallel.py tests/test_parts.py tests/test_retries.py tests/test_fetch_s3.py tests/test_environ.py

# The suite again on the oldest and the newest Python that requires-python admits, without torch
# and Ray (this disk's torch wheel is for 3.11; the index's are CUDA builds of several GB): a branch
# that only another Python takes (3.10's async-timeout deadline and exception-note fallback, say)
# is otherwise untested. The tests that need torch skip there (tests/needs.py); `make test` runs
# them. .ci/run runs this after `make test`. Each interpreter is python3.X on PATH or pyenv's;
# a missing one fails the target. tests/constraints-py3.X.txt pins what the suite last passed with.
OTHER_PYTHONS ?= 3.10 3.13
other_python = $(or $(shell python$(1) -c 'import sys; print(sys.executable)' 2>/dev/null), \
	$(lastword $(sort $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1)))))

.venv-py%/.installed: pyproject.toml tests/constraints-py%.txt
	@test -n "$(call other_python,$*)" || { echo "make test-pythons: no python$* on PATH or under pyenv" >&2; exit 1; }
	rm -rf .venv-py$*
	$(call other_python,$*) -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install --quiet --upgrade pip
	.venv-py$*/bin/python -m pip install --quiet -e ".[test]" -c tests/constraints-py$*.txt
	touch $@

test-pythons: $(foreach v,$(OTHER_PYTHONS),.venv-py$(v)/.installed)
	set -e; for v in $(OTHER_PYTHONS); do \
		echo "# the suite on Python $$v, without torch"; \
		.venv-py$$v/bin/python -m compileall -q shardstream tests tools benchmarks > /dev/null; \
		SHARDSTREAM_TEST_PARTIAL=1 .venv-py$$v/bin/python -m pytest -q -p no:cacheprovider tests; \
	done

bench: $(STAMP)
	$(PY) benchmarks/run.py --processes 3
	$(PY) benchmarks/resume.py
	$(PY) benchmarks/contention.py
	$(PY) benchmarks/media.py

clean:
	rm -rf $(VENV) $(CLIP_VENV) .venv-py* demo-data benchmarks/out

# Two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when missing and install what they need. Torch 2.13.0 (CPU build) is
# installed first when the venv has no torch, so pip never pulls a multi-GB CUDA build.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-quick lint bench clean browser-deps mutate mutate-ci postgres-deps

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip >/dev/null

$(STAMP): $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[server,excel,cluster,test]"
	@touch $(STAMP)

# The demo ends by serving its report on http://127.0.0.1:8000/ until Ctrl-C;
# `make demo SERVE=0` stops after the report is written.
SERVE ?= 1
demo: $(STAMP)
	$(VENV)/bin/accuracy demo $(if $(filter 0,$(SERVE)),--no-serve)

lint: $(STAMP)
	$(VENV)/bin/ruff check accuracy tests benchmarks tools

# Test modules run on TEST_WORKERS processes (pytest-xdist), each module whole in one of them
# (module fixtures compile their models once): ~7 min on 2 cores against ~11 serial.
# TEST_WORKERS=0 runs the suite in this process, serially.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	$(PY) -m pytest -q -rs $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The suite without its slow families (tests/_support/families.py: compiled models, the PostgreSQL
# cases, the browser): every package's core tests, run first; `make test` runs everything.
QUICK := not compiled and not postgres and not browser
test-quick: $(STAMP) lint
	$(PY) -m pytest -q -rs -m "$(QUICK)" $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# Curated bugs in core rules, one at a time (tools/mutants.toml): every one must make its tests
# fail. The working tree is never modified (mutants are applied to a temporary copy).
# Two mutants at once (each in its own copy of the tree). `make mutate` runs every mutant and
# notes each kill in .ci/mutants-killed.json (the digest of the mutant's file and tests; commit
# it); CI runs `make mutate-ci`: every mutant not killed on what it covers today, plus a
# rotating sixth of the rest (CI's whole run stays under 45 min). `tools/mutate.py -k NAME
# --record` notes a partial run's kills.
MUTATE_JOBS ?= 2
mutate: $(STAMP)
	$(PY) tools/mutate.py -j $(MUTATE_JOBS) --record

mutate-ci: $(STAMP)
	$(PY) tools/mutate.py -j $(MUTATE_JOBS) --ci

bench: $(STAMP)
	$(PY) benchmarks/bench_dump.py

# Headless Chromium for the browser test (Debian packages; never a downloaded browser).
browser-deps:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

# PostgreSQL for the server tests (they start a throwaway server: tests/_support/postgres.py)
postgres-deps:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

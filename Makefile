# The README's two commands: `make dev` (embedded service) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make dev` needs only the service (about 550 MB); `make test` adds the
# test and bench tools and vLLM-Omni's CPU-importable parts (about 880 MB in all).
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed

.PHONY: dev test quick lint migrate compose-config clean

# Python's bytecode caches, pytest's rewritten test modules among them, are written even
# where the environment sets PYTHONDONTWRITEBYTECODE: without them every xdist worker
# rewrites all test modules and every process the tests start compiles the service again.
unexport PYTHONDONTWRITEBYTECODE

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	# vLLM-Omni's own Audex prompt builder, for the GPU pipelines' CPU tests; without
	# torch or vllm (those come with the [gpu] extra on GPU hosts).
	$(BIN)/pip install --quiet --no-deps 'vllm-omni==0.30.0'
	touch $(STAMP)

## Run the service on its embedded defaults: SQLite, filesystem broker, local store.
## `make dev PORT=8137` serves on another port (else OMNIJOBS_PORT, else 8000).
dev: $(RUNTIME)
	$(BIN)/omnijobs dev $(if $(PORT),--port $(PORT))

## Run every test (integration tests start SeaweedFS, a worker and the API themselves), in
## parallel: TEST_WORKERS pytest-xdist workers, each with its own PostgreSQL, Redis,
## SeaweedFS, ports and folders (tests/services.py); a module's tests (a whole package's,
## for some) run on one worker (work_unit, tests/conftest.py; DECISIONS.md: why N).
## pytest's exit code 5 (nothing collected) is not a failure of the suite.
TEST_WORKERS ?= 4
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadscope
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) --durations=25 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

## The inner loop: every test that starts no process of its own (unit, repository and
## route tests; see `spawns` in tests/conftest.py). These compute more than they wait, so
## three workers (119 s against 123 s at four, side by side on 2 cores).
QUICK_WORKERS ?= 3
quick: $(STAMP)
	OMNIJOBS_TEST_QUICK=1 $(BIN)/python -m pytest -n $(QUICK_WORKERS) --dist loadscope \
	  -m "not spawns" -q \
	  $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .

migrate: $(RUNTIME)
	$(BIN)/omnijobs migrate

compose-config:
	docker compose config --quiet 2>/dev/null || docker-compose config --quiet

clean:
	rm -rf $(VENV) .omnijobs .pytest_cache .ruff_cache

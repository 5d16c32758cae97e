# ipamd — every target creates .venv and installs the project on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test check bench bench-cluster chaos report clean image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ipamd run --embedded

test: $(STAMP)
	tests/e2e/install-packages.sh
	$(BIN)/pytest

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench

# Many nodes against one account's EC2 API budget, in simulated time (IPAMD_BENCH_NODES=2000 for more).
bench-cluster: $(STAMP)
	$(BIN)/python -m bench.cluster

# The daemon as a real process under pod churn and a schedule of faults.
chaos: $(STAMP)
	$(BIN)/python -m chaos

# make bench + short cluster and chaos runs -> docs/benchmarks.md and its plots.
report: $(STAMP)
	$(BIN)/python -m bench.report

# The container image (Dockerfile); needs a container engine, which `make test` does not. Name it
# with IMAGE=registry/ipamd:tag; CONTAINER_ENGINE=podman to use Podman.
image:
	$(or $(CONTAINER_ENGINE),docker) build -t $(or $(IMAGE),ipamd:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)) .

clean:
	rm -rf $(VENV) .run .mypy_cache .ruff_cache .pytest_cache .hypothesis

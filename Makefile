# torchyard developer commands.
PYTHON ?= python3
TORCH_VERSION := 2.13.0
# Where torch's CPU build comes from. Public PyPI's Linux torch is the CUDA build (GBs of nvidia-*
# wheels), so the PyTorch CPU index is added; a CUDA build: TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# Debian packages of the browser test; apt-get through sudo unless already root.
BROWSER_PACKAGES := chromium:chromium nodejs:node npm:npm  # Debian package:the command it provides
# Debian packages of the Slurm executor's tests (a private single-host Slurm the tests start themselves).
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
APT_GET := $(if $(filter 0,$(shell id -u)),,sudo) apt-get

.PHONY: install install-torch install-client install-test install-browser install-slurm run test lint bench

# The service and its CLI only: torch first, then the service (torchyard-server) without extras, then the client.
install: install-torch
	$(PYTHON) -m pip install -e .
	$(MAKE) install-client PYTHON=$(PYTHON)

# The client (client/: the torchyard command, the Python client, the SDK) editable, after the service: the service
# depends on it by path, which pip installs as a plain copy; this makes edits under client/torchyard/ show at once.
# `pip install ./client` alone is the laptop install: no torch, nothing of the service.
install-client:
	$(PYTHON) -m pip install --no-deps -e ./client

# torch first and pinned, so `pip install -e .` finds it satisfied and never pulls a CUDA build.
# Where pip already resolves torch==$(TORCH_VERSION) to a CPU build (a local wheel, a mirror in the pip
# configuration), pip is left as configured; otherwise TORCH_INDEX_URL is added as an extra index,
# whose +cpu build sorts above PyPI's. The index used is recorded beside the interpreter (worker/torch_builds.py):
# a job's requirements built against torch (torchvision ...) resolve from it, as the worker's torch build.
TORCH_INDEX_RECORD = $(PYTHON) -c 'import pathlib, sys; p = pathlib.Path(sys.prefix, "torchyard-torch-index-url"); \
	p.write_text(sys.argv[1] + "\n") if sys.argv[1] else p.unlink(missing_ok=True)'
install-torch:
	@if $(PYTHON) -m pip install --dry-run --no-deps --quiet --report - 'torch==$(TORCH_VERSION)' 2>/dev/null \
	    | grep -q '"version": "$(TORCH_VERSION)+cpu"'; then \
	  echo "torch==$(TORCH_VERSION) resolves to a CPU build as pip is configured"; \
	  echo "$(PYTHON) -m pip install torch==$(TORCH_VERSION)"; \
	  $(PYTHON) -m pip install 'torch==$(TORCH_VERSION)' && $(TORCH_INDEX_RECORD) ''; \
	else \
	  echo "$(PYTHON) -m pip install --extra-index-url $(TORCH_INDEX_URL) torch==$(TORCH_VERSION)"; \
	  $(PYTHON) -m pip install --extra-index-url '$(TORCH_INDEX_URL)' 'torch==$(TORCH_VERSION)' \
	    && $(TORCH_INDEX_RECORD) '$(TORCH_INDEX_URL)'; \
	fi

run:
	$(PYTHON) -m stack

# What the tests need (the `test` extra: pytest, ruff, the tracking and lint tools some tests call), then the tests.
install-test: install-torch
	$(PYTHON) -m pip install -e '.[test]'
	$(MAKE) install-client PYTHON=$(PYTHON)

# Three test files at a time (pytest-xdist; each file whole in one process, so its module fixtures start once), the
# longest first (tests/file_order.py): 36-41 minutes of pytest on 2 cores from a clean clone with a second copy of the
# suite beside it, 1,124 tests, 1,720-1,850 CPU-seconds each, 27 minutes alone (17-18 on a faster machine, 1,147 tests, with
# catalog ranks forked from torchrun); most of it torch starting in torchrun and its ranks (python -m bench.suite_cpu:
# docs/BENCHMARKS.md, "The test suite"). Four
# processes took as long and more CPU. TEST_PROCESSES=0: pytest's own single process.
TEST_PROCESSES ?= 3

test: install-test
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -n $(TEST_PROCESSES) --dist loadfile

lint:
	$(PYTHON) -m ruff check .

# Every benchmark, side by side; prints a table, writes bench/results/*.json and docs/BENCHMARKS.md.
bench:
	$(PYTHON) -m bench

# The dashboard's browser test: Debian's Chromium, Node.js and npm, and playwright-core from the lock
# (never a downloaded browser). All three or none: the test runs with all of them and is skipped
# without Chromium, node or npm.
# Only the missing ones: a Node.js from another source (nodesource's ships npm inside) conflicts with Debian's npm.
install-browser:
	missing=""; for pair in $(BROWSER_PACKAGES); do command -v $${pair#*:} >/dev/null || missing="$$missing $${pair%%:*}"; done; \
	  [ -z "$$missing" ] || { $(APT_GET) update && $(APT_GET) install -y --no-install-recommends $$missing; }
	cd dashboard && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund

# The Slurm executor's tests: Debian's slurmctld, slurmd, client tools and munge. The tests configure and
# start their own single-host cluster in a temporary directory, and are skipped without these binaries.
install-slurm:
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
	  || ($(APT_GET) update && $(APT_GET) install -y --no-install-recommends $(SLURM_PACKAGES))

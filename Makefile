# torchyard developer commands. torch is installed first, pinned, so pip never pulls a CUDA build.
PYTHON ?= python3

.PHONY: install install-browser run test lint bench

install:
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[dev]'

run:
	$(PYTHON) -m stack

test:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest

lint:
	$(PYTHON) -m ruff check .

# Every benchmark, side by side; prints a table, writes bench/results/*.json and docs/BENCHMARKS.md.
bench:
	$(PYTHON) -m bench

# The dashboard's browser test: Debian's Chromium and playwright-core (never a downloaded browser).
install-browser:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	cd dashboard && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund

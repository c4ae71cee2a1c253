# torchyard developer commands. torch is installed first, pinned, so pip never pulls a CUDA build.
PYTHON ?= python3

.PHONY: install run test lint bench

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

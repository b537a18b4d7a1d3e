PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test sweep lint bench install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The suite runs two test files at a time (a file's tests share its module fixtures):
# 10 min instead of 14 on a 2-core machine.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  else sudo apt-get install -y -q chromium >/dev/null; fi; }
	$(BIN)/ruff check detprof tests benchmarks
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile

sweep: $(STAMP)
	$(BIN)/detprof sweep --stability --resume

lint: $(STAMP)
	$(BIN)/ruff check detprof tests benchmarks

bench: $(STAMP)
	$(BIN)/python -m benchmarks

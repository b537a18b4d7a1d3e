PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What `make sweep` needs (detprof and TensorFlow, the framework of the embedded default), and what `make test`
# adds: the other backends, Ray, the browser and the test tools. Each stamp re-installs when
# pyproject.toml changes.
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

.PHONY: test sweep lint bench install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[tensorflow]'
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(TEST_STAMP) $(RUN_STAMP)

install: $(TEST_STAMP)

# The suite runs two test files at a time (a file's tests share its module fixtures):
# 10 min instead of 14 on a 2-core machine.
test: $(TEST_STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  else sudo apt-get install -y -q chromium >/dev/null; fi; }
	$(BIN)/ruff check detprof tests benchmarks
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile

sweep: $(RUN_STAMP)
	$(BIN)/detprof sweep --stability --resume

lint: $(TEST_STAMP)
	$(BIN)/ruff check detprof tests benchmarks

bench: $(TEST_STAMP)
	$(BIN)/python -m benchmarks

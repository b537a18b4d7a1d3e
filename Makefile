PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What `make sweep` needs (detprof and TensorFlow, the framework of the embedded default), and what `make test`
# adds: the other backends, Ray, the browser and the test tools. Each stamp re-installs when
# pyproject.toml changes.
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

# `make gpu-check` runs in an environment of its own that sees the frameworks GPU_PYTHON has (a GPU
# machine's PyTorch or JAX, with their CUDA builds) and adds only what detprof needs beside them: from
# wheelhouse/ when it is there (`make wheelhouse`, for a machine without internet), else from PyPI.
GPU_PYTHON ?= python3
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
GPU_CHECK_OUT ?= gpu-check

.PHONY: test sweep lint bench install gpu-check

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

$(GPU_STAMP): pyproject.toml
	$(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	  > "$$(echo $(GPU_VENV)/lib/python3*/site-packages)/gpu_python.pth"
	$(GPU_VENV)/bin/python -m pip install --quiet $(if $(wildcard wheelhouse/*.whl),--no-index --find-links wheelhouse) \
	  -e '.[measure]'
	touch $(GPU_STAMP)

# The GPU acceptance run (detprof/doctor/gpu_check.py): without a GPU, one line and exit 0, installing nothing.
gpu-check:
	@if ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check"; exit 0; fi; \
	$(MAKE) --no-print-directory $(GPU_STAMP) && $(GPU_VENV)/bin/python -m detprof.doctor.gpu_check $(GPU_CHECK_OUT)

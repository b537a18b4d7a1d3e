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
# `make gpu-study`: one window of the GPU study (detprof gpu-study) into GPU_STUDY_OUT within GPU_BUDGET; run again
# in the next window, it continues the study there.
GPU_STUDY_OUT ?= gpu-study
GPU_BUDGET ?= 10m

.PHONY: test test-fast sweep lint bench docs install gpu-check gpu-study wheelhouse gpu-wheelhouse reference

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

# The suite runs two test files at a time (a file's tests share its module fixtures; the files that read a
# study made once per run, tests/shared_studies.py, go together: tests/conftest.py), and prints its 30 slowest
# tests. detprof's own modules are compiled first: where PYTHONDONTWRITEBYTECODE is set (this machine, CI) every
# process of the suite would compile what it imports again.
PYTEST := $(BIN)/python -m pytest -q -ra -n 2 --dist loadfile --durations=30

test: $(TEST_STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  else sudo apt-get install -y -q chromium >/dev/null; fi; }
	$(BIN)/ruff check detprof tests benchmarks
	$(BIN)/python -m compileall -q detprof tests
	$(PYTEST)

# The inner loop: the tests that start no framework process (parsers, statistics, reports over recorded
# results, command-line errors), within 3 minutes; `make test` runs everything, as CI does.
test-fast: $(TEST_STAMP)
	$(BIN)/python -m compileall -q detprof tests
	$(PYTEST) -m "not slow"

sweep: $(RUN_STAMP)
	$(BIN)/detprof sweep --stability --resume

# What the package ships of detprof's GPU runs (detprof/reports/gpu_reference.json), read again from reference/:
# after a GPU run's results are added there. A test fails while the file and the folders disagree.
reference: $(RUN_STAMP)
	$(BIN)/python -m detprof.reports.reference_build

lint: $(TEST_STAMP)
	$(BIN)/ruff check detprof tests benchmarks

bench: $(TEST_STAMP)
	$(BIN)/python -m benchmarks

# The documentation site (docs/, Sphinx with MyST and Furo), every warning an error, as the suite builds it.
docs: $(TEST_STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs/_build/html/index.html"

# An offline GPU machine's wheels (README, "GPU machines without internet"): detprof's own wheel and every wheel it
# needs there beside the framework, for that machine's Python and platforms, not this one's. The framework (torch,
# jax, tensorflow and their CUDA wheels) is left out: what is downloaded is detprof with its `measure` extra (Keras 3,
# scikit-learn, nvtx), not a framework extra, and there `pip install --no-index --find-links wheelhouse
# 'detprof[torch]'` (or [jax], [tensorflow]) takes the framework already installed. manylinux_2_28 is glibc 2.28
# (Ubuntu 20.04, RHEL 8 and newer), which pyarrow's current wheels need; manylinux2014 (glibc 2.17) brings the
# wheels tagged only that old. WHEELHOUSE_EXTRAS=measure,ray adds a fleet node's Ray.
# WHEELHOUSE_CONSTRAINTS=FILE: what that machine has installed (`pip list --format=freeze` there), so that each wheel
# fits beside its framework (TensorFlow 2.16 and 2.17 pin numpy<2, which the newest pandas does not run on).
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_PYTHON ?= 3.11
WHEELHOUSE_PLATFORMS ?= manylinux_2_28_x86_64 manylinux2014_x86_64
WHEELHOUSE_EXTRAS ?= measure
WHEELHOUSE_CONSTRAINTS ?=

wheelhouse: | $(BIN)/python
	rm -f $(WHEELHOUSE)/detprof-*.whl
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir $(WHEELHOUSE) .
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
	  --python-version $(WHEELHOUSE_PYTHON) $(addprefix --platform ,$(WHEELHOUSE_PLATFORMS)) --dest $(WHEELHOUSE) \
	  $(addprefix --constraint ,$(WHEELHOUSE_CONSTRAINTS)) \
	  "$$(ls $(WHEELHOUSE)/detprof-*.whl)[$(WHEELHOUSE_EXTRAS)]"
	@echo "$(WHEELHOUSE)/: $$(ls $(WHEELHOUSE) | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1); offline:" \
	  "pip install --no-index --find-links $(WHEELHOUSE) 'detprof[torch]' (or [jax], [tensorflow])"

# The wheelhouse for the GPU image in use, whose Python is 3.12.
GPU_WHEELHOUSE_PYTHON ?= 3.12
gpu-wheelhouse:
	$(MAKE) --no-print-directory wheelhouse WHEELHOUSE_PYTHON=$(GPU_WHEELHOUSE_PYTHON)

# The environment is made without pip and GPU_PYTHON's pip installs into it (`pip --python`): a GPU image's Python
# is often a distribution's, whose venv module has no ensurepip (Debian and Ubuntu without python3-venv).
$(GPU_STAMP): pyproject.toml
	$(GPU_PYTHON) -m venv --without-pip --system-site-packages $(GPU_VENV)
	$(GPU_PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	  > "$$(echo $(GPU_VENV)/lib/python3*/site-packages)/gpu_python.pth"
	$(GPU_PYTHON) -m pip --python $(GPU_VENV)/bin/python install --quiet \
	  $(if $(wildcard $(WHEELHOUSE)/detprof-*.whl),--no-index --find-links $(WHEELHOUSE) 'detprof[measure]',-e '.[measure]')
	touch $(GPU_STAMP)

# The GPU acceptance run (detprof/doctor/gpu_check.py): without a GPU, one line and exit 0, installing nothing.
gpu-check:
	@if ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check"; exit 0; fi; \
	$(MAKE) --no-print-directory $(GPU_STAMP) && $(GPU_VENV)/bin/python -m detprof.doctor.gpu_check $(GPU_CHECK_OUT)

# The GPU study (detprof/gpu_study): its plan, then the parts that fit GPU_BUDGET; without a GPU, one line and exit 0.
gpu-study:
	@if ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "gpu-study: no NVIDIA GPU here (nvidia-smi lists none); detprof gpu-study --dry-run --gpu h100 shows its plan"; \
	  exit 0; fi; \
	$(MAKE) --no-print-directory $(GPU_STAMP) && $(GPU_VENV)/bin/python -m detprof.cli gpu-study \
	  --out $(GPU_STUDY_OUT) --budget $(GPU_BUDGET) $(if $(wildcard $(GPU_STUDY_OUT)/gpu-study.json),--resume)

# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Keep PoCL's and pyopencl's caches out of the user's home during tests.
TEST_ENV := POCL_CACHE_DIR=$(CURDIR)/.pytest_cache/pocl XDG_CACHE_HOME=$(CURDIR)/.pytest_cache/xdg

.PHONY: run test bench bench-cluster lint clean setup gpu-check browser bytecode

setup: $(STAMP) browser bytecode

# tgc's modules byte-compiled (only those edited since: compileall checks each file's time), as an editable
# install does not and PYTHONDONTWRITEBYTECODE keeps Python from writing them: otherwise every process compiles
# them from source, ~0.09 s of a warm `tgc run` and ~0.28 s of any process importing the compiler (the tests
# start hundreds: `make test` runs this first)
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q tgc >/dev/null

$(STAMP): setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
# (UserWarnings off: setuptools' editable install warns, in a 10-line box, that a folder named tgc in the working
# directory takes precedence, which is the point of an editable install here)
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[dev,opencl,cuda,metal]'
# (Ray, the cluster extra, where it installs: tests/test_cluster.py skips, with the reason, where it does not)
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[cluster]' || echo "Ray could not be installed here: the cluster tests will skip"
	touch $(STAMP)

# headless Chromium and its driver for the `tgc viz` browser tests (tests/test_viz.py): nothing to do where both are
# on PATH; as root with apt-get, Debian's chromium and chromium-driver (an index update only if the first try fails);
# otherwise, or when apt fails, a note: those tests then skip with the reason. Never fails the setup.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver (apt-get) for the browser tests"; \
	  { $(APT_INSTALL) || { apt-get update -q >/dev/null 2>&1 && $(APT_INSTALL); }; } \
	  || echo "note: apt-get could not install chromium: the browser tests of tgc viz will skip"; \
	else echo "note: no chromium/chromedriver and no apt-get as root: the browser tests of tgc viz will skip"; fi

APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver \
	>/dev/null 2>&1

run: $(STAMP)
	$(BIN)/tgc run kernels/softmax.tg --random -D N=4 -D D=8

# the language suite runs on every device this machine can run (REMOTE through a real `tgc serve`);
# CUDA and METAL kernels are compiled and type-checked by tests/test_suite_compiles.py
TEST_DEVICES ?= CPU,OPENCL,PYTHON,REMOTE

test: $(STAMP) browser bytecode
	$(TEST_ENV) TGC_TEST_DEVICES=$(TEST_DEVICES) $(BIN)/python -m pytest -n 2 -q

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

# numpy with its best BLAS kernels and XLA (jax.jit) beside tgc, in one run (see bench/bench.py)
bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench.py

# the check to run first on a machine with an NVIDIA GPU (tools/gpu_check.py): no venv, no network, the system
# python3 with tgc from this tree on PYTHONPATH; results in $$OUT or build/gpu-check/. `make gpu-check ARGS=--quick`;
# ARGS=--standin runs it here through the CPU stand-in for the CUDA driver (as CI does)
gpu-check:
	$(PY) tools/gpu_check.py $(ARGS)

# BEAM through a local multi-node Ray cluster: candidates per second against the number of nodes (needs Ray)
bench-cluster: $(STAMP)
	$(BIN)/python bench/bench_cluster.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

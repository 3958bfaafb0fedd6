# The two commands: `make demo` and `make test`. Both create .venv if missing and
# install fedtab with every optional extra (torch CPU 2.13.0, Flower, NVIDIA FLARE).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean bench

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (fedtab needs Python >= 3.11); run 'make PYTHON=python3 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedtab demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) fedtab-demo .pytest_cache

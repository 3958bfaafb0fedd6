# The two commands: `make demo` and `make test`. Both create .venv if missing and
# install fedtab with every optional extra (torch CPU 2.13.0, Flower, NVIDIA FLARE).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bytecode clean bench

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (fedtab needs Python >= 3.11); run 'make PYTHON=python3 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	@touch $(STAMP)

install: $(STAMP) bytecode

# fedtab's own bytecode, as a wheel install compiles it (pip compiles every dependency; the
# editable install of src/ compiles nothing). Without it, every process that imports fedtab
# compiles its modules again when Python may not write them (PYTHONDONTWRITEBYTECODE, set on
# these machines): a Flower ClientApp process (one per message) answering a ballot paid up to
# 0.2 s for it (its 87 fedtab modules: 2.00 s to import without bytecode, 1.80 s with).
# Only changed files are compiled again (under a second when none).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q src

demo: $(STAMP) bytecode
	$(BIN)/fedtab demo

# The suite in TEST_WORKERS processes (pytest-xdist), one test file per worker at a time
# (``--dist loadfile``: a file's module-scoped deployment is started once). Three on a 2-core
# machine: the Flower/FLARE deployment tests spend much of their time waiting on the engines'
# polling and process starts, and the other workers compute meanwhile (measured on an idle
# 2-core machine: 9 min 6 s with 3 workers, 10 min 18 s with 2). ``make test TEST_WORKERS=0``
# runs it in one process.
TEST_WORKERS ?= 3

test: $(STAMP) bytecode
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

clean:
	rm -rf $(VENV) fedtab-demo .pytest_cache

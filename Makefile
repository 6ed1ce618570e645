# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO    := demo-output/market-entry
JOBS    ?= auto
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PYTHON_KEYRING_BACKEND ?= keyring.backends.null.Keyring

.PHONY: demo test install clean lint typecheck

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m keepstep.app.demo $(DEMO)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS)

lint: $(STAMP)
	$(BIN)/ruff check app engine storage tests bench

# mypy finds keepstep.engine / keepstep.storage through links named like the packages.
typecheck: $(STAMP)
	mkdir -p .typecheck/keepstep
	for d in app engine storage; do ln -sfn ../../$$d .typecheck/keepstep/$$d; done
	$(BIN)/python -m mypy --strict -p keepstep.storage
	$(BIN)/python -m mypy -p keepstep.engine

clean:
	rm -rf $(VENV) demo-output .pytest_cache .typecheck .mypy_cache

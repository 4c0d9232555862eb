# The two commands a newcomer needs: `make serve` and `make test`. Both install everything first.
VENV ?= .venv
BIN := $(VENV)/bin
DATASET := /usr/share/datasets/fashion-mnist

.PHONY: install serve test lint docs

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -d $(DATASET) || { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; }
	@command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl; }  # the TLS tests' certificates
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

serve: install
	$(BIN)/adaserve serve

lint: install
	$(BIN)/ruff check adaserve tests benchmarks examples docs
	$(BIN)/ruff format --check adaserve tests benchmarks examples docs
	$(BIN)/mypy adaserve

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site  # the variable quiets Material's notice of its successor

test: lint docs
	$(BIN)/pytest -q

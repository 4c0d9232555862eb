# The two commands a newcomer needs: `make serve` and `make test`. Each installs what it needs first: `serve` the
# server and `adaserve infer`'s client, `test` (`install`) everything, the test tools and reference models too.
VENV ?= .venv
BIN := $(VENV)/bin
DATASET := /usr/share/datasets/fashion-mnist

.PHONY: install serve test lint docs protos

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -d $(DATASET) || { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; }
	@command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl; }  # the TLS tests' certificates
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

$(VENV)/.served: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -e '.[client]'
	touch $@

serve: $(VENV)/.served
	$(BIN)/adaserve serve

lint: install
	$(BIN)/ruff check adaserve tests benchmarks examples docs
	$(BIN)/ruff format --check adaserve tests benchmarks examples docs
	$(BIN)/mypy adaserve

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site  # the variable quiets Material's notice of its successor

# Two workers, a test file each at a time (its module fixtures start once): the tests wait on servers and processes
# most of their time, so two share the 2-core VM's cores and the suite takes about two thirds of its serial time.
# The files go out in the order tests/conftest.py gives them, those with `slow` tests first (not xdist's default of
# the most tests first, which sent the one-test files of a minute or two out last).
# --durations: the slowest tests in the log, for keeping the suite under 15 minutes.
test: lint docs
	$(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

# The gRPC protocol's Python modules, generated from the vendored .proto files and committed. grpcio-tools is pinned
# in the test extra: its protoc 25 writes modules with no runtime-version check, which load on protobuf 4.25 (where
# tritonclient 2.48 in the test extra holds it) through 7. protoc writes top-level imports; sed makes them absolute.
PROTOS := adaserve/server/protos
protos: install
	cd $(PROTOS) && $(abspath $(BIN))/python -m grpc_tools.protoc -I. --python_out=. *.proto
	cd $(PROTOS) && $(abspath $(BIN))/python -m grpc_tools.protoc -I. --grpc_python_out=. grpc_service.proto
	sed -i 's/^import \([a-z_]*_pb2\) as /from adaserve.server.protos import \1 as /' $(PROTOS)/*_pb2*.py

# Governor: `make demo` runs the main job, `make test` the whole suite. Both set themselves up:
# a virtualenv in .venv, the project installed into it, Apache Kafka resolved from Maven Central.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: all demo test unit integration e2e kafka bench clean

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

kafka: $(STAMP)
	$(BIN)/governor broker install

demo: kafka
	$(BIN)/governor demo --duration 30 --json out/demo.json $(DEMO_ARGS)

test: kafka
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

integration: kafka
	$(BIN)/python -m pytest -q tests/integration $(PYTEST_ARGS)

e2e: kafka
	$(BIN)/python -m pytest -q tests/e2e $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks.codec
	$(BIN)/python -m benchmarks.fidelity
	$(BIN)/python -m benchmarks.engine_speed
	$(BIN)/python -m benchmarks.router_decisions
	$(BIN)/python -m benchmarks.router_throughput
	$(BIN)/python -m benchmarks.router_recovery
	$(BIN)/python -m benchmarks.controllers_scale
	$(BIN)/python -m benchmarks.live_config_apply
	$(BIN)/python -m benchmarks.vllm_adapter
	$(BIN)/python -m benchmarks.streams_long_task
	$(BIN)/python -m benchmarks.streams_gone_workers
	$(BIN)/python -m benchmarks.streams_throughput
	$(BIN)/python -m benchmarks.analytics_sink
	$(BIN)/python -m benchmarks.analytics_queries
	$(BIN)/python -m benchmarks.deleted_topic

clean:
	rm -rf $(VENV) out .governor .pytest_cache

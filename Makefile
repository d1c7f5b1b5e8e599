# compactd: every routine task is a target. `make demo` and `make test` install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp-deps
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps system-deps demo test test-slow test-versions test-matrix soak lint imports docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip compiles what it installs one file at a time (12 s here); compileall does it on every core, and leaves out the
# packages' own test suites, which nothing imports (a third of the files).
NOT_IMPORTED := '/(tests?|testing)/'
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e ".[test,demo,dashboards]"
	$(BIN)/python -m compileall -q -j 0 -x $(NOT_IMPORTED) $(VENV)/lib >/dev/null || true  # an optimisation only
	touch $@

# Redis and Prometheus (promtool, and a real server for the scrape test), Maven, javac and kcat (a plain reader of the
# compacted view in the tests) come from Debian; Spark comes from
# PyPI; Apache Kafka comes from Maven Central (local/jvm/pom.xml).
APT_NEEDS := $(if $(shell command -v redis-server),,redis-server) $(if $(shell command -v prometheus),,prometheus) \
	$(if $(shell command -v mvn),,maven) $(if $(shell command -v javac),,openjdk-17-jdk-headless) \
	$(if $(shell command -v kcat),,kcat)
system-deps:
	@if [ -n "$(strip $(APT_NEEDS))" ]; then $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(APT_NEEDS) >/dev/null; fi
	@command -v java >/dev/null || { echo "Java 17 is required (apt-get install openjdk-17-jre-headless)"; exit 1; }

# JVM artifacts (compactd/maven.py): `mvn -B dependency:copy-dependencies` of a pom into ~/.cache/compactd/<name>-
# <version>-<hash of the pom>, once per pom: Apache Kafka's jars for the test and demo broker (local/jvm/pom.xml), and
# Spark's Kafka connector for the job (streaming/jvm/pom.xml); and compactd's Java for Spark's tasks (the decoders
# and the compaction's task), compiled once with javac against pyspark's own jars (streaming/udfs.py). A broker or job
# start fills an empty one too.
deps: system-deps $(STAMP)
	@$(BIN)/python -m compactd.local.broker --fetch
	@$(BIN)/python -m compactd.streaming.connector --fetch

# CLUSTER=3: three Kafka nodes, an agent per node, and one node killed with -9 and started again while it runs
demo: deps
	$(BIN)/compactd demo $(if $(DURATION),--duration $(DURATION)) $(if $(CLUSTER),--nodes $(CLUSTER))

# Tests run in TEST_WORKERS pytest processes, each with its own Redis, broker and Spark session, work-stealing so the
# long tests do not queue up. Many tests wait on the cluster (a cleaner pass, a stall deadline, a node's election)
# rather than compute, so more workers than cores pays: on 2 cores, idle, 3 workers 311 s of tests (1.3 cores busy;
# before the stuck range reads stopped trickling and two properties ran fewer examples, about 30 s of one worker), then
# 4 workers 285 s (1.6 cores), 5 workers 260 s (1.7). Each worker holds a broker, a Redis and a Spark driver: 5
# workers peaked at 7.2 GB of memory in use, so a machine gets one worker per 1.5 GB it has available past the first
# GB, 2 to 5 of them (this machine, 23 GB available: 5; 6.5 GB available: 3).
TEST_WORKERS ?= $(shell awk '/MemAvailable/ { w = int(($$2 / 1048576 - 1) / 1.5); print (w > 5 ? 5 : (w < 2 ? 2 : w)) }' \
	/proc/meminfo 2>/dev/null || echo 3)
# The suite starts a few hundred Python processes (jobs, CLI calls, Spark's workers): compiled once here, where
# PYTHONDONTWRITEBYTECODE would otherwise have each of them compile compactd again (0.6 s of CPU per job start).
PACKAGE_DIRS := compactd kafka codec streaming state policy control sinks app daemon explain agent local demo dashboards \
  compaction tests
test: deps imports
	$(BIN)/python -m compileall -q -j 0 $(PACKAGE_DIRS) >/dev/null
	@rm -rf $${TMPDIR:-/tmp}/compactd-test-crashes
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 || { \
	  cat $${TMPDIR:-/tmp}/compactd-test-crashes/*.log 2>/dev/null; exit 1; }

# The same suite on a machine half as fast: a busy loop holds one core (CPU 0) for the whole run, so every test meets
# a slow machine's timing. A test that passes here does not depend on speed (issue 50). RUNS=3: three in a row.
test-slow: deps
	$(BIN)/python -m compileall -q -j 0 $(PACKAGE_DIRS) >/dev/null
	@for i in $$(seq $${RUNS:-1}); do \
	  taskset -c 0 $(BIN)/python -c 'while True: pass' & hog=$$!; \
	  echo "test-slow: run $$i of $${RUNS:-1}, CPU 0 held by pid $$hog"; \
	  start=$$(date +%s); \
	  $(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal; rc=$$?; \
	  kill $$hog; echo "test-slow: run $$i: exit $$rc in $$(( $$(date +%s) - start )) s"; \
	  [ $$rc = 0 ] || exit $$rc; \
	done

# The safety, nudge and compaction property tests with many more generated histories than `make test` runs, and the unit suite's
# fuzz and property tests at 10 times their nominal examples (`make test` runs half of them).
# The version matrix: the tests marked `versions` on another Apache Kafka line and mode (local/broker.py KafkaLine:
# 4.4.0, 3.9.1, 3.6.2 in KRaft or ZooKeeper mode, 2.8.2 in ZooKeeper mode), its jars fetched on first use, e.g.
#   make test-versions KAFKA_VERSION=3.9.1 KAFKA_MODE=zk
# `make test-matrix` runs every line and mode one after another and writes tests/versions.json and the README's table.
KAFKA_VERSION ?= 3.9.1
KAFKA_MODE ?= kraft
test-versions: deps
	$(BIN)/python -m compileall -q -j 0 $(PACKAGE_DIRS) >/dev/null
	COMPACTD_KAFKA_VERSION=$(KAFKA_VERSION) COMPACTD_KAFKA_MODE=$(KAFKA_MODE) \
	  $(BIN)/pytest -q -n 3 --dist worksteal -m versions --durations=5

test-matrix: deps
	$(BIN)/python -m compileall -q -j 0 $(PACKAGE_DIRS) >/dev/null
	$(BIN)/python tests/matrix.py --write

soak: deps
	COMPACTD_PROPERTY_EXAMPLES=$${EXAMPLES:-5000} $(BIN)/pytest -q tests/integration/test_safety_property.py \
	  tests/integration/test_admin_safety_property.py \
	  tests/integration/test_lifecycle_property.py --hypothesis-show-statistics
	COMPACTD_FUZZ_SCALE=$${FUZZ_SCALE:-10} $(BIN)/pytest -q tests/unit
	COMPACTD_FUZZ_SCALE=$${FUZZ_SCALE:-10} $(BIN)/pytest -q tests/integration/test_columns.py \
	  tests/integration/test_compaction_jvm.py
	COMPACTD_SOAK=1 COMPACTD_STANDALONE_SLICES=2 $(BIN)/pytest -q -s tests/e2e/test_standalone_cluster.py -k core_scenario
	COMPACTD_COMPACTION_EXAMPLES=$${COMPACTION_EXAMPLES:-30} $(BIN)/pytest -q tests/integration/test_compaction_property.py
	COMPACTD_NUDGE_EXAMPLES=$${NUDGE_EXAMPLES:-60} $(BIN)/pytest -q tests/integration/test_nudges.py -k every_nudge
	COMPACTD_SOAK=1 COMPACTD_REPLICATED_EXAMPLES=$${REPLICATED_EXAMPLES:-30} $(BIN)/pytest -q -m soak tests

lint: deps imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The layers contract of pyproject.toml ([tool.importlinter]) over the import graph. import-linter finds a package's
# modules on disk under one folder; compactd's stages are top-level folders mapped into it, so the check runs over a
# tree of links that lays them out as the installed package does.
IMPORT_TREE := build/import-graph
imports: $(STAMP)
	@rm -rf $(IMPORT_TREE) && mkdir -p $(IMPORT_TREE)/compactd
	@ln -s $(CURDIR)/compactd/*.py $(IMPORT_TREE)/compactd/
	@for p in $(filter-out compactd tests,$(PACKAGE_DIRS)); do ln -s $(CURDIR)/$$p $(IMPORT_TREE)/compactd/$$p; done
	@cd $(IMPORT_TREE) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --no-cache $(CURDIR)/pyproject.toml \
	  >../import-graph.log 2>&1; rc=$$?; sed -n '/^Contracts/,$$p' ../import-graph.log | grep -v '^[-[:space:]]*$$'; \
	  exit $$rc

# docs/configuration.md is generated from the settings models (app/config_doc.py), docs/architecture.md's module map
# from the docstrings (app/module_map.py); tests/unit/test_config_doc.py and test_module_map.py fail
# while it is stale. Only the Python package is needed, not the system deps.
docs: $(STAMP)
	$(BIN)/python -m compactd.app.config_doc --write
	$(BIN)/python -m compactd.app.module_map --write

# Each benchmark prints one JSON object; bench/results.json collects them (stderr keeps their progress logs), and
# bench/report.py renders docs/benchmarks.md's and the README's tables from it.
BENCHES := "throughput.py --events 2000000 --nothing-due" "throughput.py --events 2000000 --nothing-due --format binary" \
	"throughput.py --rounds 3" "state_footprint.py" "scaling.py" "scaling.py --nothing-due" \
	"decode.py" "decode.py --format json --records 1000000" "admin_poll.py" "group_check.py" \
	"metrics_scrape.py" "restart.py" "cold_start.py" "latency.py" "explain.py" "compaction.py" "driver_batch.py" \
	"driver_batch.py --partitions 1000000" "state_footprint.py --partitions 1000000" "cleaner_loop.py"
bench: deps
	@rm -f bench/results.jsonl
	@for b in $(BENCHES); do $(BIN)/python bench/$$b >> bench/results.jsonl || exit 1; tail -n 1 bench/results.jsonl; done
	@$(BIN)/python -c 'import json,sys; rows=[json.loads(l) for l in open("bench/results.jsonl")]; json.dump(rows, open("bench/results.json","w"), indent=2)'
	@rm -f bench/results.jsonl
	@echo "wrote bench/results.json"
	@$(BIN)/python bench/report.py --write

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo

# Quick start (fresh machine, nothing installed by hand):  make run  |  make test
# Both set the project up first (scripts/setup.sh: .venv, CPU torch, deps; quick when done).

VENV    ?= .venv
BIN     := $(VENV)/bin
ARGS    ?=
# Per-test limit of pytest-timeout, seconds.
TEST_TIMEOUT ?= 900
# Test processes of `make test` (pytest-xdist): most integration tests wait on child processes, so two
# workers keep both cores of a 2-core machine busy, each on its own share of the cores (tests/conftest.py), which
# the processes its tests start inherit. Each worker may hold a SmolLM2 (a few GB).
TEST_WORKERS ?= 2
# Each test's wall time, CPU seconds and the machine's idle core-seconds meanwhile (tests/helpers/cpu_report.py);
# the summary at the end names the tests the machine idled most beside. `--dist loadgroup` hands the tests out one
# at a time, modules with slow tests first (tests/conftest.py), so both workers end on short tests together.
CPU_REPORT ?= /tmp/agent-trainer-test-cpu.jsonl

# The main job `make run` runs: at-train on the CPU default (experiment=cpu_default), after
# building the tiny models and the tiny agent (at-models; a no-op once they are in the cache).
RUN_MAIN = $(BIN)/at-models && $(BIN)/at-train $(ARGS)

.PHONY: setup run test test-fast

setup:
	bash scripts/setup.sh

run: setup
	$(RUN_MAIN)

# Clusters the suite runs its cluster tests on (scripts/cluster.sh; started beside the tests and stopped after,
# unless already running): the SLURM and Ray tests skip with the reason where one cannot start. CLUSTERS= for none.
CLUSTERS ?= slurm ray mlflow
WITH_CLUSTERS = CLUSTERS="$(CLUSTERS)" bash scripts/with_clusters.sh

# The whole suite, slow tests included (CI runs exactly this).
test: setup
	$(WITH_CLUSTERS) $(BIN)/pytest -p no:cacheprovider --timeout=$(TEST_TIMEOUT) -n $(TEST_WORKERS) --dist loadgroup --durations=30 --cpu-report=$(CPU_REPORT) tests

# Unit tests only, for a quick check while editing: no model is built or imported (tests that need one the
# cache lacks are skipped with the reason; tests/helpers/run_if.py). About 2 minutes of CPU, on both cores.
test-fast: setup
	$(BIN)/pytest -p no:cacheprovider --timeout=$(TEST_TIMEOUT) -n $(TEST_WORKERS) -m "not slow" --no-model-builds tests/unit

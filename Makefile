# Quick start (fresh machine, nothing installed by hand):  make run  |  make test
# Both set the project up first (scripts/setup.sh: .venv, CPU torch, deps; quick when done).

VENV    ?= .venv
BIN     := $(VENV)/bin
ARGS    ?=
# Per-test limit of pytest-timeout, seconds.
TEST_TIMEOUT ?= 900

# The main job `make run` runs: the most complete pipeline there is. This is the one line to
# change when the outer loop lands (then: $(BIN)/at-train $(ARGS)).
RUN_MAIN = $(BIN)/at-models $(ARGS) && $(BIN)/at-eval table=true $(ARGS)

.PHONY: setup run test test-fast

setup:
	bash scripts/setup.sh

run: setup
	$(RUN_MAIN)

# The whole suite, slow tests included (CI runs exactly this).
test: setup
	$(BIN)/pytest -p no:cacheprovider --timeout=$(TEST_TIMEOUT) tests

# Unit tests only, for a quick check while editing.
test-fast: setup
	$(BIN)/pytest -p no:cacheprovider --timeout=$(TEST_TIMEOUT) -m "not slow" tests/unit

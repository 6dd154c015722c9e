#!/usr/bin/env bash
# The GPU check's shell entry point, for a lent GPU machine: bash scripts/gpu_check.sh [--tiny --device cpu]
# All of it is bench/gpu_check.py (what it measures, its options, $OUT and GPU_CHECK_TIMEOUT); this runs it with
# the project's venv when there is one, else with python3 (a device machine's own torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" bench/gpu_check.py "$@"

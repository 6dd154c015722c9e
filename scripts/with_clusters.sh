#!/usr/bin/env bash
# Run a command with the clusters of scripts/cluster.sh up, then stop the ones this call started (a cluster that
# was already running is left running). make test runs the suite through it, so the cluster tests
# (tests/integration/test_clusters.py) run against a real SLURM and a real two-node Ray:
#
#   CLUSTERS="slurm ray mlflow" bash scripts/with_clusters.sh .venv/bin/pytest tests/integration/test_clusters.py
#
# CLUSTERS (default "slurm ray mlflow"; mlflow: the server a sweep on SLURM logs to; empty: none). A cluster that
# cannot start here (no root for apt-get, no Ray) is reported in one line and the command runs anyway: its tests
# skip with the reason. They start side by side (~10 s for SLURM once installed, ~30-90 s for Ray and ~45 s for
# the MLflow server on 2 busy cores) before the command runs.
set -uo pipefail
cd "$(dirname "$0")/.."
CLUSTERS=${CLUSTERS-slurm ray mlflow}
LOGS=${CLUSTER_DIR:-/tmp/agent-trainer-cluster}
mkdir -p "$LOGS"

started=()
pids=()
for c in $CLUSTERS; do
  if bash scripts/cluster.sh "$c" status >/dev/null 2>&1; then
    echo "with_clusters: $c is already running (left running after)"
    continue
  fi
  started+=("$c")
  bash scripts/cluster.sh "$c" start >"$LOGS/start-$c.log" 2>&1 &
  pids+=($!)
done

stop_started() {
  for c in "${started[@]}"; do bash scripts/cluster.sh "$c" stop >/dev/null 2>&1 || true; done
}
trap stop_started EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Wait for the starts here: a test must not see half a cluster (and would skip it).
for i in "${!pids[@]}"; do
  log=$LOGS/start-${started[$i]}.log
  if wait "${pids[$i]}"; then
    echo "with_clusters: ${started[$i]} started ($(tail -n 2 "$log" | head -n 1))"
  else
    echo "with_clusters: ${started[$i]} did not start, its tests will skip: $(tail -n 1 "$log")"
  fi
done

"$@"

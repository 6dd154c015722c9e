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
# the MLflow server on 2 busy cores) beside the command.
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
  # Started beside the command: a test that needs it waits while $LOGS/starting-$c names a live process
  # (tests/integration/test_clusters.py), the others run meanwhile.
  ( bash scripts/cluster.sh "$c" start >"$LOGS/start-$c.log" 2>&1; rc=$?; rm -f "$LOGS/starting-$c"; exit $rc ) &
  pids+=($!)
  echo "$!" > "$LOGS/starting-$c"
  echo "with_clusters: starting $c in the background (log: $LOGS/start-$c.log)"
done

report_and_stop() {
  for i in "${!pids[@]}"; do
    c=${started[$i]}
    if wait "${pids[$i]}"; then
      echo "with_clusters: $c had started ($(tail -n 2 "$LOGS/start-$c.log" | head -n 1))"
    else
      echo "with_clusters: $c did not start, its tests skipped: $(tail -n 1 "$LOGS/start-$c.log")"
    fi
    rm -f "$LOGS/starting-$c"
    bash scripts/cluster.sh "$c" stop >/dev/null 2>&1 || true
  done
}
trap report_and_stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

"$@"

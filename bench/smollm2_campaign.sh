#!/usr/bin/env bash
# The SmolLM2 experiments behind docs/evaluation.md ("Agents against people") and docs/strategy.md ("The fork
# experiment"), and a seed continued to 36 steps: each stage picks up where it stopped, so the same command is run
# again after an interruption (a session's end, a reboot) and finished work is skipped. About a day of CPU on a 2-core
# box (a SmolLM2 step ~2.5 min there when quiet, 3-4x that beside other work); a GPU shortens every stage. Only
# what lies in RUNS (and the model cache, where the warm start is built once, ~35 min) carries over: on a machine
# that is replaced between sessions, put RUNS and $AGENT_TRAINER_CACHE on a disk that outlives it.
#
#   bash bench/smollm2_campaign.sh                       # every stage, in order, in runs/smollm2_campaign
#   bash bench/smollm2_campaign.sh seeds people          # only these stages
#   RUNS=/data/campaign SOURCES=24 POINTS=16 bash bench/smollm2_campaign.sh fork
#
# Stages:
#   seeds   experiment=smollm2_cpu seeds 0-2 (RUNS/smollm2_seeds/N) and the tiny agent's seeds 0-2 (RUNS/tiny_seeds/N)
#   people  at-compare mode=people over both (RUNS/people): base, hand-written, teacher, warm start, trained
#   fork    SOURCES multi-job episodes (strategy=check) of trained seed 0, of the warm start and of seed 0 with the
#           evaluator; then at-fork over POINTS fork points with continue / switch:other / reconsider (RUNS/fork_points)
#   longer  seed 0 continued to 24 and 36 steps in place, its policies at 12, 24 and 36 steps replayed on the
#           training and held-out families (RUNS/longer_*); last, since it moves seed 0's last checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
RUNS=${RUNS:-runs/smollm2_campaign}
SOURCES=${SOURCES:-24}
POINTS=${POINTS:-16}
STEPS=12
STAGES=${*:-seeds people fork longer}
for stage in $STAGES; do   # a typo is refused before hours of the stages before it
  case $stage in seeds|people|fork|longer) ;;
    *) echo "smollm2_campaign: no stage '$stage' (seeds, people, fork, longer)" >&2; exit 2 ;; esac
done
mkdir -p "$RUNS"
log() { echo "[$(date +%H:%M:%S)] campaign: $*" >&2; }
set_aside() {   # an unfinished folder goes to RUNS/unfinished/ (out of the stages' globs), never deleted
  if [ -e "$1" ]; then mkdir -p "$RUNS/unfinished"; mv "$1" "$RUNS/unfinished/$(basename "$1")-$(date +%s)"; fi
}

steps_done() {   # complete steps of an at-train run folder (0 when there is none)
  "$BIN/python" - "$1" <<'EOF'
import sys
from pathlib import Path
print(len(list(Path(sys.argv[1]).glob("checkpoints/step_*"))) if Path(sys.argv[1], "run.json").is_file() else 0)
EOF
}

train() {   # train (or resume) the run RUNS/$1 to $3 steps; $2: the experiment; the rest: overrides
  local id=$1 experiment=$2 steps=$3; shift 3
  local dir=$RUNS/$id done
  done=$(steps_done "$dir")
  if [ "$done" -ge "$steps" ] && grep -q '"status": "ok"' "$dir/run.json"; then
    log "$id: $done steps, done"; return
  fi
  if [ "$done" -gt 0 ]; then
    log "$id: resuming after $done steps (to $steps)"
    "$BIN/at-train" "resume=$dir" "outer.steps=$steps"
  else
    set_aside "$dir"   # a run that ended before its first step
    log "$id: $experiment, $steps steps"
    "$BIN/at-train" "experiment=$experiment" "outer.steps=$steps" "runs_dir=$RUNS" "run_id=$id" "$@"
  fi
}

episode() {   # one at-episode run RUNS/$1 unless it has its summary; the rest: its overrides
  local id=$1; shift
  [ -f "$RUNS/$id/summary.json" ] && return
  set_aside "$RUNS/$id"
  log "$id"
  "$BIN/at-episode" "runs_dir=$RUNS" "run_id=$id" "$@"
}

adapter() {   # seed 0's adapter after its STEPS steps (kept when the longer stage continues the run)
  printf '%s/smollm2_seeds/0/checkpoints/step_%04d/adapter' "$RUNS" $((STEPS - 1))
}

for stage in $STAGES; do
  case $stage in
    seeds)
      for s in 0 1 2; do train "smollm2_seeds/$s" smollm2_cpu $STEPS "seed=$s"; done
      for s in 0 1 2; do train "tiny_seeds/$s" cpu_default 13 "seed=$s"; done ;;
    people)
      [ -f "$RUNS/people/people.json" ] && { log "people: done"; continue; }
      "$BIN/at-compare" mode=people "runs=[$RUNS/tiny_seeds,$RUNS/smollm2_seeds]" people.episodes=4 \
          "out=$RUNS/people" ;;
    fork)
      a=$(adapter)
      common=(task=examples/tasks/calc_chain_v1_tiny.json strategy=check budget.max_jobs_per_episode=3
              agent.max_turns=24)
      for s in $(seq 0 $((SOURCES - 1))); do
        episode "fork_src_$s" "${common[@]}" "adapter=$a" "seed=$s"
        episode "fork_ws_$s" "${common[@]}" agent=smollm2 agent.model=smollm2-agent-valid "seed=$s"
        episode "fork_ev_$s" "${common[@]}" "adapter=$a" strategy.evaluator.kind=rule \
            strategy.evaluator.show_to_agent=true "seed=$s"
      done
      [ -f "$RUNS/fork_points/fork_table.json" ] && { log "fork: done"; continue; }
      set_aside "$RUNS/fork_points"
      "$BIN/at-fork" "runs_dir=$RUNS" "run=fork_src_*" "points=$POINTS" \
          "branches=[continue,switch:other,reconsider]" run_id=fork_points \
          "rates=[warm_start:fork_ws_*,trained_with_evaluator:fork_ev_*]" ;;
    longer)
      train smollm2_seeds/0 smollm2_cpu 24
      train smollm2_seeds/0 smollm2_cpu 36
      at=$(printf 'start,%d,%d,%d' $((STEPS - 1)) $((2 * STEPS - 1)) $((3 * STEPS - 1)))
      for families in train heldout; do
        [ -f "$RUNS/longer_$families/policy_eval.json" ] && continue
        "$BIN/python" scripts/policy_eval.py "$RUNS/smollm2_seeds/0" --families $families --episodes 8 \
            --steps "$at" --out "$RUNS/longer_$families"
      done ;;
  esac
done
log "stages done: $STAGES"

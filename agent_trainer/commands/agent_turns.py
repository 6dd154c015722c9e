"""How often an agent's turns held a parsed tool call, per outer step, from a run folder's trajectories.

    python -m agent_trainer.commands.agent_turns runs/<run_id>            # at-train (episodes/s0000-...) or
                                                                          # at-episode (episodes/0)

Prints one line per step (at-episode: one line): episodes, agent turns, turns with a parsed call, their share,
and the tools called. Reads ``trajectory.jsonl`` only (assistant messages with ``tool_calls``).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_STEP = re.compile(r"^s(\d+)-")


def turn_stats(run_dir: str | Path) -> dict[str, dict]:
    """``{step: {"episodes", "turns", "parsed", "share", "tools"}}``; the step is ``-`` for at-episode's folder."""
    steps: dict[str, dict] = defaultdict(lambda: {"episodes": 0, "turns": 0, "parsed": 0, "tools": Counter()})
    for traj in sorted(Path(run_dir).glob("episodes/*/trajectory.jsonl")):
        m = _STEP.match(traj.parent.name)
        s = steps[str(int(m.group(1))) if m else "-"]
        s["episodes"] += 1
        for line in traj.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") != "message" or rec.get("role") != "assistant":
                continue
            s["turns"] += 1
            calls = rec.get("tool_calls") or []
            s["parsed"] += bool(calls)
            s["tools"].update(c["function"]["name"] for c in calls)
    for s in steps.values():
        s["share"] = s["parsed"] / s["turns"] if s["turns"] else 0.0
        s["tools"] = dict(s["tools"])
    return dict(steps)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m agent_trainer.commands.agent_turns <run folder>")
    for step, s in sorted(turn_stats(sys.argv[1]).items(), key=lambda kv: (kv[0] == "-", kv[0].zfill(6))):
        print(f"step {step}: {s['episodes']} episodes, {s['turns']} turns, {s['parsed']} with a parsed tool call "
              f"({s['share']:.2f}); tools {s['tools']}")


if __name__ == "__main__":
    main()

"""bench/smollm2_campaign.sh picks up where it stopped: run again over finished work, it starts nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "smollm2_campaign.sh"


def _run(runs: Path, *stages: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNS": str(runs), "BIN": str(Path(sys.executable).parent), "SOURCES": "2"}
    return subprocess.run(["bash", str(SCRIPT), *stages], capture_output=True, text=True, env=env, timeout=60)


def _finished_run(folder: Path, steps: int) -> None:
    for i in range(steps):
        (folder / "checkpoints" / f"step_{i:04d}").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"status": "ok", "steps_completed": steps}, indent=2))


def test_a_finished_campaign_run_again_starts_nothing(tmp_path):
    for s in range(3):
        _finished_run(tmp_path / "smollm2_seeds" / str(s), 36 if s == 0 else 12)
        _finished_run(tmp_path / "tiny_seeds" / str(s), 13)
    for name in ("people/people.json", "fork_points/fork_table.json", "longer_train/policy_eval.json",
                 "longer_heldout/policy_eval.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    for s in range(2):
        for kind in ("src", "ws", "ev"):
            (tmp_path / f"fork_{kind}_{s}").mkdir()
            (tmp_path / f"fork_{kind}_{s}" / "summary.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    out = _run(tmp_path)
    assert out.returncode == 0, out.stderr
    done = [line for line in out.stderr.splitlines() if line.endswith("done")]
    assert len(done) == 6 + 2 + 2, out.stderr   # each seed, people and fork, seed 0 at 24 and 36 steps
    assert "stages done: seeds people fork longer" in out.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, "nothing started, moved or written"


def test_a_stage_it_does_not_know_is_one_line_and_exit_2(tmp_path):
    out = _run(tmp_path, "seeds", "forks")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == "smollm2_campaign: no stage 'forks' (seeds, people, fork, longer)"
    assert not any(tmp_path.iterdir()), "refused before the first stage started"

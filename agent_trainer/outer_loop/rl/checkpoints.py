"""A run's checkpoints: one folder per complete step, written atomically, and what a resume reads back.

    runs/<run_id>/checkpoints/step_0003/{adapter/, optimizer, state.json, replay.json}
    runs/<run_id>/metrics.jsonl          one row per complete step

``prepare_resume`` moves aside what a killed step left (ledger records past the checkpoint, its episode folders,
its metrics row), so the resumed run replays that step from the checkpoint. docs/outer_loop.md, "Outer training".
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

CKPT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
REPLAY_FILE = "replay.json"      # rollouts kept for the next update (max_steps_off_policy > 0)


@dataclass
class StepState:
    """What a checkpoint remembers besides the adapter and optimizer."""

    step: int = 0                      # steps completed
    ledger_bytes: int = 0
    mlflow_run_id: str | None = None


def last_complete_step(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    ckpts = sorted((run_dir / CKPT_DIR).glob("step_[0-9][0-9][0-9][0-9]"))
    return ckpts[-1] if ckpts else None


def roll_back(run_dir: Path, state: StepState) -> None:
    """Move aside what a killed step left: ledger records past the checkpoint, its episode folders."""
    ledger = run_dir / "ledger.jsonl"
    if ledger.exists() and ledger.stat().st_size > state.ledger_bytes:
        with open(ledger, "rb+") as fh:
            fh.seek(state.ledger_bytes)
            tail = fh.read()
            fh.truncate(state.ledger_bytes)
        with open(run_dir / "ledger.rolled_back.jsonl", "ab") as out:
            out.write(tail if tail.endswith(b"\n") or not tail else tail + b"\n")
    for ep in (run_dir / "episodes").glob("s*"):
        try:
            step = int(ep.name[1:5])
        except ValueError:
            continue
        if step >= state.step:
            dest = run_dir / "rolled_back" / ep.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                shutil.rmtree(dest)
            shutil.move(str(ep), dest)
    metrics = run_dir / METRICS_FILE
    if metrics.exists():
        keep = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < state.step]
        metrics.write_text("".join(ln + "\n" for ln in keep))


def prepare_resume(run_dir: Path) -> StepState:
    """The state after the last complete step, with what a killed step left moved aside (see module doc).

    Call it before opening the run's ledger: it truncates the ledger to the checkpoint's offset."""
    run_dir = Path(run_dir)
    ckpt = last_complete_step(run_dir)
    state = StepState(**json.loads((ckpt / "state.json").read_text())) if ckpt is not None else StepState()
    roll_back(run_dir, state)
    return state


def read_metrics_file(run_dir: Path) -> list[dict]:
    """Per-step metrics of complete steps, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def save_step(run_dir: Path, step: int, policy, replay: list, metrics: dict, state: StepState) -> None:
    """Write step ``step``'s checkpoint (the policy's adapter and optimizer, the kept rollouts, ``state`` advanced
    past the step) and its metrics row. The folder is renamed into place last: a kill leaves the previous
    checkpoint whole, and a step checkpointed again (a rolled-back step replayed) replaces its old folder."""
    run_dir = Path(run_dir)
    final = run_dir / CKPT_DIR / f"step_{step:04d}"
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    policy.save(tmp)
    (tmp / REPLAY_FILE).write_text(json.dumps([asdict(s) for s in replay]))
    with open(run_dir / METRICS_FILE, "a") as fh:
        fh.write(json.dumps({"step": step, **metrics}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    state.step = step + 1
    state.ledger_bytes = (run_dir / "ledger.jsonl").stat().st_size if (run_dir / "ledger.jsonl").exists() else 0
    (tmp / "state.json").write_text(json.dumps(asdict(state)))
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    from agent_trainer import sweeps

    if (run_dir / sweeps.RUN_FILE).is_file():  # the run folder says it holds a complete step
        sweeps.write_run_file(run_dir, steps_completed=step + 1)


def load_replay(ckpt: Path) -> list[dict]:
    """The kept rollouts of checkpoint ``ckpt`` (``TurnSample`` fields), [] when it kept none."""
    path = Path(ckpt) / REPLAY_FILE
    return json.loads(path.read_text()) if path.exists() else []

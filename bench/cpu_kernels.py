"""What ``hardware.cpu_kernels=portable`` costs: the same jobs with the native and the portable kernels, side by side.

Each round runs every job once with each setting (the order alternates round by round, so a change of the machine's
load falls on both sides), each as a user would: ``at-job <job> hardware.cpu_kernels=<setting>`` (its own process,
whose scoring runs the setting's kernels too), one torch thread, no job cache. Prints the training seconds and
the scores per setting, and one ratio: the median over jobs of portable's training seconds over native's (rounds'
medians). The scores of a setting must be the same every round (each setting is deterministic); native and
portable scores may differ (other kernels round differently: docs/inner_loop.md, "The same numbers on another
CPU"). Exit 1 when a setting's scores differ between rounds.

    .venv/bin/python bench/cpu_kernels.py                        # sft_full, grpo_lora; 2 rounds (~6 min on 2 cores)
    .venv/bin/python bench/cpu_kernels.py --jobs sft_full --rounds 1
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from agent_trainer.kernels import portable  # noqa: E402

SETTINGS = ("native", "portable")


def run(job: str, setting: str, runs_dir: Path, run_id: str) -> dict:
    """``at-job`` of an example job with ``hardware.cpu_kernels=<setting>``; its result.json."""
    cmd = [str(Path(sys.executable).parent / "at-job"), str(C.ROOT / "examples" / "jobs" / job),
           "task=calc_chain_v1_fast", f"hardware.cpu_kernels={setting}", "hardware.threads_per_job=1",
           "inner.cache=false", "tracking=off", f"runs_dir={runs_dir}", f"run_id={run_id}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    result = runs_dir / run_id / "job" / "result.json"
    if proc.returncode != 0 or not result.is_file():
        raise SystemExit(f"{job} ({setting}) failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(result.read_text())


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--jobs", default="sft_full,grpo_lora", help="comma-separated example jobs")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    wd = C.workdir(a.workdir, "cpu_kernels")
    names = [x for x in a.jobs.split(",") if x]
    seconds: dict[tuple[str, str], list[float]] = {}
    scores: dict[tuple[str, str], set] = {}
    for r in range(a.rounds):
        for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
            for name in names:
                res = run(name, setting, wd, f"{name}-{setting}-{r}")
                if res["status"] != "ok" or portable(res["cpu"]) != (setting == "portable"):   # what it ran
                    raise SystemExit(f"{name} ({setting}): {res['status']} {res['detail']} {res['cpu']}")
                seconds.setdefault((name, setting), []).append(res["seconds"]["train"])
                scores.setdefault((name, setting), set()).add(res["hidden_score"])
                print(f"  round {r} {setting:8s} {name}: {res['seconds']['train']:.1f} s, hidden "
                      f"{res['hidden_score']}, kernels {res['cpu']}", flush=True)
    rows, ratios = [], []
    for name in names:
        med = {s: statistics.median(seconds[(name, s)]) for s in SETTINGS}
        ratios.append(med["portable"] / med["native"])
        rows.append((name, f"{med['native']:.1f}", f"{med['portable']:.1f}", f"{ratios[-1]:.2f}",
                     ", ".join(map(str, sorted(scores[(name, 'native')]))),
                     ", ".join(map(str, sorted(scores[(name, 'portable')])))))
    C.table(rows, ("job", "native train s", "portable train s", "ratio", "native hidden", "portable hidden"))
    same = all(len(v) == 1 for v in scores.values())
    print(f"each setting's scores the same every round: {'yes' if same else 'NO'}")
    claim = C.ratio("portable_kernels_train_seconds", statistics.median(ratios), "<= 1.5")
    C.write(a.json, "cpu_kernels", {"rounds": a.rounds, "ratio": claim, "deterministic": same,
                                    "seconds": {f"{n}/{s}": v for (n, s), v in seconds.items()},
                                    "scores": {f"{n}/{s}": sorted(v) for (n, s), v in scores.items()}})
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Shared pieces of the benchmarks: a job folder, the task, a clock, a ratio line, the results file.

Every benchmark measures its two (or more) sides in the same run, one after the other, on the same
machine state, and prints a table plus one ``RATIO`` line per claim::

    RATIO harness_overhead 1.08 (target <= 1.15): PASS

``--json PATH`` also writes the numbers (for bench/RESULTS.md). Torch runs on one thread per process
unless a benchmark says otherwise: the benchmark machine may run other work at the same time, and one
thread per process keeps the timings comparable between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TASK_SPEC = ROOT / "examples" / "tasks" / "calc_chain_v1_fast.json"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers to this JSON file")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    return p


def workdir(arg: Path | None, name: str) -> Path:
    import tempfile

    path = arg or Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def task(hidden_n: int | None = None, max_steps: int | None = None):
    """The calc_chain fast task, optionally with another hidden-eval size or step budget."""
    from agent_trainer.evaluation.tasks import load_task

    t = load_task(TASK_SPEC)
    update: dict[str, Any] = {}
    if hidden_n:
        update["hidden_eval_size"] = hidden_n
    if max_steps:
        update["budget"] = t.budget.model_copy(update={"max_steps": max_steps})
    return t.model_copy(update=update) if update else t


def sft_job(folder: Path, steps: int, seed: int = 0, batch_size: int = 64, lr: float = 3e-3, size: int = 8000) -> Path:
    """An SFT job folder like examples/jobs/sft_full (full fine-tuning of tiny-s on calc_chain)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"base_model": "tiny-s", "algorithm": "sft",
            "hyperparameters": {"learning_rate": lr, "lr_scheduler": "cosine", "warmup_ratio": 0.05,
                                "batch_size": batch_size, "max_steps": steps},
            "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": size}]}, "seed": seed}
    (folder / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


@contextmanager
def clock(into: dict, key: str):
    """Wall seconds of the block, stored in ``into[key]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = round(time.perf_counter() - t0, 3)


def table(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def ratio(name: str, value: float, target: str) -> dict[str, Any]:
    """Print and return one claim: ``target`` is like '<= 1.15' or '>= 5'."""
    op, bound = target.split()
    ok = value <= float(bound) if op == "<=" else value >= float(bound)
    print(f"RATIO {name} {value:.3f} (target {target}): {'PASS' if ok else 'FAIL'}")
    return {"name": name, "value": round(value, 4), "target": target, "pass": ok}


def cpu() -> dict[str, Any]:
    """The CPU's vendor and model (``/proc/cpuinfo``) and the kernel level torch runs at (AVX2, AVX512, ...): the
    same workload can take other memory and time at another level."""
    info: dict[str, Any] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("vendor_id", "model name"):
                info.setdefault(key.strip().replace(" ", "_"), value.strip())
    except OSError:
        pass
    import sys

    if "torch" in sys.modules:
        info["torch_cpu_capability"] = sys.modules["torch"].backends.cpu.get_cpu_capability()
    return info


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cores": os.cpu_count(), **cpu(), "load_avg_1m": round(load[0], 2) if load else None,
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write(path: Path | None, name: str, data: dict[str, Any]) -> None:
    out = {"bench": name, "machine": machine(), **data}
    print(f"machine: {out['machine']}")
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2, default=str) + "\n")


def one_thread() -> None:
    import torch

    torch.set_num_threads(1)

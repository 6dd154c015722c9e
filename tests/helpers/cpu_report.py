"""``--cpu-report FILE``: each test's wall time and the CPU it used (the test process's own threads and the
child processes it waited for), one JSON line per test, and at the end of the session the suite's CPU share and
the tests that waited most, i.e. where the suite's wall time is not work:

    .venv/bin/pytest -n 2 --cpu-report /tmp/cpu.jsonl tests

CPU that a test causes outside the processes it waits for is not counted, and such tests read as waiting: a
SLURM task under slurmd, a task on a Ray node, a server the test talks to, and the inner jobs of the executors'
forkserver (its processes are reaped by the forkserver, not by the test). The share is a floor, not a measure of
idle cores; ``idle_s`` is: the machine's idle core-seconds while the test ran (``/proc/stat``), which with two
workers counts a core the other worker left idle too, but is where waiting (a sleep, a poll, a cluster's
scheduler) costs the suite wall time."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

OPTION = "--cpu-report"


def _idle_s() -> float:
    """The machine's idle seconds over all cores since boot (0 where ``/proc/stat`` cannot be read)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")   # idle + iowait
    except (OSError, IndexError, ValueError):
        return 0.0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption(OPTION)
    if not path:
        yield
        return
    wall, own, children, idle = time.perf_counter(), time.process_time(), _children_cpu(), _idle_s()
    yield
    row = {"test": item.nodeid, "wall_s": round(time.perf_counter() - wall, 2),
           "cpu_s": round(time.process_time() - own, 2), "children_cpu_s": round(_children_cpu() - children, 2),
           "idle_s": round(_idle_s() - idle, 2),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a") as f:   # one short line per write: the workers' appends do not interleave
        f.write(json.dumps(row) + "\n")


def summary(path: Path, top: int = 15) -> list[str]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    wall = sum(r["wall_s"] for r in rows)
    cpu = sum(r["cpu_s"] + r["children_cpu_s"] for r in rows)
    idle = sum(r.get("idle_s", 0.0) for r in rows)
    lines = [f"cpu report: {len(rows)} tests, {wall:.0f} s of test wall time, {cpu:.0f} s of CPU in the tests' "
             f"processes ({cpu / max(wall, 1e-9):.0%}, a floor: forkserver jobs and cluster tasks are not counted), "
             f"{idle:.0f} idle core-seconds of the machine while they ran; idle most:"]
    rows.sort(key=lambda r: -r.get("idle_s", 0.0))
    for r in rows[:top]:
        used = r["cpu_s"] + r["children_cpu_s"]
        lines.append(f"  {r['wall_s']:7.1f} s wall {used:7.1f} s CPU {r.get('idle_s', 0.0):7.1f} s idle  {r['test']}")
    return lines


def pytest_sessionstart(session):
    path = session.config.getoption(OPTION)
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):   # the controller starts the file afresh
        Path(path).unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, config):
    path = config.getoption(OPTION)
    if path and Path(path).is_file() and not os.environ.get("PYTEST_XDIST_WORKER"):
        for line in summary(Path(path)):
            terminalreporter.write_line(line)

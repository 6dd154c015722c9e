"""An inner job process that dies without a final status: its result says how (exit code, signal, the kernel's
out-of-memory killer) and its ``worker.log`` keeps its own output's tail with the harness's line after it."""

from __future__ import annotations

import sys

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.run.worker import WORKER_LOG, final_status

DIE = "import os, sys; print('loading the model', file=sys.stderr, flush=True); {how}"


def crash(tmp_path, how: str, oom_file=None) -> dict:
    """Start a real isolated child that ends as ``how`` says; the status the harness gives it."""
    out = tmp_path / "out"
    out.mkdir()
    with open(out / WORKER_LOG, "wb") as log:
        proc = isolation.start([sys.executable, "-I", "-c", DIE.format(how=how)], cwd=tmp_path, env={},
                               stdout=log, stderr=isolation.STDOUT)
        if oom_file is not None:   # the kernel counts an out-of-memory kill while the job runs
            oom_file.write_text("oom 1\noom_kill 4\n")
        proc.wait()
    return final_status(out, killed=False, returncode=proc.returncode, deadline_s=60)


def test_an_exit_code_is_kept_with_the_output_tail(tmp_path):
    st = crash(tmp_path, "sys.exit(3)")
    assert st["status"] == "crashed" and "exited with code 3" in st["detail"]
    assert "loading the model" in st["error"] and "[harness] the job process exited with code 3" in st["error"]


def test_a_sigkill_with_an_out_of_memory_kill_counted_says_so(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 3\n")
    monkeypatch.setattr(isolation, "_OOM_FILES", (str(events),))
    monkeypatch.setattr(isolation, "_oom_seen", [])
    st = crash(tmp_path, "os.kill(os.getpid(), 9)", oom_file=events)
    assert "killed by SIGKILL (signal 9): the kernel's out-of-memory killer" in st["detail"]
    assert "3 -> 4" in st["detail"]
    log = (tmp_path / "out" / WORKER_LOG).read_text()
    assert log.startswith("loading the model") and "out-of-memory killer" in log


def test_a_sigkill_without_an_out_of_memory_kill_is_not_called_one(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 3\n")
    monkeypatch.setattr(isolation, "_OOM_FILES", (str(events),))
    monkeypatch.setattr(isolation, "_oom_seen", [])
    st = crash(tmp_path, "os.kill(os.getpid(), 9)")
    assert "killed by SIGKILL (signal 9): not by the harness, and no out-of-memory kill" in st["detail"]


def test_a_machine_wide_out_of_memory_kill_is_called_one(tmp_path, monkeypatch):
    """The kernel's own count (/proc/vmstat) rises on a machine-wide out-of-memory kill that the container's
    memory cgroup does not count: the harness reads both."""
    cgroup, vmstat = tmp_path / "memory.events", tmp_path / "vmstat"
    cgroup.write_text("oom 0\noom_kill 0\n")
    vmstat.write_text("pgfault 12\noom_kill 1\n")
    monkeypatch.setattr(isolation, "_OOM_FILES", (str(cgroup), str(vmstat)))
    monkeypatch.setattr(isolation, "_oom_seen", [])
    st = crash(tmp_path, "os.kill(os.getpid(), 9)", oom_file=vmstat)
    assert "the kernel's out-of-memory killer" in st["detail"] and "1 -> 4" in st["detail"], st["detail"]

"""The one launcher (agent_trainer.inner_loop.isolation.launcher): no other module starts a process, and each start is
isolated.

Every module of the project's packages is parsed with ``ast`` (nothing is imported): a process
start anywhere but ``agent_trainer/inner_loop/isolation/launcher.py`` fails the test, so a new launcher cannot be added
without the isolation flags.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.isolation.launcher import LaunchError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_trainer",)
LAUNCHER = "agent_trainer/inner_loop/isolation/launcher.py"
MODULES = {"subprocess", "multiprocessing", "pty", "pexpect", "concurrent.futures.process"}
OS_CALLS = ("fork", "forkpty", "system", "popen", "spawn", "exec", "posix_spawn")
NAMES = {"ProcessPoolExecutor", "create_subprocess_exec", "create_subprocess_shell"}


def process_starts(source: str) -> list[str]:
    """What in ``source`` starts (or imports the means to start) a process."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in MODULES or a.name.split(".")[0] in MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in MODULES or node.module.split(".")[0] in MODULES:
                found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name in NAMES or (node.module == "os" and a.name.startswith(OS_CALLS))]
        elif isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else ""
            if (base == "os" and node.attr.startswith(OS_CALLS)) or node.attr in NAMES:
                found.append(f"{base}.{node.attr}")
    return found


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=[str(p.relative_to(ROOT)) for p in modules()])
def test_only_the_launcher_starts_processes(path):
    rel = path.relative_to(ROOT).as_posix()
    starts = process_starts(path.read_text())
    if rel == LAUNCHER:
        assert starts, "the launcher is where processes start"
        return
    assert not starts, (
        f"{rel} starts processes itself ({starts}); go through agent_trainer.inner_loop.isolation.launcher")


@pytest.mark.parametrize("source", [
    "import subprocess", "from subprocess import Popen", "import multiprocessing as mp",
    "from multiprocessing import get_context", "from concurrent.futures import ProcessPoolExecutor",
    "import os\nos.system('x')", "import os\nos.execv('/bin/sh', [])", "import os\nos.fork()",
    "from os import posix_spawn", "import asyncio\nasyncio.create_subprocess_exec('x')", "import pty",
])
def test_the_scan_catches_every_way_to_start_a_process(source):
    assert process_starts(source)


def test_harmless_code_is_not_reported():
    assert not process_starts("import os\nos.path.join('a')\nos.environ.get('X')\nimport json")


def test_a_child_without_isolated_mode_is_refused(tmp_path):
    for argv in ([sys.executable, "-c", "pass"], ["/bin/sh", "-c", "true"], ["bwrap", "--", "/bin/sh"],
                 ["bwrap", "--", sys.executable, "-I", "-c", "x", sys.executable, "-c", "y"]):
        with pytest.raises(LaunchError):
            isolation.start(argv, cwd=tmp_path, env={})


def test_a_working_directory_inside_an_agent_folder_is_refused(tmp_path):
    job = tmp_path / "job"
    (job / "sub").mkdir(parents=True)
    argv = isolation.python_module("json.tool")
    for cwd in (job, job / "sub"):
        with pytest.raises(LaunchError, match="inside the agent folder"):
            isolation.start(argv, cwd=cwd, env={}, agent_dirs=[job])
    # The harness's own output folder inside a job folder is allowed (run_job's default <job>/output).
    (job / "output").mkdir()
    proc = isolation.start([sys.executable, "-I", "-c", "pass"], cwd=job / "output", env={}, agent_dirs=[job],
                           harness_dirs=[job / "output"])
    assert proc.wait(timeout=60) == 0


def test_a_child_imports_nothing_from_its_folders_and_gets_no_secrets(tmp_path, monkeypatch):
    """A planted json.py beside the child and on PYTHONPATH is never imported; secrets never arrive."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "LEAKED"
    (planted / "json.py").write_text(f"open({str(marker)!r}, 'w').write('LEAKED')\n")
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('LEAKED')\n")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted")
    out = tmp_path / "out.txt"
    code = ("import json, os, sys\n"
            f"open({str(out)!r}, 'w').write(json.dumps({{'path': sys.path, 'env': sorted(os.environ), "
            "'cwd': os.getcwd(), 'json': json.__file__}))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(planted), "OPENAI_API_KEY": "sk-planted", "HOME": str(planted)}
    proc = isolation.start([sys.executable, *isolation.PYTHON_FLAGS, "-c", code], cwd=planted, env=env)
    assert proc.wait(timeout=60) == 0
    seen = __import__("json").loads(out.read_text())
    assert not marker.exists(), "a planted module ran"
    assert str(planted) not in seen["path"] and "" not in seen["path"]
    assert "planted" not in seen["json"]
    assert "OPENAI_API_KEY" not in seen["env"] and "PYTHONPATH" not in seen["env"]


def test_python_module_runs_the_harness_module_from_a_neutral_folder(tmp_path):
    """The boot line runs a project module as -m would, with the code root appended, not prepended."""
    out = tmp_path / "o.txt"
    argv = isolation.python_module("agent_trainer.inner_loop.spec.probe", str(tmp_path / "missing.json"), str(out))
    proc = isolation.start(argv, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, stderr=isolation.STDOUT,
                           stdout=open(tmp_path / "log", "wb"))
    assert proc.wait(timeout=120) != 0  # the request file is missing: the module ran and failed on it
    assert "missing.json" in (tmp_path / "log").read_text()
    assert argv[1:4] == ["-I", "-B", "-u"]


def test_clean_sys_path_drops_relative_entries_and_agent_folders(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    paths = ["", ".", "rel", str(job), str(job / "pkg"), "/usr/lib/python3", str(tmp_path)]
    assert isolation.clean_sys_path(paths, [job]) == ["/usr/lib/python3", str(tmp_path)]


def test_a_child_dies_with_a_harness_killed_outright(tmp_path):
    """A harness killed by SIGKILL runs no clean-up; its job must not train on, orphaned."""
    import os
    import signal
    import subprocess
    import time

    harness = ("import sys\nfrom agent_trainer.inner_loop.isolation import launcher as isolation\n"
               "p = isolation.start([sys.executable, '-I', '-c', 'import time; time.sleep(120)'], cwd=sys.argv[1], "
               "env={})\nprint(p.pid, flush=True)\nimport time; time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", harness, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert os.path.exists(f"/proc/{child}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{child}/stat").read().split()[2]
        except OSError:
            break
        if state == "Z":  # reaped by init soon; already dead
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the child outlived its killed harness")


def test_a_zombie_counts_as_exited_and_a_running_child_does_not():
    """A sandbox's first process, killed, lingers as a zombie until the machine's init reaps it (over a second on
    some hosts): it holds nothing, so the clean-up that waits for it must not wait for the reaping."""
    import subprocess
    import time

    running = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{done.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # dead, not yet reaped
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert isolation.exited(done.pid) and not isolation.exited(running.pid)
    finally:
        running.kill()
        running.wait()
        done.wait()
    assert isolation.exited(done.pid) and isolation.exited(running.pid)   # reaped: gone from /proc

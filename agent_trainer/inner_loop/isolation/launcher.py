"""The one launcher of every child process the harness starts, and the isolation each one gets.

    argv = isolation.python_module("agent_trainer.inner_loop.run.worker", str(job_dir), "--model", ...)
    proc = isolation.start(argv, cwd=out / ".home", env=env, agent_dirs=[job_dir], stdout=log)
    isolation.kill_group(proc.pid)

No other module starts a process (``tests/unit/test_isolation.py``). Every child runs ``python -I``
from a folder outside the agent's, with a whitelisted environment, its own process group and rlimits.
What it covers, and what it leaves to ``agent_trainer.inner_loop.isolation.sandbox``: docs/security.md, "One launcher".
"""

from __future__ import annotations

import atexit
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from agent_trainer.inner_loop.run.job_env import STEP_DELAY_ENV
from agent_trainer.kernels import KERNEL_ENV
from agent_trainer.registry import REGISTRY_ENV
from agent_trainer.trace import TRACE_ENV

# Interpreter flags of every Python child: isolated mode, no bytecode written, unbuffered output.
PYTHON_FLAGS = ("-I", "-B", "-u")
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
SAFE_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONHASHSEED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
            "HF_DATASETS_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES", *REGISTRY_ENV, STEP_DELAY_ENV, TRACE_ENV,
            *KERNEL_ENV)

# Runs a module as ``python -m`` would, with the harness's code roots appended to sys.path (argv[1]).
_BOOT = ("import json, runpy, sys\n"
         "sys.path.extend(p for p in json.loads(sys.argv[1]) if p not in sys.path)\n"
         "module = sys.argv[2]\n"
         "sys.argv = [module, *sys.argv[3:]]\n"
         "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


STDOUT, DEVNULL, TimeoutExpired = subprocess.STDOUT, subprocess.DEVNULL, subprocess.TimeoutExpired


class LaunchError(RuntimeError):
    """A child process the harness must not start as asked (a harness bug, never a job's fault)."""


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """Only whitelisted names, and never one that looks like a credential."""
    return {k: str(v) for k, v in env.items() if k in SAFE_ENV and not SECRET_NAME.search(k)}


def code_roots() -> list[str]:
    """The folders that hold the harness's packages (``inner_loop``, ``evaluation``), for children's sys.path."""
    from agent_trainer import evaluation
    from agent_trainer import inner_loop

    roots = [str(Path(pkg.__file__).resolve().parents[2]) for pkg in (inner_loop, evaluation)]
    return list(dict.fromkeys(roots))


def python_module(module: str, *args: str) -> list[str]:
    """``python -I -B`` running ``module`` as ``-m`` would, the harness's code roots appended to sys.path."""
    return [sys.executable, *PYTHON_FLAGS, "-c", _BOOT, json.dumps(code_roots()), module, *map(str, args)]


def python_file(path: str | Path, *args: str) -> list[str]:
    """``python -I -B FILE ARGS``: a standalone script (the reward host)."""
    return [sys.executable, *PYTHON_FLAGS, str(path), *map(str, args)]


def check_argv(argv: Sequence[str]) -> None:
    """Every interpreter in ``argv`` is ``sys.executable -I``; a wrapper (bubblewrap) ends its options with ``--``."""
    argv = [str(a) for a in argv]
    inner = argv
    if argv and argv[0] != sys.executable:  # a wrapper: its command follows its options' '--'
        inner = argv[argv.index("--") + 1:] if "--" in argv else []
    if not inner or inner[0] != sys.executable:
        raise LaunchError(f"{argv[:1]} is neither this interpreter nor a wrapper whose command (after '--') is "
                          "this interpreter")
    for i, arg in enumerate(inner):
        if arg == sys.executable and (i + 1 >= len(inner) or inner[i + 1] != "-I"):
            raise LaunchError(f"an interpreter runs without -I (isolated mode): {inner[i:i + 3]}")


def _inside(path: Path, folders: Iterable[Path]) -> Path | None:
    for folder in folders:
        if path == folder or folder in path.parents:
            return folder
    return None


def neutral_cwd(cwd: str | Path, agent_dirs: Iterable[str | Path] = (),
                harness_dirs: Iterable[str | Path] = ()) -> Path:
    """``cwd`` resolved, after checking it exists and lies outside every agent folder.

    ``harness_dirs``: folders the harness made and owns even where they sit inside an agent folder
    (``run_job``'s default output folder, ``<job>/output``, holds the job process's fresh home)."""
    path = Path(cwd).resolve()
    if not path.is_dir():
        raise LaunchError(f"working directory {path} does not exist")
    hit = _inside(path, [Path(d).resolve() for d in agent_dirs])
    if hit is not None and _inside(path, [Path(d).resolve() for d in harness_dirs]) is None:
        raise LaunchError(f"working directory {path} is inside the agent folder {hit}")
    return path


def clean_sys_path(paths: Iterable[str], agent_dirs: Iterable[str | Path] = ()) -> list[str]:
    """``paths`` without relative entries ('' is the working directory) and without agent folders."""
    agents = [Path(d).resolve() for d in agent_dirs]
    return [p for p in paths if p and os.path.isabs(p) and _inside(Path(p).resolve(), agents) is None]


def _set_limits(limits: dict[str, int]) -> None:  # in the child, before exec
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _die_with_parent()


def _die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (a harness killed by SIGTERM or SIGKILL
    runs no clean-up; without this its job would train on, orphaned). Linux only; elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(argv: Sequence[str], *, cwd: str | Path, env: dict[str, str], agent_dirs: Iterable[str | Path] = (),
          harness_dirs: Iterable[str | Path] = (), limits: dict[str, int] | None = None,
          stdout: Any = subprocess.DEVNULL, stderr: Any = subprocess.DEVNULL,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv`` isolated (see the module docstring); returns the ``Popen``. ``LaunchError`` if not allowed."""
    check_argv(argv)
    where = neutral_cwd(cwd, agent_dirs, harness_dirs)
    rlimits = {"RLIMIT_CORE": 0, **(limits or {})}
    _note_oom_count()
    return subprocess.Popen([str(a) for a in argv], cwd=where, env=scrub_env(env), stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, start_new_session=True, close_fds=True,
                            pass_fds=tuple(pass_fds), preexec_fn=lambda: _set_limits(rlimits))


def kill_group(pid: int) -> None:
    """SIGKILL the process group of ``pid`` (each child leads its own); the process alone if it has none yet."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # a warm process killed before its setsid: kill it alone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    except PermissionError:  # the group is led by another uid (a sandbox's): its namespace dies with it
        pass


def exited(pid: int) -> bool:
    """Whether process ``pid`` has exited: gone from ``/proc``, or a zombie (dead, its memory freed, only its exit
    status left for a parent to reap; an orphan waits on the machine's init for that, which on some hosts takes
    over a second). A PID namespace's first process becomes a zombie only once every process of its namespace has
    exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in (b"Z", b"X")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, its reaped children's included) of process ``pid`` and every live descendant,
    from ``/proc`` (0 where it cannot be read). A sandbox's processes sit in their own PID namespace and session but
    keep the host's parent links, so the whole tree of a job is counted. Unlike the clock, this hardly moves with
    the machine's load: what a job's own work costs."""
    parents: dict[int, list[tuple[int, float]]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the name: state, ppid, ..., utime, stime, cutime, cstime are fields 14-17 of stat(5).
        cpu = sum(int(x) for x in fields[11:15]) / tick
        parents.setdefault(int(fields[1]), []).append((int(entry.name), cpu))
    total, todo, seen = 0.0, [pid], set()
    own = next((c for kids in parents.values() for p, c in kids if p == pid), 0.0)
    total += own
    while todo:
        for child, cpu in parents.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                total += cpu
                todo.append(child)
    return total


# Files that count the kernel's out-of-memory kills: this machine's (container's) memory cgroup, v2 or v1, and the
# kernel's own count (``/proc/vmstat``), which a machine-wide out-of-memory kill raises and a cgroup's may not.
_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control", "/proc/vmstat")
_oom_seen: list[int | None] = []   # the count when the harness last looked (read at the first process start)


def oom_kill_count() -> int | None:
    """The kernel's out-of-memory kills so far, summed over the readable ``_OOM_FILES`` (a kill may be counted in
    more than one: only an increase means anything), None when none is readable."""
    counts = []
    for name in _OOM_FILES:
        try:
            for line in Path(name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    counts.append(int(value))
                    break
        except (OSError, ValueError):
            continue
    return sum(counts) if counts else None


def describe_exit(returncode: int | None, log_path: str | Path | None = None) -> str:
    """How a child that gave no final status ended, in words (``killed by SIGKILL (signal 9): the kernel's
    out-of-memory killer ...``); appended as a ``[harness]`` line to ``log_path`` (its own output's tail stays)."""
    if returncode is None:
        reason = "ended without an exit status"
    else:
        sig = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
        if sig is None:
            reason = f"exited with code {returncode}"
        else:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            how = "killed by" if returncode < 0 else f"exited with code {returncode}: its process was killed by"
            reason = f"{how} {name} (signal {sig})"
            if sig == signal.SIGKILL:
                before = _oom_seen[0] if _oom_seen else None
                now = oom_kill_count()
                if now is not None and before is not None and now > before:
                    reason += (f": the kernel's out-of-memory killer (out-of-memory kills counted on this machine "
                               f"{before} -> {now}); give the job less memory (batch, model) or run fewer "
                               f"jobs at once")
                elif now is not None:
                    reason += ": not by the harness, and no out-of-memory kill was counted (another process sent it)"
                else:
                    reason += ": not by the harness; most likely the kernel's out-of-memory killer (its count is " \
                              "not readable here)"
                _oom_seen[:] = [now]
    if log_path is not None:
        try:
            with open(log_path, "a") as log:
                log.write(f"\n[harness] the job process {reason}\n")
        except OSError:  # the output folder is gone: the reason still goes into the result
            pass
    return reason


def _note_oom_count() -> None:
    """Remember the out-of-memory kill count at the first start (``describe_exit`` compares with it)."""
    if not _oom_seen:
        _oom_seen.append(oom_kill_count())


def run_check(argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """Run a short harness command (no agent file involved), output captured, environment scrubbed."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout_s, cwd="/",
                          env=scrub_env(dict(os.environ)), stdin=subprocess.DEVNULL, start_new_session=True)


# --- warm workers ------------------------------------------------------------------------------
# A fresh interpreter pays ~10 s importing torch/transformers/TRL before a job's first step. Warm job
# processes are forked from a multiprocessing forkserver that imported those once (and ran no torch
# op, so no thread pool is forked). The forkserver is started with a scrubbed environment, so no
# harness secret is in the memory a job is forked from; it runs no agent code and never in an agent
# folder. Each job still gets its own new process, session, environment, limits and working folder.

_forkservers: dict[tuple[str, ...], Any] = {}
_server_output: list[str] = []  # the file holding the forkserver's stderr
ERROR_TAIL_BYTES = 4000  # of a warm child's start-up error copied into its job's log


def _size(path: str | Path | None) -> int:
    try:
        return os.path.getsize(path) if path is not None else 0
    except OSError:
        return 0


def forkserver(preload: Sequence[str], env: dict[str, str]):
    """The forkserver context that pre-imports ``preload`` (started on first use, scrubbed environment)."""
    key = tuple(preload)
    if key not in _forkservers:
        import multiprocessing
        from multiprocessing import forkserver as fs

        if multiprocessing.get_start_method(allow_none=True) not in (None, *multiprocessing.get_all_start_methods()):
            # This process was started by another library's context (joblib's loky, under Hydra's joblib
            # launcher): every child would be told to use it and die at start ("cannot find context for 'loky'").
            multiprocessing.set_start_method("forkserver", force=True)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        saved = dict(os.environ)
        # The forkserver's stderr (and so its children's until they open their own log) goes to a file: a child
        # that dies while it starts leaves its error there, and WarmProcess copies it into that job's log.
        if not _server_output:
            fd, path = tempfile.mkstemp(prefix="at-forkserver-", suffix=".log")
            os.close(fd)
            _server_output.append(path)
            atexit.register(lambda: Path(path).unlink(missing_ok=True))
        sys.stderr.flush()
        console, output = os.dup(2), os.open(_server_output[0], os.O_WRONLY | os.O_APPEND)
        try:
            os.environ.clear()
            os.environ.update(scrub_env(env))
            os.dup2(output, 2)
            fs.ensure_running()
        finally:
            os.dup2(console, 2)
            os.close(console)
            os.close(output)
            os.environ.clear()
            os.environ.update(saved)
        _forkservers[key] = ctx
    return _forkservers[key]


def _warm_child(target: Callable, args: tuple, kwargs: dict, cwd: str, env: dict[str, str], log_path: str,
                limits: dict[str, int], agent_dirs: list[str]) -> None:
    """The set-up a cold child gets, in a forked one, then ``target(*args, **kwargs)``."""
    os.setsid()  # its own process group, so the harness can kill everything it starts
    _set_limits(limits)  # and dies with the forkserver, which dies with the harness
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    sys.path[:] = clean_sys_path(sys.path, agent_dirs)
    target(*args, **kwargs)


class WarmProcess:
    """A job process forked from ``ctx`` (``forkserver``), with the bits of ``Popen``'s interface callers use."""

    def __init__(self, ctx, target: Callable, args: tuple = (), kwargs: dict | None = None, *, cwd: str | Path,
                 env: dict[str, str], log_path: str | Path, agent_dirs: Iterable[str | Path] = (),
                 harness_dirs: Iterable[str | Path] = (), limits: dict[str, int] | None = None):
        agent_dirs = [str(Path(d).resolve()) for d in agent_dirs]
        where = neutral_cwd(cwd, agent_dirs, harness_dirs)
        _note_oom_count()
        self.log_path, self.server_output = Path(log_path), _server_output[0] if _server_output else None
        self.server_offset = _size(self.server_output)
        self.p = ctx.Process(target=_warm_child, daemon=False, args=(
            target, tuple(args), dict(kwargs or {}), str(where), scrub_env(env), str(log_path),
            {"RLIMIT_CORE": 0, **(limits or {})}, agent_dirs))
        self.p.start()
        self.pid = self.p.pid
        self.ended = False

    def poll(self):
        if self.p.exitcode is not None and not self.ended:
            self.ended = True
            self._start_error_to_log()
        return self.p.exitcode

    def wait(self):
        self.p.join()
        return self.poll()

    def _start_error_to_log(self) -> None:
        """A child that failed and wrote nothing died before it opened its log (unpickling its task, importing
        a module): what the forkserver printed since this job started goes into the job's log."""
        if self.p.exitcode == 0 or self.server_output is None or _size(self.log_path) > 0:
            return
        try:
            with open(self.server_output, "rb") as f:   # the last ERROR_TAIL_BYTES since this job started
                f.seek(max(self.server_offset, _size(self.server_output) - ERROR_TAIL_BYTES))
                said = f.read().decode(errors="replace").strip()
            if said:
                with open(self.log_path, "a") as log:
                    log.write(f"[harness] the job process died before it opened this log; the forkserver's "
                              f"output since it started (shared by the warm jobs running at once):\n{said}\n")
        except OSError:
            pass

    @property
    def returncode(self):
        return self.p.exitcode


def spawn_pool(max_workers: int):
    """A process pool of fresh interpreters (``spawn``) for harness-only work such as building models."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: forking a process that already runs torch threads can deadlock.
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"))

"""Sandbox for inner jobs that carry agent-written code or data: bubblewrap command lines and limits.

    policy = SandboxPolicy()                    # inner.sandbox=true, inner.allow_unsafe=false
    policy.refusal(spec)                        # None, or why this job may not run on this machine
    wrap = trainer_wrapper(policy, job_dir=d, output_dir=o, model_dir=m, deadline_s=150)
    wrap(["python", "-m", "agent_trainer.inner_loop.run.worker", ...])      # ["bwrap", ..., "python", "-m", ...]

Two sandboxes per job: the trainer and the reward host. What each sees, what both cover and what
they do not: docs/security.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from agent_trainer.config import InnerConfig, settings_from
from agent_trainer.registry import INCLUDE_PATH_ENV
from agent_trainer.inner_loop.isolation.launcher import TimeoutExpired, python_file, run_check, scrub_env
from agent_trainer.inner_loop.run.job_env import MAX_FILE_BYTES, child_env

GiB = 2**30
# Agent code runs as SANDBOX_UID_BASE + a per-job offset when the harness is root: a uid no file
# belongs to, with a process count of its own (RLIMIT_NPROC is per uid and ignored for root).
SANDBOX_UID_BASE = 3_000_000
_uid_counter = itertools.count()
# Harness modules the trainer never needs: they read hidden sets, baselines or score checkpoints.
MASKED_MODULES = ("hidden_eval.py", "baselines.py", "contamination.py", "lineage.py", "staged_reward.py")
# Rooms of the project package the trainer never imports: the agent's side and the commands (hidden as empty folders).
HIDDEN_ROOMS = ("outer_loop", "commands")
REWARD_HOST_FILE = Path(__file__).with_name("reward_host.py")
REWARD_HOST_IN_SANDBOX = "/sandbox/reward_host.py"
REWARD_LOG_BYTES = 64 * 2**20

# The first program inside a sandbox: set the limits, drop to the sandbox uid, forbid privilege
# gain, then exec the real command. Standard library only, no site packages (-I -S).
_LAUNCHER = (
    "import ctypes, json, os, resource, sys\n"
    "cfg = json.loads(sys.argv[1])\n"
    "for name, value in cfg['limits'].items():\n"
    "    resource.setrlimit(getattr(resource, name), (value, value))\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "uid = cfg.get('uid')\n"
    "if uid is not None:\n"
    "    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
    "    libc.prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG = SIGKILL again (a uid change clears it)
    "libc.prctl(38, 1, 0, 0, 0)\n"  # PR_SET_NO_NEW_PRIVS
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@dataclass(frozen=True)
class SandboxPolicy:
    """How jobs with agent-written code or data run: the ``inner`` group's fields of the same names, with its
    defaults (``agent_trainer.config.InnerConfig``), and the limits no config sets."""

    sandbox: bool = InnerConfig.sandbox  # run them under bubblewrap
    allow_unsafe: bool = InnerConfig.allow_unsafe  # run them without bubblewrap when it is off or missing
    sandbox_memory_gb: float | None = InnerConfig.sandbox_memory_gb  # address space of the trainer; None: no cap
    reward_memory_gb: float = 4.0  # address space of the reward host
    sandbox_max_processes: int = InnerConfig.sandbox_max_processes  # processes + threads of the agent's reward code
    reward_timeout_s: float = InnerConfig.reward_timeout_s  # one reward call (or the reward file's import) at most
    tmp_mb: int = 256  # size of each sandbox's private /tmp
    bwrap: str = "bwrap"  # the bubblewrap executable

    @classmethod
    def coerce(cls, value: Any) -> "SandboxPolicy":
        """A policy from None/True (the default), False (sandbox off), a dict of fields, or a policy."""
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(sandbox=False)
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ValueError(f"unknown sandbox setting(s) {unknown}; known: {sorted(names)}")
            return cls(**value)
        raise TypeError(f"sandbox must be a SandboxPolicy, a dict, a bool or None, got {type(value).__name__}")

    @classmethod
    def from_config(cls, inner: InnerConfig) -> "SandboxPolicy":
        """The policy of a validated ``inner`` group: its fields of the same names."""
        return settings_from(cls, inner)

    def as_dict(self) -> dict:
        """Plain fields (for run_job keyword dicts that get copied, pickled or logged)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def use_bwrap(self) -> bool:
        """True when jobs with agent code or data run under bubblewrap here."""
        return self.sandbox and bwrap_problem(self.bwrap) is None

    def refusal(self, spec) -> str | None:
        """Why a job (a ``JobSpec``) may not run on this machine under this policy, or None."""
        if not (spec.uses_agent_code or getattr(spec, "uses_agent_data", False)):
            return None
        if self.use_bwrap() or self.allow_unsafe:
            return None
        what = "agent-written code (reward.py)" if spec.uses_agent_code else "agent-written data (data.jsonl)"
        why = (bwrap_problem(self.bwrap) if self.sandbox else "the sandbox is off (inner.sandbox=false)")
        return (f"jobs with {what} run only in the sandbox, and {why}; use library rewards and sources, "
                "or (operator) install bubblewrap, or set inner.allow_unsafe=true for trusted agents")


@functools.lru_cache(maxsize=8)
def bwrap_problem(bwrap: str = "bwrap") -> str | None:
    """None when ``bwrap`` can start a sandbox here, else why not (cached per executable)."""
    exe = shutil.which(bwrap)
    if exe is None:
        return f"bubblewrap ({bwrap}) is not installed (apt-get install bubblewrap)"
    try:
        p = run_check([exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent",
                       "--proc", "/proc", "--dev", "/dev", "true"], timeout_s=30)
    except (OSError, TimeoutExpired) as e:
        return f"bubblewrap ({exe}) could not be started: {e}"
    if p.returncode != 0:
        return f"bubblewrap ({exe}) cannot create a sandbox here: {p.stderr.strip()[-300:]}"
    return None


# --- pieces of a command line ------------------------------------------------------------------


def _user_tasks(uid: int) -> int:
    """Processes + threads of ``uid`` now (what RLIMIT_NPROC counts)."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            real = re.search(r"^Uid:\s+(\d+)", status, re.M)
            threads = re.search(r"^Threads:\s+(\d+)", status, re.M)
            if real and int(real.group(1)) == uid:
                n += int(threads.group(1)) if threads else 1
    return n


class _Mounts:
    """bwrap mount arguments; parents that bwrap creates are made traversable for the sandbox uid."""

    def __init__(self):
        self.args: list[str] = []
        self.dests: list[str] = []

    def bind(self, src: str | Path, dest: str | Path | None = None, *, rw: bool = False, dev: bool = False) -> None:
        src = str(src)
        dest = str(dest or src)
        self.args += ["--dev-bind" if dev else ("--bind" if rw else "--ro-bind"), src, dest]
        self.dests.append(dest)

    def mask(self, dest: str | Path) -> None:
        """Hide a file: /dev/null over it."""
        self.args += ["--ro-bind", "/dev/null", str(dest)]

    def hide(self, dest: str | Path) -> None:
        """Hide a folder: an empty, read-only tmpfs over it."""
        self.args += ["--perms", "0555", "--tmpfs", str(dest)]

    def system(self) -> None:
        """``/usr``, the top-level links or folders into it, the loader's cache, the interpreter, the venv."""
        self.bind("/usr")
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            p = Path(top)
            if p.is_symlink():
                self.args += ["--symlink", os.readlink(p), top]
            elif p.is_dir():
                self.bind(top)
        for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
            if os.path.exists(etc):
                self.bind(etc)
        for prefix in {sys.base_prefix, sys.prefix}:
            if not prefix.startswith("/usr/") and prefix != "/usr":
                self.bind(prefix)
        exe = Path(sys.executable)
        if not str(exe).startswith(("/usr/", sys.prefix, sys.base_prefix)):
            self.bind(exe.resolve(), exe)

    def chmod_parents(self) -> list[str]:
        """``--chmod 0755`` for every folder bwrap created on the way to a mount point (not ``/tmp``)."""
        mounted = set(self.dests)
        made: set[str] = set()
        for dest in self.dests:
            for parent in Path(dest).parents:
                p = str(parent)
                if p in ("/", "/tmp", "/dev", "/proc") or p in mounted or any(p.startswith(m + "/") for m in mounted):
                    continue
                made.add(p)
        return [a for p in sorted(made) for a in ("--chmod", "0755", p)]


def _namespaces(policy: SandboxPolicy, hostname: str = "sandbox") -> list[str]:
    exe = shutil.which(policy.bwrap) or policy.bwrap
    return [exe, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", hostname, "--die-with-parent", "--new-session", "--clearenv",
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(policy.tmp_mb * 2**20),
            "--tmpfs", "/tmp"]


def _env_args(env: dict[str, str]) -> list[str]:
    return [a for k, v in sorted(scrub_env(env).items()) for a in ("--setenv", k, v)]


def _launch(limits: dict[str, int], uid: int | None, argv: list[str]) -> list[str]:
    cfg = json.dumps({"limits": limits, "uid": uid})
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, cfg, *argv]


def _gpu_devices() -> list[str]:
    return sorted(str(p) for p in Path("/dev").glob("nvidia*"))


def trainer_limits(policy: SandboxPolicy, deadline_s: float, threads: int | None) -> dict[str, int]:
    """rlimits of the trainer: CPU seconds for every thread until the deadline, memory, file size."""
    cores = threads or os.cpu_count() or 1
    limits = {"RLIMIT_CPU": int(math.ceil(deadline_s * cores)) + 60, "RLIMIT_FSIZE": MAX_FILE_BYTES,
              "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 4096}
    if policy.sandbox_memory_gb is not None and not _gpu_devices():
        limits["RLIMIT_AS"] = int(policy.sandbox_memory_gb * GiB)
    return limits


def reward_limits(policy: SandboxPolicy, deadline_s: float, uid: int | None) -> dict[str, int]:
    """rlimits of the reward host: one core's CPU seconds, memory, a small log, few processes."""
    own = 0 if uid is not None else _user_tasks(os.getuid())  # NPROC counts every task of the uid
    return {"RLIMIT_CPU": int(math.ceil(deadline_s)) + 10, "RLIMIT_AS": int(policy.reward_memory_gb * GiB),
            "RLIMIT_FSIZE": REWARD_LOG_BYTES, "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 256,
            "RLIMIT_NPROC": own + policy.sandbox_max_processes}


def _package_dir() -> Path:
    """The project package (``agent_trainer``): the trainer imports its ``inner_loop``, its ``evaluation``
    (``MASKED_MODULES`` masked) and its shared modules (paths, registries; no hidden data)."""
    import agent_trainer

    return Path(agent_trainer.__file__).parent


def trainer_wrapper(policy: SandboxPolicy, *, job_dir: Path, output_dir: Path, model_dir: Path, deadline_s: float,
                    threads: int | None = None, gpus: str | None = None) -> Callable[[list[str]], list[str]]:
    """``wrap`` for ``run_worker``: the trainer's argv inside bubblewrap (see the module docstring).

    ``gpus``: the job's ``CUDA_VISIBLE_DEVICES`` (``agent_trainer.inner_loop.run.job_env.job_gpus``)."""
    job_dir, output_dir, model_dir = (Path(p).resolve() for p in (job_dir, output_dir, model_dir))
    home = output_dir / ".home"
    m = _Mounts()
    m.system()
    package = _package_dir()
    m.bind(package)
    for room in HIDDEN_ROOMS:
        m.hide(package / room)
    for name in MASKED_MODULES:
        if (package / "evaluation" / name).exists():
            m.mask(package / "evaluation" / name)
    m.bind(model_dir)
    for folder in os.environ.get(INCLUDE_PATH_ENV, "").split(os.pathsep):  # data families' cards and rows
        if folder and Path(folder).is_dir():
            m.bind(Path(folder).resolve())
    m.bind(job_dir)
    m.bind(output_dir, rw=True)  # after the job folder: an output folder inside it stays writable
    for dev in _gpu_devices():
        m.bind(dev, dev=True)
    env = child_env(home, threads, gpus)
    base = [*_namespaces(policy), *(["--cap-drop", "ALL"] if os.geteuid() == 0 else []), *m.args,
            *m.chmod_parents(), *_env_args(env), "--chdir", str(output_dir)]
    limits = trainer_limits(policy, deadline_s, threads)

    def wrap(argv: list[str]) -> list[str]:
        return [*base, "--", *_launch(limits, None, argv)]

    return wrap


def sandbox_uids(pid: int | None = None) -> range:
    """The uids the reward hosts of harness process ``pid`` (default: this one) run as, when it is root."""
    start = SANDBOX_UID_BASE + ((pid or os.getpid()) % 10_000) * 100
    return range(start, start + 100)


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one reward host when the harness is root, else None (keep ours)."""
    if os.geteuid() != 0:
        return None
    return sandbox_uids()[next(_uid_counter) % 100]


def reward_host_argv(policy: SandboxPolicy, *, job_dir: Path, fd: int, deadline_s: float,
                     sandboxed: bool = True, info_fd: int | None = None) -> list[str]:
    """The reward host's command line: in its own sandbox, or (unsafe mode) with limits and a clean env only.

    ``info_fd``: bwrap writes ``{"child-pid": ...}`` there (the sandbox's first process)."""
    job_dir = Path(job_dir).resolve()
    uid = sandbox_uid() if sandboxed else None
    limits = reward_limits(policy, deadline_s, uid)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1"}
    # The host (an isolated interpreter: nothing is imported from the job folder) moves into the job
    # folder itself before it runs the agent's code, so that code may read its own files by name.
    if not sandboxed:
        return _launch(limits, None, python_file(REWARD_HOST_FILE, "--fd", str(fd), "--cwd", str(job_dir)))
    m = _Mounts()
    m.system()
    m.bind(REWARD_HOST_FILE, REWARD_HOST_IN_SANDBOX)
    # The sandbox uid reads the job folder only when its mode lets anyone read it (it is the agent's
    # workspace copy, written 0644/0755); the reward source itself arrives over the socket.
    readable = job_dir.is_dir() and (job_dir.stat().st_mode & 0o005) == 0o005
    if readable:
        m.bind(job_dir)
    caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid is not None else []
    info = ["--info-fd", str(info_fd)] if info_fd is not None else []
    return [*_namespaces(policy), *caps, *info, *m.args, *m.chmod_parents(), *_env_args(env), "--chdir", "/tmp", "--",
            *_launch(limits, uid, python_file(REWARD_HOST_IN_SANDBOX, "--fd", str(fd),
                                              "--cwd", str(job_dir) if readable else "/tmp"))]

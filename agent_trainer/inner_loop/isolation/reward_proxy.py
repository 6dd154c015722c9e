"""The other side of the reward host: start it, and call the agent's reward functions through it.

    >>> host = RewardHost(policy, job_dir, log_path, deadline_s=150)    # harness side (run_worker)
    >>> fd = host.start()          # the trainer inherits fd; its argv gets --reward-fd fd
    >>> ...; host.close()          # kills the host and everything it started
    >>> install(fd, timeout_s=60)  # trainer side: resolve_rewards now asks the host for file rewards
    >>> score_with_host(reward_spec, job_dir, request, timeout_s=30, policy=policy)  # the validation probe

Agent-written reward functions (``source: file``) never run in the trainer or in the harness:
they run in ``agent_trainer/inner_loop/isolation/reward_host.py``, in a sandbox of their own
(``agent_trainer.inner_loop.isolation.sandbox``), and answer with numbers over a socket. Library rewards run where they
are called. Every answer is untrusted: size-capped, type-checked (``agent_trainer.inner_loop.train.rewards``' checks),
and a host that does not answer within ``SandboxPolicy.reward_timeout_s`` fails the job with a message that says so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.isolation.reward_host import recv, send
from agent_trainer.inner_loop.train.rewards import LIBRARY, RewardError, checked, set_file_function_loader

if TYPE_CHECKING:  # the trainer's side (install) runs in the job's process, which never needs the policy
    from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy


AGENT_ERROR_CHARS = 300


def agent_error(text: object) -> str:
    """An error from agent code as it may reach the agent: its first non-empty line, printable, bounded.

    The host already sends only the exception's type and first line; this holds even for a host the
    agent's code has taken over."""
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return "".join(c if c.isprintable() else "?" for c in first[:AGENT_ERROR_CHARS])


class HostGone(RewardError):
    """The reward host stopped answering: it timed out (``timed_out``) or its process ended."""

    def __init__(self, message: str, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


class RewardHost:
    """The agent's reward process of one job: started by the harness, killed when the job ends."""

    def __init__(self, policy: SandboxPolicy, job_dir: str | Path, log_path: str | Path, deadline_s: float):
        self.policy, self.job_dir, self.log_path, self.deadline_s = policy, Path(job_dir), Path(log_path), deadline_s
        self.proc = None  # the host's Popen (agent_trainer.inner_loop.isolation.launcher.start)
        self.child_fd: int | None = None
        self.sandbox_pid: int | None = None  # the sandbox's first process (its PID namespace's init)

    def start(self) -> int:
        """Start the host; returns the (inheritable) socket fd to talk to it through."""
        from agent_trainer.inner_loop.isolation.sandbox import reward_host_argv

        ours, theirs = socket.socketpair()
        sandboxed = self.policy.use_bwrap()
        info_r, info_w = os.pipe() if sandboxed else (None, None)
        argv = reward_host_argv(self.policy, job_dir=self.job_dir, fd=theirs.fileno(), deadline_s=self.deadline_s,
                                sandboxed=sandboxed, info_fd=info_w)
        # Unsafe mode only (no bwrap): the same scrubbed environment (bwrap sets its own inside).
        env = {} if sandboxed else {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.log_path.parent),
                                    "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            fds = (theirs.fileno(),) if info_w is None else (theirs.fileno(), info_w)
            self.proc = isolation.start(argv, cwd=self.log_path.parent, env=env, agent_dirs=[self.job_dir],
                                        harness_dirs=[self.log_path.parent], stdout=log, stderr=isolation.STDOUT,
                                        pass_fds=fds)
        theirs.close()
        if info_w is not None:
            os.close(info_w)
            self.sandbox_pid = _read_child_pid(info_r)
        ours.set_inheritable(True)
        self.child_fd = ours.detach()
        return self.child_fd

    def release_fd(self) -> None:
        """Close this process's copy of the socket (once the trainer inherited it)."""
        if self.child_fd is not None:
            os.close(self.child_fd)
            self.child_fd = None

    def close(self) -> None:
        """Kill the host's whole process group (its sandbox goes with it)."""
        self.release_fd()
        if self.proc is not None:
            if self.proc.poll() is None:
                isolation.kill_group(self.proc.pid)
            self.proc.wait()
        if self.sandbox_pid is not None:
            # Its PID namespace dies with it; wait until it has exited, so that no process of the agent's
            # (a fork bomb, a memory bomb being torn down) outlives the job.
            try:
                os.kill(self.sandbox_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + 10
            while not isolation.exited(self.sandbox_pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.sandbox_pid = None


def _read_child_pid(fd: int, timeout_s: float = 10.0) -> int | None:
    """The ``child-pid`` bwrap writes to its info fd (None if it does not within ``timeout_s``)."""
    import select

    data = b""
    try:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError, TypeError):
                continue
    finally:
        os.close(fd)
    return None


class RewardChannel:
    """Requests to a reward host over a socket, one at a time, with a timeout and size-capped answers."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock, self.timeout_s = sock, timeout_s
        self.names: dict[str, list[str]] = {}  # loaded file -> its callables
        self.lock = threading.Lock()
        self.seconds = 0.0   # wall seconds the host took to answer, every request together: the agent code's time
        sock.settimeout(timeout_s)

    def ask(self, request: dict, what: str) -> dict:
        t0 = time.monotonic()
        try:
            with self.lock:
                try:
                    send(self.sock, request)
                    answer = recv(self.sock)
                finally:
                    self.seconds += time.monotonic() - t0
        except (socket.timeout, TimeoutError):
            raise HostGone(f"{what} did not answer within {self.timeout_s:g} s (an endless loop or a very slow "
                           "reward?); reward code must return quickly", timed_out=True) from None
        except (OSError, ValueError) as e:
            raise HostGone(f"the reward process failed during {what}: {type(e).__name__}: {e}", False) from None
        if answer is None:
            raise HostGone(f"the reward process exited during {what} after {time.monotonic() - t0:.1f} s (it "
                           "crashed, hit a limit of the sandbox, or the reward code ended it)", timed_out=False)
        if not isinstance(answer, dict):
            raise RewardError(f"the reward process answered {what} with nonsense")
        return answer

    def load(self, path: Path) -> list[str]:
        """Load a reward file in the host (once per file); its callable names."""
        key = str(path)
        if key not in self.names:
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise RewardError(f"reward file {path.name} cannot be read: {e}") from None
            answer = self.ask({"op": "load", "source": source, "filename": key}, f"the import of {path.name}")
            if "error" in answer:
                raise RewardError(f"reward file {path.name} failed on import: {agent_error(answer['error'])}")
            names = answer.get("names")
            if answer.get("ok") is not True or not isinstance(names, list):
                raise RewardError(f"the reward process answered the import of {path.name} with nonsense")
            self.names[key] = [str(n) for n in names]
        return self.names[key]

    def function(self, path: Path, name: str):
        """A TRL reward callable that calls ``name`` of the reward file ``path`` in the host."""
        if name not in self.load(path):
            raise RewardError(f"reward file {path.name} defines no function {name!r}; "
                              f"define def {name}(prompts, completions, **kwargs) -> list[float]")

        def call(prompts, completions, **kwargs):
            state = kwargs.pop("trainer_state", None)
            log_metric = kwargs.pop("log_metric", None)
            plain = {k: v for k, v in kwargs.items() if k not in ("log_extra", "environments") and _jsonable(v)}
            request = {"op": "call", "filename": str(path), "name": name, "prompts": list(prompts),
                       "completions": list(completions), "kwargs": plain, "state": _state(state)}
            answer = self.ask(request, f"reward {name!r}")
            if "error" in answer:
                raise RewardError(f"reward {name!r} raised: {agent_error(answer['error'])}")
            if "not_list" in answer:
                raise RewardError(f"reward {name!r} returned {agent_error(answer['not_list'])[:40]}; return a list of "
                                  "floats")
            values = answer.get("values")
            if not isinstance(values, list):
                raise RewardError(f"the reward process answered reward {name!r} with nonsense")
            metrics = answer.get("metrics")
            if callable(log_metric) and isinstance(metrics, list):
                for item in metrics[:32]:
                    if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                            and isinstance(item[1], (int, float))):
                        log_metric(f"{name}/{item[0][:64]}", float(item[1]))
            return values

        call.__name__ = name
        return call


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _state(state) -> dict:
    return {k: getattr(state, k) for k in ("global_step", "max_steps", "epoch")
            if isinstance(getattr(state, k, None), (int, float))}


def install(fd: int, timeout_s: float, limit_s: float | None = None) -> RewardChannel:
    """In the trainer: route every ``source: file`` reward of this process to the host at ``fd``; the training
    stops as ``timeout`` once the host's answers took more than ``limit_s`` seconds together
    (``agent_trainer.inner_loop.train.callbacks.AGENT_TIME``; None: no limit but each call's ``timeout_s``)."""
    from agent_trainer.inner_loop.train.callbacks import AGENT_TIME

    channel = RewardChannel(socket.socket(fileno=fd), timeout_s)
    set_file_function_loader(channel.function)
    AGENT_TIME.watch(lambda: channel.seconds, limit_s)
    return channel


def score_with_host(reward_spec, job_dir: str | Path, request: dict, timeout_s: float,
                    policy: SandboxPolicy | None = None) -> dict:
    """The validation probe's scoring with the agent's functions in a sandboxed host.

    Same answer as ``agent_trainer.inner_loop.spec.probe.score_in_child``: ``{"values", "errors"}`` (plus
    ``load_error``), or ``{"crash": why}``. The reward sees step 0 of ``request["max_steps"]``."""
    state = {"global_step": 0, "max_steps": request.get("max_steps", 1), "epoch": 0.0}
    result = score_calls_with_host(reward_spec, job_dir, [{**request, "state": state}], timeout_s, policy)
    calls = result.pop("calls", None)
    return {**result, "values": calls[0] if calls else {}} if "crash" not in result else result


def score_calls_with_host(reward_spec, job_dir: str | Path, requests: list[dict], timeout_s: float,
                          policy: SandboxPolicy | None = None) -> dict:
    """Score ``requests`` in order with the agent's functions in one sandboxed host, each call within ``timeout_s``:
    ``{"calls": [{name: values} per request], "errors"}`` (plus ``load_error``), or ``{"crash": why}``. A request
    holds ``prompts``, ``completions``, ``completion_ids``, ``columns`` and the ``state`` the reward gets as
    ``trainer_state`` (``global_step``, ``max_steps``, ``epoch``): the same shape training passes."""
    from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

    policy = policy or SandboxPolicy()
    result: dict[str, Any] = {"calls": [], "errors": {}}
    timeout_s = min(timeout_s, policy.reward_timeout_s)
    with tempfile.TemporaryDirectory(prefix="reward-probe-") as tmp:
        host = RewardHost(policy, job_dir, Path(tmp) / "reward.log", deadline_s=timeout_s)
        sock = None
        try:
            sock = socket.socket(fileno=host.start())
            host.child_fd = None  # the socket object owns the fd now
            channel = RewardChannel(sock, timeout_s)
            funcs = []
            try:
                for f in reward_spec.functions:
                    fn = LIBRARY[f.name].fn if f.source == "library" else channel.function(
                        Path(job_dir) / reward_spec.file, f.name)
                    funcs.append((f.name, checked(f.name, fn)))
                for request in requests:
                    state = type("State", (), dict(request["state"]))()
                    kwargs = {"completion_ids": request.get("completion_ids"), **request.get("columns", {})}
                    values = {}
                    for name, fn in funcs:
                        try:
                            values[name] = fn(prompts=request["prompts"], completions=request["completions"],
                                              trainer_state=state, **kwargs)
                        except HostGone:
                            raise
                        except RewardError as e:
                            result["errors"][name] = str(e)[-800:]
                        except Exception as e:  # a library reward's own error on this data
                            result["errors"][name] = f"{type(e).__name__}: {e}"[-800:]
                    result["calls"].append(values)
                    if result["errors"]:
                        break
            except HostGone as e:
                if e.timed_out:
                    n = max(len(r["completions"]) for r in requests)
                    return {"crash": f"the reward functions did not finish within {timeout_s:g} s on {n} completions"}
                try:
                    code = host.proc.wait(timeout=5)
                except isolation.TimeoutExpired:
                    code = None
                # Its output (reward.log) is the agent code's to write: it stays in the harness's files.
                return {"crash": f"the reward process exited with code {code} without a result"}
            except RewardError as e:
                return {**result, "load_error": str(e)[-1500:]}
        finally:
            if sock is not None:
                sock.close()
            host.close()
    return result

"""Reward host: runs a job's ``reward.py`` alone in its own (sandboxed) process and answers calls.

    python -I reward_host.py --fd 3 --cwd JOB_DIR     # started by agent_trainer.inner_loop.isolation.reward_proxy,
                                                      # never by hand

Over the inherited socket ``--fd``: length-prefixed JSON, ``{"op": "load", "source", "filename"}`` ->
``{"ok", "names"}`` and ``{"op": "call", "filename", "name", "prompts", "completions", "kwargs", "state"}``
-> ``{"values", "metrics"}``, or ``{"error": "Type: first line of the message (line N)"}``. Standard library
only: it runs with no project package importable (docs/security.md).
``agent_trainer.inner_loop.isolation.reward_proxy`` treats every answer as untrusted.
"""

import argparse
import json
import math
import numbers
import os
import socket
import struct
import sys
import traceback
import types

MAX_MESSAGE = 256 * 2**20
ERROR_CHARS = 200  # of an error's first line; nothing else of an error leaves the host


def recv(sock):
    """One message, or None at end of stream."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    body = _exactly(sock, size)
    return None if body is None else json.loads(body)


def _exactly(sock, n):
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send(sock, obj):
    """Send one message."""
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def error_text(e, filename):
    """The exception's type, the first line of its message (bounded) and the reward file's line it passed last.

    No source line, no other frame: nothing read from a file reaches the agent through an error."""
    lines = [f.f_code.co_filename == filename and n for f, n in traceback.walk_tb(e.__traceback__)]
    at = [n for n in lines if n]
    if isinstance(e, SyntaxError) and e.lineno:
        at, e = [e.lineno], SyntaxError(e.msg)
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    where = f" (line {at[-1]})" if at else ""
    return f"{type(e).__name__[:60]}: {first[:ERROR_CHARS]}{where}"


def _plain(values):
    """Numbers stay numbers (floats), None stays None; anything else becomes a short repr the proxy rejects."""
    out = []
    for v in values:
        if v is None or (isinstance(v, numbers.Real) and not isinstance(v, bool)):
            out.append(None if v is None else float(v))
        else:
            out.append(repr(v)[:80])
    return out


def serve(sock):
    modules = {}
    while True:
        msg = recv(sock)
        if msg is None:
            return
        op = msg.get("op")
        filename = str(msg.get("filename", "reward.py"))
        if op == "load":
            module = types.ModuleType("job_reward")
            module.__file__ = filename
            try:
                exec(compile(msg["source"], filename, "exec"),  # noqa: S102 - the agent's code, sandboxed
                     module.__dict__)
                modules[filename] = module
                names = sorted(k for k, v in list(module.__dict__.items()) if callable(v) and not k.startswith("__"))
                send(sock, {"ok": True, "names": names})
            except Exception as e:  # the agent's code; SystemExit ends the host (so would os._exit)
                send(sock, {"error": error_text(e, filename)})
        elif op == "call":
            fn = getattr(modules.get(filename), str(msg.get("name")), None)
            if not callable(fn):
                send(sock, {"error": f"{filename} defines no function {msg.get('name')!r}"})
                continue
            metrics = []
            state = types.SimpleNamespace(**msg.get("state", {}))

            def log_metric(name, value, _m=metrics):
                if isinstance(value, numbers.Real) and math.isfinite(value) and len(_m) < 32:
                    _m.append([str(name)[:64], float(value)])

            try:
                values = fn(prompts=msg["prompts"], completions=msg["completions"], trainer_state=state,
                            log_metric=log_metric, log_extra=lambda *a, **k: None, **msg.get("kwargs", {}))
                if not isinstance(values, (list, tuple)):
                    send(sock, {"not_list": type(values).__name__})
                else:
                    send(sock, {"values": _plain(values), "metrics": metrics})
            except Exception as e:
                send(sock, {"error": error_text(e, filename)})
        else:
            send(sock, {"error": f"unknown op {op!r}"})


def main(argv=None):
    p = argparse.ArgumentParser(prog="reward_host.py")
    p.add_argument("--fd", type=int, required=True, help="the inherited socket to the trainer or the probe")
    p.add_argument("--cwd", default=None, help="the folder the reward code runs in (the job folder)")
    a = p.parse_args(argv)
    if a.cwd:
        os.chdir(a.cwd)  # after start-up: the interpreter (-I) never imports from this folder
    sock = socket.socket(fileno=a.fd)
    try:
        serve(sock)
    except (OSError, ValueError):  # the other side went away or spoke nonsense: nothing left to do
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

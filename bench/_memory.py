"""Where a process's memory goes, phase by phase: peak RSS per phase and what holds it (Linux, glibc).

A phase's peak is the kernel's high-water mark (``VmHWM``), reset at the phase's start by writing 5 to
``/proc/self/clear_refs``; what holds memory at a phase's end is read from torch (parameters, gradients, optimizer
state, tensors autograd keeps for the backward pass) and from glibc (``mallinfo2``: bytes in use, bytes free but held
in its heaps, bytes in mmapped blocks). Used by ``bench/agent_step.py``'s update side::

    probe = PhaseMemory(model)            # a Lightning callback: forward / backward / optimizer step per micro-batch
    with phase("model load", rows): ...   # any other phase
    print_table(rows)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from contextlib import contextmanager

GB = 1e9


def _status_kbs(*keys: str, pid: int | str = "self") -> dict[str, int]:
    """Fields of ``/proc/<pid>/status`` in kB (0 where absent), from one read."""
    out = dict.fromkeys(keys, 0)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in out:
                out[key] = int(line.split()[1])
    return out


def _status_kb(key: str, pid: int | str = "self") -> int:
    return _status_kbs(key, pid=pid)[key]


def status_gb(*keys: str) -> dict[str, float]:
    """Fields of ``/proc/self/status`` in GB, from one read: the kernel gives ``VmHWM`` as at least the ``VmRSS`` of
    the same read, which two reads apart (the heap moving between them) need not be."""
    return {k: kb * 1024 / GB for k, kb in _status_kbs(*keys).items()}


def rss_gb() -> float:
    """Resident set size now."""
    return _status_kb("VmRSS") * 1024 / GB


def peak_gb() -> float:
    """The high-water mark of the resident set since the last ``reset_peak`` (since start without one)."""
    return _status_kb("VmHWM") * 1024 / GB


def resident_gb() -> dict[str, float]:
    """The resident set now, split: anonymous (heaps, mmapped tensors) and file-backed (the libraries' code, and
    model weights that are mapped from their files rather than copied)."""
    now = status_gb("RssAnon", "RssFile")
    return {"rss_anon_gb": now["RssAnon"], "rss_file_gb": now["RssFile"]}


def watch_peak_gb(proc, every: float = 0.25) -> float:
    """Wait for the child ``proc`` (a ``subprocess.Popen``) and return its own peak RSS: its ``VmHWM``, read until
    it exits (the high-water mark only grows, so the last read is the peak but for its last ``every`` seconds)."""
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, _status_kb("VmHWM", proc.pid))
        except (OSError, ValueError):
            pass
        time.sleep(every)
    return peak * 1024 / GB


def reset_peak() -> bool:
    """Start a new high-water mark at the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def heap_gb() -> dict[str, float]:
    """glibc's own count over all its arenas: in use (heap + mmapped blocks), free but held in its heaps, mmapped.
    Empty where the C library has no ``mallinfo2`` (glibc < 2.33, musl)."""
    if _LIBC is None or not hasattr(_LIBC, "mallinfo2"):
        return {}
    _LIBC.mallinfo2.restype = _Mallinfo2
    m = _LIBC.mallinfo2()
    return {"malloc_in_use_gb": (m.uordblks + m.hblkhd) / GB, "malloc_free_held_gb": m.fordblks / GB,
            "malloc_mmapped_gb": m.hblkhd / GB}


def trim() -> float:
    """``malloc_trim(0)``: give glibc's free pages back to the system; the GB of RSS that returned."""
    if _LIBC is None or not hasattr(_LIBC, "malloc_trim"):
        return 0.0
    before = rss_gb()
    _LIBC.malloc_trim(0)
    return before - rss_gb()


def tensor_gb(tensors, besides=()) -> float:
    """GB of the distinct storages among ``tensors``, leaving out those of ``besides`` (e.g. the parameters, which
    autograd keeps for the backward pass too but which exist anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in besides}
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.device.type == "cpu" and t.untyped_storage().data_ptr() not in skip:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()) / GB


@contextmanager
def phase(name: str, rows: list[dict], **extra):
    """Append ``{phase, peak_gb, rss_end_gb, seconds, glibc counts, **extra}`` for the block to ``rows``."""
    reset_peak()
    t0 = time.perf_counter()
    start = rss_gb()
    yield
    rows.append({"phase": name, "rss_start_gb": start, "peak_gb": peak_gb(), "rss_end_gb": rss_gb(),
                 "seconds": time.perf_counter() - t0, **resident_gb(), **heap_gb(), **extra})


class RssSampler:
    """The largest RSS seen by a thread reading it every ``every`` seconds while the block runs: the whole block's
    peak even where phases reset the kernel's high-water mark (torch releases the GIL in its kernels)."""

    def __init__(self, every: float = 0.02):
        import threading

        self.every, self.max_gb = every, rss_gb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.every):
            self.max_gb = max(self.max_gb, rss_gb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.max_gb = max(self.max_gb, rss_gb())


def _saved_for_backward():
    """A ``saved_tensors_hooks`` context that collects the tensors autograd keeps for the backward pass outside
    checkpointed regions (inside them, checkpointing's own hooks keep nothing but what it recomputes from). The
    hooks hand each tensor back as it is: the numbers do not change."""
    import torch

    kept: list = []

    def pack(t):
        kept.append(t)
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), kept


def make_phase_callback(model, optimizer_of):
    """A Lightning callback recording, per micro-batch, the forward (loss computed), backward and optimizer-step
    phases: peak RSS, RSS at the end, glibc's counts, and what torch holds (``.rows``). ``optimizer_of()`` gives the
    optimizer whose state to count."""
    import lightning as L

    class PhaseMemory(L.Callback):
        def __init__(self):
            self.rows: list[dict] = []
            self._t0 = 0.0
            self._start = 0.0
            self._hooks = None
            self._kept: list = []
            self._batch = 0
            self._shape: dict = {}
            self._stepping = False

        def _open(self):
            reset_peak()
            self._t0, self._start = time.perf_counter(), rss_gb()

        def _close(self, name: str, **extra):
            params = list(model.parameters())
            now = status_gb("VmHWM", "VmRSS")
            self.rows.append({
                "phase": f"{name} {self._batch}", "rss_start_gb": self._start, "peak_gb": now["VmHWM"],
                "rss_end_gb": now["VmRSS"], "seconds": time.perf_counter() - self._t0, **resident_gb(),
                "params_gb": tensor_gb(params), "grads_gb": tensor_gb(p.grad for p in params),
                "optimizer_state_gb": tensor_gb(v for st in optimizer_of().state.values() for v in st.values()
                                                if hasattr(v, "untyped_storage")),
                **heap_gb(), **extra})

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._batch = batch_idx
            self._shape = {"rows": int(batch["input_ids"].shape[0]), "width": int(batch["input_ids"].shape[1]),
                           "shared": int(batch.get("shared_prefix", 0))}
            self._hooks, self._kept = _saved_for_backward()
            self._hooks.__enter__()
            self._open()

        def on_before_backward(self, trainer, pl_module, loss):
            self._hooks.__exit__(None, None, None)
            kept = tensor_gb(self._kept, besides=list(model.parameters()))
            self._close("forward", saved_for_backward_gb=kept, **self._shape)
            self._kept = []
            self._open()

        def on_after_backward(self, trainer, pl_module):
            self._close("backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self._open()
            self._stepping = True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self._stepping:
                self._close("optimizer step")
                self._stepping = False

    return PhaseMemory()


COLUMNS = ("phase", "peak_gb", "rss_start_gb", "rss_end_gb", "rss_anon_gb", "rss_file_gb", "seconds",
           "saved_for_backward_gb", "params_gb", "grads_gb", "optimizer_state_gb", "malloc_in_use_gb",
           "malloc_free_held_gb", "malloc_mmapped_gb", "trimmed_gb")


def print_table(rows: list[dict]) -> None:
    """The rows as a fixed-width table, GB to two decimals."""
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    cells = [[c.replace("_gb", " GB").replace("_", " ") for c in cols]]
    for r in rows:
        cells.append([r[c] if isinstance(r.get(c), str) else ("" if r.get(c) is None else f"{r[c]:.2f}")
                      for c in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for row in cells:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths)))

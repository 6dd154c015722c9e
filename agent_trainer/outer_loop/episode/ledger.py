"""The cost ledger: an append-only JSONL record of every LLM call and inner job, with budgets.

    >>> from agent_trainer.config import BudgetConfig
    >>> from agent_trainer.outer_loop.episode.ledger import Ledger, Prices
    >>> ledger = Ledger.open("runs/r1", budget=BudgetConfig(max_usd_per_run=5.0, max_jobs_per_episode=2),
    ...                      prices=Prices(llm={"gpt-x": (0.5, 1.5)}, job_usd_per_hour={"cpu": 0.05}))
    >>> ledger.check("llm", ledger.estimate_llm("gpt-x", tokens_in=900, max_new_tokens=256), episode="e0")
    >>> ledger.record_llm(episode="e0", model="gpt-x", tokens_in=912, tokens_out=87)
    >>> ledger.check("job", ledger.estimate_job("cpu", seconds=90), episode="e0")
    >>> ledger.record_job(episode="e0", device="cpu", seconds=41.2, charged_seconds=38.0, status="ok")

``check`` raises ``BudgetExhausted`` before a call or job that would cross a cap of the budget group
(``agent_trainer.config.BudgetConfig``: ``max_<usd|tokens|jobs>_per_<run|episode>``, None = no cap; no budget
at all = no caps). A job's ``usd`` (what the caps count) prices its ``charged_seconds``, the compute estimate it
was admitted for (``JobResult.charged_seconds``), so a loaded machine spends a budget no sooner; its measured
seconds and their price are kept beside (``seconds``, ``usd_measured``). The file, sharing it between processes
and reopening it: docs/outer_loop.md, "An episode".
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from agent_trainer.config import BudgetConfig

LEDGER_FILE = "ledger.jsonl"
KINDS = ("llm", "job")


class BudgetExhausted(RuntimeError):
    """A cap would be crossed; the message names the cap, the spending so far and the setting to raise."""


class LedgerCorrupt(RuntimeError):
    """A ledger line other than the last does not parse."""


@dataclass
class Prices:
    """USD per 1M tokens for each agent model, USD per hour for each job device.

    ``llm`` maps a model name to ``(input, output)`` prices; models not listed cost ``default_llm``
    (local models default to 0: their cost is the hardware's). ``job_usd_per_hour`` maps a device
    name (``cpu``, ``h100``, ...) to its hourly price; unlisted devices cost ``default_job_usd_per_hour``.
    """

    llm: dict[str, tuple[float, float]] = field(default_factory=dict)
    default_llm: tuple[float, float] = (0.0, 0.0)
    job_usd_per_hour: dict[str, float] = field(default_factory=dict)
    default_job_usd_per_hour: float = 0.0

    def llm_usd(self, model: str, tokens_in: int, tokens_out: int) -> float:
        p_in, p_out = self.llm.get(model, self.default_llm)
        return (tokens_in * p_in + tokens_out * p_out) / 1e6

    def job_usd(self, device: str, seconds: float) -> float:
        return seconds / 3600.0 * self.job_usd_per_hour.get(device, self.default_job_usd_per_hour)


@dataclass
class Estimate:
    """What a call or job is expected to add (an upper bound keeps caps exact)."""

    usd: float = 0.0
    tokens: int = 0
    jobs: int = 0


@dataclass
class Totals:
    """Spending so far (of a run or of one episode)."""

    usd: float = 0.0           # what the caps count: LLM tokens and jobs' charged compute, priced
    tokens_in: int = 0
    tokens_out: int = 0
    llm_calls: int = 0
    jobs: int = 0
    job_seconds: float = 0.0   # measured
    usd_measured: float = 0.0  # LLM tokens and jobs' measured seconds, priced

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def add(self, rec: dict[str, Any]) -> None:
        self.usd += float(rec.get("usd", 0.0))
        self.usd_measured += float(rec.get("usd_measured", rec.get("usd", 0.0)))
        if rec.get("kind") == "llm":
            self.tokens_in += int(rec.get("tokens_in", 0))
            self.tokens_out += int(rec.get("tokens_out", 0))
            self.llm_calls += 1
        elif rec.get("kind") == "job":
            self.jobs += 1
            self.job_seconds += float(rec.get("seconds", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usd": round(self.usd, 10), "job_seconds": round(self.job_seconds, 6),
                "usd_measured": round(self.usd_measured, 10)}


class Ledger:
    """One ledger file; safe to use from several threads and processes."""

    def __init__(self, path: str | os.PathLike, *, budget: BudgetConfig | None = None, prices: Prices | None = None):
        self.path = Path(path)
        self.budget = budget  # None: no caps
        self.prices = prices or Prices()
        self.run = Totals()
        self.episodes: dict[str, Totals] = {}
        self.records = 0
        self._offset = 0
        self._tlock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        with self._locked():
            pass  # reading the existing records (and repairing a torn last line) happens under the lock

    @classmethod
    def open(cls, run_dir: str | os.PathLike, **kwargs: Any) -> "Ledger":
        """The ledger of a run folder (``<run_dir>/ledger.jsonl``), created or resumed."""
        return cls(Path(run_dir) / LEDGER_FILE, **kwargs)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- estimates and checks -------------------------------------------------------------
    def estimate_llm(self, model: str, tokens_in: int, max_new_tokens: int) -> Estimate:
        """Upper bound of one call: the prompt plus every token it may generate."""
        return Estimate(usd=self.prices.llm_usd(model, tokens_in, max_new_tokens), tokens=tokens_in + max_new_tokens)

    def estimate_job(self, device: str, seconds: float) -> Estimate:
        """Upper bound of one job: its wall-clock budget on ``device``."""
        return Estimate(usd=self.prices.job_usd(device, seconds), jobs=1)

    def check(self, kind: str, estimate: Estimate | None = None, *, episode: str | None = None) -> None:
        """Raise ``BudgetExhausted`` if ``estimate`` more of ``kind`` would cross a cap of the run or episode."""
        if kind not in KINDS:
            raise ValueError(f"ledger kind must be one of {KINDS}, got {kind!r}")
        est = estimate or Estimate(jobs=1 if kind == "job" else 0)
        with self._locked():
            scopes = [("run", self.run)]
            if episode is not None:
                scopes.append(("episode", self.episodes.get(episode, Totals())))
            for scope, tot in scopes:
                # A call is limited by money and tokens, a job by money and the job count: a spent job
                # cap must not stop the agent from talking (it still has to finish).
                dims = (("usd", tot.usd, est.usd), ("tokens", tot.tokens, est.tokens)) if kind == "llm" \
                    else (("usd", tot.usd, est.usd), ("jobs", tot.jobs, max(est.jobs, 1)))
                for what, spent, add in dims:
                    key = f"max_{what}_per_{scope}"   # BudgetConfig's name; tokens count input plus output
                    cap = getattr(self.budget, key, None)
                    if cap is None:
                        continue
                    if spent >= cap or spent + add > cap:
                        name = f"{scope} {episode!r}" if scope == "episode" else "run"
                        raise BudgetExhausted(
                            f"{kind} refused: the {name} has spent {_fmt(what, spent)} of its {_fmt(what, cap)} "
                            f"{what} cap and this {kind} may add {_fmt(what, add)}; raise budget.{key} "
                            f"or start a new {'run' if scope == 'run' else 'episode'}"
                        )

    # --- records --------------------------------------------------------------------------
    def record_llm(self, *, episode: str, model: str, tokens_in: int, tokens_out: int, **extra: Any) -> dict:
        """Append one LLM call; returns the record written (with running totals)."""
        usd = self.prices.llm_usd(model, tokens_in, tokens_out)
        return self._append({"kind": "llm", "episode": episode, "model": model, "tokens_in": int(tokens_in),
                             "tokens_out": int(tokens_out), "usd": usd, **extra})

    def record_job(self, *, episode: str, device: str, seconds: float, charged_seconds: float | None = None,
                   **extra: Any) -> dict:
        """Append one inner job that took ``seconds`` (measured) and is charged ``charged_seconds`` of compute
        (default: the measured ones); returns the record written (with running totals)."""
        charged = float(seconds if charged_seconds is None else charged_seconds)
        return self._append({"kind": "job", "episode": episode, "device": device, "seconds": float(seconds),
                             "charged_seconds": charged, "usd": self.prices.job_usd(device, charged),
                             "usd_measured": self.prices.job_usd(device, seconds), **extra})

    def episode_totals(self, episode: str) -> Totals:
        with self._locked():
            return Totals(**asdict(self.episodes.get(episode, Totals())))

    def run_totals(self) -> Totals:
        with self._locked():
            return Totals(**asdict(self.run))

    def _append(self, rec: dict[str, Any]) -> dict[str, Any]:
        with self._locked():
            seq = self.records
            self._fold(rec)
            rec = {"ts": round(time.time(), 3), **rec, "seq": seq,
                   "run_totals": self.run.to_dict(), "episode_totals": self.episodes[rec["episode"]].to_dict()}
            line = (json.dumps(rec, sort_keys=False) + "\n").encode()
            written = os.write(self._fd, line)
            if written != len(line):  # a full disk: leave a torn line the next open will drop
                raise OSError(f"ledger {self.path}: short write ({written} of {len(line)} bytes); disk full?")
            os.fsync(self._fd)
            self._offset += len(line)
            return rec

    # --- reading --------------------------------------------------------------------------
    def _fold(self, rec: dict[str, Any]) -> None:
        self.run.add(rec)
        self.episodes.setdefault(str(rec.get("episode")), Totals()).add(rec)
        self.records += 1

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Thread lock, then the file lock, then fold in what other writers appended meanwhile."""
        with self._tlock:
            if self._fd < 0:
                raise RuntimeError(f"ledger {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._catch_up()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _catch_up(self) -> None:
        """Fold in the records appended since we last looked (by us at open, or by other processes)."""
        size = os.fstat(self._fd).st_size
        if size == self._offset:
            return
        if size < self._offset:
            raise LedgerCorrupt(f"ledger {self.path} shrank from {self._offset} to {size} bytes; "
                                f"it is append-only: restore it or start a new run")
        data = os.pread(self._fd, size - self._offset, self._offset)
        lines = data.split(b"\n")
        tail = lines.pop()  # bytes after the last newline: empty, or a torn record
        pos = self._offset
        for i, raw in enumerate(lines):
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict) or rec.get("kind") not in KINDS:
                    raise ValueError("not a ledger record")
            except ValueError:
                if i == len(lines) - 1 and not tail:
                    # A newline-terminated but unparsable last line: treat as torn too.
                    tail, lines = raw + b"\n", lines[:i]
                    break
                raise LedgerCorrupt(f"ledger {self.path}: record at byte {pos} does not parse; only the last "
                                    f"line may be damaged (a killed write). Inspect the file or start a new run")
            self._fold(rec)
            pos += len(raw) + 1
        if tail:
            # Killed mid-write: drop the partial record so the next append starts on a clean line.
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self._offset = pos


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a ledger file (a torn last line is skipped, not repaired)."""
    out = []
    for raw in Path(path).read_bytes().split(b"\n"):
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def _fmt(what: str, x: float) -> str:
    return f"${x:.4f}" if what == "usd" else f"{int(x)}"

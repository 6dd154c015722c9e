"""Whether this machine makes the numbers the docs quote: the shipped models' bytes, their baselines, the example
jobs' uplifts on calc_chain and the main job's first steps, each compared with the record in
``bench/results/reproduce.json``.

    .venv/bin/python bench/reproduce.py                          # all four parts (~12 min on 2 cores)
    .venv/bin/python bench/reproduce.py --parts models,baselines # seconds
    .venv/bin/python bench/reproduce.py --parts jobs --jobs sft_full,dpo_lora
    .venv/bin/python bench/reproduce.py --main-steps 13          # the whole main job (`make run`, ~9 min more)
    .venv/bin/python bench/reproduce.py --markdown               # also print the docs' tables of this run
    .venv/bin/python bench/reproduce.py --parts main --burn 2    # the same numbers with 2 busy loops beside it
    .venv/bin/python bench/reproduce.py --exact                  # every digit that differs, on any kind of CPU
    .venv/bin/python bench/reproduce.py --kernels portable       # hardware.cpu_kernels=portable: one record for
                                                                 # Intel and AMD alike
    .venv/bin/python bench/reproduce.py --parts jobs --jobs grpo_lora --trace DIR   # DIR/grpo_lora.jsonl: each
                                                                 # step's digest; compare two with
                                                                 # python -m agent_trainer.trace A B
    .venv/bin/python bench/reproduce.py --record                 # make the record (after a change meant to move
                                                                 # the numbers; then re-make the docs' tables)

What each part runs:
- models: the sha256 of every shipped file (``agent_trainer/inner_loop/models/shipped``), checked against the
  package's ``SHA256SUMS.json`` and the record. Always exact.
- baselines: tiny-s and tiny-m on the first 200 hidden items of every family, scored afresh (a new cache),
  as ``at-eval table=true`` does (docs/baselines.md).
- jobs: every example job in ``examples/jobs`` on ``examples/tasks/calc_chain_v1_fast.json``, one torch thread,
  no job cache (docs/jobs.md, "What the example jobs do on calc_chain").
- main: ``at-train seed=0 outer.steps=<--main-steps> inner.cache=false`` (the main job, ``make run``; the agent's
  threads pinned to the record's) and its ``metrics.jsonl`` step by step, clocks and dollars excluded
  (``bench/same_steps.py``). With fewer steps than the record, the keys only a run's last step has (the
  held-out end, the training gain) are compared only when the run is as long as the record.

``--burn N`` starts N processes that spin on the CPU for the whole run (a loaded machine: budgets are compute, not
seconds, so the load moves the timings and no number); they stop when the run does.

Exact where the record was made with the same software (Python, torch, transformers, TRL, PEFT, ...) on the same
kind of CPU (architecture, vendor, torch's kernel level: ``DEFAULT``, ``AVX2``, ``AVX512``, and any MKL or oneDNN
setting; with ``--kernels portable`` the vendor does not count): the inputs are
the same bytes and every step is deterministic, so every number must match to the last digit. Otherwise the
numbers are compared within ``TOLERANCE`` (absolute, per part) and the verdict says so. Timings are printed,
never compared. Exit 0 when every compared number matches, 1 when not (each difference listed), 2 when there is
no record.

The reference record (``bench/results/reproduce.json``) holds the docs' numbers. Another kind of CPU trains the
example jobs slightly differently (bench/RESULTS.md (i)); once a machine of that kind has run ``--record``, its
record (``bench/results/reproduce_kinds/<machine>-<vendor>-<level>.json``; portable kernels:
``<machine>-<level>-MKL_CBWR=COMPATIBLE-ONEDNN_MAX_CPU_ISA=AVX2.json``, no vendor) is what every machine of that kind
is compared with, exactly. ``--record`` on the reference's kind of CPU re-makes the reference.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import same_steps  # noqa: E402

from agent_trainer.kernels import KERNEL_ENV, cpu_kind, portable, use_cpu_kernels  # noqa: E402
from agent_trainer.trace import TRACE_ENV  # noqa: E402

RECORD = C.ROOT / "bench" / "results" / "reproduce.json"
# Records of other kinds of CPU, one file a kind (``kind_record_path``): on such a CPU the check is exact too.
KIND_RECORDS = C.ROOT / "bench" / "results" / "reproduce_kinds"
PARTS = ("models", "baselines", "jobs", "main")
JOB_TASK = C.ROOT / "examples" / "tasks" / "calc_chain_v1_fast.json"
MAIN_STEPS = 3
# Absolute tolerance of a number when the software or the kind of CPU differ from the record's. Scores are on
# 200 hidden items (0.005 each): a baseline may flip an item or two, a trained job a few; the main job's
# rewards and rates are means over 15 episodes whose sampling can fork at a single different token.
TOLERANCE = {"baselines": 0.01, "jobs": 0.03, "main": 0.10}
JOB_KEYS = ("status", "steps", "hidden_score", "baseline", "uplift")


# --- where the numbers come from ---------------------------------------------------------------------------------
def software() -> dict[str, str]:
    from agent_trainer.inner_loop.run.result import library_versions

    return library_versions()


def comparable(cpu: dict[str, str]) -> dict[str, str]:
    """What of ``cpu`` decides the numbers: all of it, less the vendor where the kernels are the portable ones
    (``hardware.cpu_kernels=portable``), which an Intel and an AMD CPU run alike."""
    return {k: v for k, v in cpu.items() if not (k == "vendor" and portable(cpu))}


def kind_record_path(cpu: dict[str, str]) -> Path:
    """Where the record of a kind of CPU other than the reference record's lives."""
    cpu = comparable(cpu)
    kind = "-".join(cpu[k] for k in ("machine", "vendor", "torch_capability") if k in cpu)
    kernels = "".join(f"-{k}={v}" for k, v in sorted(cpu.items()) if k in KERNEL_ENV)
    return KIND_RECORDS / f"{kind}{kernels}.json"


def record_for(reference: dict | None, cpu: dict[str, str]) -> tuple[dict | None, Path]:
    """The record to compare this machine with and its file: the reference record (the docs' numbers) when this is
    its kind of CPU or no record of this kind exists, else this kind's. A part this kind's record lacks (never
    measured there, or dropped when the code changed its numbers) is the reference's, listed under ``borrowed``
    and compared within tolerance (``compare``); ``--record`` on this kind replaces it with this kind's."""
    if reference is None or comparable(reference.get("cpu", {})) == comparable(cpu):
        return reference, RECORD
    path = kind_record_path(cpu)
    if not path.is_file():
        return reference, RECORD
    record = json.loads(path.read_text())
    borrowed = [p for p in PARTS if p not in record and p in reference]
    return {**record, **{p: reference[p] for p in borrowed}, "borrowed": borrowed}, path


def same_source(record: dict, now: dict) -> tuple[bool, list[str]]:
    """Whether ``now`` ran the record's software on the record's kind of CPU, and the differences if not."""
    was = {"software": record.get("software", {}), "cpu": comparable(record.get("cpu", {}))}
    here = {"software": now["software"], "cpu": comparable(now["cpu"])}
    diffs = [f"{what} {k}: {was[what].get(k)} here {here[what].get(k)}"
             for what in ("software", "cpu") for k in sorted(set(was[what]) | set(here[what]))
             if was[what].get(k) != here[what].get(k)]
    return not diffs, diffs


# --- the parts ---------------------------------------------------------------------------------------------------
def run_models() -> dict[str, dict[str, str]]:
    from agent_trainer.inner_loop.models.registry import shipped_models, verify_shipped

    out = {}
    for name, entry in sorted(shipped_models().items()):
        verify_shipped(name)   # hashes every file; raises (naming it) unless the folder holds exactly these bytes
        out[name] = entry["files"]
    return out


def run_baselines(work: Path) -> dict[str, dict[str, float]]:
    from agent_trainer.evaluation.baselines import baseline_table
    from agent_trainer.inner_loop.models.registry import resolve_model

    models = {name: resolve_model(name) for name in ("tiny-s", "tiny-m")}
    return baseline_table(models, n=200, cache_dir=work / "baselines").scores


def example_jobs() -> list[str]:
    return sorted(p.name for p in (C.ROOT / "examples" / "jobs").iterdir() if (p / "job.yaml").is_file())


def run_jobs(work: Path, names: list[str], trace: Path | None = None, timeout_s: float | None = None
             ) -> dict[str, dict[str, Any]]:
    """The example jobs ``names``; ``trace``: a folder that gets each job's trace (``<job>.jsonl``); ``timeout_s``:
    each job's wall-clock safety cap (None: the harness's, from its estimate)."""
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.run.job import run_job
    from agent_trainer.trace import TRACE_FILE

    task = load_task(JOB_TASK)
    out = {}
    for name in names:
        print(f"  job {name} ...", flush=True)
        r = run_job(C.ROOT / "examples" / "jobs" / name, task, output_dir=work / "jobs" / name, threads=1,
                    cache=False, progress=False, cache_dir=work / "cache", timeout_s=timeout_s)
        out[name] = {**{k: getattr(r, k) for k in JOB_KEYS}, "base_model": r.base_model,
                     "ran": ", ".join(f"{s.get('algorithm')}/{s.get('peft')}/{s.get('data_source')} {s.get('steps')}"
                                      for s in (r.ran or {}).get("stages", [])),
                     "seconds_train": round(r.seconds.get("train", 0.0), 1),
                     "seconds_total": round(r.seconds.get("total", 0.0), 1)}
        print(f"    {out[name]['status']}, hidden {out[name]['hidden_score']}, uplift {out[name]['uplift']}, "
              f"{out[name]['seconds_total']} s", flush=True)
        if trace is not None and (work / "jobs" / name / TRACE_FILE).is_file():
            trace.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "jobs" / name / TRACE_FILE, trace / f"{name}.jsonl")
            print(f"    trace: {trace / f'{name}.jsonl'}", flush=True)
    return out


def main_command(steps: int, agent_threads: int, runs_dir: Path, kernels: str = "native") -> list[str]:
    return [str(Path(sys.executable).parent / "at-train"), "seed=0", f"outer.steps={steps}", "inner.cache=false",
            f"hardware.agent_threads={agent_threads}", *([f"hardware.cpu_kernels={kernels}"] if kernels != "native"
                                                         else []),
            "tracking=off", f"runs_dir={runs_dir}", "run_id=reproduce"]


def run_main(work: Path, steps: int, agent_threads: int, kernels: str = "native") -> dict[str, Any]:
    cmd = main_command(steps, agent_threads, work / "runs", kernels)
    print("  " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd)   # its progress bar and any error show as it runs
    metrics = work / "runs" / "reproduce" / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.is_file():
        raise SystemExit(f"at-train failed (exit {proc.returncode}; its output is above)")
    rows = same_steps.rows(str(metrics))
    return {"steps": steps, "agent_threads": agent_threads, "command": " ".join(["at-train", *cmd[1:6]]),
            "seconds": round(sum(r.get("seconds_step", 0.0) for r in rows), 1),
            "metrics": [{k: v for k, v in r.items() if same_steps.compared(k)} for r in rows]}


# --- comparing ---------------------------------------------------------------------------------------------------
def close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    return abs(a - b) <= tol


def compare_flat(part: str, record: dict, now: dict, tol: float) -> list[str]:
    """Differences between two {name: {key: value}} tables (keys the record has)."""
    out = []
    for name in sorted(set(record) | set(now)):
        if name not in now or name not in record:
            out.append(f"{part} {name}: {'not run here' if name not in now else 'not in the record'}")
            continue
        for key, want in record[name].items():
            if key.startswith("seconds") or key not in now[name]:
                continue
            if not close(want, now[name][key], tol):
                out.append(f"{part} {name} {key}: record {want!r}, here {now[name][key]!r}")
    return out


def compare_main(record: dict, now: dict, tol: float) -> list[str]:
    if now["steps"] > record["steps"]:
        return [f"main: {now['steps']} steps here, the record has {record['steps']}"]
    whole = now["steps"] == record["steps"]
    known = set().union(*record["metrics"])   # a metric the code logs since the record was made: see unrecorded()
    out = []
    for i, (want, got) in enumerate(zip(record["metrics"], now["metrics"])):
        last = i == len(now["metrics"]) - 1
        keys = (set(want) | set(got) if whole or not last else set(want) & set(got)) & known
        for key in sorted(keys):
            if not close(want.get(key), got.get(key), tol):
                out.append(f"main step {i}: {key} record {want.get(key)!r}, here {got.get(key)!r}")
    return out


def unrecorded(record: dict, now: dict) -> list[str]:
    """The main job's metrics this run logs that no step of the record has (added to the code after the record was
    made): not compared; ``--record`` adds them."""
    if "main" not in record or "main" not in now:
        return []
    return sorted(set().union(*now["main"]["metrics"]) - set().union(*record["main"]["metrics"]))


def compare(record: dict, now: dict, exact: bool) -> list[str]:
    out = []
    for part in PARTS:
        if part not in now or part not in record:
            continue
        own = part not in record.get("borrowed", ())   # a borrowed part is another kind's: never exact
        tol = 0.0 if (exact and own) or part == "models" else TOLERANCE[part]
        if part == "main":
            out += compare_main(record["main"], now["main"], tol)
        else:
            rec, got = record[part], now[part]
            if part == "jobs":   # a partial run (--jobs) compares the jobs it ran
                rec = {k: v for k, v in rec.items() if k in got}
            out += compare_flat(part, rec, got, tol)
    return out


# --- tables ------------------------------------------------------------------------------------------------------
def markdown(now: dict) -> str:
    lines = []
    if "baselines" in now:
        s, m = now["baselines"]["tiny-s"], now["baselines"]["tiny-m"]
        lines += ["| family | tiny-s | tiny-m |", "|---|---:|---:|"]
        lines += [f"| {f}{' (held out)' if f == 'triage' else ''} | {s[f]:.3f} | {m[f]:.3f} |" for f in sorted(s)]
        lines.append("")
    if "jobs" in now:
        lines += ["| job | `ran` (algorithm/peft/data_source steps) | base | status | train s | hidden | baseline "
                  "| uplift |", "|---|---|---|---|---:|---:|---:|---:|"]
        for name, j in now["jobs"].items():
            up = f"{j['uplift']:+.3f}" if j["uplift"] is not None else "-"
            up = f"**{up}**" if (j["uplift"] or 0) >= 0.05 else up
            lines.append(f"| {name} | {j['ran']} | {j['base_model']} | {j['status']} | {j['seconds_train']} | "
                         f"{j['hidden_score']:.3f} | {j['baseline']:.3f} | {up} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.strip().splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--jobs", default="", help="comma-separated example jobs (default: all)")
    p.add_argument("--main-steps", type=int, default=MAIN_STEPS)
    p.add_argument("--kernels", choices=("native", "portable"), default="native",
                   help="hardware.cpu_kernels of every part (portable: compared with any vendor's portable record)")
    p.add_argument("--record", action="store_true", help=f"write what this run measured to {RECORD.name}")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--burn", type=int, default=0, metavar="N", help="N busy loops on the CPU beside the run")
    p.add_argument("--trace", type=Path, default=None, metavar="DIR",
                   help="write each example job's trace to DIR/<job>.jsonl (agent_trainer.trace)")
    p.add_argument("--timeout-s", type=float, default=None, metavar="S",
                   help="each example job's wall-clock safety cap (default: ~10x its estimate; a machine under heavy "
                        "load may need more: numbers never depend on it)")
    p.add_argument("--exact", action="store_true",
                   help="compare to the last digit even where the software or the kind of CPU differ")
    args = p.parse_args(argv)
    use_cpu_kernels(args.kernels)   # before any kernel runs here; at-train and the jobs inherit it
    if args.trace is not None:
        os.environ[TRACE_ENV] = "1"   # the jobs' training processes and their scoring write the trace
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS)) + sorted(set(filter(None, args.jobs.split(","))) - set(example_jobs()))
    if unknown:
        p.error(f"unknown: {', '.join(unknown)} (parts: {', '.join(PARTS)}; jobs: {', '.join(example_jobs())})")
    record, where = record_for(json.loads(RECORD.read_text()) if RECORD.is_file() else None, cpu_kind())
    if record is None and not args.record:
        print(f"no record at {RECORD}: make one with --record", file=sys.stderr)
        return 2

    if args.burn and args.record:
        p.error("--record measures a quiet machine: drop --burn")
    with burners(args.burn):
        return compare_or_record(args, parts, record, where)


@contextlib.contextmanager
def burners(n: int):
    """``n`` processes spinning on the CPU while the block runs (each a Python busy loop), stopped after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    if procs:
        print(f"{n} CPU burners beside this run (pids {', '.join(str(q.pid) for q in procs)})", flush=True)
    try:
        yield procs
    finally:
        for q in procs:
            q.kill()
            q.wait()


def compare_or_record(args, parts: list[str], record: dict | None, where: Path = RECORD) -> int:
    """Run the parts; record them (``--record``) or compare them with ``record`` (read from ``where``); the exit
    code. ``--record`` writes the reference record on its own kind of CPU (or where there is none), else this kind's
    record (``kind_record_path``), beside the reference."""
    work = C.workdir(args.workdir, "reproduce")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # a bar per model load would bury the table
    now: dict[str, Any] = {"software": software(), "cpu": cpu_kind()}
    if "models" in parts:
        print("models ...", flush=True)
        now["models"] = run_models()
    if "baselines" in parts:
        print("baselines ...", flush=True)
        now["baselines"] = run_baselines(work)
    if "jobs" in parts:
        print("jobs ...", flush=True)
        now["jobs"] = run_jobs(work, [x for x in args.jobs.split(",") if x] or example_jobs(), args.trace,
                               args.timeout_s)
    if "main" in parts:
        print("main ...", flush=True)
        threads = (record or {}).get("main", {}).get("agent_threads", 1)
        now["main"] = run_main(work, args.main_steps, threads, args.kernels)

    if args.markdown:
        print(markdown(now))
    if args.record:
        if record is not None and comparable(record.get("cpu", {})) != comparable(now["cpu"]):   # a new kind
            record, where = None, kind_record_path(now["cpu"])
        kept = {k: v for k, v in (record or {}).items() if k not in (record or {}).get("borrowed", [])}
        merged = {**kept, **now}             # a partial --record keeps the other parts' record (its own only)
        merged.pop("borrowed", None)
        if "jobs" in now:                    # and the other jobs' (--jobs)
            merged["jobs"] = dict(sorted({**kept.get("jobs", {}), **now["jobs"]}.items()))
        merged["time"] = C.machine()["time"]
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        print(f"recorded in {where}")
        return 0

    exact, why = same_source(record, now)
    diffs = compare(record, now, exact or args.exact)
    print(f"record: {where.relative_to(C.ROOT)} ({record.get('time')}, {record.get('cpu')}); here: {now['cpu']}")
    if record.get("borrowed"):
        print(f"this kind's record has no {', '.join(record['borrowed'])}: the reference record's, within tolerance "
              f"(re-make them here with --record)")
    print("compared exactly (the same software on the same kind of CPU)" if exact else
          "compared exactly (--exact), although: " + "; ".join(why) if args.exact else
          "compared within tolerance " + json.dumps(TOLERANCE) + ", because: " + "; ".join(why))
    for part in parts:
        n = sum(d.startswith(part) for d in diffs)
        print(f"{part}: {'the same' if n == 0 else f'{n} differences'}")
    for d in diffs[:60]:
        print("  " + d)
    new = unrecorded(record, now)
    if new:
        print(f"not in the record, so not compared (re-make it with --record): {', '.join(new)}")
    C.write(args.json, "reproduce", {"exact": exact, "differences": diffs, "now": now, "burners": args.burn})
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

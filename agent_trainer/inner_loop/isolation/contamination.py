"""Contamination check of a job: what the model trains on, against the task's hidden set.

    report = check_job(spec, job_dir, family="calc_chain", hidden_n=200)      # before training
    after = check_trained(spec, job_dir, output_dir, "calc_chain", 200)       # after training

``check_job`` reads every text the agent wrote for the job (data rows as trained, reward files);
``check_trained`` holds the rows the job's process recorded against the declared ones. The matching
rules are ``agent_trainer.evaluation.contamination``'s; ``run_job`` runs both, and a flagged job scores as its
baseline. Both read and fold agent text in a child process of their own (``CHECK_LIMITS``, ``CHECK_DEADLINE_S``):
a malicious file costs that child, never the harness; a child that fails or runs out of time flags the job.
What is checked: docs/security.md, "Contamination rules".

    python -m agent_trainer.inner_loop.isolation.contamination parse|job|trained|near SPEC.json JOB_DIR OUT_DIR \
        FAMILY N REPORT.json STAGES_RUN SALT_SETTING MODEL_DIR|- '["raw"|"chat", SYSTEM_PROMPT|null]'
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agent_trainer.evaluation.contamination import ContaminationReport, find_overlap
from agent_trainer.inner_loop.train.data import TRAINED_ROWS, build_rows, rendered_texts, trained_record

MAX_RECORD_BYTES = 512 * 2**20
# The checking child: 4 GB of address space, at most 300 CPU seconds and 600 s of wall clock; within those, a job's
# checks get what its size buys (``CheckBudget``).
CHECK_MAX_CPU_S = 300
CHECK_LIMITS = {"RLIMIT_AS": 4 * 2**30, "RLIMIT_CPU": CHECK_MAX_CPU_S, "RLIMIT_FSIZE": 64 * 2**20}
CHECK_DEADLINE_S = 600.0
# CPU seconds a check child may take: 30 + 10 a MB of the job's own files + 0.5 a 1,000 rows, at most 300. Measured
# (2-core box, CPU seconds, load-independent): an honest 20 MB file of 94,000 rows costs the contamination child 39 s
# and the parsing child 24 s (under 2 s a MB), 100,000 library rows the trained-rows child 6 s, a small job's child
# 1-3 s; the adversarial 1 MB GRPO file of U+FDFA 12 s (a rate 6x the honest one). So honest jobs keep a 5-10x margin
# and an agent's file buys at most its size's worth of checking. The wall clock: 4x that (a loaded shared machine
# stretched CPU seconds 4-5x in the measurements) + 60 s of start-up, at most ``CHECK_DEADLINE_S``.
CHECK_BASE_CPU_S, CHECK_CPU_S_PER_MB, CHECK_CPU_S_PER_KROW = 30.0, 10.0, 0.5
CHECK_WALL_FACTOR, CHECK_WALL_MARGIN_S = 4.0, 60.0


@dataclass(frozen=True)
class CheckBudget:
    """The limits of every checking child of one job, by the job's size: ``mb`` of its own files (data and reward
    files) and ``rows`` (library items, a self-generated source's samples, the data files' lines)."""

    mb: float = 0.0
    rows: int = 0

    @classmethod
    def of(cls, spec, job_dir: str | Path) -> "CheckBudget":
        job_dir = Path(job_dir)
        views = spec.stage_specs() if hasattr(spec, "stage_specs") else [spec]
        names = spec.agent_files() if hasattr(spec, "agent_files") else []
        size = sum(_file_size(job_dir / n) for n in names)
        datas = {id(v.data): v.data for v in views}.values()
        rows = sum(src.size * (src.self_generated.samples_per_prompt if src.self_generated else 1)
                   for d in datas for src in d.sources)
        rows += sum(_lines(job_dir / f) for f in dict.fromkeys(d.file for d in datas if d.file))
        return cls(round(size / 2**20, 3), rows)

    @property
    def cpu_s(self) -> int:
        cpu = CHECK_BASE_CPU_S + CHECK_CPU_S_PER_MB * self.mb + CHECK_CPU_S_PER_KROW * self.rows / 1000
        return int(min(CHECK_MAX_CPU_S, cpu + 0.999))

    @property
    def wall_s(self) -> float:
        return min(CHECK_DEADLINE_S, CHECK_WALL_FACTOR * self.cpu_s + CHECK_WALL_MARGIN_S)

    def limits(self) -> dict[str, int]:
        return {**CHECK_LIMITS, "RLIMIT_CPU": self.cpu_s}

    def as_dict(self) -> dict:
        return {"mb": self.mb, "rows": self.rows, "cpu_limit_s": self.cpu_s, "wall_limit_s": self.wall_s}


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _lines(path: Path) -> int:
    """Newlines of a file (a snapshot's file: at most its size cap), read 1 MB at a time."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0


def row_texts(where: str, row: object, render=None) -> Iterator[tuple]:
    """``(where, text)`` for one parsed row: its string values, its rendered texts (``render``: the prompt in the
    job's format, as the trainer renders it), all its strings joined."""
    fields = row.items() if isinstance(row, dict) else [("value", row)]
    strings = [(str(k)[:40], v) for k, v in fields if isinstance(v, str)]
    for key, value in strings:
        # A third element False: the token judge may skip the field, the joined text holds it whole (half the work).
        yield (f"{where} {key}", value) if len(strings) == 1 else (f"{where} {key}", value, False)
    if isinstance(row, dict):
        for text in rendered_texts(row, render):
            yield f"{where} as trained", text
    if len(strings) > 1:
        yield f"{where} joined", "".join(v for _, v in strings)


def agent_texts(spec, job_dir: str | Path, render=None) -> Iterator[tuple]:
    """``(where, text)`` for every data row and reward file the job's stages use."""
    job_dir = Path(job_dir)
    views = spec.stage_specs() if hasattr(spec, "stage_specs") else [spec]
    data_files = list(dict.fromkeys(v.data.file for v in views if v.data.file))
    reward_files = list(dict.fromkeys(v.reward.file for v in views
                                      if v.reward and any(f.source == "file" for f in v.reward.functions)))
    for name in data_files:
        try:
            text = (job_dir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                yield f"{name} line {n}", line
                continue
            yield from row_texts(f"{name} line {n}", row, render)
    for name in reward_files:
        try:
            yield name, (job_dir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


def check_job(spec, job_dir: str | Path, family: str, hidden_n: int, *, in_child: bool = True,
              model_dir: str | Path | None = None, fmt=None) -> ContaminationReport:
    """The job's agent-provided texts checked against the first ``hidden_n`` hidden items of ``family``
    (in a child process unless ``in_child=False``); with the base model's folder ``model_dir``, also on its token
    ids, rows rendered in the job's prompt format ``fmt``."""
    if in_child:
        return in_check_child("job", spec, job_dir, None, family, hidden_n, model_dir=model_dir, fmt=fmt)
    tokenizer, render = _tokenizer(model_dir, fmt)
    return find_overlap(family, hidden_n, agent_texts(spec, job_dir, render), tokenizer=tokenizer, fmt=fmt)


def _tokenizer(model_dir, fmt):
    """``(the base model's tokenizer, the row renderer of format fmt)``, or ``(None, None)`` without a model."""
    if model_dir is None:
        return None, None
    from agent_trainer.evaluation.folder_tokenizer import FolderTokenizer
    from agent_trainer.evaluation.prompts import RAW, render

    tokenizer = FolderTokenizer.load(model_dir)
    if fmt is None or fmt == RAW:
        return tokenizer, None
    # The template around a prompt is the same for every row: rendered once, when it places the prompt verbatim.
    head, mark, tail = render(tokenizer, "\x00", fmt).partition("\x00")
    if mark and render(tokenizer, "calc: 1+1=", fmt) == f"{head}calc: 1+1={tail}":
        return tokenizer, lambda prompt: f"{head}{prompt}{tail}"
    return tokenizer, lambda prompt: render(tokenizer, prompt, fmt)


def in_check_child(mode: str, spec, job_dir: str | Path, output_dir: str | Path | None, family: str, hidden_n: int,
                   stages_run: int | None = None, *, limits: dict[str, int] | None = None,
                   deadline_s: float | None = None, model_dir: str | Path | None = None,
                   fmt=None) -> ContaminationReport:
    """``check_job`` (``mode="job"``) or ``check_trained`` (``"trained"``) run in a child started by the launcher,
    with ``limits`` and a wall-clock deadline (default: the job's ``CheckBudget``). A child that fails, is killed or
    overruns gives a flagged report whose ``error`` says why."""
    answer, error = _in_child(mode, spec, job_dir, output_dir, family, hidden_n, stages_run, limits, deadline_s,
                              model_dir, fmt)
    return _failed(family, hidden_n, error) if answer is None else ContaminationReport(**answer)


@dataclass
class ChildParse:
    """What ``parse_in_child`` found: ``error`` (why the child did not finish; "" when it did), each stage's
    ``tokens`` as ``row_tokens`` counts them (None for a stage whose rows do not build: the validation says why),
    the child's wall ``seconds`` and the job's ``budget`` (``CheckBudget.as_dict``)."""

    error: str = ""
    tokens: list | None = None
    seconds: float = 0.0
    budget: dict | None = None


def parse_in_child(spec, job_dir: str | Path, family: str, *, limits: dict[str, int] | None = None,
                   deadline_s: float | None = None) -> ChildParse:
    """Parse the job's data files and count their rows' tokens (``cost.row_tokens``) once in a child
    (the job's ``CheckBudget``) before the harness parses them: a file's rows are then bounded work for the
    harness (their problems are the validation's to report), and the tokenizing, whose cost grows with the bytes
    per character, never runs in the harness."""
    t0 = time.monotonic()
    budget = CheckBudget.of(spec, job_dir)
    answer, error = _in_child("parse", spec, job_dir, None, family, 0, None,
                              budget.limits() if limits is None else limits,
                              budget.wall_s if deadline_s is None else deadline_s)
    tokens = None
    if answer is not None:
        from agent_trainer.inner_loop.spec.cost import RowTokens

        tokens = [RowTokens(**t) if isinstance(t, dict) else None for t in answer.get("tokens", [])]
    return ChildParse(error, tokens, round(time.monotonic() - t0, 3), budget.as_dict())


def run_in_check_child(mode: str, spec, job_dir: str | Path, family: str, hidden_n: int) -> tuple[dict | None, str]:
    """``(the child's JSON answer, "")`` of a check ``mode`` on the job folder, run in a child within the job's
    ``CheckBudget``, or ``(None, why it gave none)``. ``near``: the reward-oracle check's rows
    (``oracle_rows.probed_rows``)."""
    return _in_child(mode, spec, job_dir, None, family, hidden_n, None, None, None)


def _in_child(mode, spec, job_dir, output_dir, family, hidden_n, stages_run, limits, deadline_s, model_dir=None,
              fmt=None):
    """``(the child's JSON answer, "")``, or ``(None, why it gave none)``. ``limits`` and ``deadline_s`` (None: the
    job's ``CheckBudget``)."""
    import signal

    from agent_trainer.salt import hidden_salt
    from agent_trainer.inner_loop.isolation.launcher import STDOUT, TimeoutExpired, kill_group, python_module, start
    from agent_trainer.inner_loop.spec.jobspec import spec_to_json

    agent_dirs = [d for d in (job_dir, output_dir) if d is not None]
    if limits is None or deadline_s is None:
        budget = CheckBudget.of(spec, job_dir)
        limits = budget.limits() if limits is None else limits
        deadline_s = budget.wall_s if deadline_s is None else deadline_s
    with tempfile.TemporaryDirectory(prefix="at-check-") as tmp:
        tmp = Path(tmp)
        (tmp / "spec.json").write_text(spec_to_json(spec))
        argv = python_module(__name__, mode, tmp / "spec.json", Path(job_dir).resolve(),
                             Path(output_dir).resolve() if output_dir else "-", family, int(hidden_n),
                             tmp / "report.json", "-" if stages_run is None else int(stages_run),
                             hidden_salt().setting, Path(model_dir).resolve() if model_dir else "-",
                             json.dumps([fmt.kind, fmt.system] if fmt is not None else ["raw", None]))
        t0 = time.monotonic()
        with open(tmp / "check.log", "wb") as log:
            proc = start(argv, cwd=tmp, env=dict(os.environ), agent_dirs=agent_dirs,
                         limits=limits, stdout=log, stderr=STDOUT)
            try:
                code = proc.wait(timeout=deadline_s)
            except TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                return None, f"it ran past its {deadline_s:.0f} s deadline (the job's size buys its checks that)"
        if code in (-signal.SIGXCPU, -signal.SIGKILL) and "RLIMIT_CPU" in limits:   # the kernel's at RLIMIT_CPU
            return None, (f"it was killed at its limit of {limits['RLIMIT_CPU']} CPU seconds (the job's size buys "
                          "its checks that)")
        if code != 0 or not (tmp / "report.json").is_file():
            tail = (tmp / "check.log").read_bytes()[-300:].decode("utf-8", "replace").strip().splitlines()
            why = f"exit code {code}" + (f": {tail[-1][:200]}" if tail else "")
            return None, f"the checking process failed after {time.monotonic() - t0:.1f} s ({why})"
        return json.loads((tmp / "report.json").read_text()), ""


def _failed(family: str, hidden_n: int, why: str) -> ContaminationReport:
    return ContaminationReport(family=family, n=int(hidden_n), flagged=True, error=why)


def _stage_dirs(spec, output_dir: Path) -> list[Path]:
    n = len(spec.stage_specs())
    return [output_dir] if n == 1 else [output_dir / f"stage_{i + 1}" for i in range(n)]


def _read_record(path: Path) -> list[dict] | None:
    """The recorded rows, or None when the record is missing, oversized or not rows."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            return None
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError, RecursionError):
        return None
    return rows if all(isinstance(r, dict) for r in rows) else None


def _sampled(view) -> bool:
    """True when a stage's rows depend on the model's samples (the harness cannot rebuild them)."""
    return view.algorithm == "dpo" or any(s.self_generated is not None for s in view.data.sources)


def check_trained(spec, job_dir: str | Path, output_dir: str | Path, family: str, hidden_n: int,
                  stages_run: int | None = None, *, in_child: bool = True, model_dir: str | Path | None = None,
                  fmt=None) -> ContaminationReport:
    """The rows the job's process trained on (its records), against the declared data and the hidden set
    (in a child process unless ``in_child=False``).

    ``stages_run``: how many stages started (``result.json``'s ``ran``); later ones have no record."""
    if in_child:
        return in_check_child("trained", spec, job_dir, output_dir, family, hidden_n, stages_run,
                              model_dir=model_dir, fmt=fmt)
    tokenizer, render = _tokenizer(model_dir, fmt)
    views = spec.stage_specs()
    dirs = _stage_dirs(spec, Path(output_dir))[: len(views) if stages_run is None else stages_run]
    undeclared: list[dict] = []
    trained_texts: list[tuple[str, str]] = []  # every stage's trained rows, as the model read them
    for i, (view, folder) in enumerate(zip(views, dirs), start=1):
        record = _read_record(folder / TRAINED_ROWS)
        if record is None:
            undeclared.append({"source": f"stage {i}", "kind": "undeclared", "item": -1})
            continue
        for n, row in enumerate(record, start=1):
            for text in rendered_texts(row, render):
                trained_texts.append((f"stage {i} trained row {n}", text))
        if _sampled(view):
            continue
        declared = trained_record(build_rows(view, job_dir, default_family=family))
        if record != declared:
            changed = sum(a != b for a, b in zip(record, declared)) + abs(len(record) - len(declared))
            undeclared.append({"source": f"stage {i}: {changed} of {len(record)} trained rows are not the job's "
                                         "declared rows", "kind": "undeclared", "item": -1})
    report = find_overlap(family, hidden_n, trained_texts, tokenizer=tokenizer, fmt=fmt)
    if undeclared:
        report.kinds["undeclared"] = len(undeclared)
        report.sources = undeclared + report.sources
        report.flagged = True
    return report


def _stage_tokens(spec, job_dir: Path, family: str) -> list[dict | None]:
    """Each stage's ``row_tokens`` as a dict (None where its rows do not build: the validation reports why)."""
    from dataclasses import asdict

    from agent_trainer.evaluation.families import FamilyError
    from agent_trainer.inner_loop.spec.cost import row_tokens
    from agent_trainer.inner_loop.train.data import DataFileError, build_rows_with_origins

    out = []
    for view in spec.stage_specs():
        try:
            rows = build_rows_with_origins(view, job_dir, default_family=family)[0]
        except (DataFileError, FamilyError):
            out.append(None)
            continue
        out.append(asdict(row_tokens(rows, pairs=view.algorithm == "dpo")))
    return out


def _main(argv: list[str]) -> int:
    from agent_trainer.inner_loop.spec.jobspec import spec_from_json

    from agent_trainer.salt import SALT_ENV

    from agent_trainer.evaluation.prompts import PromptFormat

    mode, spec_path, job_dir, output_dir, family, n, report_path, stages_run, salt, model_dir, fmt = argv
    model_dir, fmt = (None if model_dir == "-" else model_dir), PromptFormat(*json.loads(fmt))
    os.environ[SALT_ENV] = salt  # the harness's salt setting (a file's path for a secret, never the secret)
    spec = spec_from_json(Path(spec_path).read_text(), family)
    if mode == "parse":  # every stage's rows built as the validation will, and their tokens counted
        Path(report_path).write_text(json.dumps({"tokens": _stage_tokens(spec, Path(job_dir), family)}))
        return 0
    if mode == "near":   # the reward-oracle check's probed rows: every prompt of the file folded here
        from agent_trainer.inner_loop.isolation.oracle_rows import probed_rows

        Path(report_path).write_text(json.dumps({"stages": probed_rows(spec, Path(job_dir), family, int(n))}))
        return 0
    if mode == "job":
        report = check_job(spec, job_dir, family, int(n), in_child=False, model_dir=model_dir, fmt=fmt)
    else:
        report = check_trained(spec, job_dir, output_dir, family, int(n),
                               None if stages_run == "-" else int(stages_run), in_child=False, model_dir=model_dir,
                               fmt=fmt)
    Path(report_path).write_text(json.dumps(report.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

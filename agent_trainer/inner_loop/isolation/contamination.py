"""Contamination check of a job: what the model trains on, against the task's hidden set.

    report = check_job(spec, job_dir, family="calc_chain", hidden_n=200)      # before training
    after = check_trained(spec, job_dir, output_dir, "calc_chain", 200)       # after training

``check_job`` reads every text the agent wrote for the job (data rows as trained, reward files);
``check_trained`` holds the rows the job's process recorded against the declared ones. The matching
rules are ``agent_trainer.evaluation.contamination``'s; ``run_job`` runs both, and a flagged job scores as its
baseline. What is checked: docs/security.md, "Contamination rules".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from agent_trainer.evaluation.contamination import ContaminationReport, find_overlap
from agent_trainer.inner_loop.train.data import TRAINED_ROWS, build_rows, rendered_texts, trained_record

MAX_RECORD_BYTES = 512 * 2**20


def row_texts(where: str, row: object) -> Iterator[tuple[str, str]]:
    """``(where, text)`` for one parsed row: its string values, its rendered texts, all its strings joined."""
    fields = row.items() if isinstance(row, dict) else [("value", row)]
    strings = [(str(k)[:40], v) for k, v in fields if isinstance(v, str)]
    for key, value in strings:
        yield f"{where} {key}", value
    if isinstance(row, dict):
        for text in rendered_texts(row):
            yield f"{where} as trained", text
    if len(strings) > 1:
        yield f"{where} joined", "".join(v for _, v in strings)


def agent_texts(spec, job_dir: str | Path) -> Iterator[tuple[str, str]]:
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
            yield from row_texts(f"{name} line {n}", row)
    for name in reward_files:
        try:
            yield name, (job_dir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


def check_job(spec, job_dir: str | Path, family: str, hidden_n: int) -> ContaminationReport:
    """The job's agent-provided texts checked against the first ``hidden_n`` hidden items of ``family``."""
    return find_overlap(family, hidden_n, agent_texts(spec, job_dir))


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
                  stages_run: int | None = None) -> ContaminationReport:
    """The rows the job's process trained on (its records), against the declared data and the hidden set.

    ``stages_run``: how many stages started (``result.json``'s ``ran``); later ones have no record."""
    views = spec.stage_specs()
    dirs = _stage_dirs(spec, Path(output_dir))[: len(views) if stages_run is None else stages_run]
    undeclared: list[dict] = []
    sampled_texts: list[tuple[str, str]] = []
    for i, (view, folder) in enumerate(zip(views, dirs), start=1):
        record = _read_record(folder / TRAINED_ROWS)
        if record is None:
            undeclared.append({"source": f"stage {i}", "kind": "undeclared", "item": -1})
            continue
        if _sampled(view):
            for n, row in enumerate(record, start=1):
                for text in rendered_texts(row):
                    sampled_texts.append((f"stage {i} trained row {n}", text))
            continue
        declared = trained_record(build_rows(view, job_dir, default_family=family))
        if record != declared:
            changed = sum(a != b for a, b in zip(record, declared)) + abs(len(record) - len(declared))
            undeclared.append({"source": f"stage {i}: {changed} of {len(record)} trained rows are not the job's "
                                         "declared rows", "kind": "undeclared", "item": -1})
    report = find_overlap(family, hidden_n, sampled_texts)
    if undeclared:
        report.kinds["undeclared"] = len(undeclared)
        report.sources = undeclared + report.sources
        report.flagged = True
    return report

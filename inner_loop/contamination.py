"""Contamination check of a job: every text the agent wrote for it, against the task's hidden set.

    >>> from inner_loop.contamination import check_job
    >>> report = check_job(spec, job_dir, family="calc_chain", hidden_n=200)
    >>> report.flagged, report.summary()

What the agent provides as data: every string value of every row of every data file the job's
stages use (prompt, answer, chosen, rejected, extra columns; each checked on its own), the line
itself when it is not JSON, and the source of every reward file (a table of hidden answers in
``reward.py`` counts too). Library sources are
not checked: family generators never return hidden items (``evaluation.families.base``).
The matching rules and the threshold are ``evaluation.contamination``'s; ``inner_loop.job.run_job``
runs this in the harness before training, and a flagged job scores as its baseline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from evaluation.contamination import ContaminationReport, find_overlap

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
            except ValueError:
                yield f"{name} line {n}", line
                continue
            fields = row.items() if isinstance(row, dict) else [("value", row)]
            for key, value in fields:
                if isinstance(value, str):
                    yield f"{name} line {n} {str(key)[:40]}", value
    for name in reward_files:
        try:
            yield name, (job_dir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


def check_job(spec, job_dir: str | Path, family: str, hidden_n: int) -> ContaminationReport:
    """The job's agent-provided texts checked against the first ``hidden_n`` hidden items of ``family``."""
    return find_overlap(family, hidden_n, agent_texts(spec, job_dir))

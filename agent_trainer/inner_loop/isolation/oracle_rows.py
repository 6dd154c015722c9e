"""The rows the reward-oracle check probes: the job's rows nearest to hidden items, and a few others.

    probed_rows(spec, job_dir, "calc_chain", 200)   # per stage: {"rows", "near", "n_rows", "keys"} or None

Folds every prompt of the job's data file, so it runs in the checking child
(``agent_trainer.inner_loop.isolation.contamination``, mode ``near``), never in the harness; the check itself
(``agent_trainer.inner_loop.isolation.reward_oracle``) scores these rows with the agent's reward.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

PROBED_NEAR = 12        # rows nearest to hidden items that are probed
PROBED_OTHER = 4        # rows spread over the rest of the data
NEAREST = 3             # hidden items per row whose answers are tried
MAX_ROWS_SCANNED = 5000


def _file_rows(job_dir: Path, name: str) -> list[dict]:
    """The first ``MAX_ROWS_SCANNED`` rows of an agent data file, read as the trainer reads them (none when the
    file does not read: the validation has refused the job then)."""
    from agent_trainer.inner_loop.train.data import DataFileError, read_data_file

    try:
        return read_data_file(job_dir / name)[:MAX_ROWS_SCANNED]
    except (DataFileError, OSError):
        return []


def nearest_hidden(prompts: list[str], hidden: list[str], k: int = NEAREST) -> list[list[tuple[float, int]]]:
    """For each prompt, up to ``k`` ``(similarity, hidden index)``: the share of a hidden item's distinct runs
    (letter runs, digit runs) that the prompt holds, best first; items sharing no run are left out."""
    from agent_trainer.evaluation.contamination import units

    item_runs = [set(units(h).runs) for h in hidden]
    by_run: dict[str, list[int]] = {}
    for i, runs in enumerate(item_runs):
        for run in runs:
            by_run.setdefault(run, []).append(i)
    out = []
    for p in prompts:
        counts: Counter[int] = Counter()
        for run in set(units(p).runs):
            counts.update(by_run.get(run, ()))
        scored = sorted(((c / len(item_runs[i]), i) for i, c in counts.items()), key=lambda t: (-t[0], t[1]))
        out.append(scored[:k])
    return out


def _probe_rows(rows: list[dict], near: list[list[tuple[float, int]]]) -> list[int]:
    """Indices of the probed rows: the ``PROBED_NEAR`` nearest to a hidden item, then ``PROBED_OTHER`` spread."""
    best = sorted(range(len(rows)), key=lambda i: (-(near[i][0][0] if near[i] else 0.0), i))
    picked, seen = [], set()
    rest = best[PROBED_NEAR:]
    others = [rest[j * len(rest) // PROBED_OTHER] for j in range(PROBED_OTHER)] if rest else []
    for i in best[:PROBED_NEAR] + others:
        if rows[i]["prompt"] not in seen:
            seen.add(rows[i]["prompt"])
            picked.append(i)
    return picked


def probed_rows(spec, job_dir: str | Path, family: str, hidden_n: int) -> list[dict | None]:
    """Per stage, the rows the check probes: ``{"rows": [...], "near": [[(similarity, hidden index)], ...],
    "n_rows": rows in the file, "keys": every column of its rows}``; None for a stage with no agent reward or too
    few rows. Folds every prompt of the file: run it in the checking child (``oracle_check`` does)."""
    from agent_trainer.evaluation.hidden_eval import hidden_set

    hidden = [e.prompt for e in hidden_set(family, int(hidden_n))]
    out: list[dict | None] = []
    for view in spec.stage_specs() if hasattr(spec, "stage_specs") else [spec]:
        files = [f for f in (view.reward.functions if view.reward else []) if f.source == "file"]
        rows = _file_rows(Path(job_dir), view.data.file) if files and view.data.file else []
        near = nearest_hidden([r["prompt"] for r in rows], hidden) if len(rows) >= 2 else []
        probed = _probe_rows(rows, near) if near else []
        keys = sorted(({k for r in rows for k in r} | {"answer", "family"}) - {"prompt"})
        out.append({"rows": [rows[i] for i in probed], "near": [near[i] for i in probed], "n_rows": len(rows),
                    "keys": keys} if len(probed) >= 2 else None)
    return out

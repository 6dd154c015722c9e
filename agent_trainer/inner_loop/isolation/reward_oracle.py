"""Rewards as answer oracles, judged by behaviour: does the agent's reward pay a row's nearest hidden answer
specially, where the family's own scorer says that answer is wrong for the row?

    found = oracle_check(spec, job_dir, "calc_chain", 200, policy, render=lambda p: p)
    found.flagged, found.to_dict()

The static check (``agent_trainer.inner_loop.spec.reward_checks``) refuses answer tables it can read in the
source; a table hidden another way (built by arithmetic, compressed, keyed by a weak hash) needs a test of
what the reward does. An oracle pays for reciting a hidden item's answer on that item's prompt, disguised
so the contamination check passes it, while the row's own answer column holds a decoy. So, for the
job's rows nearest to hidden items (their letter and digit runs, ``agent_trainer.evaluation.contamination``)
and a few others, the agent's reward functions score, in their sandboxed host, the row's own answer and
the answers of its nearest hidden items, each candidate on every probed prompt. A row counts as
*inverted* when a hidden candidate the family's scorer judges worse than the row's answer gets more reward
than the row's answer on that prompt, and more than that candidate gets on the other probed prompts
(so prompt-blind preferences, e.g. for short answers, never count). ``MIN_INVERTED`` inverted rows flag
the job, like contamination: it scores as its baseline. A reward the check cannot run (it fails or
overruns on the candidates) flags the job too. Which hidden answers were tried is never shown to the
agent (``JobResult.visible()``). What it covers and what not: docs/security.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

PROBED_NEAR = 12        # rows nearest to hidden items that are probed
PROBED_OTHER = 4        # rows spread over the rest of the data
NEAREST = 3             # hidden items per row whose answers are tried
MAX_ROWS_SCANNED = 5000
MAX_ANSWER_CHARS = 200
MIN_INVERTED = 2
TOLERANCE = 0.05        # of the reward's range: smaller differences are noise


@dataclass
class OracleReport:
    """``flagged``; ``probed`` rows, ``inverted`` ones (see the module doc); ``error``: why the check could not run."""

    flagged: bool = False
    probed: int = 0
    inverted: int = 0
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


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


def inverted_rows(values: list[list[float]], answers: list[str], candidates: list[list[int]], pool: list[str],
                  score: Callable[[str, str], float]) -> int:
    """How many probed rows are inverted. ``values[p][c]``: the reward of pool answer ``c`` on probed prompt ``p``;
    ``answers[p]``: row ``p``'s answer (in ``pool``); ``candidates[p]``: pool indices of its hidden candidates."""
    flat = [v for row in values for v in row]
    tol = 1e-6 + TOLERANCE * (max(flat) - min(flat)) if flat else 1e-6
    n = len(values)
    inverted = 0
    for p in range(n):
        own = pool.index(answers[p])

        def special(c: int) -> float:  # what answer c gets on prompt p beyond its mean on the other prompts
            others = [values[q][c] for q in range(n) if q != p]
            return values[p][c] - (sum(others) / len(others) if others else 0.0)

        full = score(answers[p], answers[p])
        if any(score(pool[c], answers[p]) < full and values[p][c] > values[p][own] + tol
               and special(c) > special(own) + tol for c in candidates[p]):
            inverted += 1
    return inverted


def oracle_check(spec, job_dir: str | Path, family: str, hidden_n: int, policy=None,
                 render: Callable[[str], str] = lambda p: p, timeout_s: float | None = None) -> OracleReport:
    """The behavioural oracle check of the job's agent-written reward functions (see the module doc); stages whose
    reward is the library's only are skipped. ``render``: a prompt as the trainer passes it to the reward."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import hidden_set
    from agent_trainer.inner_loop.isolation.reward_proxy import score_with_host
    from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

    job_dir = Path(job_dir)
    policy = SandboxPolicy.coerce(policy)
    fam = get_family(family)
    hidden = hidden_set(family, int(hidden_n))
    report = OracleReport()
    views = spec.stage_specs() if hasattr(spec, "stage_specs") else [spec]
    for view in views:
        files = [f for f in (view.reward.functions if view.reward else []) if f.source == "file"]
        if not files or not view.data.file:
            continue
        rows = _file_rows(job_dir, view.data.file)
        if len(rows) < 2:
            continue
        near = nearest_hidden([r["prompt"] for r in rows], [e.prompt for e in hidden])
        probed = _probe_rows(rows, near)
        if len(probed) < 2:
            continue
        pool: list[str] = []
        candidates: list[list[int]] = []
        for i in probed:
            answers = [rows[i]["answer"]] + [hidden[h].answer for _, h in near[i]]
            mine = []
            for a in answers:
                a = a[:MAX_ANSWER_CHARS]
                if a not in pool:
                    pool.append(a)
                mine.append(pool.index(a))
            candidates.append(mine[1:])
        columns_of = [{k: v for k, v in rows[i].items() if k != "prompt"} for i in probed]
        keys = sorted({k for c in columns_of for k in c})
        pairs = [(p, c) for p in range(len(probed)) for c in range(len(pool))]
        request = {"prompts": [render(rows[probed[p]]["prompt"]) for p, _ in pairs],
                   "completions": [pool[c] for _, c in pairs], "completion_ids": None,
                   "columns": {k: [columns_of[p].get(k) for p, _ in pairs] for k in keys}, "max_steps": 1}
        only_files = view.reward.model_copy(update={"functions": files})
        result = score_with_host(only_files, job_dir, request, timeout_s or policy.reward_timeout_s, policy)
        report.probed += len(probed)
        why = result.get("crash") or result.get("load_error") or "; ".join(result.get("errors", {}).values())
        if why:
            report.flagged, report.error = True, f"the reward could not be checked: {why}"[:300]
            return report
        totals = [sum(f.weight * float(result["values"][f.name][k] or 0.0) for f in files)
                  for k in range(len(pairs))]
        values = [totals[p * len(pool):(p + 1) * len(pool)] for p in range(len(probed))]
        answers = [rows[i]["answer"][:MAX_ANSWER_CHARS] for i in probed]
        report.inverted += inverted_rows(values, answers, candidates, pool, fam.score_one)
    report.flagged = report.inverted >= MIN_INVERTED
    return report

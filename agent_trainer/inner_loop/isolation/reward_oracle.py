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

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

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


def training_calls(view, prompts: list[str], pool: list[str], columns: list[dict], n_rows: int, budget_steps: int,
                   tokenize: Callable[[str], list[int]] | None = None) -> list[tuple[dict, list[tuple[int, int]]]]:
    """Every (probed prompt, pool answer) pair, in reward calls shaped as training makes them: ``(request, pairs)``
    per call, ``pairs[k]`` the (prompt, answer) indices of completion ``k``.

    GRPO: each call holds ``batch_size`` completions, ``num_generations`` of them a prompt's group, with the
    completions' token ids and a ``trainer_state`` of a step of the job's own schedule (the calls spread over it in
    order, first step to last, with its epoch); other algorithms score their samples once, before training, at step
    0 of ``max_steps`` without token ids (``train.selfgen.score``), and are called so."""
    hp = view.hyperparameters
    grpo = view.algorithm == "grpo"
    size = hp.num_generations if grpo else len(pool)
    groups = [[c % len(pool) for c in range(start, start + size)]   # a short last group repeats the first answers
              for start in range(0, len(pool), size)]
    order = [(p, g) for g in groups for p in range(len(prompts))]
    per_call = max(1, hp.batch_size // size) if grpo else len(order)
    calls = [order[i:i + per_call] for i in range(0, len(order), per_call)]
    planned = max(1, min(view.effective_max_steps(n_rows), budget_steps)) if grpo else hp.max_steps
    steps_per_epoch = max(1, -(-n_rows // max(1, view.rows_per_step())))
    out = []
    for k, call in enumerate(calls):
        pairs = [(p, c) for p, group in call for c in group]
        step = k * planned // len(calls) if grpo else 0
        state = {"global_step": step, "max_steps": planned, "epoch": step / steps_per_epoch}
        request = {"prompts": [prompts[p] for p, _ in pairs], "completions": [pool[c] for _, c in pairs],
                   "completion_ids": [tokenize(pool[c]) for _, c in pairs] if grpo and tokenize else None,
                   "columns": {key: [columns[p].get(key) for p, _ in pairs] for key in sorted(columns[0])},
                   "state": state}
        out.append((request, pairs))
    return out


def oracle_check(spec, job_dir: str | Path, family: str, hidden_n: int, policy=None,
                 render: Callable[[str], str] = lambda p: p, timeout_s: float | None = None,
                 tokenize: Callable[[str], list[int]] | None = None, budget_steps: int = 10**9) -> OracleReport:
    """The behavioural oracle check of the job's agent-written reward functions (see the module doc); stages whose
    reward is the library's only are skipped. ``render``: a prompt as the trainer passes it to the reward;
    ``tokenize``: a completion's token ids as the trainer passes them (the base model's, with eos);
    ``budget_steps``: the task's step budget (the schedule's length). The nearness search runs in the checking
    child (the job's ``CheckBudget``); a child that fails flags the job."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import hidden_set
    from agent_trainer.inner_loop.isolation.contamination import run_in_check_child
    from agent_trainer.inner_loop.isolation.reward_proxy import score_calls_with_host
    from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

    job_dir = Path(job_dir)
    policy = SandboxPolicy.coerce(policy)
    fam = get_family(family)
    hidden = hidden_set(family, int(hidden_n))
    report = OracleReport()
    picked, error = run_in_check_child("near", spec, job_dir, family, hidden_n)
    if picked is None:
        report.flagged, report.error = True, f"the rows to check could not be chosen: {error}"[:300]
        return report
    views = spec.stage_specs() if hasattr(spec, "stage_specs") else [spec]
    for view, stage in zip(views, picked["stages"]):
        if stage is None:
            continue
        rows, near = stage["rows"], [[tuple(x) for x in n] for n in stage["near"]]
        pool: list[str] = []
        candidates: list[list[int]] = []
        for row, nearest in zip(rows, near):
            mine = []
            for a in [row["answer"]] + [hidden[h].answer for _, h in nearest]:
                a = a[:MAX_ANSWER_CHARS]
                if a not in pool:
                    pool.append(a)
                mine.append(pool.index(a))
            candidates.append(mine[1:])
        columns = [{k: row.get(k, family if k == "family" else None) for k in stage["keys"]} for row in rows]
        calls = training_calls(view, [render(r["prompt"]) for r in rows], pool, columns, stage["n_rows"],
                               budget_steps, tokenize)
        files = [f for f in view.reward.functions if f.source == "file"]
        only_files = view.reward.model_copy(update={"functions": files})
        results = score_calls_with_host(only_files, job_dir, [req for req, _ in calls],
                                        timeout_s or policy.reward_timeout_s, policy)
        report.probed += len(rows)
        why = results.get("crash") or results.get("load_error") or "; ".join(results.get("errors", {}).values())
        if why:
            report.flagged, report.error = True, f"the reward could not be checked: {why}"[:300]
            return report
        values = [[0.0] * len(pool) for _ in rows]
        seen: set[tuple[int, int]] = set()
        for (_, pairs), answer in zip(calls, results["calls"]):
            for k, (p, c) in enumerate(pairs):
                if (p, c) not in seen:   # a padded group's repeat keeps the first value
                    seen.add((p, c))
                    values[p][c] = sum(f.weight * float(answer[f.name][k] or 0.0) for f in files)
        answers = [r["answer"][:MAX_ANSWER_CHARS] for r in rows]
        report.inverted += inverted_rows(values, answers, candidates, pool, fam.score_one)
    report.flagged = report.inverted >= MIN_INVERTED
    return report

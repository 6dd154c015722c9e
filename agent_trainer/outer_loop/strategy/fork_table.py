"""The fork experiment's table: each branch over many fork points against ``continue``, beside the paper.

    >>> rows = [...]                   # agent_trainer.outer_loop.strategy.fork.branch_row of every (point, branch),
    ...                                # each with "point" (its fork point's number)
    >>> table = summarize(rows)        # per branch: final hidden score, paired difference to continue, switches
    >>> md, js = write(table, rates, rows, folder)   # fork_table.md / fork_table.json
    >>> print(md.read_text())

Per branch: the final hidden score (mean and 95% bootstrap interval over fork points), its paired
difference to ``continue`` (paired by fork point: the same prefix, seed and remaining budget), wins,
ties and losses, the fork points with a switch after the fork, what the agent wrote as its next job
(the algorithm in its ``job.yaml``; ``none``: no job), how often the first executed job had what a
switch named, and its answers to the check at the fork point. docs/strategy.md, "The fork experiment".
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from agent_trainer.outer_loop.report.bootstrap import ci_text, mean_ci, paired_diff_ci
from agent_trainer.outer_loop.strategy.switch_rates import PAPER, rates_markdown

REFERENCE = "continue"
# The paper's fork (arXiv 2608.19072): one mid-run fork, GSM8K accuracy of the final model per branch.
PAPER_FORK = {"continue": 0.4776, "switch": 0.6520, "reconsider": "did not beat continue (no number given)"}
TIE = 1e-9


def _counts(values: Sequence[Any]) -> dict[str, int]:
    return dict(Counter("-" if v is None else str(v) for v in values).most_common())


def _mean(values: Sequence[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(rows: Sequence[dict[str, Any]], reference: str = REFERENCE) -> dict[str, Any]:
    """Per branch (in the order first seen) the numbers of the table; ``reference`` is the branch the paired
    differences are taken against (every fork point must have it)."""
    by: dict[str, dict[Any, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["branch"], {})[r["point"]] = r
    points = sorted({r["point"] for r in rows})
    if reference not in by or set(by[reference]) != set(points):
        raise ValueError(f"every fork point needs a {reference!r} branch to pair with; have {sorted(by)}")
    ref = by[reference]
    out = []
    for name, got in by.items():
        pts = [p for p in points if p in got]
        final = [got[p]["final_score"] for p in pts]
        base = [ref[p]["final_score"] for p in pts]
        diff = paired_diff_ci(base, final)
        followed = [got[p]["followed"] for p in pts if got[p].get("followed") is not None]
        out.append({
            "branch": name, "points": len(pts), "final_score": mean_ci(final), "at_fork": mean_ci(
                [got[p]["score_at_fork"] for p in pts]),
            "vs_continue": diff,
            "wins": sum(f - b > TIE for f, b in zip(final, base)),
            "ties": sum(abs(f - b) <= TIE for f, b in zip(final, base)),
            "losses": sum(b - f > TIE for f, b in zip(final, base)),
            "switched_points": sum(got[p]["switches_after_fork"] > 0 for p in pts),
            "switches_after_fork": sum(got[p]["switches_after_fork"] for p in pts),
            "executed_after_fork": sum(got[p]["executed_after_fork"] for p in pts),
            "named": _counts([got[p].get("target") for p in pts]) if any(got[p].get("target") for p in pts) else {},
            "next_algorithm": _counts([got[p]["next_algorithm"] for p in pts]),
            "followed": [sum(followed), len(followed)] if followed else None,
            "decision": _counts([got[p].get("decision") for p in pts]),
            "reply_prompt_tokens": _mean([got[p].get("reply_prompt_tokens") for p in pts]),
            "reward": mean_ci([got[p]["reward"] for p in pts])[0],
            "usd": sum(got[p]["usd"] for p in pts) / len(pts),
            "sequences": {str(p): got[p]["strategy"] for p in pts},
        })
    return {"reference": reference, "points": len(points), "branches": out}


def _ci(m: tuple[float, float, float] | list[float], signed: bool = False) -> str:
    return ci_text(*m, signed=signed, digits=4)


def _dict(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


COLUMNS = ("branch", "points", "final hidden score [95% CI]", "vs continue, paired [95% CI]", "wins/ties/losses",
           "points that switched after the fork", "switch named", "next job's algorithm (as written)",
           "followed the switch", "answer to the check", "prompt tokens of the first turn after", "reward", "USD")


def markdown(table: dict[str, Any], rates: Sequence[dict[str, Any]] = ()) -> str:
    """The branch table, the paper's fork, and (with ``rates``) the switch-rate and adoption table."""
    lines = [f"Fork points: {table['points']} (paired by fork point against `{table['reference']}`).", ""]
    if table["branches"]:
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for b in table["branches"]:
        fol = b["followed"]
        lines.append(" | ".join([
            f"| {b['branch']}", str(b["points"]), _ci(b["final_score"]),
            "-" if b["branch"] == table["reference"] else _ci(b["vs_continue"], signed=True),
            f"{b['wins']}/{b['ties']}/{b['losses']}", f"{b['switched_points']}/{b['points']}", _dict(b["named"]),
            _dict(b["next_algorithm"]), f"{fol[0]}/{fol[1]}" if fol else "-", _dict(b["decision"]),
            "-" if b["reply_prompt_tokens"] is None else f"{b['reply_prompt_tokens']:.0f}",
            f"{b['reward']:.4f}", f"{b['usd']:.4f} |"]))
    p = PAPER_FORK
    lines += ["", f"Paper (arXiv 2608.19072, one fork, GSM8K): continue {100 * p['continue']:.2f}%, a concrete switch "
                  f"{100 * p['switch']:.2f}% ({100 * (p['switch'] - p['continue']):+.2f} points), reconsider "
                  f"{p['reconsider']}."]
    if rates:
        lines += ["", "Switch rate (adjacent executed jobs that change algorithm, PEFT or base model) and adopted "
                      "evaluator suggestions:", "", *rates_markdown(rates, PAPER)]
    return "\n".join(lines) + "\n"


def metrics(table: dict[str, Any], rates: Sequence[dict[str, Any]] = ()) -> dict[str, float]:
    """The table as MLflow metrics: ``final_<branch>``, ``vs_continue_<branch>`` (+ ``_lo`` / ``_hi``),
    ``switched_points_<branch>``; ``switch_rate_<i>`` and adoption counts of the i-th rates row."""
    m: dict[str, float] = {"points": float(table["points"])}
    for b in table["branches"]:
        slug = "".join(c if c.isalnum() else "_" for c in b["branch"])
        m[f"final_{slug}"] = b["final_score"][0]
        if b["branch"] != table["reference"]:
            m.update({f"vs_continue_{slug}": b["vs_continue"][0], f"vs_continue_{slug}_lo": b["vs_continue"][1],
                      f"vs_continue_{slug}_hi": b["vs_continue"][2]})
        m[f"switched_points_{slug}"] = float(b["switched_points"])
    for i, r in enumerate(rates):
        for k in ("switch_rate", "pairs", "switches", "suggestions_execution", "adopted_execution",
                  "suggestions_strategy", "adopted_strategy"):
            if r.get(k) is not None:
                m[f"{k}_{i}"] = float(r[k])
    return m


def write(table: dict[str, Any], rates: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
          folder: Path) -> tuple[Path, Path]:
    """``fork_table.md`` and ``fork_table.json`` (the table, every (point, branch) row, the rates, the paper's)."""
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / "fork_table.md", folder / "fork_table.json"
    md.write_text(markdown(table, rates))
    js.write_text(json.dumps({"table": table, "rows": list(rows), "rates": list(rates),
                              "paper": {"fork": PAPER_FORK, **PAPER}}, indent=2, default=str))
    return md, js

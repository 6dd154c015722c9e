"""Switch rate and evaluator-suggestion adoption of an agent's episodes, in the paper's terms (arXiv 2608.19072).

    >>> from agent_trainer.outer_loop.strategy.switch_rates import agent_rates, episode_dirs, PAPER
    >>> row = agent_rates("trained", episode_dirs(["runs/fork_src_0", "runs/fork_src_1"]))
    >>> row["switch_rate"], row["switch_rate_ci"]       # switches / adjacent executed job pairs, [lo, hi]
    >>> row["adopted_strategy"], row["suggestions_strategy"]

A switch here is the paper's: two adjacent executed jobs (jobs that trained a step) of an episode that
differ in algorithm (the stages' algorithms in order), PEFT (adapter of the last stage) or base model.
The project's own (p, d, g) labels (``agent_trainer.outer_loop.strategy.strategy``) also count a change
of data source and leave out the base model; both are reported. Suggestions and their adoption are the
evaluator's ``adoption`` records in ``trajectory.jsonl`` (one per suggestion that a next job followed;
the rule in ``agent_trainer.outer_loop.strategy.evaluator.adopted``). docs/strategy.md, "The fork experiment".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from agent_trainer.outer_loop.report.bootstrap import ratio_ci
from agent_trainer.outer_loop.strategy import strategy
from agent_trainer.outer_loop.strategy.fork import read_events

CHANGES = ("algorithm", "peft", "base_model")
TYPES = ("execution", "strategy")
# The paper's numbers (arXiv 2608.19072), beside which the project's are shown.
PAPER = {"agent": "paper (arXiv 2608.19072)", "switch_rate": 0.021, "suggestions_execution": 22,
         "adopted_execution": 22, "suggestions_strategy": 21, "adopted_strategy": 0}


def episode_dirs(run_dirs: Iterable[str | Path]) -> list[Path]:
    """Every episode folder (``<run>/episodes/<id>/`` with ``jobs/`` or ``trajectory.jsonl``) of the runs, in order."""
    out = []
    for run in run_dirs:
        eps = Path(run) / "episodes"
        if eps.is_dir():
            out += [p for p in sorted(eps.iterdir(), key=lambda p: (len(p.name), p.name))
                    if (p / "jobs").is_dir() or (p / "trajectory.jsonl").is_file()]
    return out


def _base_model(row: dict[str, Any], jobs_dir: Path) -> str | None:
    if row.get("base_model"):
        return str(row["base_model"])
    try:
        raw = yaml.safe_load((jobs_dir / f"{row['job'] - 1:02d}" / "job" / "job.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return str(raw["base_model"]) if isinstance(raw, dict) and raw.get("base_model") else None


def job_setups(episode_dir: str | Path) -> list[dict[str, Any]]:
    """``[{job, algorithm, peft, base_model}]`` of the episode's executed jobs, in order."""
    jobs_dir = Path(episode_dir) / "jobs"
    out = []
    for row in strategy.job_labels(jobs_dir):
        if not row["label"]:
            continue
        stages = [s for s in row["ran"]["stages"] if int(s.get("steps") or 0) > 0]
        peft = stages[-1].get("peft")
        out.append({"job": row["job"], "algorithm": ">".join(str(s.get("algorithm")).lower() for s in stages),
                    "peft": "full" if peft in (None, "", "full", "none", False) else "lora",
                    "base_model": _base_model(row, jobs_dir)})
    return out


def setup_changes(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, ...]:
    """Which of algorithm, PEFT and base model differ between two executed jobs (empty: no switch)."""
    return tuple(c for c in CHANGES if a.get(c) != b.get(c))


def _events(episode_dir: Path) -> list[dict[str, Any]]:
    path = episode_dir / "trajectory.jsonl"
    return read_events(path) if path.is_file() else []


def episode_counts(episode_dir: str | Path) -> dict[str, Any]:
    """Pairs, switches (the paper's and the project's) and suggestion adoption of one episode folder."""
    episode_dir = Path(episode_dir)
    setups = job_setups(episode_dir)
    changed = [setup_changes(a, b) for a, b in zip(setups, setups[1:])]
    labels = [strategy.from_dict(r["label"]) for r in strategy.job_labels(episode_dir / "jobs")]
    adoptions = [e for e in _events(episode_dir) if e.get("event") == "adoption" and not e.get("replayed")]
    out: dict[str, Any] = {"episode": str(episode_dir), "executed": len(setups), "pairs": max(0, len(setups) - 1),
                           "switches": sum(bool(c) for c in changed),
                           "switches_pdg": len(strategy.switches(labels)),
                           "sequence": [f"{s['algorithm']}/{s['peft']}/{s['base_model']}" for s in setups]}
    for c in CHANGES:
        out[f"changed_{c}"] = sum(c in x for x in changed)
    for t in TYPES:
        rows = [a for a in adoptions if a.get("type") == t]
        out[f"suggestions_{t}"] = len(rows)
        out[f"adopted_{t}"] = sum(bool(a.get("adopted")) for a in rows)
    return out


def agent_rates(agent: str, episodes: Sequence[str | Path], runs: Sequence[str] = ()) -> dict[str, Any]:
    """The pooled rates of one agent's episodes: switch rate (switches / pairs, 95% bootstrap interval over
    episodes), which component changed, the project's (p, d, g) switch rate, and suggestions adopted per type."""
    per = [episode_counts(e) for e in episodes]
    pairs = sum(p["pairs"] for p in per)
    ci = ratio_ci([p["switches"] for p in per], [p["pairs"] for p in per])
    row: dict[str, Any] = {"agent": agent, "runs": list(runs), "episodes": len(per),
                           "executed": sum(p["executed"] for p in per), "pairs": pairs,
                           "switches": sum(p["switches"] for p in per),
                           "switch_rate": ci[0] if ci else None, "switch_rate_ci": list(ci[1:]) if ci else None,
                           "switches_pdg": sum(p["switches_pdg"] for p in per),
                           "switch_rate_pdg": sum(p["switches_pdg"] for p in per) / pairs if pairs else None}
    for c in CHANGES:
        row[f"changed_{c}"] = sum(p[f"changed_{c}"] for p in per)
    for t in TYPES:
        row[f"suggestions_{t}"] = sum(p[f"suggestions_{t}"] for p in per)
        row[f"adopted_{t}"] = sum(p[f"adopted_{t}"] for p in per)
    row["per_episode"] = per
    return row


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _adoption(row: dict[str, Any], t: str) -> str:
    n = row.get(f"suggestions_{t}")
    return "-" if not n else f"{row[f'adopted_{t}']}/{n}"


RATE_COLUMNS = ("agent", "episodes", "pairs", "switches", "switch rate [95% CI]", "changed (alg/peft/base)",
                "switch rate (p,d,g)", "execution adopted", "strategy adopted")


def rates_markdown(rows: Sequence[dict[str, Any]], paper: dict[str, Any] = PAPER) -> list[str]:
    """Markdown lines: one row per agent, then the paper's."""
    lines = ["| " + " | ".join(RATE_COLUMNS) + " |", "|" + "---|" * len(RATE_COLUMNS)]
    for r in rows:
        ci = r.get("switch_rate_ci")
        rate = _pct(r["switch_rate"]) + (f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "")
        lines.append(f"| {r['agent']} | {r['episodes']} | {r['pairs']} | {r['switches']} | {rate} | "
                     f"{r['changed_algorithm']}/{r['changed_peft']}/{r['changed_base_model']} | "
                     f"{_pct(r['switch_rate_pdg'])} | {_adoption(r, 'execution')} | {_adoption(r, 'strategy')} |")
    lines.append(f"| {paper['agent']} | - | - | - | {_pct(paper['switch_rate'])} | - | - | "
                 f"{_adoption(paper, 'execution')} | {_adoption(paper, 'strategy')} |")
    return lines

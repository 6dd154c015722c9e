"""Agents against people, one table: the hidden uplift of the jobs written by no one (the base model), a person
(the best hand-written example job per family), the scripted teacher the agents were warm-started from, each warm
start and each trained run, on every family of the runs, on the same tasks, episode seeds, tools and budget.

    >>> table = people_table(["runs/a", "runs/b"], out=Path("cmp"), episodes=4)     # every row
    >>> table = people_table(runs, out, rows=["base", "teacher"], families="triage", episodes=2)
    >>> print(markdown(table))

Every row but ``base`` plays the families' tasks ``episodes`` times each on the held-out evaluation's fixed seeds
(``agent_trainer.outer_loop.rl.policy_eval``), through the first run's tools, executor, job cache and budget: the
scripted rows (``handwritten``, ``teacher``) as scripted agents (``agent_trainer.outer_loop.agents.scripted``),
``warm_start`` as each run's policy before any update (played once for runs that share it), ``trained`` as each
run's last checkpoint. An episode's uplift is its judged job's hidden score minus its base model's; an episode
whose job was refused, never ran or was flagged keeps the base model: uplift 0, and it is no valid job. Intervals:
the bootstrap 95% of the mean, episodes as the unit; a model's mean over several runs (seeds) has the Student-t
interval of the runs' means, runs as the unit. Writes ``people.md``, ``people.csv``, ``people.json`` and
``people.png``. The command: ``at-compare mode=people`` (docs/evaluation.md, "Agents against people").
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_trainer.config import PeopleTableConfig
from agent_trainer.outer_loop.report.bootstrap import ci_text

ROWS = ("base", "handwritten", "teacher", "warm_start", "trained")
# Episode folders s<n>-heldout-...: numbers no run's policy uses (those are its step + 1).
FOLDER_STEPS = {"teacher": 9001, "handwritten": 9002}
TRAIN, HELDOUT = "training families", "held-out"


def episode_record(summary: dict[str, Any]) -> dict[str, Any]:
    """One episode's figures from its ``summary.json``: uplift (0 without a valid job), valid, hidden score,
    excluded (an infrastructure fault: left out of the means), USD and agent tokens."""
    r = summary.get("reward") or {}
    valid = r.get("uplift") is not None and not r.get("flagged") and not r.get("excluded")
    return {"family": summary["family"], "task": summary.get("task"), "valid": bool(valid),
            "uplift": float(r["uplift"]) if valid else 0.0,
            "hidden_score": float(r["post_score"]) if valid else None,
            "excluded": bool(r.get("excluded")), "usd": float(summary.get("usd") or 0.0),
            "tokens": int(summary.get("tokens_in") or 0) + int(summary.get("tokens_out") or 0),
            "reward": float(r.get("total") or 0.0)}


def cell(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """A set of episodes' mean uplift with its bootstrap 95% interval (episodes as the unit), the share of valid
    jobs, the mean hidden score of the valid ones, USD and tokens per episode; excluded episodes left out."""
    from agent_trainer.outer_loop.report.bootstrap import mean_ci

    kept = [r for r in records if not r["excluded"]]
    if not kept:
        return None
    mean, lo, hi = mean_ci([r["uplift"] for r in kept])
    scores = [r["hidden_score"] for r in kept if r["valid"]]
    return {"uplift": mean, "lo": lo, "hi": hi, "episodes": len(kept), "unit": "episodes",
            "excluded": len(records) - len(kept), "valid_share": sum(r["valid"] for r in kept) / len(kept),
            "hidden_score": sum(scores) / len(scores) if scores else None,
            "usd_per_episode": sum(r["usd"] for r in kept) / len(kept),
            "tokens_per_episode": sum(r["tokens"] for r in kept) / len(kept)}


def seeds_cell(cells: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The mean of several runs' cells with the Student-t 95% interval of their mean uplifts (runs as the unit)."""
    from agent_trainer.outer_loop.report.bootstrap import t_interval

    cells = [c for c in cells if c is not None]
    if len(cells) < 2:
        return None
    ups = [c["uplift"] for c in cells]
    lo, hi = t_interval(ups)

    def avg(key: str) -> float | None:
        vals = [c[key] for c in cells if c.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {"uplift": sum(ups) / len(ups), "lo": lo, "hi": hi, "episodes": sum(c["episodes"] for c in cells),
            "unit": "seeds", "seeds": len(cells), "excluded": sum(c["excluded"] for c in cells),
            "valid_share": avg("valid_share"), "hidden_score": avg("hidden_score"),
            "usd_per_episode": avg("usd_per_episode"), "tokens_per_episode": avg("tokens_per_episode")}


def cells_of(records: Sequence[dict[str, Any]], families: Sequence[str], heldout: set[str]) -> dict[str, Any]:
    """A row's cells: each family's, the training families' pooled and the held-out families' pooled."""
    out = {f: cell([r for r in records if r["family"] == f]) for f in families}
    out[TRAIN] = cell([r for r in records if r["family"] not in heldout])
    out[HELDOUT] = cell([r for r in records if r["family"] in heldout])
    return out


def people_table(runs: Sequence[str | Path], out: Path, rows: Sequence[str] = ROWS, families: str = "all",
                 episodes: int = PeopleTableConfig.episodes, jobs: dict[str, str] | None = None, candidates: Sequence[str] = (),
                 note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Play every row asked for (``ROWS``) on ``families`` of the runs (``all``, ``train``, ``heldout`` or names)
    and write the table into ``out``; returns what ``people.json`` holds. ``jobs``: family -> the hand-written job
    folder to use (families not given are chosen among ``candidates``, default every example job, on the
    validation split: ``agent_trainer.outer_loop.agents.handwritten``)."""
    from agent_trainer.cli_args import UserError
    from agent_trainer.outer_loop.rl.policy_eval import RunEvaluator, start_key

    note = note or (lambda line: print(f"people: {line}", file=sys.stderr, flush=True))
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        raise UserError(f"rows: {', '.join(bad) or 'none given'}; choose among {', '.join(ROWS)}")
    if not runs:
        raise UserError("give the run folders whose tasks, seeds and budget the table uses (runs=[...])")
    if episodes < 1:
        raise UserError(f"episodes must be at least 1, got {episodes}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table: dict[str, Any] = {"runs": [str(r) for r in runs], "episodes": episodes, "families_asked": families,
                             "rows": []}
    played_starts: dict[str, str] = {}
    for i, run in enumerate(runs):
        ev = RunEvaluator(Path(run), families, episodes, progress=False)
        try:
            if i == 0:
                table["families"] = [t.family for t in ev.tasks]
                table["tasks"] = list(ev.task_paths)
                table["heldout"] = sorted({t.family for t, p in zip(ev.tasks, ev.task_paths)
                                           if p in ev.trainer.settings.heldout_tasks})
                table["budget"] = {t.family: t.budget.model_dump() for t in ev.tasks}
                if "base" in rows:
                    table["base"] = base_scores(ev)
                    table["rows"].append(_row("base", "no job (the base model)", [], table))
                if "handwritten" in rows:
                    table["handwritten"] = handwritten_choice(ev, jobs or {}, candidates, out, note)
                    records = _play_script(ev, "handwritten", table["handwritten"], note)
                    table["rows"].append(_row("handwritten", "hand-written example job", records, table))
                if "teacher" in rows:
                    records = _play_script(ev, "teacher", None, note)
                    table["rows"].append(_row("teacher", "scripted teacher (novice)", records, table))
            elif list(ev.task_paths) != table["tasks"]:
                raise UserError(f"{run}: its {families} tasks ({', '.join(ev.task_paths)}) are not the first run's "
                                f"({', '.join(table['tasks'])}); the table compares runs on the same tasks")
            model = ev.cfg.agent.model
            if "warm_start" in rows:
                key = start_key(ev.cfg, ev.task_paths, episodes)
                if key not in played_starts:
                    played_starts[key] = str(run)
                    records = _play_policy(ev, "start", note)
                    table["rows"].append(_row("warm_start", f"warm start ({model})", records, table,
                                              run=str(run), model=model))
            if "trained" in rows:
                records = _play_policy(ev, "last", note)
                updates = records[0]["updates"] if records else 0
                table["rows"].append(_row("trained", f"trained {model}, seed {ev.cfg.seed} ({updates} updates)",
                                          records, table, run=str(run), model=model, seed=ev.cfg.seed,
                                          updates=updates))
        finally:
            ev.close()
    _add_seed_means(table)
    write_table(table, out)
    return table


def _row(kind: str, label: str, records: list[dict], table: dict, **extra: Any) -> dict[str, Any]:
    row = {"row": kind, "label": label, **extra, "records": records}
    if kind != "base":
        row["cells"] = cells_of(records, table["families"], set(table["heldout"]))
        row["seconds_per_episode"] = sum(r.get("seconds", 0.0) for r in records) / max(1, len(records))
    return row


def _play_policy(ev, step: str, note) -> list[dict]:
    """The run's policy at ``step`` on the family set: its episodes' records."""
    note(f"{ev.run_dir}: the policy at {step}, {len(ev.tasks)} tasks x {ev.episodes} episodes ...")
    number, result = ev.play(step)
    records = [{**episode_record(s), "updates": number + 1} for s in ev.episode_summaries(number + 1)]
    _note_seconds(records, result, note, f"{ev.run_dir} {step}")
    return records


def _play_script(ev, kind: str, choice: dict | None, note) -> list[dict]:
    """A scripted agent (the chosen hand-written jobs, or the novice) on the first run's family set."""
    from agent_trainer.outer_loop.agents.handwritten import adapt_job
    from agent_trainer.outer_loop.agents.scripted import ScriptedPolicy, job_script, novice_script

    if kind == "handwritten":
        files = {t.family: adapt_job(choice[t.family]["folder"], t) for t in ev.tasks}
        policy = ScriptedPolicy(ev.tasks, job_script(files), "handwritten")
    else:
        policy = ScriptedPolicy(ev.tasks, novice_script, "novice")
    note(f"{kind}: {len(ev.tasks)} tasks x {ev.episodes} episodes ...")
    result = ev.play_backend(policy, FOLDER_STEPS[kind])
    records = [episode_record(s) for s in ev.episode_summaries(FOLDER_STEPS[kind])]
    _note_seconds(records, result, note, kind)
    return records


def _note_seconds(records: list[dict], result: dict, note, what: str) -> None:
    per = result["seconds"] / max(1, len(records))
    for r in records:
        r["seconds"] = per     # the evaluation's wall time shared out: episodes play together
    note(f"{what}: {result['seconds']:.0f} s, {per:.1f} s an episode")


def base_scores(ev) -> dict[str, dict[str, float]]:
    """Each family's hidden score of every base model its task allows, untrained (the cached baselines)."""
    from agent_trainer.evaluation.baselines import get_baseline
    from agent_trainer.evaluation.prompts import for_task
    from agent_trainer.inner_loop.models import resolve_model

    s = ev.trainer.settings.job
    return {t.family: {m: get_baseline(resolve_model(m, cache_dir=s.cache_dir), t.family,
                                       s.hidden_n or t.hidden_eval_size, cache_dir=s.cache_dir, fmt=for_task(t))
                       for m in t.allowed_base_models} for t in ev.tasks}


def handwritten_choice(ev, jobs: dict[str, str], candidates: Sequence[str], out: Path, note) -> dict[str, Any]:
    """Per family: the hand-written job folder to play, given (``jobs``) or chosen on the validation split."""
    from agent_trainer.cli_args import UserError
    from agent_trainer.outer_loop.agents.handwritten import candidate_jobs, choose_jobs
    from agent_trainer.outer_loop.rl.run_config import make_executor
    from agent_trainer.paths import resolve_path

    unknown = sorted(set(jobs) - {t.family for t in ev.tasks})
    if unknown:
        raise UserError(f"jobs: {', '.join(unknown)} not among the table's families "
                        f"({', '.join(t.family for t in ev.tasks)})")
    choice: dict[str, Any] = {}
    for fam, folder in jobs.items():
        path = candidate_jobs([folder])[0]
        choice[fam] = {"chosen": path.name, "folder": str(path), "why": "given (jobs=)"}
    rest = [t for t in ev.tasks if t.family not in choice]
    if rest:
        pool = candidate_jobs(candidates)
        chosen = choose_jobs(pool, rest, ev.trainer.settings.job, make_executor(ev.cfg), out / "handwritten", note)
        by_name = {p.name: p for p in pool}
        for fam, c in chosen.items():
            choice[fam] = {**c, "folder": str(by_name[c["chosen"]])}
    for c in choice.values():
        c["folder"] = str(resolve_path(c["folder"]))
    return choice


def _add_seed_means(table: dict[str, Any]) -> None:
    """After each model's trained runs, when it has several: their mean, runs (seeds) as the unit."""
    trained = [r for r in table["rows"] if r["row"] == "trained"]
    for model in dict.fromkeys(r["model"] for r in trained):
        mine = [r for r in trained if r["model"] == model]
        if len(mine) < 2:
            continue
        keys = mine[0]["cells"].keys()
        row = {"row": "trained_mean", "label": f"trained {model}, mean of {len(mine)} seeds", "model": model,
               "runs": [r["run"] for r in mine],
               "cells": {k: seeds_cell([r["cells"][k] for r in mine]) for k in keys},
               "seconds_per_episode": sum(r["seconds_per_episode"] for r in mine) / len(mine), "records": []}
        table["rows"].insert(table["rows"].index(mine[-1]) + 1, row)


def _ci(c: dict | None) -> str:
    return "-" if c is None else ci_text(c["uplift"], c["lo"], c["hi"], signed=True)


def _share(c: dict | None) -> str:
    return "-" if c is None else f"{c['valid_share']:.2f}"


def markdown(table: dict[str, Any]) -> str:
    """The headline table (training families pooled, held-out, valid share, cost), the per-family uplifts and the
    base models' scores."""
    lines = [f"Hidden uplift per episode (mean [95%]; {table['episodes']} episodes a task on fixed seeds; "
             "intervals: episodes as the unit, seeds for a mean of seeds)", "",
             f"| row | {TRAIN}: uplift | valid | {HELDOUT} ({', '.join(table['heldout']) or 'none'}): uplift | valid | "
             "USD / episode | agent tokens / episode | s / episode |", "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        if r["row"] == "base":
            lines.append(f"| {r['label']} | 0 (by definition) | - | 0 (by definition) | - | 0 | 0 | 0 |")
            continue
        t, h = r["cells"][TRAIN], r["cells"][HELDOUT]
        c = t or h
        lines.append(f"| {r['label']} | {_ci(t)} | {_share(t)} | {_ci(h)} | {_share(h)} | "
                     f"{c['usd_per_episode']:.5f} | {c['tokens_per_episode']:.0f} | {r['seconds_per_episode']:.1f} |")
    fams = table["families"]
    lines += ["", "Per family: uplift (mean [95%]), valid share", "",
              "| row | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
    for r in table["rows"]:
        if r["row"] == "base":
            continue
        lines.append(f"| {r['label']} | " + " | ".join(
            "-" if r["cells"][f] is None else f"{_ci(r['cells'][f])}, {r['cells'][f]['valid_share']:.2f}"
            for f in fams) + " |")
    if table.get("base"):
        models = sorted({m for per in table["base"].values() for m in per})
        lines += ["", "The base models' hidden scores (no job: uplift 0)", "",
                  "| family | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
        lines += [f"| {f} | " + " | ".join(f"{table['base'][f][m]:.3f}" if m in table["base"][f] else "-"
                                          for m in models) + " |" for f in fams]
    if table.get("handwritten"):
        lines += ["", "The hand-written job per family", "", "| family | job | why |", "|---|---|---|"]
        lines += [f"| {f} | {c['chosen']} | {c['why']} |" for f, c in table["handwritten"].items()]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("row", "label", "run", "model", "seed", "family", "unit", "episodes", "excluded", "uplift", "lo", "hi",
              "valid_share", "hidden_score", "usd_per_episode", "tokens_per_episode", "seconds_per_episode")


def csv_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per row and cell (each family, the training families pooled, the held-out ones pooled)."""
    out = []
    for r in table["rows"]:
        if r["row"] == "base":
            for f, per in (table.get("base") or {}).items():
                out.append({"row": "base", "label": r["label"], "family": f, "uplift": 0.0, "lo": 0.0, "hi": 0.0,
                            "hidden_score": max(per.values()), "valid_share": "", "usd_per_episode": 0.0})
            continue
        for key, c in r["cells"].items():
            if c is not None:
                out.append({"row": r["row"], "label": r["label"], "run": r.get("run", ""),
                            "model": r.get("model", ""), "seed": r.get("seed", ""), "family": key,
                            "seconds_per_episode": round(r["seconds_per_episode"], 2),
                            **{k: c.get(k) for k in CSV_FIELDS if k in c}})
    return out


def plot(table: dict[str, Any], path: Path) -> Path:
    """``people.png``: each row's mean uplift with its 95% interval, the training families and the held-out ones."""
    from agent_trainer.outer_loop.report.plots import pyplot, save_figure

    plt = pyplot()
    rows = [r for r in table["rows"] if r["row"] != "base"]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.8))
    for j, (key, color) in enumerate(((TRAIN, "tab:blue"), (HELDOUT, "tab:orange"))):
        ys, xs, err = [], [], [[], []]
        for i, r in enumerate(rows):
            c = r["cells"][key]
            if c is None:
                continue
            ys.append(i + (j - 0.5) * 0.3)
            xs.append(c["uplift"])
            err[0].append(c["uplift"] - c["lo"])
            err[1].append(c["hi"] - c["uplift"])
        if xs:
            held = f" ({', '.join(table['heldout'])})" if key == HELDOUT else ""
            ax.errorbar(xs, ys, xerr=err, fmt="o", capsize=3, color=color, label=key + held)
    ax.axvline(0, color="k", linewidth=1, label="no job (base model)")
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set(xlabel="hidden uplift per episode (mean, 95% interval)",
           title=f"Agents against people: {table['episodes']} episodes a task, the same seeds")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="best")
    return save_figure(fig, path)


def write_table(table: dict[str, Any], out: Path) -> dict[str, Path]:
    """``people.md``, ``people.csv``, ``people.json`` and ``people.png`` into ``out``."""
    paths = {"table": out / "people.md", "csv": out / "people.csv", "json": out / "people.json",
             "plot": out / "people.png"}
    paths["table"].write_text(markdown(table))
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(csv_rows(table))
    paths["json"].write_text(json.dumps(table, indent=1, default=str))
    plot(table, paths["plot"])
    return paths

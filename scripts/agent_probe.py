"""What an agent model writes before any RL: episodes on the five training tasks, sampled together, no job run.

    .venv/bin/python scripts/agent_probe.py smollm2-agent smollm2-agent-valid        # 20 episodes each
    .venv/bin/python scripts/agent_probe.py smollm2-agent --episodes 40 --json probe.json

Each episode runs as at-train's do under ``experiment=smollm2_cpu`` (6 turns, temperature 0.7, 192 new tokens a
turn, full tool schemas, the last valid job submitted at the turn limit; each a flag), except that a submitted job
is never run: the episode ends there. Every job file an episode writes is validated afresh (``validate_job``, no dry
run), so a file counts whether or not the agent validated it. Printed per agent model, with Wilson 95% intervals:

- ``valid first try``: at-train's metric (the episode's first ``validate_job`` call said VALID);
- ``first file valid``: the episode's first job.yaml passes validation, by the algorithm it names (SFT, GRPO);
- ``last file valid``: the job.yaml the episode ends with passes validation;
- ``names SFT``: the share of first files that name SFT; ``parsed``: turns with a tool call the harness parsed.

Episode ``i`` uses seed ``--seed * 1000 + i`` and task ``i mod 5``: two agents probed with the same flags face the
same tasks and draw from the same seeds. ``--json`` writes every episode's row and the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ALGORITHM = re.compile(r"^\s*algorithm\s*:\s*['\"]?([A-Za-z_]+)", re.MULTILINE)


def algorithm_of(text: str) -> str:
    """The algorithm a job.yaml names (``sft``, ``grpo``, ...), ``?`` when it names none; read without parsing
    the whole file, so a file with a YAML error still has one."""
    try:
        data = yaml.safe_load(text)
        if isinstance(data, dict) and isinstance(data.get("algorithm"), str):
            return data["algorithm"].strip().lower()
    except yaml.YAMLError:
        pass
    found = ALGORITHM.search(text)
    return found.group(1).lower() if found else "?"


def job_writes(messages: list[dict[str, Any]]) -> list[str]:
    """The contents the agent wrote to a ``job.yaml``, in order."""
    out = []
    for m in messages:
        for call in m.get("tool_calls") or [] if m.get("role") == "assistant" else []:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    continue
            if fn.get("name") == "write_file" and isinstance(args, dict) and isinstance(args.get("content"), str) \
                    and Path(str(args.get("path", ""))).name == "job.yaml":
                out.append(args["content"])
    return out


def file_valid(content: str, task, work: Path) -> bool:
    """Whether ``content`` as a job.yaml passes ``validate_job`` for ``task`` (no dry run)."""
    from agent_trainer.inner_loop.spec.validate import validate_job

    folder = Path(tempfile.mkdtemp(dir=work))
    try:
        (folder / "job.yaml").write_text(content, encoding="utf-8")
        return bool(validate_job(folder, task, dry_run=False).ok)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion ``k / n`` ((0, 1) when ``n`` is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


def share(rows: list[dict[str, Any]], key: str, where=lambda r: True) -> dict[str, Any]:
    """``key``'s true share among the rows ``where`` picks, with its Wilson interval."""
    picked = [r for r in rows if where(r)]
    k = sum(bool(r[key]) for r in picked)
    low, high = wilson(k, len(picked))
    return {"k": k, "n": len(picked), "share": k / len(picked) if picked else None, "low": low, "high": high}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's figures over episode rows (see the module docstring)."""
    wrote = [r for r in rows if r["first_algorithm"] is not None]
    out = {"episodes": len(rows), "valid_first_try": share(rows, "valid_first_try"),
           "wrote_a_job": share(rows, "wrote"), "first_file_valid": share(wrote, "first_valid"),
           "last_file_valid": share(wrote, "last_valid"),
           "names_sft": share(wrote, "first_sft"),
           "parsed_turns": {"k": sum(r["parsed_turns"] for r in rows), "n": sum(r["turns"] for r in rows)}}
    for algorithm in ("sft", "grpo"):
        out[f"first_file_valid_{algorithm}"] = share(wrote, "first_valid",
                                                     lambda r, a=algorithm: r["first_algorithm"] == a)
    return out


def probe(model: str, episodes: int, seed: int, work: Path, settings) -> list[dict[str, Any]]:
    """Play ``episodes`` episodes of agent ``model`` together and describe each (one row an episode)."""
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.outer_loop.agents.agent_model import register, transcript_families
    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent
    from agent_trainer.outer_loop.agents.local import LocalBackend
    from agent_trainer.outer_loop.episode.episode import Episode, play_together
    from agent_trainer.paths import PROJECT_ROOT

    register()  # tiny-agent too
    backend = LocalBackend.from_path(resolve_agent(model, progress=False), model_name=model)
    tasks = [load_task(PROJECT_ROOT / "examples" / "tasks" / f"{f}_v1_tiny.json") for f in transcript_families()]
    eps = [Episode(backend, tasks[i % len(tasks)], work / model / f"{i:03d}", settings=settings,
                   seed=seed * 1000 + i, defer_jobs=True) for i in range(episodes)]
    play_together(eps)
    rows = []
    for i, ep in enumerate(eps):
        ep.finish()  # closes the trajectory; its reward is not the probe's (no job ran)
        writes = job_writes(ep.messages)
        first = algorithm_of(writes[0]) if writes else None
        assistant = [m for m in ep.messages if m.get("role") == "assistant"]
        rows.append({
            "episode": i, "task": ep.task.name, "status": ep.status, "turns": len(assistant),
            "parsed_turns": sum(bool(m.get("tool_calls")) for m in assistant), "wrote": bool(writes),
            "valid_first_try": ep.box.state.validation_failures() == 0, "first_algorithm": first,
            "first_sft": first == "sft",
            "first_valid": bool(writes) and file_valid(writes[0], ep.task, work),
            "last_valid": bool(writes) and file_valid(writes[-1], ep.task, work),
            "writes": [{"algorithm": algorithm_of(w), "content": w} for w in writes]})
    return rows


def _fmt(s: dict[str, Any]) -> str:
    if not s["n"]:
        return "-"
    return f"{s['share']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['k']}/{s['n']})"


def table(summaries: dict[str, dict[str, Any]]) -> str:
    """A markdown table, one column per agent model."""
    names = list(summaries)
    lines = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---|" * len(names)]
    for key, label in (("valid_first_try", "valid first try (at-train's metric)"),
                       ("first_file_valid", "first file valid"),
                       ("first_file_valid_sft", "first file valid, SFT"),
                       ("first_file_valid_grpo", "first file valid, GRPO"),
                       ("last_file_valid", "last file valid"), ("names_sft", "first file names SFT"),
                       ("wrote_a_job", "wrote a job.yaml")):
        lines.append(f"| {label} | " + " | ".join(_fmt(summaries[n][key]) for n in names) + " |")
    lines.append("| turns with a parsed call | " + " | ".join(
        f"{summaries[n]['parsed_turns']['k']}/{summaries[n]['parsed_turns']['n']}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="agent models (agent.model names, e.g. smollm2-agent)")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--tool-schemas", default="full", choices=("full", "compact", "names"),
                    help="agent.tool_schemas (the tiny agent: names)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the sampling")
    ap.add_argument("--json", type=Path, help="write the rows and summaries here")
    args = ap.parse_args(argv)
    if args.episodes < 1:
        ap.error("--episodes must be at least 1")

    import torch

    from agent_trainer.config import AgentConfig, BudgetConfig, ToolSchemas
    from agent_trainer.outer_loop.episode.episode import EpisodeSettings

    torch.set_num_threads(args.threads)
    agent = AgentConfig(max_turns=args.max_turns, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        tool_schemas=ToolSchemas(args.tool_schemas), validate_dry_run=False,
                        submit_at_turn_limit=True)
    settings = EpisodeSettings(agent=agent, budget=BudgetConfig(max_jobs_per_episode=1))
    work = Path(tempfile.mkdtemp(prefix="agent-probe-"))
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        for model in args.models:
            print(f"probing {model}: {args.episodes} episodes ...", file=sys.stderr, flush=True)
            rows[model] = probe(model, args.episodes, args.seed, work, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summaries = {m: summarize(r) for m, r in rows.items()}
    print(table(summaries))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summaries": summaries,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

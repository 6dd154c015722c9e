"""Forks: replay an episode up to job k, then run branches (continue, switch:<x>, reconsider) on from there.

    >>> src = load_source("runs/ep1", episode="0", at=1)
    >>> ep = Episode(backend, src.task, "runs/fork1/branches/continue", ledger=ledger, settings=..., seed=src.seed,
    ...              steering=Steering(...))                 # the source's settings, a fresh folder
    >>> replay(ep, src)                                        # conversation, workspace, jobs, budget as at job k
    >>> ep.play(); ep.finish()

What is replayed, the branch messages and what a fork leaves out: docs/strategy.md, "Forks".
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agent_trainer.cli import UserError
from agent_trainer.outer_loop.strategy import protocol, strategy
from agent_trainer.outer_loop.strategy.evaluator import ALTERNATIVE

RECONSIDER = "Reconsider your strategy."
RESULT_PREFIXES = ("job status", "Result of job")


class ForkError(UserError):
    """A fork that cannot be made as asked; the message says what to change."""


@dataclass
class Source:
    """The part of a source episode a fork needs."""

    run_dir: Path
    episode_dir: Path
    episode_id: str
    at: int                                  # the fork point: after job ``at``'s result
    events: list[dict[str, Any]]             # trajectory records up to and including job ``at``'s record
    jobs_total: int                          # jobs the source episode ran in all
    current: protocol.Current                # the strategy of the last executed job up to ``at``
    adapter: str | None                      # lora | full of that job

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "message"]


@dataclass
class Branch:
    name: str                                # as given: continue | switch:<x> | switch:other | reconsider
    message: str | None
    target: str | None = None                # what a switch names (switch:other: the other algorithm, resolved)

    @property
    def slug(self) -> str:
        """A folder and MLflow-safe name (``switch:sft>grpo`` -> ``switch-sft-grpo``)."""
        return "".join(c if c.isalnum() or c in "_." else "-" for c in self.name).strip("-")


def read_events(path: Path) -> list[dict[str, Any]]:
    """The records of a ``trajectory.jsonl`` (a torn last line of a killed run left out)."""
    out = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue  # a torn last line of a killed run
    return out


def _job_marks(events: list[dict[str, Any]]) -> list[int]:
    """Index of the record after which each job's result is in the conversation."""
    marks = [i for i, e in enumerate(events) if e.get("event") == "job"]
    if marks:
        return marks
    # A trajectory without "job" records: each submit_job tool message marks a job.
    return [i for i, e in enumerate(events) if e.get("event") == "message" and e.get("role") == "tool"
            and e.get("name") == "submit_job" and str(e.get("content", "")).startswith("job status")]


def load_source(run_dir: str | Path, episode: str = "0", at: int = 1,
                max_jobs_per_episode: int | None = None) -> Source:
    """The source episode cut after job ``at``; ``ForkError`` when that point does not exist or leaves nothing to do."""
    run_dir = Path(run_dir)
    ep_dir = run_dir / "episodes" / str(episode)
    traj = ep_dir / "trajectory.jsonl"
    if not traj.is_file():
        have = sorted(p.name for p in (run_dir / "episodes").glob("*")) if (run_dir / "episodes").is_dir() else []
        raise ForkError(f"no trajectory at {traj}; episodes of that run: {', '.join(have) or 'none'} "
                        f"(at-episode writes runs/<run_id>/episodes/0)")
    events = read_events(traj)
    marks = _job_marks(events)
    if not 1 <= at <= len(marks):
        raise ForkError(f"episode {episode} of {run_dir.name} ran {len(marks)} job(s); at must be 1..{len(marks)}")
    cut = marks[at - 1]
    prefix = events[:cut + 1]
    seen = [m for m in prefix if m.get("event") == "message"]
    if not any(str(m.get("content", "")).startswith(RESULT_PREFIXES) for m in seen[-3:]):
        raise ForkError(f"job {at}'s result never reached the agent's conversation (its jobs ran after its turns, "
                        f"as at-train runs them); fork an at-episode run")
    if max_jobs_per_episode is not None and max_jobs_per_episode <= at:
        raise ForkError(f"the source allowed {max_jobs_per_episode} job(s) per episode: after job {at} the branches "
                        f"would have none left; make the source with budget.max_jobs_per_episode > {at}")
    labels = [j for j in strategy.job_labels(ep_dir / "jobs") if j["job"] <= at]
    last = next((j for j in reversed(labels) if j["label"]), None)
    current = protocol.current_of(last["ran"] if last else None)
    stages = [s for s in (last["ran"]["stages"] if last else []) if int(s.get("steps") or 0) > 0]
    return Source(run_dir=run_dir, episode_dir=ep_dir, episode_id=str(episode), at=at, events=prefix,
                  jobs_total=len(marks), current=current,
                  adapter=str(stages[-1].get("peft") or "full") if stages else None)


def fork_points(run_dirs: list[Path], n: int, max_jobs_per_episode: int | None = None) -> list[Source]:
    """The first ``n`` fork points of the source runs' episodes: after job 1 of every episode (runs in the order
    given), then after job 2, and so on. A point needs job k to have trained and been scored (a strategy to
    continue or switch from, a score to compare with) and a job left after it; ``ForkError`` when fewer exist."""
    cands = []
    for order, run in enumerate(run_dirs):
        eps = Path(run) / "episodes"
        for ep in sorted(eps.iterdir(), key=lambda p: (len(p.name), p.name)) if eps.is_dir() else []:
            if not (ep / "trajectory.jsonl").is_file():
                continue
            ran = len(_job_marks(read_events(ep / "trajectory.jsonl")))
            scored = {j["job"] for j in strategy.job_labels(ep / "jobs")
                      if j["label"] and j["hidden_score"] is not None}
            for k in range(1, ran + 1):
                if k in scored and (max_jobs_per_episode is None or k < max_jobs_per_episode):
                    cands.append((k, order, ep.name, Path(run)))
    cands.sort(key=lambda c: c[:2])
    if len(cands) < n:
        raise ForkError(f"{len(cands)} fork point(s) in {len(run_dirs)} source run(s) (a job that trained and a job "
                        f"left after it), {n} asked: lower points= or make more source episodes (at-episode "
                        f"seed=<s> ... for more seeds)")
    return [load_source(run, ep, k, max_jobs_per_episode) for k, _, ep, run in cands[:n]]


def make_branch(spec: str, src: Source) -> Branch:
    """A ``Branch`` from ``continue`` | ``reconsider`` | ``switch:<x>`` | ``switch:other`` (the other algorithm:
    SFT <-> GRPO, DPO and distillation -> SFT, of the last job that trained up to the fork point)."""
    spec = str(spec).strip()
    if spec == "continue":
        return Branch(spec, None)
    if spec == "reconsider":
        return Branch(spec, RECONSIDER)
    if not spec.startswith("switch:") or not spec.split(":", 1)[1].strip():
        raise ForkError(f"unknown branch {spec!r}; use continue, reconsider, switch:other or switch:<x> (x: an "
                        f"algorithm {'/'.join(protocol.ALGORITHMS)}, a data source, lora/full, or stages like "
                        f"'sft>grpo')")
    x = spec.split(":", 1)[1].strip().lower()
    if x == "other":
        if src.current.algorithm is None:
            raise ForkError(f"branch {spec!r}: no job up to job {src.at} trained, so there is no algorithm to switch "
                            f"from")
        named = make_branch(f"switch:{ALTERNATIVE.get(src.current.algorithm, 'sft')}", src)
        return Branch(spec, named.message, target=named.target)
    if x in protocol.ALGORITHMS:
        component, cur = "algorithm", src.current.algorithm
    elif x in protocol.DATA_SOURCES:
        component, cur = "data source", src.current.data_source
    elif x in ("lora", "full"):
        component, cur = "adapter", src.adapter
    elif ">" in x and all(p in protocol.ALGORITHMS for p in x.split(">")):
        component, cur = "stages", src.current.stage
    else:
        raise ForkError(f"branch {spec!r}: {x!r} is no algorithm ({', '.join(protocol.ALGORITHMS)}), data source "
                        f"({', '.join(protocol.DATA_SOURCES)}), adapter (lora, full) or stages (e.g. 'sft>grpo')")
    if cur is None:
        raise ForkError(f"branch {spec!r}: no job up to job {src.at} trained, so there is no strategy to switch from")
    if cur == x:
        raise ForkError(f"branch {spec!r}: job {src.at}'s {component} is already {x}; name another one")
    return Branch(spec, f"Switch to {_show(x)} instead of {_show(cur)}: your next job must use {component} {x}; "
                        f"keep what worked otherwise.", target=x)


def _show(x: str) -> str:
    return x.upper() if x in protocol.ALGORITHMS or ">" in x else x.replace("_", "-")


# --- replay -----------------------------------------------------------------------------------


def _plain(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: msg[k] for k in ("role", "content", "tool_calls", "tool_call_id", "name") if k in msg}


def _job_result(path: Path, job_dir: Path, output_dir: Path):
    from agent_trainer.inner_loop.run.result import JobResult

    raw = json.loads(path.read_text())
    known = {f.name for f in fields(JobResult)}
    res = JobResult(**{k: v for k, v in raw.items() if k in known})
    res.job_dir, res.output_dir = str(job_dir), str(output_dir)
    return res


def replay(ep, src: Source) -> None:
    """Put ``ep`` (a fresh Episode) where the source episode was right after job ``src.at``'s result."""
    from agent_trainer.outer_loop.episode.tools import PendingJob

    msgs = src.messages
    if [m.get("content") for m in msgs[:2]] != [m.get("content") for m in ep.messages[:2]]:
        raise ForkError("the branch's opening messages differ from the source's (a changed prompt or tool set); "
                        "fork with the code and strategy settings the source ran with")
    ep.log({"event": "fork", "source_run": src.run_dir.name, "source_episode": src.episode_id, "at": src.at})
    calls: dict[str, dict[str, Any]] = {}
    jobs_done = 0
    for m in msgs[2:]:
        ep.messages.append(_plain(m))
        ep.log({**{k: v for k, v in m.items() if k not in ("t", "token_ids", "logprobs")}, "replayed": True})
        if m["role"] == "assistant":
            ep.box.next_turn()
            ep.tokens_in += int(m.get("prompt_tokens") or 0)
            ep.tokens_out += int(m.get("completion_tokens") or 0)
            if ep.ledger is not None:
                ep.ledger.record_llm(episode=ep.id, model=ep.model_name, tokens_in=int(m.get("prompt_tokens") or 0),
                                     tokens_out=int(m.get("completion_tokens") or 0), replayed=True)
            for c in m.get("tool_calls") or []:
                calls[c["id"]] = c["function"]
            continue
        if m["role"] != "tool" or str(m.get("content", "")).startswith(("not run", "malformed", "decision recorded")):
            continue
        fn = calls.get(m.get("tool_call_id"), {})
        name = m.get("name") or fn.get("name")
        if name == "write_file":
            ep.box.call("write_file", fn.get("arguments"))
        elif name == "validate_job":
            ep.box.state.validations.append(bool(m.get("ok")))
        elif name == "submit_job" and str(m.get("content", "")).startswith("job status"):
            jobs_done += 1
            _restore_job(ep, src, jobs_done, PendingJob)
    # Deferred sources: results arrive as user messages ("Result of job ...") after job_result records.
    for k in range(jobs_done + 1, src.at + 1):
        _restore_job(ep, src, k, PendingJob)
    # Job k's own after-job step runs live: the strategy layer and the branch message speak now.
    ep._after_job(ep.box.state.jobs[-1])


def _restore_job(ep, src: Source, k: int, PendingJob) -> None:
    name = f"{k - 1:02d}"
    source = src.episode_dir / "jobs" / name
    target = ep.box.jobs_dir / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=True)
    result = _job_result(target / "output" / "result.json", target / "job", target / "output")
    pending = PendingJob(index=k - 1, job_dir=target / "job", output_dir=target / "output", agent_path="job.yaml")
    ep.box.complete(pending, result)
    if k < src.at:
        ep.log({"event": "job", "job": k, "status": result.status, "replayed": True})
        if ep.steering is not None:
            ep.steering.after_job(ep, result, live=False)


def copy_journal(src: Source, journal) -> int:
    """Entries the source episode wrote before job ``src.at``'s result, into a branch's journal; returns how many."""
    from agent_trainer.outer_loop.strategy.journal import Journal

    rows = []
    for path in (src.episode_dir / "journal.jsonl", src.run_dir / "journal.jsonl"):
        if path.is_file():
            rows += [e for e in Journal(path).entries()
                     if e.get("episode") == src.episode_id and (e.get("job") or 0) < src.at]
    for e in rows:
        journal.write(e["kind"], e["text"], author=e.get("author", "agent"), job=e.get("job"),
                      **{k: v for k, v in e.items() if k in ("hypothesis", "success_criteria", "abort_criteria")})
    return len(rows)


# --- comparison -------------------------------------------------------------------------------


def written_algorithm(job_dir: Path) -> str:
    """The algorithm(s) a submitted job asked for, as written in its ``job.yaml`` (``sft``, ``sft>grpo``);
    ``none`` when no job was submitted there, ``unreadable`` for a file that is no YAML mapping."""
    import yaml

    path = Path(job_dir) / "job.yaml"
    if not path.is_file():
        return "none"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return "unreadable"
    if not isinstance(raw, dict):
        return "unreadable"
    stages = raw["stages"] if isinstance(raw.get("stages"), list) and raw["stages"] else [raw]
    return ">".join(str((b if isinstance(b, dict) else {}).get("algorithm") or raw.get("algorithm") or "?").lower()
                    for b in stages)


def carried_out(target: str, ran: dict[str, Any] | None) -> bool:
    """Whether a job's ``ran`` has what a switch named: an algorithm in a stage, the data source, the adapter
    (lora | full) of the last stage, or the stages in order."""
    cur = protocol.current_of(ran)
    if cur.algorithm is None:
        return False
    if target in protocol.ALGORITHMS:
        return target in cur.stage.split(">")
    if target in protocol.DATA_SOURCES:
        return cur.data_source == target
    if target in ("lora", "full"):
        peft = [s for s in ran["stages"] if int(s.get("steps") or 0) > 0][-1].get("peft")
        return ("full" if peft in (None, "", "full", "none", False) else "lora") == target
    return cur.stage == target


def branch_row(branch: Branch, result, at: int, episode_dir: Path | None = None) -> dict[str, Any]:
    """One line of the comparison table from a branch's ``EpisodeResult`` (``episode_dir``: its folder, for the
    next job as written). ``final_score`` is the hidden score of the last job that has one (the fork point's
    when no job after it scored); ``followed`` whether the first executed job after the fork has what a switch
    named (None for other branches); ``decision`` the answer to the check at the fork point (strategy=check)."""
    st = result.strategy
    jobs = st.get("jobs", [])
    labels = [strategy.from_dict(j["label"]) for j in jobs]
    first_after = next((j for j in jobs[at:] if j["label"]), None)
    decision = next((d["decision"] for d in st.get("steering", {}).get("decisions", []) if d["after_job"] == at),
                    None)
    before = strategy.executed(labels[:at])
    after = strategy.executed(labels[at:])
    sw = [s for s in strategy.switches(labels) if s.position > len(before)]
    scores = [j.get("hidden_score") for j in jobs]
    post = [x for x in scores[at:] if x is not None]
    return {
        "branch": branch.name, "message": branch.message or "-", "status": result.status, "jobs": len(jobs),
        "jobs_after_fork": len(jobs) - at,
        "strategy": " -> ".join(str(x) for x in before) + " | " + (" -> ".join(str(x) for x in after) or "(none)"),
        "switches_after_fork": len(sw),
        "switched": ",".join(sorted({c for s in sw for c in s.components})) or "-",
        "score_at_fork": scores[at - 1] if len(scores) >= at else None,
        "best_score_after_fork": max(post) if post else None,
        "reward": result.reward["total"], "uplift": result.reward.get("uplift"),
        "usd": result.usd, "tokens": result.tokens_in + result.tokens_out, "seconds": round(result.seconds, 1),
        "scores": scores,
        "target": branch.target, "final_score": next((x for x in reversed(scores) if x is not None), None),
        "next_algorithm": written_algorithm(episode_dir / "jobs" / f"{at:02d}" / "job") if episode_dir else None,
        "executed_after_fork": len(after), "decision": decision,
        "followed": None if branch.target is None else first_after is not None and carried_out(branch.target,
                                                                                               first_after["ran"]),
        **first_reply(episode_dir),
    }


def first_reply(episode_dir: Path | None) -> dict[str, Any]:
    """The agent's first turn after the fork: its prompt length in tokens (``reply_prompt_tokens``) and the
    start of what it wrote (``reply``: its text, or the tools it called)."""
    path = Path(episode_dir) / "trajectory.jsonl" if episode_dir else None
    events = read_events(path) if path is not None and path.is_file() else []
    live = [e for e in events if e.get("event") == "message" and e.get("role") == "assistant" and not e.get("replayed")]
    if not live:
        return {"reply_prompt_tokens": None, "reply": None}
    m = live[0]
    calls = ", ".join(f"{c['function']['name']}(...)" for c in m.get("tool_calls") or [])
    return {"reply_prompt_tokens": m.get("prompt_tokens"), "reply": (calls or str(m.get("content") or ""))[:160]}


COLUMNS = ("branch", "message", "status", "jobs_after_fork", "strategy", "switches_after_fork", "switched",
           "score_at_fork", "best_score_after_fork", "reward", "usd", "tokens", "seconds")


def _cell(column: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if column == "seconds" else f"{v:.4f}"
    return str(v).replace(" | ", " ‖ ").replace("|", "/")


def write_table(rows: list[dict[str, Any]], folder: Path) -> tuple[Path, Path]:
    """``comparison.md`` and ``comparison.csv`` in ``folder``."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(_cell(c, r[c]) for c in COLUMNS) + " |" for r in rows]
    (folder / "comparison.md").write_text("\n".join(md) + "\n")
    with open(folder / "comparison.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*COLUMNS, "scores"])
        w.writeheader()
        for r in rows:
            w.writerow({**{c: r[c] for c in COLUMNS}, "scores": json.dumps(r["scores"])})
    return folder / "comparison.md", folder / "comparison.csv"


def plot(rows: list[dict[str, Any]], at: int, path: Path) -> Path:
    """Score per job per branch (fork point marked), reward, switches after the fork, cost."""
    from agent_trainer.outer_loop.report.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0][0]
    for r in rows:
        xs = [i + 1 for i, s in enumerate(r["scores"]) if s is not None]
        ax.plot(xs, [s for s in r["scores"] if s is not None], marker="o", label=r["branch"])
    ax.axvline(at + 0.5, ls="--", color="grey")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="job", ylabel="hidden score", title=f"Score per job (fork after job {at})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    names = [r["branch"] for r in rows]
    for a, key, title in ((axes[0][1], "reward", "Episode reward"), (axes[1][0], "switches_after_fork",
                                                                      "Strategy switches after the fork"),
                          (axes[1][1], "usd", "Cost (USD, whole episode)")):
        vals = [float(r[key] or 0.0) for r in rows]
        bars = a.bar(names, vals, color=[f"C{i}" for i in range(len(rows))])
        a.set(title=title)
        a.grid(alpha=0.3, axis="y")
        if key == "switches_after_fork":
            for b, r in zip(bars, rows):
                after = r["strategy"].split(" | ", 1)[-1]
                a.annotate(after.replace(" -> ", "\n"), (b.get_x() + b.get_width() / 2, b.get_height()),
                           ha="center", va="bottom", fontsize=7)
            a.set_ylim(0, max(vals + [1]) * 1.6)
        elif key == "usd":
            for b, r in zip(bars, rows):
                a.annotate(f"{r['seconds']:.0f} s", (b.get_x() + b.get_width() / 2, b.get_height()),
                           ha="center", va="bottom", fontsize=8)
    return save_figure(fig, path)

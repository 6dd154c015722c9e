"""``at-fork``: replay an episode up to job k, run branches from there, compare them; or many fork points at once.

    at-episode task=examples/tasks/calc_chain_v1_tiny.json run_id=src budget.max_jobs_per_episode=3 agent.max_turns=16
    at-fork run=src episode=0 at=1 branches=[continue,switch:grpo,reconsider]
    at-fork 'run=src_*' points=16 'branches=[continue,switch:other,reconsider]' 'rates=[warm_start:ws_*]'

One fork point writes ``runs/<run_id>/``: ``episodes/<branch>/`` (each branch an episode folder, itself
forkable), ``comparison.md`` / ``comparison.csv`` (score per branch, strategy sequence, switches, cost),
``fork.png``, ``ledger.jsonl``; MLflow: a parent run ``fork-<run>-ep<n>-at<k>`` with one nested
run per branch (the metrics at-episode logs, plus ``switches_after_fork`` and friends).

``points=N`` (the fork experiment) forks the first N fork points of the runs ``run`` names (a glob in
runs_dir) and writes ``episodes/p<i>-<branch>/``, ``fork_table.md`` / ``fork_table.json`` (per branch the
final hidden score with a paired interval against continue, switches and the next job's algorithm after
the fork; the switch rate and adoption of the source runs and of the ``rates`` runs; the paper's numbers)
and prints the table; MLflow: a parent run with one nested run per fork point and branch. ``points=0``:
the rates table only. docs/strategy.md, "The fork experiment".
"""

from __future__ import annotations

import dataclasses
import glob
import re
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR, Intervention
from agent_trainer.paths import resolve_path
from agent_trainer.commands._errors import user_errors

SOURCE_GROUPS = ("agent", "budget", "strategy", "task", "inner", "hardware")


def source_dir(cfg: DictConfig) -> Path:
    """The source run folder: ``runs_dir/<run>``, or ``run`` as a path."""
    if not cfg.run:
        raise cli.UserError("at-fork needs the source run: run=<run_id> (a folder in runs_dir), e.g. "
                            "at-fork run=2026-01-01_12-00-00_episode at=1")
    for cand in (Path(cfg.runs_dir) / cfg.run, resolve_path(cfg.run)):
        if (cand / "config.resolved.yaml").is_file():
            return cand.resolve()
    raise cli.UserError(f"source run {cfg.run!r} not found in {cfg.runs_dir} (no config.resolved.yaml)")


def _natural(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def matching_runs(pattern: str, runs_dir: str) -> list[Path]:
    """Run folders (with ``config.resolved.yaml``) a run id, folder or glob names (in runs_dir, or as a path),
    in natural order (src_2 before src_10)."""
    if not any(c in pattern for c in "*?["):
        for cand in (Path(runs_dir) / pattern, resolve_path(pattern)):
            if (cand / "config.resolved.yaml").is_file():
                return [cand.resolve()]
        return []
    found = {Path(p).resolve() for base in (str(Path(runs_dir) / pattern), str(resolve_path(pattern)))
             for p in glob.glob(base) if (Path(p) / "config.resolved.yaml").is_file()}
    return sorted(found, key=_natural)


def source_dirs(cfg: DictConfig) -> list[Path]:
    """The source runs of the fork experiment: every run folder ``run`` names (a glob such as ``src_*``)."""
    if not cfg.run:
        raise cli.UserError("at-fork points=<n> needs the source runs: run=<run_id or glob in runs_dir>, e.g. "
                            "'run=fork_src_*'")
    found = matching_runs(cfg.run, cfg.runs_dir)
    if not found:
        raise cli.UserError(f"no source run matches {cfg.run!r} in {cfg.runs_dir} (a folder with config.resolved.yaml)")
    return found


def _plain(node):
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node


def check_same_settings(srcs: list[Path]) -> None:
    """The fork experiment's sources must be one agent with one setting (their seeds differ)."""
    first = OmegaConf.load(srcs[0] / "config.resolved.yaml")
    for src in srcs[1:]:
        other = OmegaConf.load(src / "config.resolved.yaml")
        for group in (*SOURCE_GROUPS, "adapter"):
            if _plain(first.get(group)) != _plain(other.get(group)):
                raise cli.UserError(f"source runs {srcs[0].name} and {src.name} differ in {group}: the fork "
                                    f"experiment's sources are one agent with one setting (only the seed differs)")


def adopt_source_settings(cfg: DictConfig, src: Path) -> None:
    """Give ``cfg`` the source run's agent, budget, strategy, task, inner, hardware, seed and adapter."""
    old = OmegaConf.load(src / "config.resolved.yaml")
    with cli.writable(cfg):
        for group in SOURCE_GROUPS:
            if group in old:  # keys of the source run this version does not have are left out
                known = {k: v for k, v in old[group].items() if k in cfg[group]}
                cfg[group] = OmegaConf.merge(cfg[group], known)
        cfg.seed = old.get("seed", cfg.seed)
        if old.get("adapter"):
            cfg.adapter = old.adapter


def play_branch(conf, b, src, folder: Path, ep_id: str, *, backend, task, ledger, seed: int):
    """Replay ``src`` into a fresh episode ``episodes/<ep_id>`` with branch ``b``'s message and play it to its end;
    returns the episode and its result."""
    from agent_trainer.outer_loop.episode.episode import Episode
    from agent_trainer.outer_loop.rl.run_config import episode_settings, job_settings, policy_device
    from agent_trainer.outer_loop.strategy import fork
    from agent_trainer.outer_loop.strategy.steering import Steering, make_evaluator

    # each branch its own journal (journal_path None): branches must not see each other
    settings = dataclasses.replace(conf.strategy, journal_path=None, interventions=[
        *conf.strategy.interventions, *([Intervention(after_job=src.at, message=b.message)] if b.message else [])])
    evaluator = make_evaluator(conf.strategy.evaluator, min_gain=conf.strategy.rule_min_gain,
                               device=policy_device(conf), ledger=ledger, cache_dir=conf.cache_dir)
    steering = Steering(settings, evaluator=evaluator, run_dir=folder, cache_dir=conf.cache_dir)
    ep = Episode(backend, task, folder / "episodes" / ep_id, ledger=ledger, settings=episode_settings(conf),
                 episode_id=ep_id, seed=seed, job_settings=job_settings(conf), model_name=conf.agent.model,
                 steering=steering)
    if steering.journal is not None:
        fork.copy_journal(src, steering.journal)
    fork.replay(ep, src)
    ep.play()
    return ep, ep.finish()


def log_branch(tr, cfg: DictConfig, b, src, ep, result, row: dict, tags: dict) -> None:
    """A branch's nested MLflow run: the metrics at-episode logs, the fork's own, its trajectory and summary."""
    from agent_trainer.outer_loop.episode.episode import reward_metrics
    from agent_trainer.commands.episode import log_strategy

    with tr.child(f"branch-{ep.id}", tags={"command": "at-fork-branch", "branch": b.name,
                                          "source_run": src.run_dir.name, **tags}) as ch:
        ch.log_config(cfg)
        ch.log_params({"branch": b.name, "branch.message": b.message or "", "fork.at": src.at})
        ch.log_metrics(reward_metrics(result.reward))
        ch.log_metrics({"tokens": float(result.tokens_in + result.tokens_out), "usd": float(result.usd),
                        "turns": float(result.n_turns), "switches_after_fork": row["switches_after_fork"],
                        "jobs_after_fork": row["jobs_after_fork"], "fork_at": src.at,
                        "best_score_after_fork": row["best_score_after_fork"],
                        **({"final_score": row["final_score"]} if row.get("final_score") is not None else {})})
        log_strategy(ch, result.strategy)
        ch.log_artifact(ep.dir / "trajectory.jsonl")
        ch.log_artifact(ep.dir / "summary.json")


def rates_rows(cfg: DictConfig, srcs: list[Path]) -> list[dict]:
    """Switch rate and adoption of the source runs' episodes and of each ``rates`` entry (``<label>:<run glob>``)."""
    from agent_trainer.outer_loop.strategy.switch_rates import agent_rates, episode_dirs

    groups = [(f"forked agent ({cfg.run})", srcs)] if srcs else []
    for entry in cfg.rates:
        label, sep, pattern = str(entry).partition(":")
        if not sep or not label.strip() or not pattern.strip():
            raise cli.UserError(f"rates entry {entry!r}: write '<label>:<run glob>', e.g. 'warm_start:ws_*'")
        runs = matching_runs(pattern.strip(), cfg.runs_dir)
        if not runs:
            raise cli.UserError(f"rates entry {entry!r}: {pattern.strip()!r} matches no run folder in {cfg.runs_dir}")
        groups.append((label.strip(), runs))
    return [agent_rates(label, episode_dirs(runs), [r.name for r in runs]) for label, runs in groups]


def run_points(cfg: DictConfig) -> dict:
    """The fork experiment: every branch at each of the first ``points`` fork points of the source runs, the paired
    table and the rates; prints the table and returns ``{"table", "rows", "rates"}``."""
    from agent_trainer.outer_loop.strategy import fork, fork_table

    if cfg.points < 0:
        raise cli.UserError(f"points must be >= 0 (0: the rates table only), got {cfg.points}")
    srcs = source_dirs(cfg) if cfg.run or cfg.points else []
    if not srcs and not cfg.rates:
        raise cli.UserError("at-fork points=0 needs runs to rate: run=<glob> and/or 'rates=[<label>:<glob>]'")
    if srcs:
        check_same_settings(srcs)
        adopt_source_settings(cfg, srcs[0])
    points = fork.fork_points(srcs, cfg.points, cfg.budget.max_jobs_per_episode) if cfg.points else []
    if points and fork_table.REFERENCE not in [str(b).strip() for b in cfg.branches]:
        raise cli.UserError(f"branches must include continue, the branch the others are paired with, got "
                            f"{list(cfg.branches)}")
    branches = [[fork.make_branch(b, src) for b in cfg.branches] for src in points]
    slugs = [b.slug for b in branches[0]] if branches else []
    if points and len(set(slugs)) != len(slugs):
        raise cli.UserError(f"branches must be distinct, got {list(cfg.branches)}")
    rates = rates_rows(cfg, srcs)
    from agent_trainer.commands.episode import resolve_agent_prices

    resolve_agent_prices(cfg)
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        return {}
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.outer_loop.rl.run_config import make_ledger
    from agent_trainer.commands.episode import make_agent_backend

    rows: list[dict] = []
    ledger = make_ledger(conf, folder)
    with cli.tracker(cfg, "at-fork", label=f"fork-points-{len(points)}", tags={"source_run": cfg.run or "-"}) as tr:
        tr.log_config(cfg)
        if points:
            task = load_task(resolve_path(cfg.task.spec_path))
            backend = make_agent_backend(conf)
            total = len(points) * len(slugs)
            for i, (src, bs) in enumerate(zip(points, branches)):
                seed = int(OmegaConf.load(src.run_dir / "config.resolved.yaml").get("seed", cfg.seed))
                for b in bs:
                    ep_id = f"p{i:02d}-{b.slug}"
                    print(f"at-fork: [{len(rows) + 1}/{total}] point {i} ({src.run_dir.name}/episodes/"
                          f"{src.episode_id} after job {src.at}), branch {b.name} ...", flush=True)
                    ep, result = play_branch(conf, b, src, folder, ep_id, backend=backend, task=task, ledger=ledger,
                                             seed=seed)
                    row = {"point": i, "source_run": src.run_dir.name, "episode": src.episode_id, "at": src.at,
                           **fork.branch_row(b, result, src.at, ep.dir)}
                    rows.append(row)
                    log_branch(tr, cfg, b, src, ep, result, row, {"point": str(i)})
        table = fork_table.summarize(rows) if rows else {"reference": fork_table.REFERENCE, "points": 0,
                                                         "branches": []}
        md, js = fork_table.write(table, rates, rows, folder)
        tr.log_metrics(fork_table.metrics(table, rates))
        for path in (md, js):
            tr.log_artifact(path)
    ledger.close()
    print(md.read_text())
    print(f"at-fork: {md}, {js}")
    return {"table": table, "rows": rows, "rates": rates}


def run(cfg: DictConfig) -> list[dict] | dict | None:
    """Run every branch of the fork (or, with ``points``, of many fork points); print and return the rows."""
    from agent_trainer.outer_loop.strategy import fork

    if cfg.points is not None:
        return run_points(cfg)
    src_dir = source_dir(cfg)
    adopt_source_settings(cfg, src_dir)
    # Everything a user can get wrong is checked before the run folder is made.
    src = fork.load_source(src_dir, cfg.episode, cfg.at, max_jobs_per_episode=cfg.budget.max_jobs_per_episode)
    branches = [fork.make_branch(b, src) for b in cfg.branches]
    slugs = [b.slug for b in branches]
    if not branches or len(set(slugs)) != len(slugs):
        raise cli.UserError(f"branches must be distinct and non-empty, got {list(cfg.branches)}")
    from agent_trainer.commands.episode import resolve_agent_prices

    resolve_agent_prices(cfg)  # a served agent's null prices, before the typed config the ledger reads
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        return None
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.outer_loop.rl.run_config import make_ledger
    from agent_trainer.commands.episode import make_agent_backend
    task = load_task(resolve_path(cfg.task.spec_path))
    backend = make_agent_backend(conf)
    ledger = make_ledger(conf, folder)
    rows = []
    name = f"fork-{src_dir.name}-ep{src.episode_id}-at{src.at}"
    with cli.tracker(cfg, "at-fork", label=name, tags={"source_run": src_dir.name}) as tr:
        tr.log_config(cfg)
        for b in branches:
            print(f"at-fork: branch {b.name} from job {src.at} of {src_dir.name}/episodes/{src.episode_id} ...")
            ep, result = play_branch(conf, b, src, folder, b.slug, backend=backend, task=task, ledger=ledger,
                                     seed=conf.seed)
            row = fork.branch_row(b, result, src.at, ep.dir)
            rows.append(row)
            log_branch(tr, cfg, b, src, ep, result, row, {})
        md, csv = fork.write_table(rows, folder)
        png = fork.plot(rows, src.at, folder / "fork.png")
        for path in (md, csv, png):
            tr.log_artifact(path)
    ledger.close()
    print(md.read_text())
    print(f"at-fork: {md}, {csv}, {png}")
    return rows


@hydra.main(config_path=str(CONFIG_DIR), config_name="fork", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    return cli.call(run, cfg, user_errors=user_errors)


def main() -> None:
    cli.main(_hydra_main, "fork")


if __name__ == "__main__":
    main()

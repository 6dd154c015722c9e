"""``at-fork``: replay an episode up to job k, run branches from there, compare them.

    at-episode task=examples/tasks/calc_chain_v1_tiny.json run_id=src budget.max_jobs_per_episode=3 agent.max_turns=16
    at-fork run=src episode=0 at=1 branches=[continue,switch:grpo,reconsider]

Writes ``runs/<run_id>/``: ``episodes/<branch>/`` (each branch an episode folder, itself forkable),
``comparison.md`` / ``comparison.csv`` (score per branch, strategy sequence, switches, cost),
``fork.png``, ``ledger.jsonl``; MLflow: a parent run ``fork-<run>-ep<n>-at<k>`` with one nested
run per branch (the metrics at-episode logs, plus ``switches_after_fork`` and friends).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
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


def run(cfg: DictConfig) -> list[dict] | None:
    """Run every branch of the fork; print and return the comparison rows."""
    from agent_trainer.outer_loop.strategy import fork

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
    from agent_trainer.outer_loop.episode.episode import Episode, reward_metrics
    from agent_trainer.outer_loop.rl.run_config import episode_settings, job_settings, make_ledger, policy_device
    from agent_trainer.outer_loop.strategy.steering import Steering, make_evaluator, settings_from_config
    from agent_trainer.commands.episode import log_strategy, make_agent_backend
    task = load_task(resolve_path(cfg.task.spec_path))
    backend = make_agent_backend(conf)
    ledger = make_ledger(conf, folder)
    rows = []
    name = f"fork-{src_dir.name}-ep{src.episode_id}-at{src.at}"
    with cli.tracker(cfg, "at-fork", label=name, tags={"source_run": src_dir.name}) as tr:
        tr.log_config(cfg)
        for b in branches:
            print(f"at-fork: branch {b.name} from job {src.at} of {src_dir.name}/episodes/{src.episode_id} ...")
            settings = settings_from_config(conf.strategy)
            settings.journal_path = None     # each branch its own journal: branches must not see each other
            if b.message:
                settings.interventions.append({"after_job": src.at, "message": b.message})
            evaluator = make_evaluator(conf.strategy.evaluator, min_gain=conf.strategy.rule_min_gain,
                                       device=policy_device(conf), ledger=ledger, cache_dir=conf.cache_dir)
            steering = Steering(settings, evaluator=evaluator, run_dir=folder, cache_dir=conf.cache_dir)
            ep = Episode(backend, task, folder / "episodes" / b.slug, ledger=ledger, settings=episode_settings(conf),
                         episode_id=b.slug, seed=conf.seed, job_settings=job_settings(conf),
                         model_name=conf.agent.model, steering=steering)
            if steering.journal is not None:
                fork.copy_journal(src, steering.journal)
            fork.replay(ep, src)
            ep.play()
            result = ep.finish()
            row = fork.branch_row(b, result, src.at)
            rows.append(row)
            with tr.child(f"branch-{b.slug}", tags={"command": "at-fork-branch", "branch": b.name,
                                                   "source_run": src_dir.name}) as ch:
                ch.log_config(cfg)
                ch.log_params({"branch": b.name, "branch.message": b.message or "", "fork.at": src.at})
                ch.log_metrics(reward_metrics(result.reward))
                ch.log_metrics({"tokens": float(result.tokens_in + result.tokens_out), "usd": float(result.usd),
                                "turns": float(result.n_turns), "switches_after_fork": row["switches_after_fork"],
                                "jobs_after_fork": row["jobs_after_fork"], "fork_at": src.at,
                                "best_score_after_fork": row["best_score_after_fork"]})
                log_strategy(ch, result.strategy)
                ch.log_artifact(ep.dir / "trajectory.jsonl")
                ch.log_artifact(ep.dir / "summary.json")
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

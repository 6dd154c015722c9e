"""``at-episode``: one agent episode on one task, from the task to the staged reward.

    at-episode task=examples/tasks/calc_chain_v1_tiny.json                 # the tiny local agent
    at-episode task=calc_chain_v1_fast agent=openai agent.model=gpt-x agent.base_url=http://host/v1 \
        agent.api_key_env=OPENAI_API_KEY

Writes ``runs/<run_id>/`` (resolved config, ledger.jsonl, episodes/0/ with the workspace, the
trajectory, the job and summary.json) and one MLflow run; prints a summary table.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import Tracker, check_reachable
from scripts._errors import user_errors


def make_agent_backend(cfg: DictConfig):
    """The configured agent backend (local: the tiny agent or ``agent.model_path``, plus ``adapter``)."""
    from outer_loop.backends import make_backend

    a = cfg.agent
    if str(a.backend) == "local":
        from outer_loop.backends.local import LocalBackend
        from outer_loop.run_config import agent_dir

        backend = LocalBackend.from_path(agent_dir(cfg), model_name=str(a.model))
        if cfg.get("adapter"):
            from peft import PeftModel

            backend.model = PeftModel.from_pretrained(backend.model, str(resolve_path(cfg.adapter))).eval()
        return backend
    return make_backend({"kind": str(a.backend), "model": str(a.model), "base_url": a.base_url,
                         "api_key_env": a.api_key_env, **({"model_path": a.model_path} if a.model_path else {})})


def run(cfg: DictConfig) -> float | None:
    """Play one episode of ``cfg.task.spec_path``; print the stages, reward and cost; return the reward."""
    folder = cli.start_run(cfg)
    if cfg.dry_run:
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    from evaluation.tasks import load_task
    from outer_loop.episode import Episode, reward_metrics
    from outer_loop.run_config import episode_settings, job_kwargs, make_ledger
    from outer_loop.steering import make_steering

    task = load_task(resolve_path(cfg.task.spec_path))
    backend = make_agent_backend(cfg)
    ledger = make_ledger(cfg, folder)
    with Tracker.from_config(cfg, run_name=f"episode-{folder.name}", tags={"command": "at-episode"}) as tr:
        tr.log_config(cfg)
        steering = make_steering(cfg.strategy, run_dir=folder, ledger=ledger, cache_dir=cfg.cache_dir)
        ep = Episode(backend, task, folder / "episodes" / "0", ledger=ledger, settings=episode_settings(cfg),
                     episode_id="0", seed=int(cfg.seed), job_kwargs=job_kwargs(cfg), model_name=str(cfg.agent.model),
                     steering=steering)
        print(f"at-episode: {cfg.agent.backend} agent {cfg.agent.model} on {task.name} ...")
        try:
            ep.play()
        finally:
            backend.close()  # a vllm engine's worker processes go now, not at interpreter exit
        result = ep.finish()
        stages = result.reward
        tr.log_metrics(reward_metrics(stages) | {"tokens": float(result.tokens_in + result.tokens_out),
                                                 "usd": float(result.usd), "turns": float(result.n_turns)})
        log_strategy(tr, result.strategy)
        tr.log_artifact(ep.dir / "trajectory.jsonl")
        tr.log_artifact(ep.dir / "summary.json")
    ledger.close()
    job = result.jobs[-1] if result.jobs else {}
    cli.print_kv({
        "status": result.status, "turns": result.n_turns, "job": job.get("status", "-"),
        "choices": ", ".join(f"{k}={v}" for k, v in result.choices.items()) or "-",
        "validation": f"{stages['validation']:.3f}", "job_success": f"{stages['job_success']:.3f}",
        "quality": f"{stages['quality']:.3f}", "speed": f"{stages['speed']:.3f}",
        "hidden_score": _fmt(stages.get("post_score")), "baseline": _fmt(stages.get("baseline")),
        "strategies": " -> ".join(result.strategy.get("sequence", [])) or "-",
        "switches": f"{result.strategy.get('switches', 0)} of {result.strategy.get('pairs', 0)} adjacent pairs",
        "reward": f"{stages['total']:.4f}", "tokens": result.tokens_in + result.tokens_out,
        "usd": f"{result.usd:.5f}", "seconds": f"{result.seconds:.1f}", "folder": str(ep.dir),
    })
    return float(stages["total"])


def log_strategy(tracker, strategy: dict) -> None:
    """Switch metrics, the steering layer's metrics and per-job scores (step = job number) to MLflow."""
    from outer_loop.strategy import numeric_metrics

    tracker.log_metrics(numeric_metrics({k: v for k, v in strategy.items() if k != "jobs"}))
    tracker.log_metrics((strategy.get("steering") or {}).get("metrics", {}))
    dev = {j["job"]: j.get("dev_score") for j in (strategy.get("steering") or {}).get("jobs", [])}
    for j in strategy.get("jobs", []):
        tracker.log_metrics({"job_hidden_score": j.get("hidden_score"), "job_uplift": j.get("uplift"),
                             "job_dev_score": dev.get(j["job"])}, step=j["job"])


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


@hydra.main(config_path=str(CONFIG_DIR), config_name="episode", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(run, cfg, user_errors=user_errors)


def main() -> None:
    cli.main(_hydra_main, "episode")


if __name__ == "__main__":
    main()

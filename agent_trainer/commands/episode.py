"""``at-episode``: one agent episode on one task, from the task to the staged reward.

    at-episode task=examples/tasks/calc_chain_v1_tiny.json                 # the tiny local agent
    at-episode task=calc_chain_v1_fast agent=openai agent.model=gpt-x agent.base_url=http://host/v1 \\
        agent.api_key_env=OPENAI_API_KEY

Writes ``runs/<run_id>/`` (resolved config, ledger.jsonl, episodes/0/ with the workspace, trajectory, job
and summary.json, written however the episode ends) and one MLflow run. Exit codes: 0 finished, 1 an
unexpected error, 2 a user mistake, 3 backend_error, 4 budget_exhausted, 5 max_turns without a
submission, 130 interrupted (docs/agents.md, "A served agent").
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, read_write

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR, EpisodeCommand, compose_config
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import check_reachable
from agent_trainer.commands._errors import user_errors


def make_agent_backend(conf: EpisodeCommand):
    """The configured agent backend (local: the tiny agent or ``agent.model_path``, plus ``adapter``) of a
    validated config (``cli.open_run``; a served agent's null prices resolved before: ``resolve_agent_prices``)."""
    from agent_trainer.outer_loop.agents import make_backend

    a = conf.agent
    if a.backend == "local":
        from agent_trainer.outer_loop.agents.local import LocalBackend
        from agent_trainer.outer_loop.rl.run_config import agent_dir, policy_device

        backend = LocalBackend.from_path(agent_dir(conf), model_name=a.model, tool_format=a.tool_format,
                                         device=policy_device(conf))
        if conf.adapter:
            from peft import PeftModel

            backend.model = PeftModel.from_pretrained(backend.model, str(resolve_path(conf.adapter))).eval()
        return backend
    spec = {"kind": a.backend, "model": a.model, "base_url": a.base_url, "api_key_env": a.api_key_env,
            "tool_format": a.tool_format, **({"model_path": a.model_path} if a.model_path else {})}
    if a.backend == "openai":
        spec.update({k: getattr(a, k) for k in ("timeout_s", "max_retries", "retry_backoff_s", "context_tokens",
                                                 "tool_choice", "parallel_tool_calls", "legacy_max_tokens")})
    return make_backend(spec)


def check_agent(cfg: DictConfig) -> None:
    """What a served agent needs of this machine, checked before anything is written: its key variable."""
    a = cfg.agent
    if cfg.get("dry_run"):
        return  # a dry run writes the resolved config only
    if a.backend == "openai" and a.api_key_env:
        from agent_trainer.outer_loop.agents.base import read_api_key

        read_api_key(a.api_key_env, a.base_url, error=cli.UserError)


def resolve_agent_prices(cfg: DictConfig) -> str | None:
    """``agent=openai``: null prices become the price table's for agent.model, or 0 on a local server
    (``agent_trainer.prices``), in ``cfg`` itself (the ledger reads them there); returns their source."""
    a = cfg.agent
    if a.backend != "openai":
        return None
    from agent_trainer.prices import UnknownPrice, agent_prices

    try:
        p_in, p_out, source = agent_prices(a.model, a.base_url, a.usd_per_1m_tokens_in, a.usd_per_1m_tokens_out)
    except UnknownPrice as e:
        raise cli.UserError(str(e)) from None
    with read_write(a):
        a.usd_per_1m_tokens_in, a.usd_per_1m_tokens_out = p_in, p_out
    return source


# status (summary.json) -> exit code; max_turns is 0 after a submission (exit_code)
EXIT_CODES = {"finished": 0, "max_jobs": 0, "max_turns": 5, "backend_error": 3, "budget_exhausted": 4}


def exit_code(summary: dict) -> int:
    """The exit code of an episode from its summary (the module docstring lists them)."""
    if summary.get("status") == "max_turns" and summary.get("jobs"):
        return 0
    return EXIT_CODES.get(str(summary.get("status")), 1)


def run(cfg: DictConfig) -> float | None:
    """Play one episode of ``cfg.task.spec_path``; print the stages, reward and cost; return the reward."""
    result = play(cfg)
    return None if result is None else float(result.reward["total"])


def play(cfg: DictConfig):
    """``run``, returning the whole ``EpisodeResult`` (None for a dry run)."""
    check_agent(cfg)
    prices = resolve_agent_prices(cfg)
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    from agent_trainer.commands._task_specs import check_answer_room
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.outer_loop.episode.episode import Episode, reward_metrics
    from agent_trainer.outer_loop.rl.run_config import episode_settings, job_settings, make_ledger, policy_device
    from agent_trainer.outer_loop.strategy.steering import make_steering

    task = load_task(resolve_path(cfg.task.spec_path))
    check_answer_room(conf, [task])
    backend = make_agent_backend(conf)
    ledger = make_ledger(conf, folder)
    with cli.tracker(cfg, "at-episode") as tr:
        tr.log_config(cfg)
        steering = make_steering(conf.strategy, device=policy_device(conf), run_dir=folder, ledger=ledger,
                                 cache_dir=conf.cache_dir)
        ep = Episode(backend, task, folder / "episodes" / "0", ledger=ledger, settings=episode_settings(conf),
                     episode_id="0", seed=conf.seed, job_settings=job_settings(conf), model_name=conf.agent.model,
                     steering=steering)
        if hasattr(backend, "event_log"):
            backend.event_log = ep.log  # trimming, retries and warnings of a served agent go into the trajectory
        priced = (f" (USD {cfg.agent.usd_per_1m_tokens_in:g} / {cfg.agent.usd_per_1m_tokens_out:g} per 1M tokens in / "
                  f"out, {prices})") if prices else ""
        print(f"at-episode: {cfg.agent.backend} agent {cfg.agent.model} on {task.name}{priced} ...")
        crash = None
        try:
            ep.play()
        except BaseException as e:  # summary.json is written however the episode ends
            crash = e
            ep.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "error"
            ep.log({"event": ep.status, "message": f"{type(e).__name__}: {e}"})
        finally:
            backend.close()  # a vllm engine's worker processes go now, not at interpreter exit
        result = ep.finish()
        if crash is not None:
            raise crash
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
    if result.status == "backend_error":
        print(f"at-episode: backend error: {getattr(backend, 'last_error', None) or 'see trajectory.jsonl'}",
              file=sys.stderr)
    return result


def log_strategy(tracker, strategy: dict) -> None:
    """Switch metrics, the steering layer's metrics and per-job scores (step = job number) to MLflow."""
    from agent_trainer.outer_loop.strategy.strategy import numeric_metrics

    tracker.log_metrics(numeric_metrics({k: v for k, v in strategy.items() if k != "jobs"}))
    tracker.log_metrics((strategy.get("steering") or {}).get("metrics", {}))
    dev = {j["job"]: j.get("dev_score") for j in (strategy.get("steering") or {}).get("jobs", [])}
    for j in strategy.get("jobs", []):
        tracker.log_metrics({"job_hidden_score": j.get("hidden_score"), "job_uplift": j.get("uplift"),
                             "job_dev_score": dev.get(j["job"])}, step=j["job"])


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _run_with_exit_code(cfg: DictConfig) -> float | None:
    """``run``, then exit with the episode's code (a single run; in a multirun the reward is returned)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    result = play(cfg)
    if result is None:
        return None
    code = exit_code(result.summary())
    if code and not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        print(f"at-episode: the episode ended with status {result.status} (exit code {code})", file=sys.stderr)
        sys.exit(code)
    return float(result.reward["total"])


def _user_errors() -> tuple[type[BaseException], ...]:
    """The scripts' user errors, and a backend that cannot be built from its config (a BackendError then)."""
    backend_error = getattr(sys.modules.get("agent_trainer.outer_loop.agents.base"), "BackendError", None)
    return user_errors() + ((backend_error,) if backend_error is not None else ())


@hydra.main(config_path=str(CONFIG_DIR), config_name="episode", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(_run_with_exit_code, cfg, user_errors=_user_errors)


def _checked_main() -> None:
    """A missing key variable is refused before Hydra starts: Hydra makes the run folder before the run."""
    overrides = cli.overrides_to_check(sys.argv[1:])
    if overrides is not None:
        try:
            check_agent(compose_config(overrides, "episode"))
        except cli.UserError as e:
            cli.fail(str(e))
    _hydra_main()


def main() -> None:
    cli.main(_checked_main, "episode")


if __name__ == "__main__":
    main()

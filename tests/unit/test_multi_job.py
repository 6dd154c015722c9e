"""Several jobs per episode: each job's visible result is in the conversation before the agent's next turn,
in-turn (at-episode) and with deferred jobs (at-train's batches, ``play_all``); the reward picks last or best.

The jobs here are real ``run_job`` calls on jobs that fail validation (no training: milliseconds each);
the agent is scripted because what is tested is the harness's order of events."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agent_trainer.config import AgentConfig, BudgetConfig
from agent_trainer.evaluation.tasks import load_task
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings, play_all
from agent_trainer.inner_loop.run.request import JobSettings

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scripted_backend", ROOT / "tests" / "fixtures" / "scripted_backend.py")
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)
TASK = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
BAD = "base_model: tiny-s\nalgorithm: sft\nhyperparameters: {learning_rte: 1.0e-3}\ndata: {sources: [{family: calc_chain}]}\n"
call = scripted.call


def script():
    return scripted.ScriptedBackend([
        [call("write_file", path="job.yaml", content=BAD)], [call("submit_job", path="job.yaml")],
        [call("write_file", path="job.yaml", content=BAD.replace("sft", "grpo"))],
        [call("submit_job", path="job.yaml")],
        [call("finish", summary="done")]])


def _result_seen_before_next_turn(backend, marker: str) -> None:
    # the turn that wrote job 2 was sampled from a conversation that held job 1's result
    write2 = next(i for i, msgs in enumerate(backend.seen) if sum(m["role"] == "assistant" for m in msgs) == 2)
    assert any(marker in (m.get("content") or "") for m in backend.seen[write2])


def test_in_turn_jobs(tmp_path):
    backend = script()
    settings = EpisodeSettings(AgentConfig(max_turns=6), BudgetConfig(max_jobs_per_episode=2))
    ep = Episode(backend, TASK, tmp_path / "ep", settings=settings,
                 job_settings=JobSettings(dry_run=False, cache=False))
    assert ep.play() == "max_jobs"
    _result_seen_before_next_turn(backend, "job status: invalid")
    result = ep.finish()
    assert [j["status"] for j in result.jobs] == ["invalid", "invalid"]
    assert result.strategy["executed"] == 0 and result.strategy["pairs"] == 0   # nothing trained: no label


def test_deferred_jobs_pause_until_their_result(tmp_path):
    backend = script()
    settings = EpisodeSettings(AgentConfig(max_turns=6), BudgetConfig(max_jobs_per_episode=2))
    ep = Episode(backend, TASK, tmp_path / "ep", settings=settings,
                 defer_jobs=True, job_settings=JobSettings(dry_run=False, cache=False))
    assert ep.play() == "running" and ep.waiting and len(ep.pending) == 1
    assert "its result follows" in ep.messages[-1]["content"]
    ran = []

    def run_jobs(episodes):
        for e in episodes:
            ran.append(len(e.pending))
            e.run_pending()

    play_all([ep], run_jobs)
    assert ran == [1] and not ep.waiting and len(ep.pending) == 1 and ep.status == "max_jobs"
    _result_seen_before_next_turn(backend, "Result of job 1 (.):\njob status: invalid")
    ep.run_pending()   # the last job (no job left: no pause) is run after the turns, as before
    assert [r.status for r in ep.box.state.jobs] == ["invalid", "invalid"]
    ep.finish()


def test_one_job_episodes_are_unchanged(tmp_path):
    backend = script()
    settings = EpisodeSettings(AgentConfig(max_turns=6), BudgetConfig(max_jobs_per_episode=1))
    ep = Episode(backend, TASK, tmp_path / "ep", settings=settings,
                 defer_jobs=True, job_settings=JobSettings(dry_run=False, cache=False))
    assert ep.play() == "max_jobs" and not ep.waiting
    assert ep.messages[-1]["content"].endswith("it runs when this episode's turns are over")
    ep.run_pending()
    assert not any(m["role"] == "user" and "Result of job" in (m.get("content") or "") for m in ep.messages)


def test_episode_reward_pick_comes_from_the_strategy_group():
    from agent_trainer.config import compose_config
    from agent_trainer.outer_loop.rl.run_config import episode_settings

    assert episode_settings(compose_config([])).strategy.episode_reward == "last"
    assert episode_settings(compose_config(["strategy.episode_reward=best"])).strategy.episode_reward == "best"

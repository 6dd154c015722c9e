"""at-episode end to end with the tiny agent: locally, and served over a real OpenAI-compatible
HTTP endpoint with native tool calls (tokens from the response's usage, USD = tokens x price)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agent_trainer.config import compose_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("openai_server", ROOT / "tests" / "fixtures" / "openai_server.py")
openai_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openai_server)
TASK = str(ROOT / "examples/tasks/calc_chain_v1_tiny.json")


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x.strip()]


def test_tiny_agent_episode_writes_the_run_folder(tmp_path, built_agent):
    from agent_trainer.commands import episode as at_episode

    reward = at_episode.run(compose_config([f"runs_dir={tmp_path}", "run_id=ep", f"task.spec_path={TASK}",
                                            "agent=tiny_local"], "episode"))
    run = tmp_path / "ep"
    ep = run / "episodes" / "0"
    summary = json.loads((ep / "summary.json").read_text())
    assert summary["reward"]["total"] == pytest.approx(reward)
    assert set(summary["reward"]) >= {"validation", "job_success", "quality", "speed", "total"}
    lines = [json.loads(x) for x in (ep / "trajectory.jsonl").read_text().splitlines()]
    agent_turns = [x for x in lines if x.get("role") == "assistant"]
    assert agent_turns and all(len(t["token_ids"]) == len(t["logprobs"]) for t in agent_turns)
    assert (ep / "workspace" / "task.json").is_file() and (ep / "workspace" / "GUIDE.md").is_file()
    assert (run / "config.resolved.yaml").is_file() and (run / "versions.json").is_file()
    records = _records(run)
    assert sum(r["kind"] == "llm" for r in records) == summary["n_turns"]
    assert sum(r["kind"] == "job" for r in records) == len(summary["jobs"])
    if summary["jobs"]:  # the job ran out of the agent's reach, its result beside the workspace
        assert (ep / "jobs" / "00" / "output" / "result.json").is_file()
        assert not list((ep / "workspace").rglob("result.json"))


def test_episode_through_an_openai_compatible_endpoint(tmp_path, built_agent, monkeypatch):
    from agent_trainer.outer_loop.agents.local import LocalBackend
    from agent_trainer.commands import episode as at_episode

    monkeypatch.setenv("AT_TEST_KEY", "sk-test-planted-key-0123456789")
    local = LocalBackend.from_path(built_agent)
    with openai_server.serve(local, model="tiny-agent", api_key="sk-test-planted-key-0123456789",
                             max_seconds=600, render_tools=False) as srv:
        price_in, price_out = 2.0, 8.0
        cfg = compose_config([f"runs_dir={tmp_path}", "run_id=http", f"task.spec_path={TASK}", "agent=openai",
                              "agent.model=tiny-agent", f"agent.base_url={srv.base_url}",
                              "agent.api_key_env=AT_TEST_KEY",
                              "agent.tool_schemas=names", "agent.temperature=0.7", "agent.max_new_tokens=320",
                              f"agent.usd_per_1m_tokens_in={price_in}", f"agent.usd_per_1m_tokens_out={price_out}",
                              "agent.max_turns=8"], "episode")
        at_episode.run(cfg)
        assert srv.requests >= 1
    run = tmp_path / "http"
    lines = [json.loads(x) for x in (run / "episodes/0/trajectory.jsonl").read_text().splitlines()]
    native = [x for x in lines if x.get("role") == "assistant" and x.get("tool_calls")]
    assert native, "the served agent answered with native tool calls"
    calls = [r for r in _records(run) if r["kind"] == "llm"]
    assert calls and all(r["tokens_in"] > 0 and r["tokens_out"] > 0 for r in calls)
    for r in calls:  # USD from the usage the server reported
        assert r["usd"] == pytest.approx((r["tokens_in"] * price_in + r["tokens_out"] * price_out) / 1e6)
    # the planted key is nowhere in the run's files
    for path in run.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml", ".md", ".txt", ".log"):
            assert "sk-test-planted-key" not in path.read_text(errors="replace"), path

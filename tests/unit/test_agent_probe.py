"""scripts/agent_probe.py: what an agent model writes before any RL, by the algorithm its job names.

    .venv/bin/pytest tests/unit/test_agent_probe.py -q        (~10 s; the end-to-end test needs the tiny agent)
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("agent_probe", ROOT / "scripts" / "agent_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: str, content) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "write_file", "arguments": json.dumps({"path": path, "content": content})}}]}


def test_the_algorithm_is_read_even_from_a_broken_file(probe):
    assert probe.algorithm_of("base_model: tiny-s\nalgorithm: SFT\n") == "sft"
    assert probe.algorithm_of("algorithm: grpo\nreward: {functions: [\n") == "grpo"   # a YAML error
    assert probe.algorithm_of("base_model: tiny-s\n") == "?"


def test_only_the_job_files_written_count(probe):
    messages = [_write("job.yaml", "algorithm: sft\n"), _write("notes.md", "algorithm: grpo\n"),
                {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "type": "function", "function": {
                    "name": "write_file", "arguments": "{not json"}}]},
                {"role": "tool", "name": "write_file", "content": "algorithm: dpo"},
                _write("sub/job.yaml", "algorithm: grpo\n")]
    assert probe.job_writes(messages) == ["algorithm: sft\n", "algorithm: grpo\n"]


def test_wilson_intervals(probe):
    low, high = probe.wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = probe.wilson(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert probe.wilson(0, 0) == (0.0, 1.0)


def test_files_are_judged_by_the_real_validator_per_algorithm(probe, tmp_path):
    """A novice's job is valid and the same job with GRPO's reward-less mistake is not; the summary splits the
    first files by the algorithm they name."""
    from agent_trainer.outer_loop.agents.agent_model import training_tasks
    from agent_trainer.outer_loop.agents.novice import break_job, render_job, sample_job

    task = training_tasks()[0]
    rng = random.Random(0)
    job = sample_job(task, rng)
    assert probe.file_valid(render_job(job), task, tmp_path)
    assert not probe.file_valid(render_job(break_job(job, "unknown_reward", task)), task, tmp_path)
    assert not probe.file_valid("algorithm: [\n", task, tmp_path)
    assert list(tmp_path.iterdir()) == []            # each file is validated in its own folder, removed after

    def row(algorithm, first, last=True):
        return {"first_algorithm": algorithm, "first_valid": first, "last_valid": last, "first_sft": algorithm == "sft",
                "valid_first_try": first, "wrote": algorithm is not None, "turns": 2, "parsed_turns": 2}

    s = probe.summarize([row("sft", False), row("sft", True), row("grpo", True), row(None, False, False)])
    assert (s["first_file_valid_sft"]["k"], s["first_file_valid_sft"]["n"]) == (1, 2)
    assert (s["first_file_valid_grpo"]["k"], s["first_file_valid_grpo"]["n"]) == (1, 1)
    assert s["first_file_valid"]["n"] == 3 and s["valid_first_try"]["n"] == 4
    assert s["names_sft"]["share"] == pytest.approx(2 / 3)
    assert "| first file valid, SFT | 0.50 [" in probe.table({"a": s})


def test_the_probe_plays_an_agent_and_reports_its_files(probe, built_agent, tmp_path, capsys):
    """End to end on the tiny agent: every episode is described, the summary counts them, nothing is trained."""
    out = tmp_path / "probe.json"
    assert probe.main(["tiny-agent", "--episodes", "5", "--threads", "1", "--tool-schemas", "names",
                       "--max-new-tokens", "320", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]["tiny-agent"]
    assert [r["episode"] for r in rows] == list(range(5))
    assert len({r["task"] for r in rows}) == 5                       # one episode on each training task
    assert all(r["parsed_turns"] <= r["turns"] for r in rows) and any(r["wrote"] for r in rows)
    for r in rows:
        assert r["first_algorithm"] == (r["writes"][0]["algorithm"] if r["writes"] else None)
    summary = data["summaries"]["tiny-agent"]
    assert summary["episodes"] == 5 and summary["first_file_valid"]["n"] == sum(r["wrote"] for r in rows)
    assert "| first file valid, SFT |" in capsys.readouterr().out

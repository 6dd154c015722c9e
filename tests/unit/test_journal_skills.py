"""Journal and skill tools: shapes, append-only persistence across episodes, and tools only when enabled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_trainer.evaluation.tasks import load_task
from agent_trainer.config import AgentConfig, Intervention, StrategyConfig, StrategyMode, ToolSchemas
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings
from agent_trainer.outer_loop.strategy.journal import KINDS, Journal, SkillLibrary
from agent_trainer.outer_loop.strategy.steering import Steering
from agent_trainer.outer_loop.episode.tools import SCHEMAS

ROOT = Path(__file__).resolve().parents[2]
TASK = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
PLAN = {"kind": "plan", "text": "sft 100 steps lr 3e-3", "hypothesis": "curated sft lifts the dev score",
        "success_criteria": "dev +0.05", "abort_criteria": "loss flat after 30 steps"}


def episode(tmp_path, name, steering=None):
    return Episode(backend=None, task=TASK, episode_dir=tmp_path / "episodes" / name, steering=steering,
                   settings=EpisodeSettings(agent=AgentConfig(tool_schemas=ToolSchemas.names)))


def names(ep):
    return [s["function"]["name"] for s in ep.box.schemas()]


def test_default_tool_set_is_unchanged(tmp_path):
    ep = episode(tmp_path, "0")
    assert names(ep) == [s["function"]["name"] for s in SCHEMAS]
    # a steering layer with nothing enabled adds no tool and no sentence
    ep2 = episode(tmp_path, "1", Steering(StrategyConfig(interventions=[Intervention(1, "x")])))
    assert names(ep2) == names(ep) and ep2.messages[0]["content"] == ep.messages[0]["content"]


def test_tools_appear_when_enabled_and_are_listed_for_the_agent(tmp_path):
    ep = episode(tmp_path, "0", Steering(StrategyConfig(mode=StrategyMode.check, journal=True, skills=True)))
    assert names(ep)[-5:] == ["decide", "journal_write", "journal_read", "list_skills", "read_skill"]
    system = ep.messages[0]["content"]
    assert "journal_write(kind, text, hypothesis, success_criteria, abort_criteria)" in system
    assert "read_skill(name)" in system and "decide(" in system
    # decide outside a check is refused, not an error
    res = ep.box.call("decide", {"strategy": "x", "scores": [], "decision": "CONTINUE", "reason": "a b c"})
    assert not res.ok and "no check is open" in res.text


def test_journal_tool_validates_and_appends(tmp_path):
    ep = episode(tmp_path, "0", Steering(StrategyConfig(journal=True)))
    bad = ep.box.call("journal_write", {"kind": "plan", "text": "try sft"})
    assert not bad.ok and "hypothesis, success_criteria, abort_criteria" in bad.text
    assert not ep.box.call("journal_write", {"kind": "diary", "text": "x"}).ok
    assert ep.box.call("journal_write", PLAN).ok
    assert ep.box.call("journal_write", {"kind": "lesson", "text": "lr 1e-5 does nothing in 100 steps"}).ok
    path = ep.dir / "journal.jsonl"   # no journal_path: one journal per episode
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["plan", "lesson"] and rows[0]["abort_criteria"] == PLAN["abort_criteria"]
    assert rows[0]["episode"] == "0" and rows[0]["job"] == 0
    read = ep.box.call("journal_read", {"kind": "lesson"})
    assert read.ok and "lr 1e-5 does nothing" in read.text and "sft 100 steps" not in read.text


def test_a_run_level_journal_persists_across_episodes(tmp_path):
    run = tmp_path / "run"
    s = StrategyConfig(journal=True, journal_path="journal.jsonl")
    first = episode(run, "0", Steering(s, run_dir=run))
    first.box.call("journal_write", PLAN)
    second = episode(run, "1", Steering(s, run_dir=run))
    seen = second.box.call("journal_read", {})
    assert "curated sft lifts the dev score" in seen.text and "ep 0" in seen.text
    second.box.call("journal_write", {"kind": "observation", "text": "the plan of episode 0 is here"})
    rows = Journal(run / "journal.jsonl").entries()
    assert [r["episode"] for r in rows] == ["0", "1"]   # appended, never rewritten


def test_skill_library(tmp_path):
    lib = SkillLibrary()
    assert {"grpo_vs_sft", "learning_rate", "lora_vs_full", "when_to_switch"} <= set(lib.names())
    ep = episode(tmp_path, "0", Steering(StrategyConfig(skills=True)))
    listed = ep.box.call("list_skills", {})
    assert listed.ok and "learning_rate: How to pick a learning rate" in listed.text
    text = ep.box.call("read_skill", {"name": "when_to_switch"})
    assert text.ok and "2.1%" in text.text
    missing = ep.box.call("read_skill", {"name": "nope"})
    assert not missing.ok and "grpo_vs_sft" in missing.text
    own = tmp_path / "skills"
    own.mkdir()
    (own / "mine.md").write_text("# Mine\nbody\n")
    assert SkillLibrary(own).names() == ["mine"] and SkillLibrary(own).title("mine") == "Mine"


def test_journal_kinds_match_the_issue():
    assert KINDS == ("plan", "observation", "lesson", "eval_result", "eval_analysis")
    with pytest.raises(ValueError, match="text is empty"):
        Journal("/tmp/unused.jsonl").write("lesson", " ")

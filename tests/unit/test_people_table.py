"""Agents against people (``at-compare mode=people``), its parts: an episode without a valid job counts as uplift 0
and as no valid job, a mean over seeds has the seeds as its unit, an example job is copied onto another family
within its budget, and the scripted agents (a person's job, the novice) play through the real tools, the same
calls on the same episode seed. The whole table on two tiny runs: tests/integration/test_policy_eval.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_trainer.config import AgentConfig, BudgetConfig
from agent_trainer.evaluation.tasks import load_task
from agent_trainer.outer_loop.agents.handwritten import adapt_job
from agent_trainer.outer_loop.agents.scripted import ScriptedPolicy, job_script, novice_script
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings
from agent_trainer.outer_loop.report.bootstrap import t_interval
from agent_trainer.outer_loop.report.people import (
    HELDOUT, TRAIN, cell, cells_of, csv_rows, episode_record, markdown, seeds_cell,
)
from agent_trainer.inner_loop.run.request import JobSettings

ROOT = Path(__file__).resolve().parents[2]
TINY = {f: load_task(ROOT / f"examples/tasks/{f}_v1_tiny.json") for f in ("calc_chain", "triage")}


def summary(family: str, uplift: float | None, **reward) -> dict:
    return {"family": family, "task": f"{family}_v1_tiny", "usd": 0.001, "tokens_in": 90, "tokens_out": 10,
            "reward": {"uplift": uplift, "post_score": None if uplift is None else 0.2 + uplift, "total": 0.1,
                       **reward}}


def test_an_episode_without_a_valid_job_is_uplift_zero_and_counts_against_the_valid_share():
    records = [episode_record(s) for s in (
        summary("calc_chain", 0.30), summary("calc_chain", None),                # a refused job: no uplift
        summary("calc_chain", 0.0, flagged=True),                                # trained on hidden items
        summary("calc_chain", None, excluded=True),                              # the machine's fault
        summary("triage", -0.10))]
    c = cell([r for r in records if r["family"] == "calc_chain"])
    assert c["episodes"] == 3 and c["excluded"] == 1
    assert c["valid_share"] == pytest.approx(1 / 3)
    assert c["uplift"] == pytest.approx(0.30 / 3)            # the two invalid ones in the mean, as 0
    assert c["hidden_score"] == pytest.approx(0.50)          # of the valid job only
    assert c["lo"] <= c["uplift"] <= c["hi"] and c["unit"] == "episodes"
    assert c["usd_per_episode"] == pytest.approx(0.001) and c["tokens_per_episode"] == 100
    cells = cells_of(records, ["calc_chain", "triage"], {"triage"})
    assert cells[TRAIN] == c and cells[HELDOUT]["uplift"] == pytest.approx(-0.10)


def test_a_mean_of_seeds_has_the_seeds_as_its_unit():
    per_seed = [cell([episode_record(summary("calc_chain", u)) for u in ups])
                for ups in ((0.1, 0.3), (0.0, 0.0), (0.2, None))]
    m = seeds_cell(per_seed)
    means = [0.2, 0.0, 0.1]
    assert m["unit"] == "seeds" and m["seeds"] == 3 and m["uplift"] == pytest.approx(0.1)
    assert (m["lo"], m["hi"]) == pytest.approx(t_interval(means))
    assert m["valid_share"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert seeds_cell(per_seed[:1]) is None                 # one seed: no interval over seeds


def test_the_table_files_hold_every_row_and_cell():
    rec = [episode_record(summary("calc_chain", 0.2)), episode_record(summary("triage", None))]
    row = {"row": "teacher", "label": "scripted teacher (novice)", "records": rec, "seconds_per_episode": 3.0,
           "cells": cells_of(rec, ["calc_chain", "triage"], {"triage"})}
    table = {"episodes": 1, "families": ["calc_chain", "triage"], "heldout": ["triage"],
             "base": {"calc_chain": {"tiny-s": 0.1}, "triage": {"tiny-s": 0.3}},
             "rows": [{"row": "base", "label": "no job (the base model)", "records": []}, row]}
    text = markdown(table)
    assert "| scripted teacher (novice) | +0.200 [+0.200, +0.200] | 1.00 | +0.000 [+0.000, +0.000] | 0.00 |" in text
    assert "| triage | 0.300 |" in text
    lines = csv_rows(table)
    assert {(r["row"], r["family"]) for r in lines} == {
        ("base", "calc_chain"), ("base", "triage"), *(("teacher", k) for k in ("calc_chain", "triage", TRAIN, HELDOUT))}


def test_an_example_job_is_copied_onto_another_family_within_its_budget():
    task = TINY["triage"]
    files = adapt_job(ROOT / "examples/jobs/sft_full", task)
    job = yaml.safe_load(files["job.yaml"])
    assert job["data"]["sources"][0]["family"] == "triage"
    assert job["hyperparameters"]["max_steps"] == task.budget.max_steps == 100     # 400 in the example
    assert job["hyperparameters"]["learning_rate"] == 3.0e-3 and job["base_model"] == "tiny-s"
    staged = yaml.safe_load(adapt_job(ROOT / "examples/jobs/sft_then_grpo", task)["job.yaml"])
    assert sum(s["hyperparameters"]["max_steps"] for s in staged["stages"]) <= 100
    assert set(adapt_job(ROOT / "examples/jobs/custom_reward", task)) == {"job.yaml", "data.jsonl", "reward.py"}


def _episode(tmp_path: Path, policy, name: str, seed: int) -> Episode:
    return Episode(policy, TINY["calc_chain"], tmp_path / name, seed=seed, defer_jobs=True,
                   settings=EpisodeSettings(agent=AgentConfig(max_turns=8, validate_dry_run=False),
                                            budget=BudgetConfig(max_jobs_per_episode=1)),
                   job_settings=JobSettings(dry_run=False, cache=False))


def _calls(ep: Episode) -> list:
    return [(c["function"]["name"], c["function"]["arguments"]) for m in ep.messages if m["role"] == "assistant"
            for c in m.get("tool_calls", [])]


def test_scripted_agents_play_through_the_real_tools(tmp_path):
    tasks = list(TINY.values())
    novice = ScriptedPolicy(tasks, novice_script, "novice")
    eps = [_episode(tmp_path, novice, name, seed) for name, seed in (("a", 7), ("b", 7), ("c", 8))]
    for ep in eps:
        ep.play()
    assert _calls(eps[0]) == _calls(eps[1])                  # the same episode seed, the same calls
    assert _calls(eps[0]) != _calls(eps[2])
    assert all(_calls(ep)[-1][0] == "submit_job" and len(ep.pending) == 1 for ep in eps)
    fixes = [ep for ep in eps if [n for n, _ in _calls(ep)].count("validate_job") > 1]
    for ep in fixes:   # a fix follows what validate_job said: the novice was sent the real result
        assert "INVALID" in next(m["content"] for m in ep.messages if m.get("name") == "validate_job")

    files = adapt_job(ROOT / "examples/jobs/sft_lora", TINY["calc_chain"])
    person = _episode(tmp_path, ScriptedPolicy(tasks, job_script({"calc_chain": files}), "handwritten"), "p", 7)
    assert person.play() == "max_jobs"
    assert [n for n, _ in _calls(person)] == ["write_file", "validate_job", "submit_job"]
    assert ": VALID (" in next(m["content"] for m in person.messages if m.get("name") == "validate_job")
    assert (person.pending[0].job_dir / "job.yaml").read_text() == files["job.yaml"]
    assert json.loads(_calls(person)[0][1])["content"] == files["job.yaml"]
